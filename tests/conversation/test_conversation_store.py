"""Conversations persisted through the real stores: pending, commit, rollback, versions.

Every test runs against MemoryStore and SQLiteStore, on asyncio and trio.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from pathlib import Path
from typing import Any

import anyio
import pytest

from threadline import (
    Agent,
    Client,
    ConcurrentModificationError,
    Conversation,
    ConversationNotFoundError,
    InvalidRequestError,
    Message,
    Model,
    ProviderUnavailableError,
    TextDelta,
)
from threadline.drivers import ProviderCall, ProviderResponse
from threadline.serialization import ConversationDocument, ConversationEvent
from threadline.stores import ConversationStore
from threadline.stores.memory import MemoryStore
from threadline.stores.sqlite import SQLiteStore
from threadline.testing import ScriptedDriver, ScriptedReply

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

MODEL = Model("scripted-model", context_size=8192)


@pytest.fixture(params=["memory", "sqlite"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, anyio_backend: str
) -> AsyncIterator[ConversationStore]:
    opened: ConversationStore = (
        MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "threads.db")
    )
    try:
        yield opened
    finally:
        await opened.aclose()


class WatchingDriver(ScriptedDriver):
    """Runs ``on_call`` as each call arrives, before answering it."""

    def __init__(self, replies: Iterable[ScriptedReply] = ()) -> None:
        super().__init__(replies)
        self.on_call: Callable[[ProviderCall], Awaitable[None]] | None = None

    async def complete(self, call: ProviderCall) -> ProviderResponse:
        if self.on_call is not None:
            await self.on_call(call)
        return await super().complete(call)


def agent_on(driver: ScriptedDriver) -> Agent:
    return Agent(Client(driver), model=MODEL)


async def stored(store: ConversationStore, conversation_id: str = "t") -> ConversationDocument:
    return (await store.load(conversation_id)).document


async def test_the_prompt_is_stored_pending_before_the_model_is_called(
    store: ConversationStore,
) -> None:
    driver = WatchingDriver(["answer"])
    conv = Conversation(agent_on(driver), id="t", store=store)
    seen: list[ConversationDocument] = []

    async def look(call: ProviderCall) -> None:
        seen.append(await stored(store))

    driver.on_call = look
    await conv.run("question")

    (during,) = seen
    assert [(e.message.text, e.pending) for e in during.events] == [("question", True)]
    after = await stored(store)
    assert [(e.message.text, e.pending) for e in after.events] == [
        ("question", False),
        ("answer", False),
    ]
    assert after.events == conv.events
    assert (after.next_turn_id, after.total_usage) == (1, conv.total_usage)
    assert conv.version == (await store.load("t")).version == 2


async def test_settings_and_metadata_are_stored_with_the_turn(store: ConversationStore) -> None:
    conv = Conversation(
        agent_on(ScriptedDriver(["a"])),
        id="t",
        store=store,
        history_limit=8,
        max_context_tokens=6000,
        output_reserve_tokens=0,
        metadata={"owner": "ada"},
    )
    await conv.run("q")

    document = await stored(store)
    assert document.history_limit == 8
    assert document.settings == {"max_context_tokens": 6000, "output_reserve_tokens": 0}
    assert document.metadata == {"owner": "ada"}


async def test_a_failed_run_leaves_the_store_as_it_was(store: ConversationStore) -> None:
    driver = ScriptedDriver(["first answer", ProviderUnavailableError("down"), "third"])
    conv = Conversation(agent_on(driver), id="t", store=store)
    await conv.run("first")
    before = await stored(store)

    with pytest.raises(ProviderUnavailableError):
        await conv.run("second")

    assert await stored(store) == before
    assert conv.events == before.events
    await conv.run("third")
    assert [e.message.text for e in (await stored(store)).events] == [
        "first",
        "first answer",
        "third",
        "third",
    ]


async def test_a_cancelled_stream_leaves_the_store_as_it_was(store: ConversationStore) -> None:
    driver = ScriptedDriver(["first answer", "a long streamed answer"])
    conv = Conversation(agent_on(driver), id="t", store=store)
    await conv.run("first")
    before = await stored(store)

    with anyio.CancelScope() as scope:
        async with conv.stream("second") as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    scope.cancel()
                    await anyio.lowlevel.checkpoint()

    assert scope.cancelled_caught
    assert await stored(store) == before
    reloaded = await Conversation.load(agent_on(ScriptedDriver()), store, "t")
    assert reloaded.events == conv.events
    assert reloaded.pending_events == ()


async def test_a_loaded_conversation_continues(store: ConversationStore) -> None:
    conv = Conversation(agent_on(ScriptedDriver(["Hi Ada."])), id="t", store=store)
    await conv.run("I am Ada.")

    driver = ScriptedDriver(["You are Ada."])
    loaded = await Conversation.load(agent_on(driver), store, "t")
    assert loaded.events == conv.events
    assert loaded.version == conv.version
    await loaded.run("Who am I?")

    assert [m.text for m in driver.calls[0].messages] == ["I am Ada.", "Hi Ada.", "Who am I?"]
    assert len((await stored(store)).events) == 4


async def test_a_stale_conversation_is_refused_before_the_model_and_nothing_is_lost(
    store: ConversationStore,
) -> None:
    await Conversation(agent_on(ScriptedDriver(["a"])), id="t", store=store).run("q")
    first = await Conversation.load(agent_on(ScriptedDriver(["from first"])), store, "t")
    second_driver = ScriptedDriver(["from second"])
    second = await Conversation.load(agent_on(second_driver), store, "t")

    await first.run("first writer")
    before = second.events
    with pytest.raises(ConcurrentModificationError):
        await second.run("second writer")

    assert second_driver.calls == []
    assert second.events == before
    kept = await stored(store)
    assert [e.message.text for e in kept.events][-2:] == ["first writer", "from first"]
    assert not any(e.pending for e in kept.events)

    again = await Conversation.load(agent_on(second_driver), store, "t")
    await again.run("second writer")
    assert [e.message.text for e in (await stored(store)).events][-2:] == [
        "second writer",
        "from second",
    ]


async def test_a_new_conversation_never_overwrites_a_stored_one(store: ConversationStore) -> None:
    await Conversation(agent_on(ScriptedDriver(["a"])), id="t", store=store).run("q")
    driver = ScriptedDriver(["b"])
    with pytest.raises(ConcurrentModificationError):
        await Conversation(agent_on(driver), id="t", store=store).run("other")
    assert driver.calls == []
    assert len((await stored(store)).events) == 2


async def test_replace_events_reset_and_save_persist(store: ConversationStore) -> None:
    conv = Conversation(agent_on(ScriptedDriver(["a1", "a2"])), id="t", store=store)
    await conv.run("q1")
    await conv.run("q2")

    await conv.replace_events(conv.events[2:])
    assert (await stored(store)).events == conv.events
    assert (await stored(store)).total_usage == conv.total_usage

    conv.history_limit = 3
    await conv.save()
    assert (await stored(store)).history_limit == 3

    await conv.reset()
    document = await stored(store)
    assert (document.events, document.next_turn_id) == ((), 2)
    assert conv.version == (await store.load("t")).version


async def test_a_stale_rewrite_changes_nothing(store: ConversationStore) -> None:
    conv = Conversation(agent_on(ScriptedDriver(["a1"])), id="t", store=store)
    await conv.run("q1")
    other = await Conversation.load(agent_on(ScriptedDriver(["other"])), store, "t")
    await other.run("q2")

    with pytest.raises(ConcurrentModificationError):
        await conv.reset()
    assert conv.turn_count() == 1
    assert len((await stored(store)).events) == 4


async def test_pending_prompts_left_by_a_crash_are_visible_kept_and_never_sent(
    store: ConversationStore,
) -> None:
    crashed = ConversationDocument(
        id="t",
        next_turn_id=2,
        events=(
            ConversationEvent(message=Message.user("q0"), turn_id=0),
            ConversationEvent(message=Message.assistant("a0"), turn_id=0),
            ConversationEvent(message=Message.user("lost"), turn_id=1, pending=True),
        ),
    )
    await store.save(crashed, expected_version=0)
    driver = ScriptedDriver(["a2", "a-lost"])
    conv = await Conversation.load(agent_on(driver), store, "t")

    assert [m.text for m in conv.pending_messages()] == ["lost"]
    await conv.run("q2")
    assert "lost" not in [m.text for m in driver.calls[0].messages]
    # The crashed prompt's pending copy stays where it was, with its writer's marker.
    events = [(e.message.text, e.pending) for e in (await stored(store)).events]
    assert [text for text, pending in events if not pending][-2:] == ["q2", "a2"]
    assert [text for text, pending in events if pending] == ["lost"]
    assert conv.turns[-1].id == 2

    # Sending the lost prompt again answers it and retires the pending copy.
    await conv.run(conv.pending_messages()[0])
    assert conv.pending_messages() == ()
    assert not any(e.pending for e in (await stored(store)).events)


async def test_discard_pending_drops_what_a_crash_left(store: ConversationStore) -> None:
    crashed = ConversationDocument(
        id="t",
        next_turn_id=1,
        events=(ConversationEvent(message=Message.user("lost"), turn_id=0, pending=True),),
    )
    await store.save(crashed, expected_version=0)
    conv = await Conversation.load(agent_on(ScriptedDriver()), store, "t")

    await conv.discard_pending()

    assert conv.pending_events == ()
    assert (await stored(store)).events == ()
    assert (await stored(store)).next_turn_id == 1


async def test_discard_pending_refuses_when_another_writer_wrote_since(
    store: ConversationStore,
) -> None:
    crashed = ConversationDocument(
        id="t",
        next_turn_id=1,
        events=(ConversationEvent(message=Message.user("lost"), turn_id=0, pending=True),),
    )
    await store.save(crashed, expected_version=0)
    ours = await Conversation.load(agent_on(ScriptedDriver()), store, "t")
    other = await Conversation.load(agent_on(ScriptedDriver(["a"])), store, "t")
    await other.run("q")

    with pytest.raises(ConcurrentModificationError):
        await ours.discard_pending()
    # Nothing the other writer did is undone.
    texts = [e.message.text for e in (await stored(store)).events]
    assert texts[-2:] == ["q", "a"]


async def test_loading_a_missing_conversation_raises(store: ConversationStore) -> None:
    with pytest.raises(ConversationNotFoundError):
        await Conversation.load(agent_on(ScriptedDriver()), store, "nobody")


async def test_save_needs_a_store() -> None:
    conv = Conversation(agent_on(ScriptedDriver()))
    with pytest.raises(InvalidRequestError, match="no store"):
        await conv.save()


async def test_a_commit_refused_as_stale_hands_back_the_answer_with_the_error(
    store: ConversationStore,
) -> None:
    driver = WatchingDriver(["the answer nobody stored"])
    mine = Conversation(agent_on(driver), id="t", store=store)
    other_driver = ScriptedDriver(["sneaked in"])

    async def another_writer_gets_in(call: ProviderCall) -> None:
        # Between this turn's pending write and its commit, another process
        # (here, another Conversation object) writes the same conversation.
        other = await Conversation.load(agent_on(other_driver), store, "t")
        await other.run("me first")

    driver.on_call = another_writer_gets_in
    with pytest.raises(ConcurrentModificationError) as caught:
        await mine.run("mine")
    assert caught.value.unsaved_result.text == "the answer nobody stored"
    assert mine.turn_count() == 0
    texts = [e.message.text for e in (await stored(store)).events]
    assert "me first" in texts
    assert "the answer nobody stored" not in texts


async def test_a_failed_first_turn_leaves_no_conversation_behind(
    store: ConversationStore,
) -> None:
    driver = ScriptedDriver([ProviderUnavailableError("down"), "hello"])
    with pytest.raises(ProviderUnavailableError):
        await Conversation(agent_on(driver), id="fresh", store=store).run("hi")
    assert await store.list() == []
    # A new Conversation with the same id starts cleanly.
    retry = Conversation(agent_on(driver), id="fresh", store=store)
    assert (await retry.run("hi")).text == "hello"
    assert [e.message.text for e in (await stored(store, "fresh")).events] == ["hi", "hello"]


async def test_a_failed_turn_leaves_the_stored_settings_as_they_were(
    store: ConversationStore,
) -> None:
    await Conversation(agent_on(ScriptedDriver(["a"])), id="t", store=store).run("q")
    before = await stored(store)
    driver = ScriptedDriver([ProviderUnavailableError("down")])
    conv = await Conversation.load(agent_on(driver), store, "t", max_context_tokens=6000)

    with pytest.raises(ProviderUnavailableError):
        await conv.run("second")

    # The keyword arguments of this load are this object's, not the stored conversation's.
    assert await stored(store) == before
    reloaded = await Conversation.load(agent_on(ScriptedDriver()), store, "t")
    assert reloaded.max_context_tokens is None


async def test_a_cancelled_stream_leaves_the_stored_settings_as_they_were(
    store: ConversationStore,
) -> None:
    await Conversation(agent_on(ScriptedDriver(["a"])), id="t", store=store).run("q")
    before = await stored(store)
    driver = ScriptedDriver(["a long streamed answer"])
    conv = await Conversation.open(agent_on(driver), store, "t", history_limit=20)
    conv.max_context_tokens = 6000

    async with conv.stream("second") as events:
        async for _ in events:
            break

    assert await stored(store) == before
    reloaded = await Conversation.load(agent_on(ScriptedDriver()), store, "t")
    assert (reloaded.max_context_tokens, reloaded.history_limit) == (None, 0)


async def test_a_turn_under_way_stores_its_settings_only_when_it_commits(
    store: ConversationStore,
) -> None:
    await Conversation(agent_on(ScriptedDriver(["a"])), id="t", store=store).run("q")
    driver = WatchingDriver(["b"])
    conv = await Conversation.load(agent_on(driver), store, "t", max_context_tokens=6000)
    seen: list[ConversationDocument] = []

    async def look(call: ProviderCall) -> None:
        seen.append(await stored(store))

    driver.on_call = look
    await conv.run("second")

    # A process killed mid-turn leaves the prompt pending and the settings as stored.
    assert [e.message.text for e in seen[0].events if e.pending] == ["second"]
    assert seen[0].settings == {"max_context_tokens": None}
    assert seen[0].next_turn_id == 2
    assert (await stored(store)).settings == {"max_context_tokens": 6000}


async def test_load_takes_history_limit_as_open_does(store: ConversationStore) -> None:
    await Conversation(agent_on(ScriptedDriver(["a"])), id="t", store=store, history_limit=6).run(
        "q"
    )

    assert (await Conversation.load(agent_on(ScriptedDriver()), store, "t")).history_limit == 6
    loaded = await Conversation.load(agent_on(ScriptedDriver()), store, "t", history_limit=2)
    assert loaded.history_limit == 2


@pytest.mark.parametrize(("option", "value"), [("metadata", {"owner": "bob"}), ("version", 3)])
async def test_what_the_store_holds_is_not_a_keyword_argument_of_load(
    store: ConversationStore, option: str, value: object
) -> None:
    await Conversation(agent_on(ScriptedDriver(["a"])), id="t", store=store).run("q")
    given: dict[str, Any] = {option: value}
    with pytest.raises(InvalidRequestError, match=option):
        await Conversation.load(agent_on(ScriptedDriver()), store, "t", **given)


async def test_an_id_no_encoder_takes_is_refused_where_it_is_given(
    store: ConversationStore,
) -> None:
    # A lone surrogate is a Python str but no text: every turn would fail on the
    # prompt-cache key (and a store could not keep it).
    driver = ScriptedDriver(["a"])
    with pytest.raises(InvalidRequestError, match=r"^id must be .*surrogate"):
        Conversation(agent_on(driver), id="\ud800x", store=store)
    with pytest.raises(InvalidRequestError, match=r"^id must be .*surrogate"):
        await Conversation.load(agent_on(driver), store, "\ud800x")
    with pytest.raises(InvalidRequestError, match=r"^id must be .*surrogate"):
        await Conversation.open(agent_on(driver), store, "\ud800x")
    assert driver.calls == []
    assert await store.list() == []
