"""Script calls on asyncio: the calls of concurrent tasks go to Redis together.

``RedisStore`` on asyncio sends its calls through :class:`ScriptCalls`, on
redis-py's connections but not through its client. The calls that tasks make
in the same round of the event loop go out as one batch: one write on one
connection, the answers read back in order. The server then wakes once for
the batch instead of once per call, and the client makes one send, one read
and one pool step per batch rather than per call (redis-py's client also
records metrics and dispatches events for each command). Each call is still
its own script, run atomically and answered on its own: a batch is not a
transaction, and one call's error is that call's alone.

A batch whose connection is lost is sent again once, on a fresh connection,
without the calls already answered (safe: a write carries an id its script
recognises). A server that lost its scripts (restarted, ``SCRIPT FLUSH``) is
given them again and the calls that found none are sent again. A batch is
bounded by its first caller's deadline (the store's ``timeout``, as every
call); cut short, its connection is closed, so no late answer is read as
another call's, and the calls not answered fail as timed out.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import anyio.lowlevel
import redis.asyncio
import redis.exceptions

__all__ = ["ScriptCalls"]


class _Call:
    """One script call, its answer (or error) once read, and whether its task still waits."""

    __slots__ = ("answer", "command", "done", "error", "finished", "gave_up", "script")

    def __init__(self, script: str, command: bytes) -> None:
        self.script = script
        self.command = command  # as sent: the EVALSHA in the Redis protocol (RESP)
        self.done: anyio.Event | None = None  # made when another task sends this call
        self.answer: Any = None
        self.error: BaseException | None = None
        self.finished = False
        self.gave_up = False  # its task stopped waiting (its deadline): do not send it

    def finish(self, answer: Any = None, error: BaseException | None = None) -> None:
        self.answer, self.error, self.finished = answer, error, True
        if self.done is not None:
            self.done.set()

    def release(self) -> None:
        """Let the task waiting for this call go, unanswered: its batch was never sent."""
        if self.done is not None:
            self.done.set()

    def result(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.answer


class ScriptCalls:
    """Runs Lua scripts for tasks on asyncio, gathering concurrent calls into batches.

    ``pool`` makes the connections (it holds the URL's settings); none is
    taken from its own pool. At most ``max_connections`` batches are in
    flight; ``timeout`` is only named in the error of a call whose batch was
    cut short. Every error a call raises is redis-py's.
    """

    def __init__(
        self,
        pool: redis.asyncio.ConnectionPool,
        scripts: Mapping[str, str],
        *,
        max_connections: int,
        timeout: float,
    ) -> None:
        self._pool: Any = pool  # redis-py's make_connection is not typed
        self._scripts = {
            name: (hashlib.sha1(lua.encode(), usedforsecurity=False).hexdigest().encode(), lua)
            for name, lua in scripts.items()
        }
        self._timeout = timeout
        self._slots = anyio.Semaphore(max_connections, fast_acquire=True)
        self._idle: list[Any] = []  # connected connections, most recently used last
        self._open: set[Any] = set()  # every connection made and not yet closed
        self._gathering: list[_Call] | None = None  # the batch other calls may join
        self._busy = 0  # calls sending a batch, or waiting to
        self._closed = False

    async def call(self, script: str, keys: Sequence[str], args: Sequence[str | int]) -> Any:
        """Run ``script`` on ``keys`` and ``args``; its answer, or redis-py's error."""
        call = _Call(script, _evalsha(self._scripts[script][0], keys, args))
        while True:
            batch = self._gathering
            if batch is None:
                await self._send_batch(call)
                return call.result()
            # Another task sends the calls made now: go with them.
            call.done = anyio.Event()
            batch.append(call)
            try:
                await call.done.wait()
            except BaseException:
                call.gave_up = True
                raise
            if call.finished:
                return call.result()
            # The task sending the batch stopped (its deadline) before sending it: go again.

    async def _send_batch(self, call: _Call) -> None:
        batch = [call]
        sent = False
        self._busy += 1
        try:
            if self._busy > 1 or self._slots.value == 0:
                # Others in flight: yield once, so the calls of every task ready in this
                # round join this batch (they stay welcome until a connection is free).
                # Alone, there is nothing to wait for.
                self._gathering = batch
                await anyio.lowlevel.checkpoint()
            async with self._slots:
                if self._gathering is batch:
                    self._gathering = None
                sent = True
                await self._exchange(batch)
        except BaseException as exc:
            # The others in the batch get its error; cut short (this task's deadline),
            # a timeout. Never sent, they are free to go again.
            if not isinstance(exc, redis.exceptions.RedisError):
                exc = redis.exceptions.TimeoutError(f"no answer within {self._timeout:g} s")
            for other in batch[1:]:
                if not sent:
                    other.release()
                elif not other.finished:
                    other.finish(error=exc)
            raise
        finally:
            self._busy -= 1
            if self._gathering is batch:
                self._gathering = None

    async def _exchange(self, batch: list[_Call]) -> None:
        """Send the batch and read its answers; once more on a fresh connection when the
        connection is lost before every answer came."""
        for attempt in (1, 2):
            calls = [call for call in batch if not call.finished and not call.gave_up]
            if not calls:
                return
            connection = self._idle.pop() if self._idle else self._connection()
            try:
                await self._round_trip(connection, calls, reload_scripts=True)
            except redis.exceptions.AuthenticationError:
                await self._close(connection)
                raise
            except redis.exceptions.ConnectionError:
                await self._close(connection)
                if attempt == 2:
                    raise
            except BaseException:
                await self._close(connection)
                raise
            else:
                if self._closed:  # closed meanwhile: a closed connection would reconnect
                    await self._close(connection)
                else:
                    self._idle.append(connection)
                return

    async def _round_trip(
        self, connection: Any, calls: list[_Call], *, reload_scripts: bool
    ) -> None:
        await connection.send_packed_command([call.command for call in calls], check_health=False)
        lost_scripts: list[_Call] = []
        for call in calls:
            try:
                call.finish(answer=await connection.read_response())
            except redis.exceptions.NoScriptError as exc:
                if reload_scripts:
                    lost_scripts.append(call)
                else:
                    call.finish(error=exc)
            except redis.exceptions.ResponseError as exc:
                call.finish(error=exc)
        if lost_scripts:
            # The server lost its scripts (restarted, or SCRIPT FLUSH): load them again.
            names = sorted({call.script for call in lost_scripts})
            loads = [("SCRIPT", "LOAD", self._scripts[name][1]) for name in names]
            await connection.send_packed_command(connection.pack_commands(loads))
            for _ in loads:
                await connection.read_response()
            await self._round_trip(connection, lost_scripts, reload_scripts=False)

    def _connection(self) -> Any:
        if self._closed:
            raise redis.exceptions.ConnectionError("the store was closed")
        connection = self._pool.make_connection()
        self._open.add(connection)
        return connection

    async def _close(self, connection: Any) -> None:
        self._open.discard(connection)
        with anyio.CancelScope(shield=True):
            await connection.disconnect(nowait=True)

    async def aclose(self) -> None:
        """Close every connection, those of calls still in flight too."""
        self._closed = True
        self._idle.clear()
        for connection in list(self._open):
            await self._close(connection)


def _evalsha(sha: bytes, keys: Sequence[str], args: Sequence[str | int]) -> bytes:
    """The EVALSHA of a script on ``keys`` and ``args``, as the Redis protocol (RESP) sends it.

    Packed here rather than by redis-py, whose packer checks the type of every
    argument of every command: a write has fourteen, and that was a tenth of a
    turn's time in the client.
    """
    parts = [
        b"EVALSHA",
        sha,
        b"%d" % len(keys),
        *(key.encode() for key in keys),
        *(arg.encode() if isinstance(arg, str) else b"%d" % arg for arg in args),
    ]
    return b"".join([b"*%d\r\n" % len(parts), *(b"$%d\r\n%b\r\n" % (len(p), p) for p in parts)])
