"""The server stores under network faults, for real: a fault proxy (``proxy.py``)
between each store and its PostgreSQL or Redis server resets connections,
swallows answers, goes silent (no FIN, no RST) and goes away and comes back.

What must hold, on asyncio and trio: every call returns or raises
``StoreError`` within about the store's ``timeout``, whatever the network
does; a caller's cancellation is honoured within that bound; and once the
server is reachable again the next call works at once.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import anyio
import pytest

from servers import PostgresServer, RedisServer, user_document
from threadline import Agent, Client, Conversation, Model, StoreError
from threadline.stores import PostgresStore, RedisStore
from threadline.testing import FunctionDriver

from .proxy import FaultProxy

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

TIMEOUT = 1.0
"""The stores' ``timeout`` here: every call must end within it, plus ``SLACK``."""
SLACK = 0.75
HANG = TIMEOUT * 6

doc = user_document
Store = PostgresStore | RedisStore


@pytest.fixture(params=["postgres", "redis"])
def server_kind(request: pytest.FixtureRequest) -> str:
    kind: str = request.param
    return kind


@pytest.fixture
async def proxy(request: pytest.FixtureRequest, server_kind: str) -> AsyncIterator[FaultProxy]:
    server: PostgresServer | RedisServer = request.getfixturevalue(f"{server_kind}_server")
    async with FaultProxy(server.port) as running:
        yield running


@pytest.fixture
def make_store(
    request: pytest.FixtureRequest, server_kind: str, proxy: FaultProxy
) -> Callable[..., Store]:
    """A store of ``server_kind`` that reaches its server through the proxy."""
    if server_kind == "postgres":
        url = proxy.url_for(request.getfixturevalue("postgres_server").create_database())
        return lambda **options: PostgresStore(url, **{"timeout": TIMEOUT, **options})
    url = proxy.url_for(request.getfixturevalue("redis_server").url())
    prefix = f"faults-{uuid.uuid4().hex}:"
    return lambda **options: RedisStore(url, prefix=prefix, **{"timeout": TIMEOUT, **options})


@pytest.fixture
async def store(make_store: Callable[..., Store]) -> AsyncIterator[Store]:
    async with make_store() as opened:
        await opened.save(doc("c1", "one"), expected_version=0)  # connected, tables ready
        yield opened


async def timed(proxy: FaultProxy, call: Awaitable[Any]) -> tuple[float, Any]:
    """How long ``call`` took and what it returned or raised (the exception itself).

    A call still running at ``HANG`` is one no deadline would end: the proxy
    then resets every connection, so the test fails on the time instead of
    hanging.
    """
    started = time.monotonic()
    outcome: Any = None

    async def run() -> None:
        nonlocal outcome
        try:
            outcome = await call
        except Exception as exc:
            outcome = exc
        group.cancel_scope.cancel()

    async with anyio.create_task_group() as group:
        group.start_soon(run)
        await anyio.sleep(HANG)
        proxy.down()
    return time.monotonic() - started, outcome


# --- silence: no answer, no FIN, no RST -----------------------------------------------------


async def test_a_silent_partition_ends_every_call_within_the_timeout(
    store: Store, proxy: FaultProxy
) -> None:
    proxy.blackhole()
    calls: list[Callable[[], Awaitable[Any]]] = [
        lambda: store.load("c1"),
        lambda: store.save(doc("c1", "two"), expected_version=1),
        lambda: store.list(),
        lambda: store.delete("c1"),
    ]
    for call in calls:
        elapsed, outcome = await timed(proxy, call())
        assert isinstance(outcome, StoreError), outcome
        assert elapsed < TIMEOUT + SLACK, f"{outcome} after {elapsed:.2f} s"
        assert "within" in str(outcome) or "cannot reach" in str(outcome)
    proxy.up()
    assert (await store.load("c1")).version == 1


async def test_a_commit_whose_answer_is_swallowed_ends_within_the_timeout_applied_once(
    store: Store, proxy: FaultProxy
) -> None:
    proxy.mute()
    elapsed, outcome = await timed(proxy, store.save(doc("c1", "one", "two"), expected_version=1))
    assert isinstance(outcome, StoreError), outcome
    assert elapsed < TIMEOUT + SLACK, f"{outcome} after {elapsed:.2f} s"
    assert "load the conversation to see which" in str(outcome)
    proxy.up()
    stored = await store.load("c1")
    assert stored.version == 2  # the server applied it, once
    assert [e.message.text for e in stored.document.events] == ["one", "two"]


async def test_a_turn_whose_commit_meets_silence_ends_in_bounded_time(
    store: Store, proxy: FaultProxy
) -> None:
    # The model answers; the network then goes silent before the commit.
    def answer(call: object) -> str:
        proxy.mute()
        return "two"

    agent = Agent(Client(FunctionDriver(answer)), model=Model("m", context_size=8192))
    conversation = await Conversation.load(agent, store, "c1")

    async def turn() -> object:
        with anyio.fail_after(TIMEOUT * 3):  # what a caller of the turn allows
            return await conversation.run("second")

    elapsed, outcome = await timed(proxy, turn())
    assert isinstance(outcome, StoreError | TimeoutError), outcome
    assert elapsed < TIMEOUT * 3 + SLACK, f"{outcome!r} after {elapsed:.2f} s"
    proxy.up()
    stored = await store.load("c1")  # the commit was applied once, or not at all
    assert [e.message.text for e in stored.document.events if not e.pending] in (
        ["one"],
        ["one", "second", "two"],
    )


async def test_a_store_that_meets_silence_when_connecting_gives_up_within_the_timeout(
    make_store: Callable[..., Store], proxy: FaultProxy
) -> None:
    proxy.blackhole()
    async with make_store() as fresh:
        elapsed, outcome = await timed(proxy, fresh.load("c1"))
    assert isinstance(outcome, StoreError), outcome
    assert elapsed < TIMEOUT + SLACK, f"{outcome} after {elapsed:.2f} s"


async def test_a_cancelled_call_returns_within_the_timeout(store: Store, proxy: FaultProxy) -> None:
    proxy.blackhole()

    async def cancelled_save() -> bool:
        with anyio.move_on_after(0.1) as scope:
            await store.save(doc("c1", "one", "two"), expected_version=1)
        return scope.cancelled_caught

    elapsed, outcome = await timed(proxy, cancelled_save())
    assert outcome is True, outcome
    assert elapsed < TIMEOUT + SLACK, f"the cancelled call took {elapsed:.2f} s"


# --- resets and restarts ----------------------------------------------------------------


async def test_a_reset_between_calls_costs_the_next_call_a_reconnect(
    store: Store, proxy: FaultProxy
) -> None:
    accepted = proxy.accepted
    proxy.reset()
    assert await store.save(doc("c1", "one", "two"), expected_version=1) == 2
    assert proxy.accepted > accepted


async def test_after_an_outage_the_first_call_reconnects_at_once(
    store: Store, proxy: FaultProxy
) -> None:
    proxy.down()
    for _ in range(3):  # a server that refuses: calls fail at once, saying so
        elapsed, outcome = await timed(proxy, store.load("c1"))
        assert isinstance(outcome, StoreError), outcome
        assert elapsed < TIMEOUT / 2, f"{outcome} after {elapsed:.2f} s"
    proxy.up()
    elapsed, outcome = await timed(proxy, store.save(doc("c1", "one", "two"), expected_version=1))
    assert outcome == 2
    assert elapsed < 0.5, f"the first call after the outage took {elapsed:.2f} s"
