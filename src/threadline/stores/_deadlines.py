"""Ending a server store's call by its deadline, whatever the network does.

A server that goes silent (no answer, no FIN, no RST) keeps a blocked read
waiting for ever, and neither a worker thread nor a statement shielded from
cancellation can be cancelled. So a call that must end by a deadline

- stops waiting for a worker thread that connects (:func:`run_sync_until`);
  what the thread makes afterwards is disposed of there, not leaked;
- has its socket shut down by a :class:`Watchdog` when its statement is
  still unanswered at the deadline: the blocked read then ends at once, in
  the event loop or in a worker thread alike.

Deadlines are in ``anyio.current_time()``, the running loop's clock.
"""

from __future__ import annotations

import itertools
import math
import os
import socket
import threading
import time
from collections.abc import Callable
from contextlib import suppress
from typing import Final, Generic, TypeVar

import anyio
import anyio.to_thread

__all__ = ["Watchdog", "run_sync_until", "seconds_left"]

_T = TypeVar("_T")

_IDLE_ROUNDS: Final = 6
"""How many watch periods with nothing armed before the watchdog's thread ends."""


def seconds_left(deadline: float) -> float:
    """How long until ``deadline``, never below 0."""
    return max(0.0, deadline - anyio.current_time())


def _sever(fd: int) -> None:
    """Shut down the socket ``fd``: a read blocked on it, in any thread, ends at once.

    Its owner sees a lost connection; ``fd`` itself stays open for the owner
    to close (only a duplicate is closed here).
    """
    with suppress(OSError), socket.socket(fileno=os.dup(fd)) as duplicate:
        duplicate.shutdown(socket.SHUT_RDWR)


class Watchdog:
    """Shuts down the socket of every statement still unanswered at its deadline.

    A call arms it with its socket and deadline before it waits for the
    answer and disarms it after: a lock and a dict entry each, where a task
    watching each call would cost the event loop more than a local round
    trip. One thread watches: it sleeps until the earliest deadline armed,
    or for ``period`` seconds (the store's timeout, which every deadline is
    at most) when nothing is, so arming almost never needs to wake it. It
    ends when :meth:`close` is called, or after a few periods with nothing
    armed; the next ``arm`` starts it again.
    """

    def __init__(self, period: float) -> None:
        self._period = period
        self._lock = threading.Condition()
        self._armed: dict[int, tuple[float, int]] = {}  # token -> (time.monotonic() deadline, fd)
        self._severed: set[int] = set()
        self._tokens = itertools.count()
        self._running = False
        self._wake_at = math.inf  # when the thread looks next
        self._closed = False

    def arm(self, fd: int, deadline: float) -> int:
        """Watch socket ``fd`` until ``deadline``; the token to :meth:`disarm` it with."""
        due = time.monotonic() + seconds_left(deadline)
        with self._lock:
            token = next(self._tokens)
            self._armed[token] = (due, fd)
            if not self._running:
                self._running = True
                watcher = threading.Thread(target=self._watch, name="watchdog", daemon=True)
                watcher.start()
            elif due < self._wake_at:
                self._lock.notify()
        return token

    def disarm(self, token: int) -> bool:
        """Stop watching; ``True`` when the socket was shut down (its deadline passed)."""
        with self._lock:
            if self._armed.pop(token, None) is not None:
                return False
            self._severed.discard(token)
            return True

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._lock.notify()

    def _watch(self) -> None:
        idle = 0
        with self._lock:
            while not self._closed and idle < _IDLE_ROUNDS:
                now = time.monotonic()
                for token, (due, fd) in list(self._armed.items()):
                    if due <= now:
                        del self._armed[token]
                        self._severed.add(token)
                        _sever(fd)
                idle = 0 if self._armed else idle + 1
                self._wake_at = min((due for due, _ in self._armed.values()), default=math.inf)
                self._wake_at = min(self._wake_at, now + self._period)
                self._lock.wait(self._wake_at - now)
            self._running = False
            self._wake_at = math.inf


class _Handover(Generic[_T]):
    """A result made in a worker thread, or disposed of there when nobody waits any more."""

    def __init__(self, dispose: Callable[[_T], None]) -> None:
        self._lock = threading.Lock()
        self._dispose = dispose
        self._result: list[_T] = []
        self._abandoned = False

    def deliver(self, result: _T) -> _T:
        with self._lock:
            if not self._abandoned:
                self._result.append(result)
                return result
        self._dispose(result)
        return result

    def abandon(self) -> None:
        with self._lock:
            self._abandoned = True
            late = self._result
        for result in late:  # made just as the wait ended: nobody will take it
            self._dispose(result)


async def run_sync_until(
    deadline: float, work: Callable[[], _T], dispose: Callable[[_T], None]
) -> _T | None:
    """``work()`` in a worker thread, or ``None`` when it is not done by ``deadline``.

    The thread is left to finish on its own; what it makes after the wait
    ended is passed to ``dispose`` (a connection is closed, not leaked).
    """
    handover: _Handover[_T] = _Handover(dispose)
    with anyio.CancelScope(deadline=deadline):
        return await anyio.to_thread.run_sync(
            lambda: handover.deliver(work()), abandon_on_cancel=True
        )
    handover.abandon()
    return None
