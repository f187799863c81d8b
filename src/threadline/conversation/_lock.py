"""One turn at a time: the lock a conversation holds while a turn or a rewrite changes it.

An anyio lock belongs to the event loop that first used it, and an idle
conversation may move on to another loop (asyncio, then trio), or be one of
thousands kept in memory. So :class:`TurnLock` makes its lock for a turn and
lets it go once nobody holds or waits on it: an idle conversation keeps none.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
import anyio.lowlevel

__all__ = ["TurnLock"]


class TurnLock:
    """Held while a turn (or a rewrite) changes a conversation: one at a time."""

    __slots__ = ("_lock", "_loop")

    def __init__(self) -> None:
        self._lock: anyio.Lock | None = None
        self._loop: anyio.lowlevel.EventLoopToken | None = None

    @asynccontextmanager
    async def held(self) -> AsyncIterator[None]:
        """Hold the lock for the ``async with`` block, waiting for it first."""
        lock = self._current()
        try:
            async with lock:
                yield
        finally:
            if self._lock is lock and not lock.locked() and not lock.statistics().tasks_waiting:
                self._lock = self._loop = None

    def _current(self) -> anyio.Lock:
        loop = anyio.lowlevel.current_token()
        lock = self._lock
        if lock is None or (loop != self._loop and not lock.locked()):
            lock = self._lock = anyio.Lock()
            self._loop = loop
        return lock
