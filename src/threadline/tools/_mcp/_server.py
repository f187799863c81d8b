"""``MCPServer``: a Model Context Protocol server whose tools a run may call.

A server is entered with ``async with``; that starts it (stdio) or connects
to it (Streamable HTTP), lists its tools once and keeps the connection in a
task of the server's own, so any task may call through it. Its tools are
plain :class:`~threadline.tools.Tool` values whose function sends
``tools/call``: the run loop runs them like any tool, with the same time
limit and cancellation. A server that stops is noticed at once (its stream
ends); the call in flight becomes an error result and the next call starts
it again. ``notifications/tools/list_changed`` re-lists the tools, which the
next request offers.
"""

from __future__ import annotations

import functools
import logging
import shlex
import tempfile
import urllib.parse
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any, Literal, Self, TypeVar

import anyio
import anyio.abc
import attrs

from threadline._errors import InvalidRequestError, ToolError
from threadline._validate import fail
from threadline.tools._mcp import _sdk
from threadline.tools._mcp._convert import result_of, tool_of
from threadline.tools._results import ToolResult, describe_exception
from threadline.tools._tools import Tool, ToolSource

__all__ = ["MCPServer"]

logger = logging.getLogger("threadline.tools.mcp")

_T = TypeVar("_T")
_CLOSE_SECONDS = 5.0
"""How long leaving a server waits for its connection to close before cancelling it."""
_STDERR_TAIL = 2_000
"""The most characters of a server's stderr an error quotes."""


class _Lost(Exception):
    """The connection ended while a request waited for its answer."""


@attrs.frozen(kw_only=True)
class _Stdio:
    command: str
    args: tuple[str, ...]
    env: Mapping[str, str] = attrs.field(repr=False)
    cwd: str | None

    def describe(self) -> str:
        return shlex.join((self.command, *self.args))

    def default_name(self) -> str:
        scripts = [a for a in self.args if not a.startswith("-")]
        return Path(scripts[-1] if scripts else self.command).stem

    def scrub(self, text: str) -> str:
        return text


@attrs.frozen(kw_only=True)
class _HTTP:
    url: str
    headers: Mapping[str, str] = attrs.field(repr=False)

    def describe(self) -> str:
        # No user, password or query: they may carry a token.
        parts = urllib.parse.urlsplit(self.url)
        host = parts.hostname or ""
        netloc = f"{host}:{parts.port}" if parts.port else host
        return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", ""))

    def default_name(self) -> str:
        return urllib.parse.urlsplit(self.url).hostname or "mcp"

    def scrub(self, text: str) -> str:
        """``text`` (an HTTP error's message, which may quote the URL) without the URL's
        user, password and query."""
        parts = urllib.parse.urlsplit(self.url)
        text = text.replace(self.url, self.describe())
        user = parts.netloc.rpartition("@")[0]
        for secret in (parts.query, user):
            if secret:
                text = text.replace(secret, "...")
        return text


@attrs.define(kw_only=True)
class _Live:
    """One connection: its session, and ``lost`` set once it has ended."""

    session: Any
    lost: anyio.Event
    errlog: IO[str] | None
    calls: dict[Any, str] = attrs.Factory(dict)
    """mcp 1 only: the id and key of each ``tools/call`` request not yet answered."""


class _Call:
    """A tool's function: ``tools/call`` to the server by the tool's own name."""

    __slots__ = ("_name", "_server")

    def __init__(self, server: MCPServer, name: str) -> None:
        self._server = server
        self._name = name

    async def __call__(self, **arguments: Any) -> ToolResult:
        return await self._server.call(self._name, arguments)


class MCPServer(ToolSource):
    """An MCP server whose tools a run may call, beside ``@tool`` functions.

    Build one with :meth:`stdio` or :meth:`http`, enter it with ``async with``
    and pass it in ``tools=``::

        server = MCPServer.stdio("python", ["server.py"])
        async with server:
            agent = Agent(client, model=model, tools=[server, get_weather])
            result = await agent.run("What is 2 + 3?")

    ``name`` is put in front of its tools' names (``NAME_tool``) when one
    collides with another tool's; ``prefix`` set puts it in front always,
    ``""`` never (a collision is then an error). ``timeout`` is each call's
    time limit (unset: the request's ``tool_timeout``); ``max_result_tokens``
    caps a result, cut once as it enters the transcript (default
    ``"budget"``: a quarter of the prompt budget); ``startup_timeout`` bounds
    starting and listing.

    Raises:
        ToolError: from ``async with``: the server cannot start (naming the
            command and the end of its stderr), or ``mcp`` is not installed.
    """

    __slots__ = (
        "_group",
        "_live",
        "_lock",
        "_max_result_tokens",
        "_name",
        "_prefix",
        "_startup_timeout",
        "_target",
        "_timeout",
        "_tools",
    )

    def __init__(
        self,
        target: _Stdio | _HTTP,
        *,
        name: str | None,
        prefix: str | None,
        timeout: float | None,
        max_result_tokens: int | Literal["budget"] | None,
        startup_timeout: float,
    ) -> None:
        self._target = target
        self._name = name if name is not None else _safe_name(target.default_name())
        self._prefix = prefix
        self._timeout = timeout
        self._max_result_tokens = max_result_tokens
        self._startup_timeout = startup_timeout
        self._group: anyio.abc.TaskGroup | None = None
        self._live: _Live | None = None
        self._lock: anyio.Lock | None = None
        self._tools: tuple[Tool, ...] = ()
        # A bad option fails here, not on the first listing.
        Tool(name="probe", timeout=timeout, max_result_tokens=max_result_tokens)
        if prefix is not None and not isinstance(prefix, str):
            fail("prefix", "a str or None", prefix)

    @classmethod
    def stdio(
        cls,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        name: str | None = None,
        prefix: str | None = None,
        timeout: float | None = None,
        max_result_tokens: int | Literal["budget"] | None = "budget",
        startup_timeout: float = 30.0,
    ) -> MCPServer:
        """A server threadline starts as ``command args`` and talks to over stdin/stdout.

        Its environment is ``env`` over the SDK's safe defaults (``PATH``,
        ``HOME``, ``USER`` and a few like them), never the whole of this
        process's: pass what the server needs.
        """
        if not isinstance(command, str) or not command:
            fail("command", "a non-empty str", command)
        if isinstance(args, str) or not all(isinstance(a, str) for a in args):
            fail("args", "a list of str", args)
        if env is not None and not all(
            isinstance(k, str) and isinstance(v, str) for k, v in env.items()
        ):
            raise InvalidRequestError("env must map str names to str values")
        target = _Stdio(
            command=command,
            args=tuple(args),
            env=dict(env or {}),
            cwd=None if cwd is None else str(cwd),
        )
        return cls(
            target,
            name=name,
            prefix=prefix,
            timeout=timeout,
            max_result_tokens=max_result_tokens,
            startup_timeout=startup_timeout,
        )

    @classmethod
    def http(
        cls,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        name: str | None = None,
        prefix: str | None = None,
        timeout: float | None = None,
        max_result_tokens: int | Literal["budget"] | None = "budget",
        startup_timeout: float = 30.0,
    ) -> MCPServer:
        """A server at ``url`` over Streamable HTTP; ``headers`` go with every request.

        The headers (an ``Authorization`` token, say) appear in no repr,
        log line or error.
        """
        if not isinstance(url, str) or urllib.parse.urlsplit(url).scheme not in ("http", "https"):
            fail("url", "an http:// or https:// URL", url)
        if headers is not None and not all(
            isinstance(k, str) and isinstance(v, str) for k, v in headers.items()
        ):
            raise InvalidRequestError("headers must map str names to str values")
        return cls(
            _HTTP(url=url, headers=dict(headers or {})),
            name=name,
            prefix=prefix,
            timeout=timeout,
            max_result_tokens=max_result_tokens,
            startup_timeout=startup_timeout,
        )

    # -- the ToolSource face ---------------------------------------------------------

    @property
    def source_name(self) -> str:
        """The name put in front of a tool's name when it collides."""
        return self._name

    @property
    def prefix(self) -> str | None:
        """``None``: prefix on collision; a string: always; ``""``: never."""
        return self._prefix

    def current_tools(self) -> tuple[Tool, ...]:
        """The tools as last listed.

        Raises:
            InvalidRequestError: the server was not entered with ``async with``.
        """
        if self._group is None:
            raise InvalidRequestError(
                f"MCP server {self._name!r} is not connected: enter it with "
                "'async with server:' around the runs that use it"
            )
        return self._tools

    # -- connecting ------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        if self._group is not None:
            raise InvalidRequestError(f"MCP server {self._name!r} is entered already")
        group = anyio.create_task_group()
        await group.__aenter__()
        self._group, self._lock = group, anyio.Lock()
        try:
            await group.start(self._serve)
        except BaseException:
            await self.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        group, live, self._group, self._live = self._group, self._live, None, None
        if group is not None:
            if live is not None:
                live.lost.set()  # the connection closes itself, as the SDK's own clients do
            # Past the grace, whatever is left (a re-listing, a stuck server) is cancelled.
            group.cancel_scope.deadline = anyio.current_time() + _CLOSE_SECONDS
            await group.__aexit__(None, None, None)
        if live is not None and live.errlog is not None:
            live.errlog.close()

    async def _serve(self, *, task_status: anyio.abc.TaskStatus[_Live]) -> None:
        """Hold one connection open until it ends or the server is left."""
        # Closed when the connection is replaced or left: a call it broke quotes it.
        errlog = tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace")  # noqa: SIM115
        lost = anyio.Event()
        live: _Live | None = None
        calls: dict[Any, str] = {}
        try:
            async with self._open(errlog) as streams, anyio.create_task_group() as inner:
                inbound, relayed = anyio.create_memory_object_stream[Any](0)
                inner.start_soon(self._relay, streams[0], inbound, lost, calls)
                session_streams = (relayed, streams[1])
                if not _sdk.cancels_itself():
                    outgoing, onward = anyio.create_memory_object_stream[Any](0)
                    inner.start_soon(_note_calls, onward, streams[1], calls)
                    session_streams = (relayed, outgoing)
                handler = functools.partial(self._on_message, lost)
                async with relayed, _sdk.open_session(session_streams, handler) as session:
                    with anyio.fail_after(self._startup_timeout):
                        listed = await _until_lost(lost, lambda: self._start(session))
                    self._tools = listed
                    kept = errlog if isinstance(self._target, _Stdio) else None
                    live = _Live(session=session, lost=lost, errlog=kept, calls=calls)
                    self._live = live
                    task_status.started(live)
                    await lost.wait()
                inner.cancel_scope.cancel()
        except Exception as exc:
            if live is None:
                raise self._start_error(exc, errlog) from None
            logger.info("MCP server %r: the connection ended (%s)", self._name, type(exc).__name__)
        finally:
            lost.set()
            if live is None or live.errlog is None:
                errlog.close()  # else kept for the error of the call it broke, closed on replacing

    def _open(self, errlog: IO[str]) -> Any:
        target = self._target
        if isinstance(target, _HTTP):
            return _sdk.open_http(target.url, target.headers)
        env = _sdk.default_environment() | dict(target.env)
        return _sdk.open_stdio(target.command, target.args, env, target.cwd, errlog)

    async def _start(self, session: Any) -> tuple[Tool, ...]:
        await session.initialize()
        return await self._listed(session)

    async def _listed(self, session: Any) -> tuple[Tool, ...]:
        return tuple(
            tool_of(
                wire,
                _Call(self, str(wire.get("name", ""))),
                timeout=self._timeout,
                max_result_tokens=self._max_result_tokens,
            )
            for wire in await _sdk.list_tools(session)
        )

    async def _relay(
        self,
        source: anyio.abc.ObjectReceiveStream[Any],
        sink: anyio.abc.ObjectSendStream[Any],
        lost: anyio.Event,
        calls: dict[Any, str],
    ) -> None:
        """Pass the transport's messages to the session; the stream's end (the
        server stopped) or a broken HTTP exchange ends the connection."""
        # The session would close the stream it reads: this relay reads it instead.
        async with source, sink:
            try:
                async for message in source:
                    if isinstance(message, Exception) and isinstance(self._target, _HTTP):
                        detail = self._target.scrub(describe_exception(message))
                        logger.info("MCP server %r: %s", self._name, detail)
                        break
                    if calls:
                        calls.pop(_sdk.answered_id(message), None)
                    await sink.send(message)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream):
                pass
            finally:
                # Set before the session sees its stream close and fails the calls in flight.
                lost.set()

    async def _on_message(self, lost: anyio.Event, message: Any) -> None:
        if lost.is_set() or not _sdk.is_tools_list_changed(message):
            return
        live, group = self._live, self._group
        if live is not None and group is not None:
            # Not awaited here: the answer to tools/list arrives through this very handler's loop.
            group.start_soon(self._relist, live)

    async def _relist(self, live: _Live) -> None:
        try:
            listed = await _until_lost(live.lost, lambda: self._listed(live.session))
        except Exception as exc:
            logger.info("MCP server %r: re-listing tools failed: %s", self._name, exc)
            return
        self._tools = listed
        logger.debug("MCP server %r: tools re-listed: %s", self._name, [t.name for t in listed])

    # -- calling ---------------------------------------------------------------------

    async def call(self, name: str, arguments: dict[str, Any]) -> ToolResult:
        """``tools/call`` of the server's tool ``name``: what a tool's function does.

        Raises:
            ToolError: the server is not entered, cannot be started again, or
                stopped or failed during the call.
        """
        live = await self._ready()
        try:
            calling = functools.partial(_sdk.call_tool, live.session, name, arguments)
            wire = await _until_lost(live.lost, calling)
        except anyio.get_cancelled_exc_class():
            await _tell_cancelled(live, name, arguments)
            raise
        except _Lost:
            raise self._stopped(name, live) from None
        except Exception as exc:
            if live.lost.is_set():
                raise self._stopped(name, live) from None
            # A tool's own failure comes as a result; an exception means the exchange broke
            # (over HTTP, a server that went away): the next call connects afresh.
            live.lost.set()
            raise ToolError(
                f"MCP server {self._name!r} could not run {name!r}: "
                + self._target.scrub(describe_exception(exc))
                + "; it is connected again on the next call"
            ) from None
        return result_of(wire)

    def _stopped(self, name: str, live: _Live) -> ToolError:
        return ToolError(
            f"MCP server {self._name!r} ({self._target.describe()}) stopped during the "
            f"call to {name!r}; it is started again on the next call{_tail(live.errlog)}"
        )

    async def _ready(self) -> _Live:
        group, lock = self._group, self._lock
        if group is None or lock is None:
            raise ToolError(
                f"MCP server {self._name!r} is not connected (enter it with async with)"
            )
        async with lock:
            live = self._live
            if live is None or live.lost.is_set():
                logger.info("MCP server %r: starting it again", self._name)
                if live is not None and live.errlog is not None:
                    live.errlog.close()
                live = await group.start(self._serve)
        return live

    def _start_error(self, cause: BaseException, errlog: IO[str]) -> ToolError:
        if isinstance(cause, ToolError):
            return cause
        what = self._target.describe()
        if isinstance(cause, TimeoutError):
            why = f"it did not answer within {self._startup_timeout:g} s"
        elif isinstance(cause, _Lost):
            why = "it stopped before it answered"
        else:
            why = self._target.scrub(describe_exception(_first(cause)))
        return ToolError(
            f"MCP server {self._name!r} ({what}) could not start: {why}"
            + (_tail(errlog) if isinstance(self._target, _Stdio) else "")
        )

    def __repr__(self) -> str:
        kind = "stdio" if isinstance(self._target, _Stdio) else "http"
        state = "connected" if self._group is not None else "not connected"
        return f"MCPServer.{kind}({self._target.describe()!r}, name={self._name!r}, {state})"


async def _note_calls(
    source: anyio.abc.ObjectReceiveStream[Any],
    sink: anyio.abc.ObjectSendStream[Any],
    calls: dict[Any, str],
) -> None:
    """Pass the session's messages to the transport, noting each ``tools/call`` (mcp 1)."""
    async with source, sink:
        async for message in source:
            noted = _sdk.outgoing_tool_call(message)
            if noted is not None:
                calls[noted[0]] = noted[1]
            await sink.send(message)


async def _tell_cancelled(live: _Live, name: str, arguments: dict[str, Any]) -> None:
    """Send ``notifications/cancelled`` for a call its caller gave up (mcp 1; mcp 2's
    session does it): the server can stop the tool instead of running it to its end."""
    key = _sdk.call_key(name, arguments)
    found = next((rid for rid, noted in live.calls.items() if noted == key), None)
    if found is None or live.lost.is_set():
        return
    live.calls.pop(found, None)
    with anyio.CancelScope(shield=True), anyio.move_on_after(_CLOSE_SECONDS):
        try:
            await _sdk.send_cancelled(live.session, found)
        except Exception as exc:  # the notice is a courtesy: the call is over either way
            logger.debug("MCP server: could not send notifications/cancelled: %s", exc)


async def _until_lost(lost: anyio.Event, request: Callable[[], Awaitable[_T]]) -> _T:
    """``request()``, or :class:`_Lost` as soon as the connection ends."""
    outcome: list[_T] = []
    failure: list[Exception] = []
    async with anyio.create_task_group() as group:

        async def watch() -> None:
            await lost.wait()
            group.cancel_scope.cancel()

        group.start_soon(watch)
        try:
            outcome.append(await request())
        except Exception as exc:
            failure.append(exc)
        group.cancel_scope.cancel()
    if failure:
        raise failure[0]
    if not outcome:
        raise _Lost
    return outcome[0]


def _first(exc: BaseException) -> BaseException:
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    return exc


def _tail(errlog: IO[str] | None) -> str:
    if errlog is None or errlog.closed:
        return ""
    errlog.flush()
    errlog.seek(0)
    text = errlog.read()[-_STDERR_TAIL:].strip()
    return f"; its stderr ends:\n{text}" if text else "; it wrote nothing to stderr"


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "_-" else "_" for c in name)[:32] or "mcp"
