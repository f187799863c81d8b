"""Two writers and crashes on one SQLiteStore: every pending prompt is taken back exactly.

A crash is simulated two ways: by cancelling the turn between its pending
write and its commit (the conversation's clean-up runs), and by a store that
goes dead inside the model call, as a killed process would (no clean-up
reaches the store). tests/conversation/test_conversation_processes.py kills real processes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

from threadline import (
    Agent,
    Client,
    ConcurrentModificationError,
    Conversation,
    Message,
    Model,
    ProviderUnavailableError,
    TextDelta,
)
from threadline.drivers import ProviderCall, ProviderResponse
from threadline.serialization import ConversationDocument, ConversationEvent
from threadline.stores import ConversationStore
from threadline.stores.sqlite import SQLiteStore
from threadline.testing import ScriptedDriver

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

MODEL = Model("scripted-model", context_size=8192)


@pytest.fixture
async def store(tmp_path: Path, anyio_backend: str) -> AsyncIterator[SQLiteStore]:
    async with SQLiteStore(tmp_path / "threads.db") as opened:
        yield opened


class Killed(Exception):
    """The process is gone: raised by everything it would still have done."""


class MortalStore:
    """A store as one process sees it: after ``die()``, nothing it asks reaches the file."""

    def __init__(self, inner: ConversationStore) -> None:
        self._inner = inner
        self.dead = False

    def __getattr__(self, name: str) -> Any:
        method = getattr(self._inner, name)

        async def call(*args: Any, **kwargs: Any) -> Any:
            if self.dead:
                raise Killed(name)
            return await method(*args, **kwargs)

        return call


class DiesInTheModel(ScriptedDriver):
    """Kills its process's store while the model is working on the prompt."""

    def __init__(self, store: MortalStore) -> None:
        super().__init__()
        self.store = store

    async def complete(self, call: ProviderCall) -> ProviderResponse:
        self.store.dead = True
        raise Killed("kill -9")


class GatedDriver(ScriptedDriver):
    """Says when the model has the prompt, then answers (or raises) when let go."""

    def __init__(self, reply: str | Exception) -> None:
        super().__init__([reply])
        self.called = anyio.Event()
        self.go = anyio.Event()

    async def complete(self, call: ProviderCall) -> ProviderResponse:
        self.called.set()
        await self.go.wait()
        return await super().complete(call)


def agent_on(driver: ScriptedDriver) -> Agent:
    return Agent(Client(driver), model=MODEL)


async def pending_in(store: ConversationStore) -> list[tuple[str, str | None]]:
    stored = await store.load("t")
    texts = [e.message.text for e in stored.document.events if e.pending]
    return list(zip(texts, stored.pending_markers, strict=True))


async def answered_in(store: ConversationStore) -> list[str]:
    return [e.message.text for e in (await store.load("t")).document.events if not e.pending]


async def started(store: ConversationStore) -> None:
    await Conversation(agent_on(ScriptedDriver(["a0"])), id="t", store=store).run("q0")


async def crash_during(store: ConversationStore, prompt: str | None) -> None:
    """One process loads "t", sends ``prompt`` (None: its first pending prompt again)
    and is killed inside the model call."""
    mortal = MortalStore(store)
    conv = await Conversation.load(agent_on(DiesInTheModel(mortal)), mortal, "t")  # type: ignore[arg-type]
    with pytest.raises(Killed):
        await conv.run(conv.pending_messages()[0] if prompt is None else prompt)


# -- one writer's failure never touches another writer's pending prompt ------------------


@pytest.mark.parametrize("outcome", ["refused", "failed", "cancelled"])
async def test_a_turn_that_ends_badly_takes_back_only_its_own_pending_prompt(
    store: SQLiteStore, outcome: str
) -> None:
    await started(store)
    mine_driver = GatedDriver(ProviderUnavailableError("down") if outcome == "failed" else "mine!")
    mine = await Conversation.load(agent_on(mine_driver), store, "t")
    theirs_driver = GatedDriver("their answer")
    caught: list[Exception] = []
    mine_done = anyio.Event()

    async def run_mine(scope: anyio.CancelScope) -> None:
        try:
            with scope:
                await mine.run("mine")
        except (ConcurrentModificationError, ProviderUnavailableError) as exc:
            caught.append(exc)
        finally:
            mine_done.set()

    async def run_theirs() -> None:
        await mine_driver.called.wait()
        # Loaded while "mine" is pending: it sees that prompt, then writes its own.
        theirs = await Conversation.load(agent_on(theirs_driver), store, "t")
        assert [m.text for m in theirs.pending_messages()] == ["mine"]
        await theirs.run("theirs")

    scope = anyio.CancelScope()
    async with anyio.create_task_group() as group:
        group.start_soon(run_mine, scope)
        group.start_soon(run_theirs)
        await theirs_driver.called.wait()
        assert [text for text, _ in await pending_in(store)] == ["mine", "theirs"]
        # Both prompts are pending; the first writer's turn ends badly.
        if outcome == "cancelled":
            scope.cancel()
        else:
            mine_driver.go.set()
        await mine_done.wait()
        # Its prompt went; the other writer's stayed, with that writer's marker.
        (theirs_pending,) = await pending_in(store)
        assert theirs_pending[0] == "theirs"
        assert theirs_pending[1] is not None
        theirs_driver.go.set()

    assert await pending_in(store) == []
    assert await answered_in(store) == ["q0", "a0", "theirs", "their answer"]
    if outcome == "refused":
        (error,) = caught
        assert isinstance(error, ConcurrentModificationError)
        assert error.unsaved_result.text == "mine!"
    else:
        assert len(caught) == (outcome == "failed")


async def test_a_stream_refused_at_commit_hands_back_its_answer(store: SQLiteStore) -> None:
    await started(store)
    mine = await Conversation.load(agent_on(ScriptedDriver(["my streamed answer"])), store, "t")
    other_agent = agent_on(ScriptedDriver(["sneaked in"]))
    texts: list[str] = []

    async def stream_mine() -> None:
        async with mine.stream("mine") as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    if not texts:
                        # After the model started answering, another writer commits.
                        other = await Conversation.load(other_agent, store, "t")
                        await other.run("me first")
                    texts.append(event.text)

    with pytest.raises(ConcurrentModificationError) as caught:
        await stream_mine()

    assert "".join(texts) == "my streamed answer"
    assert caught.value.unsaved_result.text == "my streamed answer"
    assert await pending_in(store) == []
    assert await answered_in(store) == ["q0", "a0", "me first", "sneaked in"]


# -- sending a pending prompt again ---------------------------------------------------


async def test_a_crash_while_a_pending_prompt_is_sent_again_leaves_one_copy(
    store: SQLiteStore,
) -> None:
    await started(store)
    await crash_during(store, "lost")
    ((_, marker),) = await pending_in(store)

    await crash_during(store, None)  # killed again, while answering "lost"

    assert await pending_in(store) == [("lost", marker)]
    conv = await Conversation.load(agent_on(ScriptedDriver(["found"])), store, "t")
    await conv.run(conv.pending_messages()[0])
    assert await pending_in(store) == []
    assert conv.pending_events == ()
    assert await answered_in(store) == ["q0", "a0", "lost", "found"]
    reloaded = await Conversation.load(conv.agent, store, "t")
    assert reloaded.pending_events == ()
    assert reloaded.events == conv.events


async def test_a_cancelled_resend_of_a_pending_prompt_leaves_it_pending_once(
    store: SQLiteStore,
) -> None:
    await started(store)
    await crash_during(store, "lost")
    before = await pending_in(store)
    driver = GatedDriver("never")
    conv = await Conversation.load(agent_on(driver), store, "t")

    async with anyio.create_task_group() as group:
        group.start_soon(conv.run, conv.pending_messages()[0])
        await driver.called.wait()
        group.cancel_scope.cancel()

    assert await pending_in(store) == before
    assert [m.text for m in conv.pending_messages()] == ["lost"]
    driver.go.set()
    await conv.run(conv.pending_messages()[0])
    assert await pending_in(store) == []
    assert await answered_in(store) == ["q0", "a0", "lost", "never"]


async def test_answering_a_prompt_takes_back_every_copy_earlier_crashes_left(
    store: SQLiteStore,
) -> None:
    # Two marked copies of one prompt, as two crashed resends of an older version left them.
    await started(store)
    version = (await store.load("t")).version
    for marker in ("crash-1", "crash-2"):
        version = await store.append_events(
            "t",
            [ConversationEvent(message=Message.user("lost"), turn_id=1, pending=True)],
            header=attrs.evolve((await store.load("t")).document, next_turn_id=2),
            expected_version=version,
            pending_marker=marker,
        )
    conv = await Conversation.load(agent_on(ScriptedDriver(["found"])), store, "t")
    assert [m.text for m in conv.pending_messages()] == ["lost", "lost"]

    await conv.run(conv.pending_messages()[0])

    assert await pending_in(store) == []
    assert conv.pending_events == ()
    assert (await answered_in(store)).count("lost") == 1


async def test_answering_an_unmarked_pending_prompt_keeps_the_other_pending_ones(
    store: SQLiteStore,
) -> None:
    # A document saved whole (save() writes no markers) with two crashed prompts.
    crashed = ConversationDocument(
        id="t",
        next_turn_id=3,
        events=(
            ConversationEvent(message=Message.user("q0"), turn_id=0),
            ConversationEvent(message=Message.assistant("a0"), turn_id=0),
            ConversationEvent(message=Message.user("lost"), turn_id=1, pending=True),
            ConversationEvent(message=Message.user("other"), turn_id=2, pending=True),
        ),
    )
    await store.save(crashed, expected_version=0)
    conv = await Conversation.load(agent_on(ScriptedDriver(["found"])), store, "t")

    await conv.run(conv.pending_messages()[0])

    assert [text for text, _ in await pending_in(store)] == ["other"]
    assert [m.text for m in conv.pending_messages()] == ["other"]
    assert await answered_in(store) == ["q0", "a0", "lost", "found"]


# -- a new Conversation on an id that exists -----------------------------------------


async def test_a_new_conversation_on_a_stored_id_says_it_exists_and_how_to_load_it(
    store: SQLiteStore,
) -> None:
    await started(store)
    driver = ScriptedDriver(["unused"])
    with pytest.raises(ConcurrentModificationError) as caught:
        await Conversation(agent_on(driver), id="t", store=store).run("hello")

    message = str(caught.value)
    assert "'t' already exists in the store" in message
    assert "Conversation.load(agent, store, 't')" in message
    assert "Conversation.open(agent, store, 't')" in message
    assert "changed under you" not in message
    assert driver.calls == []
    assert await pending_in(store) == []

    with pytest.raises(ConcurrentModificationError, match="already exists"):
        await Conversation(agent_on(driver), id="t", store=store).save()


async def test_open_creates_a_missing_conversation_and_loads_a_stored_one(
    store: SQLiteStore,
) -> None:
    driver = ScriptedDriver(["Hi Ada.", "You are Ada."])
    first = await Conversation.open(
        agent_on(driver), store, "t", history_limit=6, metadata={"owner": "ada"}
    )
    assert (first.version, first.history_limit, first.metadata) == (0, 6, {"owner": "ada"})
    await first.run("I am Ada.")

    again = await Conversation.open(agent_on(driver), store, "t", metadata={"owner": "bob"})
    assert again.version == first.version
    assert (again.history_limit, again.metadata) == (6, {"owner": "ada"})
    await again.run("Who am I?")
    assert [m.text for m in driver.calls[1].messages] == ["I am Ada.", "Hi Ada.", "Who am I?"]

    narrower = await Conversation.open(agent_on(driver), store, "t", history_limit=2)
    assert narrower.history_limit == 2


async def test_a_failed_first_turn_takes_back_only_the_conversation_it_created(
    store: SQLiteStore,
) -> None:
    driver = GatedDriver(ProviderUnavailableError("down"))
    conv = Conversation(agent_on(driver), id="t", store=store)
    async with anyio.create_task_group() as group:

        async def first_turn() -> None:
            with pytest.raises(ProviderUnavailableError):
                await conv.run("mine")

        group.start_soon(first_turn)
        await driver.called.wait()
        # Meanwhile another writer deletes "t" and creates it again: version 1 once more.
        await store.delete("t")
        other = ConversationDocument(id="t", metadata={"who": "other"})
        await store.save(other, expected_version=0)
        driver.go.set()

    stored = await store.load("t")
    assert (stored.version, stored.document.metadata) == (1, {"who": "other"})
    assert stored.document.events == ()


@pytest.mark.parametrize("rewrite", ["save", "replace_events"])
async def test_a_rewrite_leaves_another_writers_pending_prompt_in_its_hands(
    store: SQLiteStore, rewrite: str
) -> None:
    await started(store)
    theirs_driver = GatedDriver("theirs!")
    theirs = await Conversation.load(agent_on(theirs_driver), store, "t")
    async with anyio.create_task_group() as group:

        async def their_turn() -> None:
            with pytest.raises(ConcurrentModificationError) as refused:
                await theirs.run("their prompt")
            assert refused.value.unsaved_result is not None

        group.start_soon(their_turn)
        await theirs_driver.called.wait()  # their prompt is pending in the store
        mine = await Conversation.load(agent_on(ScriptedDriver()), store, "t")
        if rewrite == "save":
            await mine.save()
        else:
            await mine.replace_events(mine.events)
        assert [text for text, _ in await pending_in(store)] == ["their prompt"]
        theirs_driver.go.set()

    # Their commit was refused (the rewrite came first), and it took back exactly its own copy.
    assert await pending_in(store) == []
    assert await answered_in(store) == ["q0", "a0"]
