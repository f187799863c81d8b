"""A small TCP proxy of the tests' own, between a store and a real server.

``server.py`` plays scripted HTTP; the server stores speak their own
protocols to real PostgreSQL and Redis servers (``tests/servers.py``), so
their network faults are made in between: every byte passes through this
proxy, which a test switches between

- ``up()``: bytes pass both ways (the start);
- ``mute()``: requests reach the server, its answers are swallowed (a commit
  applied whose answer never comes back);
- ``blackhole()``: nothing passes either way and new connections are
  accepted and never answered: a silent partition, no FIN, no RST;
- ``down()``: every connection is reset and new ones are reset as they
  come: a server that is gone (a restart is ``down()`` then ``up()``);
- ``reset()``: every open connection is reset, new ones work.

Leaving ``mute`` or ``blackhole`` resets the connections that lost bytes,
as a real network's timeouts would end them. The proxy runs in the test's
event loop (asyncio or trio) with anyio; the store may talk to it from
worker threads. ``accepted`` counts the connections it took.

    async with FaultProxy(postgres_server.port) as proxy:
        store = PostgresStore(proxy.url_for(url), timeout=1)
        proxy.blackhole()
"""

from __future__ import annotations

import socket
import struct
from collections.abc import Callable
from typing import Literal, Self

import anyio
import anyio.abc
from anyio.abc import SocketAttribute

__all__ = ["FaultProxy"]

Mode = Literal["up", "mute", "blackhole", "down"]


def _reset(stream: anyio.abc.SocketStream) -> None:
    """Make closing ``stream`` send RST, not FIN (SO_LINGER with a zero timeout)."""
    raw: socket.socket = stream.extra(SocketAttribute.raw_socket)
    raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


class _Link:
    """One client connection and its connection to the server."""

    def __init__(self, client: anyio.abc.SocketStream) -> None:
        self.client = client
        self.upstream: anyio.abc.SocketStream | None = None
        self.scope = anyio.CancelScope()
        self.lost_bytes = False

    def cut(self) -> None:
        """Reset the client's connection and drop the server's."""
        _reset(self.client)
        self.scope.cancel()


class FaultProxy:
    """A TCP proxy on 127.0.0.1 in front of ``127.0.0.1:target_port``; see the module."""

    def __init__(self, target_port: int) -> None:
        self._target_port = target_port
        self._mode: Mode = "up"
        self._links: set[_Link] = set()
        self._group: anyio.abc.TaskGroup | None = None
        self.port = 0
        self.accepted = 0

    def url_for(self, url: str) -> str:
        """``url`` (the real server's) with this proxy's port instead."""
        return url.replace(f"127.0.0.1:{self._target_port}", f"127.0.0.1:{self.port}", 1)

    # --- the faults --------------------------------------------------------------------

    def up(self) -> None:
        self._switch("up", cut=lambda link: link.lost_bytes)

    def mute(self) -> None:
        self._switch("mute", cut=lambda link: False)

    def blackhole(self) -> None:
        self._switch("blackhole", cut=lambda link: False)

    def down(self) -> None:
        self._switch("down", cut=lambda link: True)

    def reset(self) -> None:
        self._switch(self._mode, cut=lambda link: True)

    def _switch(self, mode: Mode, cut: Callable[[_Link], bool]) -> None:
        self._mode = mode
        for link in [link for link in self._links if cut(link)]:
            link.cut()

    # --- running -----------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        self.port = listener.extra(SocketAttribute.local_port)
        self._group = anyio.create_task_group()
        await self._group.__aenter__()
        self._group.start_soon(self._serve, listener)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._group is not None
        for link in list(self._links):
            link.cut()
        self._group.cancel_scope.cancel()
        await self._group.__aexit__(None, None, None)

    async def _serve(self, listener: anyio.abc.Listener[anyio.abc.SocketStream]) -> None:
        async with listener:
            await listener.serve(self._handle)

    async def _handle(self, client: anyio.abc.SocketStream) -> None:
        self.accepted += 1
        link = _Link(client)
        self._links.add(link)
        try:
            with link.scope:
                if self._mode == "down":
                    _reset(client)
                    return
                if self._mode == "blackhole":
                    link.lost_bytes = True
                    async for _ in client:
                        pass  # accepted, read, never answered
                    return
                async with await anyio.connect_tcp("127.0.0.1", self._target_port) as upstream:
                    link.upstream = upstream
                    async with anyio.create_task_group() as pumps:
                        pumps.start_soon(self._pump, link, client, upstream, "request")
                        pumps.start_soon(self._pump, link, upstream, client, "answer")
        except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            _reset(client)
        finally:
            self._links.discard(link)
            with anyio.CancelScope(shield=True):
                await client.aclose()

    async def _pump(
        self,
        link: _Link,
        source: anyio.abc.SocketStream,
        sink: anyio.abc.SocketStream,
        direction: Literal["request", "answer"],
    ) -> None:
        """Copy ``source`` to ``sink`` while the mode lets this direction through."""
        try:
            async for chunk in source:
                if self._mode == "blackhole" or (self._mode == "mute" and direction == "answer"):
                    link.lost_bytes = True
                    continue  # swallowed: read, so the sender never notices
                await sink.send(chunk)
        except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
            pass
        # One side closed: end the link, passing a close on as a close.
        link.scope.cancel()
