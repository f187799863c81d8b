"""The server stores' deadline tools, without a server: the watchdog ends a read
blocked on a silent socket (in a worker thread or the event loop) at its
deadline and not before, and a worker thread not done by its deadline is
left behind with what it makes disposed of, not leaked."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator

import anyio
import anyio.to_thread
import pytest

# Private room: the deadline tools are the stores' own, not public API.
from threadline.stores._deadlines import Watchdog, run_sync_until

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]


@pytest.fixture
def silent() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A connected pair of sockets whose far end never says anything."""
    near, far = socket.socketpair()
    yield near, far
    near.close()
    far.close()


async def test_a_read_still_blocked_at_its_deadline_ends_at_once(
    silent: tuple[socket.socket, socket.socket],
) -> None:
    near, _ = silent
    watchdog = Watchdog(period=0.5)
    started = time.monotonic()
    token = watchdog.arm(near.fileno(), anyio.current_time() + 0.2)
    data = await anyio.to_thread.run_sync(near.recv, 10)  # would block for ever
    elapsed = time.monotonic() - started
    assert watchdog.disarm(token) is True
    assert data == b""  # the socket was shut down: the read sees its end
    assert 0.2 <= elapsed < 1.0
    watchdog.close()


async def test_a_call_answered_in_time_is_left_alone(
    silent: tuple[socket.socket, socket.socket],
) -> None:
    near, far = silent
    watchdog = Watchdog(period=0.5)
    token = watchdog.arm(near.fileno(), anyio.current_time() + 0.2)
    far.sendall(b"answer")
    assert await anyio.to_thread.run_sync(near.recv, 10) == b"answer"
    assert watchdog.disarm(token) is False
    # Another socket armed later is shut down, so the first one's deadline has passed.
    later, other = socket.socketpair()
    with later, other:
        watchdog.arm(later.fileno(), anyio.current_time() + 0.3)
        assert await anyio.to_thread.run_sync(later.recv, 10) == b""
    far.sendall(b"more")
    assert await anyio.to_thread.run_sync(near.recv, 10) == b"more"
    watchdog.close()


async def test_each_armed_socket_is_shut_down_at_its_own_deadline() -> None:
    pairs = [socket.socketpair() for _ in range(3)]
    watchdog = Watchdog(period=5.0)  # longer than any deadline: arming must wake it
    try:
        now = anyio.current_time()
        tokens = [
            watchdog.arm(near.fileno(), now + delay)
            for (near, _), delay in zip(pairs, (0.1, 60, 0.2), strict=True)
        ]
        for near, _ in (pairs[0], pairs[2]):
            with anyio.fail_after(2):
                assert await anyio.to_thread.run_sync(near.recv, 10) == b""
        assert [watchdog.disarm(token) for token in tokens] == [True, False, True]
    finally:
        watchdog.close()
        for near, far in pairs:
            near.close()
            far.close()


async def test_work_not_done_by_its_deadline_is_left_and_its_result_disposed_of() -> None:
    release = threading.Event()
    disposed: list[str] = []
    finished = threading.Event()

    def slow() -> str:
        release.wait(5)
        return "a connection"

    def dispose(result: str) -> None:
        disposed.append(result)
        finished.set()

    started = time.monotonic()
    assert await run_sync_until(anyio.current_time() + 0.1, slow, dispose) is None
    assert time.monotonic() - started < 1.0
    release.set()
    assert await anyio.to_thread.run_sync(finished.wait, 5)
    assert disposed == ["a connection"]


async def test_work_done_in_time_is_returned_and_not_disposed_of() -> None:
    disposed: list[str] = []
    result = await run_sync_until(anyio.current_time() + 5, lambda: "made", disposed.append)
    assert result == "made"
    assert disposed == []
