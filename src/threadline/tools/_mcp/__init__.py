"""MCP servers as tools (the ``threadline[mcp]`` extra): ``MCPServer``.

Nothing here imports ``mcp`` until a server is entered, so ``import
threadline`` never does.
"""

from threadline.tools._mcp._server import MCPServer

__all__ = ["MCPServer"]
