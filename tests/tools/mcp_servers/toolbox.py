"""An MCP server for the tests, written with the official SDK's FastMCP.

Run as ``python toolbox.py`` it serves stdio; ``python toolbox.py http PORT``
serves Streamable HTTP on 127.0.0.1:PORT at ``/mcp``. Both SDK majors work:
mcp 2 renamed FastMCP to ``MCPServer``. ``MARKS`` (an environment variable)
names a file where a tool that was cancelled writes a line.
"""

import base64
import os
import signal
import sys

import anyio

try:
    from mcp.server.fastmcp import Context, FastMCP, Image
except ModuleNotFoundError:  # mcp 2
    from mcp.server.mcpserver import Context, Image
    from mcp.server.mcpserver import MCPServer as FastMCP

from mcp import types

server = FastMCP("toolbox")

# A 1x1 PNG.
PIXEL = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg=="
)


@server.tool()
def add(a: int, b: int) -> str:
    """Add two integers."""
    return str(a + b)


@server.tool()
def weather(city: str) -> dict[str, object]:
    """The weather in a city, as structured content."""
    return {"city": city, "celsius": 21, "sky": "clear"}


@server.tool()
def fail(reason: str) -> str:
    """Always fails with ``reason``."""
    raise ValueError(reason)


@server.tool()
async def slow(seconds: float) -> str:
    """Sleeps; a cancelled call leaves a line in the MARKS file."""
    try:
        await anyio.sleep(seconds)
    except anyio.get_cancelled_exc_class():
        marks = os.environ.get("MARKS")
        if marks:
            # Blocking on purpose: a cancelled scope cannot await, and the line is tiny.
            with open(marks, "a", encoding="utf-8") as file:  # noqa: ASYNC230
                file.write("cancelled\n")
        raise
    return "slept"


@server.tool()
def die() -> str:
    """Kills this server's process in the middle of the call."""
    os.kill(os.getpid(), signal.SIGKILL)
    return "unreachable"


@server.tool()
def pid() -> str:
    """This server's process id."""
    return str(os.getpid())


@server.tool()
def big(characters: int) -> str:
    """A long text of numbered words."""
    words = " ".join(f"w{i}" for i in range(characters // 4))
    return words[:characters]


@server.tool()
def picture() -> Image:
    """A tiny PNG image."""
    return Image(data=PIXEL, format="png")


@server.tool()
def link() -> types.ResourceLink:
    """A link to a resource."""
    return types.ResourceLink(
        type="resource_link", name="report", uri="file:///tmp/report.txt", mimeType="text/plain"
    )


@server.tool()
def env(name: str) -> str:
    """The value of an environment variable, or 'unset'."""
    return os.environ.get(name, "unset")


@server.tool()
async def grow(name: str, ctx: Context) -> str:  # type: ignore[type-arg]
    """Adds a tool called ``name`` and tells the client its tools changed."""

    def late() -> str:
        return f"{name} arrived late"

    server.add_tool(late, name=name, description="A tool that arrived later.")
    await ctx.session.send_tool_list_changed()
    return "grown"


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        import uvicorn

        app = server.streamable_http_app()
        uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[2]), log_level="warning")
    else:
        server.run()
