"""How ``RedisStore`` writes, on a real server: one script call per write (so a
turn is two round trips), fields packed into few arguments that any id, marker
or generation survives, the same outcome as ``MemoryStore`` for any sequence of
writes, and a deadline that holds for calls queued behind a silent one."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import anyio.to_thread
import attrs
import pytest
import redis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from servers import RedisServer
from threadline import (
    ConcurrentModificationError,
    InvalidRequestError,
    Message,
    Origin,
    StoreError,
    Usage,
)
from threadline.serialization import ConversationDocument, ConversationEvent
from threadline.stores import ConversationStore
from threadline.stores.memory import MemoryStore
from threadline.stores.redis import RedisStore

pytestmark = [pytest.mark.integration]


@pytest.fixture
def prefix() -> str:
    return f"writes-{uuid.uuid4().hex}:"


@pytest.fixture
async def store(redis_server: RedisServer, prefix: str) -> AsyncIterator[RedisStore]:
    async with RedisStore(redis_server.url(), prefix=prefix) as opened:
        yield opened


@pytest.fixture
def admin(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url(), decode_responses=True)
    yield client
    client.close()


def prompt(text: str, turn_id: int, *, pending: bool = False) -> ConversationEvent:
    return ConversationEvent(
        message=Message.user(text, origin=Origin.TURN), turn_id=turn_id, pending=pending
    )


def answer(text: str, turn_id: int) -> ConversationEvent:
    return ConversationEvent(
        message=Message.assistant(text, origin=Origin.TURN),
        turn_id=turn_id,
        usage=Usage(input_tokens=3, output_tokens=2),
        model="m",
    )


async def turn(store: ConversationStore, conversation_id: str, version: int, turn_id: int) -> int:
    """One turn as a conversation writes it: the pending prompt, then the commit."""
    state = ConversationDocument(id=conversation_id, next_turn_id=turn_id + 1)
    marker = uuid.uuid4().hex
    version = await store.append_events(
        conversation_id,
        [prompt("hi", turn_id, pending=True)],
        header=state,
        expected_version=version,
        pending_marker=marker,
    )
    return await store.append_events(
        conversation_id,
        [prompt("hi", turn_id), answer("hello", turn_id)],
        header=state,
        expected_version=version,
        drop_pending=marker,
    )


# --- round trips ----------------------------------------------------------------------------


@pytest.mark.anyio
async def test_a_turn_is_two_round_trips_each_one_script_call(
    store: RedisStore, admin: redis.Redis, prefix: str
) -> None:
    version = await turn(store, "c1", 0, 0)  # connected, scripts loaded
    seen: list[dict[str, Any]] = []
    end = f"end-{uuid.uuid4().hex}"
    listening = threading.Event()

    def monitor() -> None:
        with admin.monitor() as commands:
            listening.set()
            for command in commands.listen():
                if end in command["command"]:
                    return
                seen.append(command)

    async with anyio.create_task_group() as group:
        group.start_soon(anyio.to_thread.run_sync, monitor)
        await anyio.to_thread.run_sync(listening.wait, 10)
        for turn_id in range(1, 4):
            version = await turn(store, "c1", version, turn_id)
        admin.echo(end)

    # What the store's connections sent (the scripts' own commands show as "lua").
    sent = [c["command"] for c in seen if c["client_type"] != "lua" and prefix in c["command"]]
    assert len(sent) == 6, sent
    assert all(command.startswith("EVALSHA") for command in sent)
    assert version == 8


# --- the packed fields ----------------------------------------------------------------------

ODD_IDS = ["tab\there", "new\nline", "both\t\n\r", "ünïcødé 会话", "p1\tm\t{}", " ", "1e3"]


@pytest.mark.anyio
@pytest.mark.parametrize("conversation_id", ODD_IDS)
async def test_any_conversation_id_survives_the_packed_write(
    store: RedisStore, conversation_id: str
) -> None:
    version = await turn(store, conversation_id, 0, 0)
    stored = await store.load(conversation_id)
    assert stored.version == version == 2
    assert [e.message.text for e in stored.document.events] == ["hi", "hello"]
    assert conversation_id in [info.id for info in await store.list()]


@pytest.mark.anyio
async def test_markers_and_generations_of_every_allowed_character_survive(
    store: RedisStore,
) -> None:
    marker = ("Az09._:@/+=-" * 11)[:128]  # the longest marker, every allowed symbol
    generation = marker[::-1]
    state = ConversationDocument(id="c1", next_turn_id=10**12)
    version = await store.append_events(
        "c1",
        [prompt("late", 10**12 - 1, pending=True)],
        header=state,
        expected_version=0,
        pending_marker=marker,
        generation=generation,
    )
    stored = await store.load("c1")
    assert (stored.generation, stored.pending_markers) == (generation, (marker,))
    assert stored.document.events[0].turn_id == 10**12 - 1
    version = await store.append_events(
        "c1", [], header=state, expected_version=version, drop_pending=marker, generation=generation
    )
    assert (await store.load("c1")).document.events == ()
    with pytest.raises(ConcurrentModificationError):
        await store.append_events(
            "c1", [], header=state, expected_version=version, generation=marker
        )


# --- any sequence of writes ends where MemoryStore's does ----------------------------------

MARKERS = ["m1", "m2", "m3"]

writes = st.lists(
    st.one_of(
        st.tuples(st.just("pending"), st.sampled_from(MARKERS), st.integers(0, 1)),
        st.tuples(st.just("commit"), st.sampled_from([*MARKERS, True, False]), st.integers(0, 1)),
        st.tuples(st.just("remove"), st.sampled_from(MARKERS), st.just(0)),
        st.tuples(st.just("save"), st.sampled_from(MARKERS), st.integers(0, 1)),
        st.tuples(st.just("rewind"), st.integers(1, 2), st.integers(0, 1)),
    ),
    min_size=1,
    max_size=12,
)


async def apply(store: ConversationStore, steps: list[tuple[str, Any, int]]) -> list[object]:
    """Run ``steps`` on one conversation; what each returned or raised (its type)."""
    outcomes: list[object] = []
    version, next_turn = 0, 0
    for step, (kind, which, stale) in enumerate(steps):
        state = ConversationDocument(
            id="c1", next_turn_id=next_turn + 1, metadata={"step": str(step)}
        )
        expected = version - stale if version else 0
        try:
            if kind == "pending":
                version = await store.append_events(
                    "c1",
                    [prompt(f"ask {step}", next_turn, pending=True)],
                    header=state,
                    expected_version=expected,
                    pending_marker=which,
                )
            elif kind == "commit":
                version = await store.append_events(
                    "c1",
                    [prompt(f"ask {step}", next_turn), answer(f"reply {step}", next_turn)],
                    header=state,
                    expected_version=expected,
                    drop_pending=which,
                )
            elif kind == "remove":
                outcomes.append(await store.remove_pending("c1", which))
                continue
            elif kind == "rewind":  # a header whose next_turn_id falls below stored turns
                back = attrs.evolve(state, next_turn_id=max(0, next_turn + 1 - which))
                version = await store.append_events(
                    "c1", [], header=back, expected_version=expected
                )
            else:
                events = (prompt(f"kept {step}", next_turn, pending=True),)
                document = attrs.evolve(state, events=events)
                version = await store.save(
                    document, expected_version=expected, pending_markers=[which]
                )
            next_turn += 1
            outcomes.append(version)
        except ConcurrentModificationError as exc:
            outcomes.append((type(exc).__name__, exc.actual))
        except InvalidRequestError as exc:
            outcomes.append(str(exc))
    try:
        stored = await store.load("c1")
    except Exception as exc:
        outcomes.append(type(exc).__name__)
    else:
        outcomes.append((stored.version, stored.pending_markers, stored.document.events))
        outcomes.append((stored.document.next_turn_id, stored.document.metadata))
    return outcomes


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(steps=writes)
def test_any_sequence_of_writes_ends_where_the_memory_store_does(
    redis_server: RedisServer, steps: list[tuple[str, Any, int]]
) -> None:
    async def both() -> tuple[list[object], list[object]]:
        expected = await apply(MemoryStore(), steps)
        async with RedisStore(redis_server.url(), prefix=f"model-{uuid.uuid4().hex}:") as store:
            return expected, await apply(store, steps)

    expected, actual = anyio.run(both)
    assert actual == expected


# --- deadlines --------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_calls_queued_for_a_connection_end_within_the_timeout(
    redis_server: RedisServer, admin: redis.Redis, prefix: str
) -> None:
    timeout = 0.5
    async with RedisStore(
        redis_server.url(), prefix=prefix, max_connections=1, timeout=timeout
    ) as store:
        version = await turn(store, "c1", 0, 0)
        outcomes: list[object] = []

        async def write(turn_id: int) -> None:
            try:
                outcomes.append(await turn(store, "c1", version, turn_id))
            except StoreError as exc:
                outcomes.append(exc)

        admin.execute_command("CLIENT", "PAUSE", 5_000, "WRITE")  # the server goes silent
        started = time.monotonic()
        try:
            async with anyio.create_task_group() as group:
                for turn_id in (1, 2, 3):
                    group.start_soon(write, turn_id)
        finally:
            admin.execute_command("CLIENT", "UNPAUSE")
        elapsed = time.monotonic() - started
        assert len(outcomes) == 3
        assert all(isinstance(outcome, StoreError) for outcome in outcomes), outcomes
        assert all("within 0.5 s" in str(outcome) for outcome in outcomes), outcomes
        assert elapsed < timeout + 0.75, f"the queued calls took {elapsed:.2f} s"
        assert await turn(store, "c1", version, 1) == version + 2  # and then it works again
