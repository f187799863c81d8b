"""A tiny MCP server, for docs/tools.md and ``threadline chat --mcp``.

It is written with the official SDK (``pip install 'threadline[mcp]'``) and
speaks MCP over stdin/stdout; threadline starts it:

    threadline chat --mcp 'python examples/mcp_server.py'
"""

try:
    from mcp.server.fastmcp import FastMCP
except ModuleNotFoundError:  # mcp 2 renamed FastMCP to MCPServer
    from mcp.server.mcpserver import MCPServer as FastMCP

server = FastMCP("words")


@server.tool()
def count_words(text: str) -> int:
    """How many words a text has."""
    return len(text.split())


@server.tool()
def shout(text: str) -> str:
    """The text in capitals."""
    return text.upper()


if __name__ == "__main__":
    server.run()
