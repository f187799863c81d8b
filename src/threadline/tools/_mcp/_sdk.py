"""Everything that touches the ``mcp`` package, imported here and only when used.

The supported range (``mcp>=1.10,<3``, the ``threadline[mcp]`` extra) spans
two majors whose Python APIs differ (v2 renamed fields to snake_case, pages
``tools/list`` by a params object and builds its HTTP transport on
``httpx2``). The rest of the MCP room works on the protocol's own JSON
(``wire``): what both majors send over the wire is the same.
"""

from __future__ import annotations

import importlib.metadata
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import IO, Any, TypeAlias

import anyio
import anyio.abc

from threadline._errors import ToolError

__all__ = [
    "ClientSession",
    "Streams",
    "answered_id",
    "call_key",
    "call_tool",
    "cancels_itself",
    "default_environment",
    "is_tools_list_changed",
    "list_tools",
    "open_http",
    "open_session",
    "open_stdio",
    "outgoing_tool_call",
    "sdk_major",
    "send_cancelled",
]

ClientSession: TypeAlias = Any
"""``mcp.ClientSession`` (typed loosely: its signatures differ between the majors)."""

Streams: TypeAlias = tuple[anyio.abc.ObjectReceiveStream[Any], anyio.abc.ObjectSendStream[Any]]

INSTALL_HINT = "pip install 'threadline[mcp]'"


def sdk_major() -> int:
    """The installed ``mcp`` package's major version.

    Raises:
        ToolError: ``mcp`` is not installed, or its version is outside the range.
    """
    try:
        version = importlib.metadata.version("mcp")
    except importlib.metadata.PackageNotFoundError:
        raise ToolError(f"MCP servers need the mcp package: {INSTALL_HINT}") from None
    major_text, _, rest = version.partition(".")
    minor = int(rest.partition(".")[0]) if rest.partition(".")[0].isdigit() else 0
    major = int(major_text) if major_text.isdigit() else 0
    if (major, minor) < (1, 10) or major >= 3:
        raise ToolError(
            f"mcp {version} is installed; threadline supports mcp>=1.10,<3 ({INSTALL_HINT})"
        )
    return major


def default_environment() -> dict[str, str]:
    """The SDK's safe defaults for a stdio server: ``PATH``, ``HOME`` and a few like them."""
    sdk_major()
    from mcp.client.stdio import get_default_environment

    defaults: dict[str, str] = get_default_environment()
    return defaults


@asynccontextmanager
async def open_stdio(
    command: str,
    args: tuple[str, ...],
    env: Mapping[str, str],
    cwd: str | None,
    errlog: IO[str],
) -> AsyncIterator[Streams]:
    """The SDK's stdio transport to a server it starts with exactly ``env``."""
    sdk_major()
    from mcp.client.stdio import StdioServerParameters, stdio_client

    # The SDK merges its defaults under ``env``; the caller already chose them.
    parameters = StdioServerParameters(command=command, args=list(args), env=dict(env), cwd=cwd)
    async with stdio_client(parameters, errlog=errlog) as streams:
        yield streams[0], streams[1]


@asynccontextmanager
async def open_http(url: str, headers: Mapping[str, str]) -> AsyncIterator[Streams]:
    """The SDK's Streamable HTTP transport to ``url``, sending ``headers`` with each request."""
    if sdk_major() == 1:
        from mcp.client.streamable_http import streamablehttp_client

        async with streamablehttp_client(url, headers=dict(headers)) as streams:
            yield streams[0], streams[1]
        return
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    async with (
        create_mcp_http_client(headers=dict(headers)) as client,
        streamable_http_client(url, http_client=client) as streams,
    ):
        yield streams[0], streams[1]


def open_session(
    streams: Streams, on_notification: Callable[[Any], Awaitable[None]]
) -> AbstractAsyncContextManager[ClientSession]:
    """A client session over ``streams``; ``on_notification`` hears what the server sends."""
    from mcp import ClientSession as Session

    session: AbstractAsyncContextManager[ClientSession] = Session(
        streams[0], streams[1], message_handler=on_notification
    )
    return session


def is_tools_list_changed(message: Any) -> bool:
    """Whether a message the session hands over is ``notifications/tools/list_changed``."""
    from mcp import types
    from pydantic import RootModel

    root = message.root if isinstance(message, RootModel) else message
    return isinstance(root, types.ToolListChangedNotification)


async def list_tools(session: ClientSession) -> list[dict[str, Any]]:
    """Every tool the server offers, page after page, as protocol JSON."""
    tools: list[dict[str, Any]] = []
    cursor: str | None = None
    while True:
        if sdk_major() == 1:
            page = await session.list_tools(cursor)
        else:
            from mcp import types

            params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
            page = await session.list_tools(params=params)
        wire = _wire(page)
        tools.extend(wire.get("tools", []))
        cursor = wire.get("nextCursor")
        if not cursor:
            return tools


async def call_tool(session: ClientSession, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """``tools/call``, its result as protocol JSON."""
    return _wire(await session.call_tool(name, arguments))


def _wire(value: Any) -> dict[str, Any]:
    dumped: dict[str, Any] = value.model_dump(mode="json", by_alias=True, exclude_none=True)
    return dumped


# -- telling an mcp 1 server that a call was cancelled ---------------------------------
# mcp 2 sends notifications/cancelled itself when a request's caller is cancelled; mcp 1
# only stops waiting. For mcp 1 the connection notes the id of each tools/call request
# as it goes out, so a cancelled call can name its request.


def cancels_itself() -> bool:
    """Whether the session sends ``notifications/cancelled`` for a cancelled request."""
    return sdk_major() >= 2


def call_key(name: str, arguments: Any) -> str:
    """What tells one ``tools/call`` from another: the tool's name and its arguments."""
    return json.dumps([name, arguments], sort_keys=True, default=str)


def outgoing_tool_call(message: Any) -> tuple[Any, str] | None:
    """``(request id, call key)`` of a ``tools/call`` request going out, else ``None``."""
    wire = _wire(message.message)
    if wire.get("method") != "tools/call" or "id" not in wire:
        return None
    params = wire.get("params") or {}
    return wire["id"], call_key(params.get("name", ""), params.get("arguments") or {})


def answered_id(message: Any) -> Any:
    """The request id a response or error coming in answers, else ``None``."""
    if isinstance(message, Exception):
        return None
    wire = _wire(message.message)
    return None if "method" in wire else wire.get("id")


async def send_cancelled(session: ClientSession, request_id: Any) -> None:
    """``notifications/cancelled`` for the request ``request_id``."""
    from mcp import types

    params = types.CancelledNotificationParams(requestId=request_id, reason="cancelled by caller")
    notice = types.CancelledNotification(method="notifications/cancelled", params=params)
    await session.send_notification(types.ClientNotification(notice))
