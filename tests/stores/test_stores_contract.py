"""The contract every ``ConversationStore`` keeps, run against each store on asyncio and trio.

A new store joins by adding a factory to ``STORE_FACTORIES``: a function of
the test's temporary directory that returns a fresh, empty store (a store of
a server, PostgreSQL or Redis, would take a fresh database or key prefix).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

from threadline import (
    ConcurrentModificationError,
    ConversationFormatError,
    ConversationNotFoundError,
    InvalidRequestError,
    Message,
    Origin,
    Reasoning,
    StoreError,
    ToolCall,
    Usage,
)
from threadline.serialization import ConversationDocument, ConversationEvent
from threadline.stores import ConversationStore, StoreClosedError
from threadline.stores.memory import MemoryStore
from threadline.stores.sqlite import SQLiteStore

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

StoreFactory = Callable[[pytest.FixtureRequest, Path], ConversationStore]


def _memory_store(request: pytest.FixtureRequest, tmp_path: Path) -> ConversationStore:
    return MemoryStore()


def _sqlite_store(request: pytest.FixtureRequest, tmp_path: Path) -> ConversationStore:
    return SQLiteStore(tmp_path / "conversations.db")


def _postgres_store(request: pytest.FixtureRequest, tmp_path: Path) -> ConversationStore:
    from threadline.stores.postgres import PostgresStore

    server = request.getfixturevalue("postgres_server")
    return PostgresStore(server.create_database())


def _redis_store(request: pytest.FixtureRequest, tmp_path: Path) -> ConversationStore:
    from threadline.stores.redis import RedisStore

    server = request.getfixturevalue("redis_server")
    return RedisStore(server.url(), prefix=f"test-{uuid.uuid4().hex}:")


STORE_FACTORIES = [
    pytest.param(_memory_store, id="memory"),
    pytest.param(_sqlite_store, id="sqlite"),
    pytest.param(_postgres_store, id="postgres", marks=pytest.mark.integration),
    pytest.param(_redis_store, id="redis", marks=pytest.mark.integration),
]


@pytest.fixture(params=STORE_FACTORIES)
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, anyio_backend: str
) -> AsyncIterator[ConversationStore]:
    factory: StoreFactory = request.param
    opened = factory(request, tmp_path)
    try:
        yield opened
    finally:
        await opened.aclose()


# --- building documents ------------------------------------------------------------


def prompt(text: str, turn_id: int, *, pending: bool = False) -> ConversationEvent:
    return ConversationEvent(
        message=Message.user(text, origin=Origin.TURN), turn_id=turn_id, pending=pending
    )


def answer(text: str, turn_id: int) -> ConversationEvent:
    return ConversationEvent(
        message=Message.assistant(text, origin=Origin.TURN),
        turn_id=turn_id,
        usage=Usage(input_tokens=10, output_tokens=2),
        model="scripted",
        finish_reason="stop",
    )


def header(
    conversation_id: str = "c1", *, next_turn_id: int = 1, **fields: Any
) -> ConversationDocument:
    return ConversationDocument(id=conversation_id, next_turn_id=next_turn_id, **fields)


async def run_turn(
    store: ConversationStore, conversation_id: str, text: str, reply: str, *, version: int
) -> int:
    """One turn the way a conversation writes it: the pending prompt, then the commit."""
    turn_id = 0
    if version:
        turn_id = (await store.load(conversation_id)).document.next_turn_id
    state = header(conversation_id, next_turn_id=turn_id + 1)
    version = await store.append_events(
        conversation_id,
        [prompt(text, turn_id, pending=True)],
        header=state,
        expected_version=version,
    )
    return await store.append_events(
        conversation_id,
        [prompt(text, turn_id), answer(reply, turn_id)],
        header=state,
        expected_version=version,
        drop_pending=True,
    )


def full_document() -> ConversationDocument:
    return ConversationDocument(
        id="full",
        history_limit=6,
        next_turn_id=3,
        total_usage=Usage(input_tokens=120, output_tokens=30, cached_input_tokens=64),
        settings={"max_context_tokens": 8000, "stop": ["END"], "nested": {"a": [1, 2.5, None]}},
        metadata={"user": "ada", "ünïcode": "✓"},
        created_at=datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC),
        updated_at=datetime(2025, 1, 2, 3, 4, 6, tzinfo=UTC),
        events=(
            ConversationEvent(message=Message.system("Be terse."), turn_id=0),
            prompt("What's the weather in Porto?", 1),
            ConversationEvent(
                message=Message.assistant(
                    "",
                    tool_calls=[
                        ToolCall(id="call_1", name="weather", arguments='{"city": "Porto"}')
                    ],
                    reasoning=Reasoning(text="look it up", provider_reasoning=b'{"sig": "x"}'),
                    origin=Origin.TURN,
                ),
                turn_id=1,
                usage=Usage(input_tokens=50, output_tokens=10),
                finish_reason="tool_calls",
            ),
            ConversationEvent(
                message=Message.tool("call_1", '{"sky": "clear"}', origin=Origin.TURN), turn_id=1
            ),
            answer("Clear skies.", 1),
            prompt("And tomorrow? \u2028 \ud800", 2, pending=True),
        ),
    )


# --- loading and creating ------------------------------------------------------------


async def test_every_store_implements_the_protocol(store: ConversationStore) -> None:
    assert isinstance(store, ConversationStore)


async def test_loading_a_conversation_that_does_not_exist_raises_not_found(
    store: ConversationStore,
) -> None:
    with pytest.raises(ConversationNotFoundError) as caught:
        await store.load("nobody")

    assert caught.value.conversation_id == "nobody"
    assert isinstance(caught.value, KeyError)


async def test_save_creates_at_version_one_and_load_returns_the_same_document(
    store: ConversationStore,
) -> None:
    document = full_document()

    version = await store.save(document, expected_version=0)
    stored = await store.load("full")

    assert version == 1
    assert stored.version == 1
    assert stored.document == document


async def test_append_events_with_version_zero_creates_the_conversation(
    store: ConversationStore,
) -> None:
    version = await store.append_events(
        "c1", [prompt("hi", 0), answer("hello", 0)], header=header(), expected_version=0
    )

    stored = await store.load("c1")
    assert version == stored.version == 1
    assert [event.message.text for event in stored.document.events] == ["hi", "hello"]


async def test_every_write_adds_one_to_the_version(store: ConversationStore) -> None:
    version = await run_turn(store, "c1", "one", "1", version=0)
    version = await run_turn(store, "c1", "two", "2", version=version)
    version = await store.save((await store.load("c1")).document, expected_version=version)

    assert version == 5
    assert (await store.load("c1")).version == 5


async def test_the_header_events_are_ignored_and_its_state_is_stored(
    store: ConversationStore,
) -> None:
    await store.append_events("c1", [prompt("hi", 0)], header=header(), expected_version=0)
    state = header(
        next_turn_id=2,
        history_limit=4,
        total_usage=Usage(input_tokens=7),
        settings={"max_context_tokens": 4096},
        metadata={"topic": "weather"},
        events=[prompt("not stored", 1)],
    )

    await store.append_events("c1", [answer("hello", 0)], header=state, expected_version=1)

    document = (await store.load("c1")).document
    assert [event.message.text for event in document.events] == ["hi", "hello"]
    assert document == attrs.evolve(state, events=document.events)


# --- pending and commit -----------------------------------------------------------------


async def test_a_pending_prompt_is_visible_on_load_before_its_turn_commits(
    store: ConversationStore,
) -> None:
    version = await run_turn(store, "c1", "first", "ok", version=0)

    await store.append_events(
        "c1",
        [prompt("second", 1, pending=True)],
        header=header(next_turn_id=2),
        expected_version=version,
    )

    events = (await store.load("c1")).document.events
    assert [(event.message.text, event.pending) for event in events] == [
        ("first", False),
        ("ok", False),
        ("second", True),
    ]


async def test_committing_with_drop_pending_replaces_the_pending_copy(
    store: ConversationStore,
) -> None:
    version = await run_turn(store, "c1", "first", "ok", version=0)
    version = await run_turn(store, "c1", "second", "fine", version=version)

    events = (await store.load("c1")).document.events
    assert [(event.message.text, event.turn_id, event.pending) for event in events] == [
        ("first", 0, False),
        ("ok", 0, False),
        ("second", 1, False),
        ("fine", 1, False),
    ]
    infos = await store.list()
    assert [(info.id, info.events) for info in infos] == [("c1", 4)]


async def test_a_failed_turn_drops_its_pending_prompt_and_keeps_the_rest(
    store: ConversationStore,
) -> None:
    version = await run_turn(store, "c1", "first", "ok", version=0)
    before = (await store.load("c1")).document
    version = await store.append_events(
        "c1",
        [prompt("doomed", 1, pending=True)],
        header=header(next_turn_id=2),
        expected_version=version,
    )

    version = await store.append_events(
        "c1",
        [],
        header=attrs.evolve(before, events=()),
        expected_version=version,
        drop_pending=True,
    )

    assert version == 4
    assert (await store.load("c1")).document == before


async def test_drop_pending_removes_pending_events_wherever_they_are(
    store: ConversationStore,
) -> None:
    document = header(
        next_turn_id=3,
        events=[
            prompt("lost", 0, pending=True),
            prompt("kept", 1),
            prompt("also lost", 2, pending=True),
        ],
    )
    await store.save(document, expected_version=0)

    await store.append_events(
        "c1",
        [answer("reply", 1)],
        header=header(next_turn_id=3),
        expected_version=1,
        drop_pending=True,
    )

    events = (await store.load("c1")).document.events
    assert [event.message.text for event in events] == ["kept", "reply"]
    assert [info.events for info in await store.list()] == [2]


async def test_without_drop_pending_a_pending_event_stays(store: ConversationStore) -> None:
    await store.append_events(
        "c1", [prompt("waiting", 0, pending=True)], header=header(), expected_version=0
    )

    await store.append_events("c1", [answer("late", 0)], header=header(), expected_version=1)

    events = (await store.load("c1")).document.events
    assert [(event.message.text, event.pending) for event in events] == [
        ("waiting", True),
        ("late", False),
    ]


# --- save, list, delete -------------------------------------------------------------------


async def test_save_replaces_the_whole_transcript(store: ConversationStore) -> None:
    version = await run_turn(store, "c1", "first", "ok", version=0)
    compacted = header(next_turn_id=5, events=[prompt("summary of it all", 4)])

    version = await store.save(compacted, expected_version=version)
    version = await run_turn(store, "c1", "next", "sure", version=version)

    events = (await store.load("c1")).document.events
    assert [(event.message.text, event.turn_id) for event in events] == [
        ("summary of it all", 4),
        ("next", 5),
        ("sure", 5),
    ]
    assert [info.events for info in await store.list()] == [3]


async def test_list_is_most_recently_updated_first(store: ConversationStore) -> None:
    for conversation_id in ("a", "b", "c"):
        await store.save(
            header(conversation_id, metadata={"name": conversation_id.upper()}), expected_version=0
        )
    await store.append_events("a", [prompt("hi", 0)], header=header("a"), expected_version=1)

    infos = await store.list()

    assert [(info.id, info.version, info.events) for info in infos] == [
        ("a", 2, 1),
        ("c", 1, 0),
        ("b", 1, 0),
    ]
    assert [info.metadata for info in infos] == [{}, {"name": "C"}, {"name": "B"}]
    for info in infos:
        assert info.updated_at is not None
        assert info.updated_at.utcoffset() is not None


async def test_an_empty_store_lists_nothing(store: ConversationStore) -> None:
    assert await store.list() == []


async def test_delete_removes_the_conversation_and_says_whether_there_was_one(
    store: ConversationStore,
) -> None:
    await run_turn(store, "gone", "hi", "hello", version=0)
    await run_turn(store, "stays", "hi", "hello", version=0)

    assert await store.delete("gone") is True
    assert await store.delete("gone") is False

    with pytest.raises(ConversationNotFoundError):
        await store.load("gone")
    assert [info.id for info in await store.list()] == ["stays"]
    # Gone means version 0 again: it can be created anew.
    assert (
        await store.append_events(
            "gone", [prompt("again", 0)], header=header("gone"), expected_version=0
        )
        == 1
    )
    assert [event.message.text for event in (await store.load("gone")).document.events] == ["again"]


# --- stale versions -------------------------------------------------------------------------


async def test_a_stale_append_is_refused_and_nothing_is_lost(store: ConversationStore) -> None:
    version = await run_turn(store, "c1", "first", "ok", version=0)
    before = await store.load("c1")

    with pytest.raises(ConcurrentModificationError) as caught:
        await store.append_events(
            "c1",
            [prompt("stale", 1)],
            header=header(next_turn_id=2),
            expected_version=version - 1,
            drop_pending=True,
        )

    assert (caught.value.conversation_id, caught.value.expected, caught.value.actual) == (
        "c1",
        version - 1,
        version,
    )
    assert await store.load("c1") == before


async def test_a_stale_save_is_refused_and_nothing_is_lost(store: ConversationStore) -> None:
    version = await run_turn(store, "c1", "first", "ok", version=0)
    before = await store.load("c1")

    with pytest.raises(ConcurrentModificationError):
        await store.save(header(next_turn_id=9), expected_version=version + 1)

    assert await store.load("c1") == before


async def test_creating_a_conversation_that_exists_is_refused(store: ConversationStore) -> None:
    await store.save(full_document(), expected_version=0)

    with pytest.raises(ConcurrentModificationError) as caught:
        await store.save(header("full"), expected_version=0)
    with pytest.raises(ConcurrentModificationError):
        await store.append_events("full", [], header=header("full"), expected_version=0)

    assert caught.value.actual == 1
    assert (await store.load("full")).document == full_document()


async def test_writing_to_a_conversation_that_does_not_exist_is_refused(
    store: ConversationStore,
) -> None:
    with pytest.raises(ConcurrentModificationError) as caught:
        await store.append_events(
            "ghost", [prompt("hi", 0)], header=header("ghost"), expected_version=3
        )

    assert caught.value.actual is None
    with pytest.raises(ConversationNotFoundError):
        await store.load("ghost")
    assert await store.list() == []


# --- what is refused before anything is written -------------------------------------------------


@pytest.mark.parametrize("expected_version", [-1, True, 1.0, "1"])
async def test_an_expected_version_that_is_not_a_count_is_refused(
    store: ConversationStore, expected_version: Any
) -> None:
    with pytest.raises(InvalidRequestError, match="expected_version"):
        await store.save(header(), expected_version=expected_version)

    assert await store.list() == []


async def test_a_header_for_another_conversation_is_refused(store: ConversationStore) -> None:
    with pytest.raises(InvalidRequestError, match="'other'"):
        await store.append_events(
            "c1", [prompt("hi", 0)], header=header("other"), expected_version=0
        )

    assert await store.list() == []


async def test_events_at_or_past_the_headers_next_turn_id_are_refused(
    store: ConversationStore,
) -> None:
    with pytest.raises(InvalidRequestError, match="next_turn_id"):
        await store.append_events(
            "c1", [prompt("hi", 1)], header=header(next_turn_id=1), expected_version=0
        )

    assert await store.list() == []


async def test_a_header_whose_next_turn_id_falls_below_stored_turns_is_refused(
    store: ConversationStore,
) -> None:
    document = header(next_turn_id=3, events=[prompt("a", 0), prompt("b", 1, pending=True)])
    await store.save(document, expected_version=0)
    stored = await store.load("c1")

    with pytest.raises(InvalidRequestError, match="next_turn_id"):
        await store.append_events("c1", [], header=header(next_turn_id=1), expected_version=1)

    assert await store.load("c1") == stored
    # Once the pending turn-1 event is dropped, 1 is a valid next id again.
    assert (
        await store.append_events(
            "c1", [], header=header(next_turn_id=1), expected_version=1, drop_pending=True
        )
        == 2
    )
    assert [event.message.text for event in (await store.load("c1")).document.events] == ["a"]


async def test_a_message_the_saved_format_cannot_hold_is_refused_by_every_store(
    store: ConversationStore,
) -> None:
    broken = ConversationEvent(
        message=Message.assistant("x", reasoning=Reasoning(provider_reasoning=b"{not json")),
        turn_id=0,
    )

    with pytest.raises(ConversationFormatError, match="provider_reasoning"):
        await store.append_events("c1", [broken], header=header(), expected_version=0)
    with pytest.raises(ConversationFormatError, match="provider_reasoning"):
        await store.save(header(events=[broken]), expected_version=0)

    assert await store.list() == []


# --- copies -----------------------------------------------------------------------------------


async def test_documents_are_copied_in_and_out(store: ConversationStore) -> None:
    document = full_document()
    await store.save(document, expected_version=0)
    document.settings["stop"].append("caller's edit")  # type: ignore[union-attr]
    document.metadata["user"] = "mallory"

    loaded = (await store.load("full")).document
    loaded.settings["nested"]["a"].append("loader's edit")  # type: ignore[call-overload,index,union-attr]
    loaded.metadata["user"] = "eve"
    (await store.list())[0].metadata["user"] = "trudy"

    assert (await store.load("full")).document == full_document()
    assert [info.metadata for info in await store.list()] == [full_document().metadata]


# --- concurrency ---------------------------------------------------------------------------------


async def test_of_many_tasks_writing_on_one_version_exactly_one_wins(
    store: ConversationStore,
) -> None:
    version = await run_turn(store, "c1", "first", "ok", version=0)
    winners: list[str] = []
    refused: list[int | None] = []

    async def write(name: str) -> None:
        try:
            await store.append_events(
                "c1", [prompt(name, 1)], header=header(next_turn_id=2), expected_version=version
            )
        except ConcurrentModificationError as exc:
            refused.append(exc.actual)
        else:
            winners.append(name)

    async with anyio.create_task_group() as group:
        for index in range(20):
            group.start_soon(write, f"writer {index}")

    assert len(winners) == 1
    assert refused == [version + 1] * 19
    stored = await store.load("c1")
    assert stored.version == version + 1
    assert [event.message.text for event in stored.document.events] == ["first", "ok", *winners]


async def test_tasks_that_reload_and_retry_lose_no_turn(store: ConversationStore) -> None:
    await store.save(header(next_turn_id=0), expected_version=0)
    attempts = 0

    async def take_a_turn(name: str) -> None:
        nonlocal attempts
        while True:
            attempts += 1
            stored = await store.load("c1")
            turn_id = stored.document.next_turn_id
            state = attrs.evolve(stored.document, next_turn_id=turn_id + 1, events=())
            try:
                await store.append_events(
                    "c1",
                    [prompt(name, turn_id), answer(f"to {name}", turn_id)],
                    header=state,
                    expected_version=stored.version,
                )
            except ConcurrentModificationError:
                continue
            return

    async with anyio.create_task_group() as group:
        for index in range(8):
            group.start_soon(take_a_turn, f"task {index}")

    document = (await store.load("c1")).document
    assert (await store.load("c1")).version == 9
    assert sorted(
        event.message.text for event in document.events if event.message.role == "user"
    ) == [f"task {index}" for index in range(8)]
    # Each turn is whole and in order: a prompt, then its own answer.
    pairs = list(zip(document.events[::2], document.events[1::2], strict=True))
    assert all(reply.message.text == f"to {ask.message.text}" for ask, reply in pairs)
    assert [ask.turn_id for ask, _ in pairs] == list(range(8))
    assert attempts >= 8


async def test_writes_to_different_conversations_do_not_conflict(
    store: ConversationStore,
) -> None:
    async with anyio.create_task_group() as group:
        for index in range(10):
            group.start_soon(
                lambda name: run_turn(store, name, "hi", "hello", version=0), f"c{index}"
            )

    infos = await store.list()
    assert sorted(info.id for info in infos) == sorted(f"c{index}" for index in range(10))
    assert {(info.version, info.events) for info in infos} == {(2, 2)}


async def test_a_closed_store_refuses_every_call_with_store_closed_error(
    store: ConversationStore,
) -> None:
    await store.save(header("c1"), expected_version=0)
    await store.aclose()
    await store.aclose()  # closing twice is harmless

    calls = [
        store.load("c1"),
        store.save(header("c2"), expected_version=0),
        store.append_events("c1", [], header=header("c1"), expected_version=1),
        store.list(),
        store.delete("c1"),
    ]
    for call in calls:
        with pytest.raises(StoreClosedError, match="closed"):
            await call
    assert issubclass(StoreClosedError, StoreError)


# --- generations -------------------------------------------------------------------------


async def test_a_conversation_deleted_and_created_again_has_a_new_generation(
    store: ConversationStore,
) -> None:
    await store.save(header("c1"), expected_version=0)
    first = await store.load("c1")
    assert first.generation
    await store.delete("c1")
    await store.save(header("c1"), expected_version=0)
    second = await store.load("c1")

    assert second.version == first.version == 1
    assert second.generation != first.generation
    assert [info.generation for info in await store.list()] == [second.generation]


async def test_a_writer_from_before_a_delete_cannot_match_the_new_conversation(
    store: ConversationStore,
) -> None:
    await store.save(header("c1"), expected_version=0)
    stale = await store.load("c1")
    await store.delete("c1")
    await store.save(header("c1", metadata={"who": "new"}), expected_version=0)

    with pytest.raises(ConcurrentModificationError, match="deleted and created again"):
        await store.append_events(
            "c1",
            [prompt("stale", 0)],
            header=header("c1"),
            expected_version=stale.version,
            generation=stale.generation,
        )
    with pytest.raises(ConcurrentModificationError, match="deleted and created again"):
        await store.save(header("c1"), expected_version=1, generation=stale.generation)
    after = await store.load("c1")
    assert after.version == 1
    assert after.document.metadata == {"who": "new"}


async def test_a_whole_save_keeps_each_pending_prompts_marker(store: ConversationStore) -> None:
    document = header(
        "c1",
        next_turn_id=3,
        events=(prompt("hi", 0), answer("hello", 0), prompt("w1", 1, pending=True)),
    )
    document = attrs.evolve(document, events=(*document.events, prompt("old", 2, pending=True)))
    version = await store.save(document, expected_version=0, pending_markers=["writer-1", None])
    assert (await store.load("c1")).pending_markers == ("writer-1", None)

    # The writer that owns "w1" commits it, or takes it back, exactly.
    assert await store.remove_pending("c1", "writer-1") is True
    stored = await store.load("c1")
    assert [e.message.text for e in stored.document.events if e.pending] == ["old"]
    assert stored.version == version


async def test_a_save_needs_one_marker_per_pending_event(store: ConversationStore) -> None:
    document = header("c1", next_turn_id=1, events=(prompt("w1", 0, pending=True),))
    for markers in ([], ["a", "b"], ["no spaces"]):
        with pytest.raises(InvalidRequestError):
            await store.save(document, expected_version=0, pending_markers=markers)
    with pytest.raises(ConversationNotFoundError):
        await store.load("c1")


async def test_a_delete_with_the_version_and_generation_held_deletes(
    store: ConversationStore,
) -> None:
    await store.save(header("c1"), expected_version=0, generation="mine")
    assert await store.delete("c1", expected_version=1, generation="mine") is True
    with pytest.raises(ConversationNotFoundError):
        await store.load("c1")
    assert await store.delete("c1", expected_version=1, generation="mine") is False


async def test_a_delete_with_a_stale_version_deletes_nothing(store: ConversationStore) -> None:
    version = await run_turn(store, "c1", "hi", "hello", version=0)
    await run_turn(store, "c1", "more", "sure", version=version)  # another writer

    with pytest.raises(ConcurrentModificationError, match="expected version 2"):
        await store.delete("c1", expected_version=version)
    stored = await store.load("c1")
    assert stored.version == version + 2
    assert len(stored.document.events) == 4


async def test_a_delete_of_another_generation_deletes_nothing(store: ConversationStore) -> None:
    await store.save(header("c1"), expected_version=0, generation="first")
    await store.delete("c1")
    await store.save(header("c1", metadata={"who": "new"}), expected_version=0)

    with pytest.raises(ConcurrentModificationError, match="deleted and created again"):
        await store.delete("c1", expected_version=1, generation="first")
    assert (await store.load("c1")).document.metadata == {"who": "new"}


@pytest.mark.parametrize(
    "arguments", [{"expected_version": 0}, {"expected_version": -1}, {"generation": "no spaces"}]
)
async def test_a_delete_refuses_a_check_that_cannot_hold(
    store: ConversationStore, arguments: dict[str, Any]
) -> None:
    await store.save(header("c1"), expected_version=0)
    with pytest.raises(InvalidRequestError):
        await store.delete("c1", **arguments)
    assert (await store.load("c1")).version == 1


async def test_an_id_that_is_not_text_is_refused_by_name_before_the_backend_sees_it(
    store: ConversationStore,
) -> None:
    lone = "c\ud800"  # a Python str no encoder takes (JSON's escapes can spell it)
    calls = [
        store.load(lone),
        store.delete(lone),
        store.remove_pending(lone, "m1"),
        store.append_events(lone, [prompt("hi", 0)], header=header("c1"), expected_version=0),
    ]
    for call in calls:
        with pytest.raises(InvalidRequestError, match="lone surrogate at 1"):
            await call
    assert await store.list() == []


async def test_a_writer_may_choose_the_generation_it_creates(store: ConversationStore) -> None:
    version = await store.append_events(
        "c1", [prompt("hi", 0)], header=header("c1"), expected_version=0, generation="gen-a"
    )
    assert (await store.load("c1")).generation == "gen-a"
    assert await store.save(header("c1"), expected_version=version, generation="gen-a") == 2


@pytest.mark.parametrize("generation", ["", "has space", 7, "x" * 129])
async def test_a_generation_that_is_not_a_short_token_is_refused(
    store: ConversationStore, generation: Any
) -> None:
    with pytest.raises(InvalidRequestError, match="generation"):
        await store.save(header("c1"), expected_version=0, generation=generation)


# --- pending markers ---------------------------------------------------------------------


async def two_writers_pending(store: ConversationStore) -> int:
    """Conversation c1 with one answered turn and the pending prompts of writers a and b."""
    version = await store.append_events(
        "c1",
        [prompt("first", 0), answer("one", 0)],
        header=header("c1", next_turn_id=1),
        expected_version=0,
    )
    version = await store.append_events(
        "c1",
        [prompt("from a", 1, pending=True)],
        header=header("c1", next_turn_id=2),
        expected_version=version,
        pending_marker="writer-a",
    )
    return await store.append_events(
        "c1",
        [prompt("from b", 2, pending=True)],
        header=header("c1", next_turn_id=3),
        expected_version=version,
        pending_marker="writer-b",
    )


def texts(stored: Any) -> list[str]:
    return [event.message.text for event in stored.document.events]


async def test_pending_events_carry_their_writers_marker(store: ConversationStore) -> None:
    await two_writers_pending(store)
    stored = await store.load("c1")
    assert texts(stored) == ["first", "one", "from a", "from b"]
    assert stored.pending_markers == ("writer-a", "writer-b")


async def test_a_commit_drops_exactly_its_own_pending_copy(store: ConversationStore) -> None:
    version = await two_writers_pending(store)
    await store.append_events(
        "c1",
        [prompt("from b", 2), answer("two", 2)],
        header=header("c1", next_turn_id=3),
        expected_version=version,
        drop_pending="writer-b",
    )
    stored = await store.load("c1")
    assert texts(stored) == ["first", "one", "from a", "from b", "two"]
    assert [event.pending for event in stored.document.events] == [
        False,
        False,
        True,
        False,
        False,
    ]
    assert stored.pending_markers == ("writer-a",)


async def test_remove_pending_takes_back_one_writers_prompt_whatever_the_version(
    store: ConversationStore,
) -> None:
    version = await two_writers_pending(store)

    assert await store.remove_pending("c1", "writer-a") is True
    stored = await store.load("c1")
    assert stored.version == version  # pending copies are not part of the versioned transcript
    assert texts(stored) == ["first", "one", "from b"]
    assert stored.pending_markers == ("writer-b",)
    assert (await store.list())[0].events == 3

    assert await store.remove_pending("c1", "writer-a") is False
    assert await store.remove_pending("c1", "writer-c") is False
    assert await store.remove_pending("missing", "writer-a") is False
    # The writer still holding the version commits as if nothing happened.
    await store.append_events(
        "c1",
        [prompt("from b", 2), answer("two", 2)],
        header=header("c1", next_turn_id=3),
        expected_version=version,
        drop_pending="writer-b",
    )
    assert texts(await store.load("c1")) == ["first", "one", "from b", "two"]


async def test_drop_pending_true_still_drops_every_pending_event(
    store: ConversationStore,
) -> None:
    version = await two_writers_pending(store)
    await store.append_events(
        "c1", [], header=header("c1", next_turn_id=3), expected_version=version, drop_pending=True
    )
    stored = await store.load("c1")
    assert texts(stored) == ["first", "one"]
    assert stored.pending_markers == ()


async def test_a_pending_event_written_without_a_marker_has_none(
    store: ConversationStore,
) -> None:
    await store.append_events(
        "c1", [prompt("hi", 0, pending=True)], header=header("c1"), expected_version=0
    )
    assert (await store.load("c1")).pending_markers == (None,)
    assert await store.remove_pending("c1", "anyone") is False


@pytest.mark.parametrize("marker", ["", "two words", "x" * 129, 3])
async def test_a_marker_that_is_not_a_short_token_is_refused(
    store: ConversationStore, marker: Any
) -> None:
    with pytest.raises(InvalidRequestError, match="marker"):
        await store.append_events(
            "c1",
            [prompt("hi", 0, pending=True)],
            header=header("c1"),
            expected_version=0,
            pending_marker=marker,
        )
    with pytest.raises(InvalidRequestError, match="marker"):
        await store.remove_pending("c1", marker)
    with pytest.raises(ConversationNotFoundError):
        await store.load("c1")


# --- pages ---------------------------------------------------------------------------


async def test_list_page_reads_every_conversation_once_newest_first(
    store: ConversationStore,
) -> None:
    for index in range(7):
        await store.save(header(f"c{index}"), expected_version=0)
    await store.save(header("c2"), expected_version=1)  # c2 becomes the newest

    seen: list[str] = []
    cursor = None
    pages = 0
    while True:
        page = await store.list_page(limit=3, cursor=cursor)
        assert len(page.conversations) <= 3
        seen += [info.id for info in page.conversations]
        pages += 1
        if page.next_cursor is None:
            break
        cursor = page.next_cursor
    assert seen == ["c2", "c6", "c5", "c4", "c3", "c1", "c0"]
    assert pages == 3
    assert [info.id for info in await store.list()] == seen


@pytest.mark.parametrize(("limit", "cursor"), [(0, None), (True, None), (3, "not-a-cursor")])
async def test_a_bad_page_request_is_refused(
    store: ConversationStore, limit: Any, cursor: Any
) -> None:
    with pytest.raises(InvalidRequestError):
        await store.list_page(limit=limit, cursor=cursor)
