"""``Conversation.compact()``: the driver's native compaction, committed as a transaction.

The driver's answer is added as one event in one versioned write; a driver
without native compaction, a provider that fails, an answer without a
compaction block, a cancelled call: each leaves the conversation and the
store exactly as they were, with an outcome that says why. A second writer
that got in first makes the write refuse with ``ConcurrentModificationError``.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from threadline import (
    Agent,
    Client,
    ConcurrentModificationError,
    Conversation,
    Message,
    Model,
    ProviderUnavailableError,
    Reasoning,
    Usage,
)
from threadline.drivers import ProviderCall, ProviderResponse, ReplayRules
from threadline.stores import ConversationStore
from threadline.stores.memory import MemoryStore
from threadline.stores.sqlite import SQLiteStore
from threadline.testing import ScriptedDriver

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

MODEL = Model("scripted-model", context_size=100_000)
LABEL = "scripted:scripted-model"
RULES = ReplayRules({"window"}, boundary={"window"})
STATE = json.dumps({"type": "window", "data": "opaque"})
USAGE = Usage(input_tokens=70, output_tokens=7)


class Compacting(ScriptedDriver):
    """Answers as scripted; compacts natively into one opaque ``window`` block."""

    def __init__(self, *replies: str, compacted: ProviderResponse | Exception | None = None):
        super().__init__(list(replies))
        self.compacted = compacted
        self.compact_calls: list[ProviderCall] = []

    def replay_rules(self, model: Model) -> ReplayRules:
        return RULES

    async def compact(self, call: ProviderCall) -> ProviderResponse | None:
        self.compact_calls.append(call)
        if isinstance(self.compacted, Exception):
            raise self.compacted
        return self.compacted


def compaction(state: str = STATE, provider: str = LABEL, text: str = "") -> ProviderResponse:
    reasoning = Reasoning(provider_reasoning=state, provider=provider)
    return ProviderResponse(
        message=Message.assistant(text, reasoning=reasoning),
        finish_reason="compaction",
        usage=USAGE,
        model=MODEL.name,
    )


@pytest.fixture(params=["memory", "sqlite"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> ConversationStore:
    return MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "c.db")


async def two_turns(driver: ScriptedDriver, store: ConversationStore) -> Conversation:
    conv = Conversation(Agent(Client(driver), model=MODEL), id="c1", store=store)
    await conv.run("first")
    await conv.run("second")
    return conv


async def test_applied_adds_one_event_and_later_calls_open_their_window_at_it(
    store: ConversationStore,
) -> None:
    driver = Compacting("one", "two", "three", compacted=compaction())
    conv = await two_turns(driver, store)
    usage, version = conv.total_usage, conv.version
    outcome = await conv.compact()
    assert outcome.status == "applied"
    assert outcome.applied
    assert outcome.covered_messages == 4
    assert outcome.summary_tokens is not None
    assert [m.text for m in driver.compact_calls[0].messages] == ["first", "one", "second", "two"]
    assert len(conv.events) == 5
    assert conv.version > version
    assert conv.total_usage == usage + USAGE
    await conv.run("third")
    handed = driver.calls[-1].messages
    assert [m.text for m in handed] == ["", "third"]  # only from the compaction on
    stored = await store.load("c1")
    assert stored is not None
    assert [e.message.text for e in stored.document.events] == [
        "first", "one", "second", "two", "", "third", "three"
    ]  # fmt: skip


@pytest.mark.parametrize(
    ("compacted", "status", "said"),
    [
        (None, "unsupported", "no native compaction"),
        (ProviderUnavailableError("overloaded"), "failed", "overloaded"),
        (compaction(json.dumps({"type": "other"})), "empty", "no compaction block"),
        (compaction(json.dumps({"type": "window", "data": None})), "empty", "an empty one"),
        (compaction(provider="another:model"), "empty", "tagged 'another:model'"),
        (compaction(text="a summary in words"), "empty", "not a bare compaction"),
    ],
)
async def test_a_compaction_that_cannot_be_used_changes_nothing(
    store: ConversationStore,
    compacted: ProviderResponse | Exception | None,
    status: str,
    said: str,
) -> None:
    driver = Compacting("one", "two", compacted=compacted)
    conv = await two_turns(driver, store)
    before = (conv.version, conv.events, conv.total_usage)
    stored = await store.load("c1")
    outcome = await conv.compact()
    assert outcome.status == status
    assert not outcome.applied
    assert said in outcome.detail
    assert (conv.version, conv.events, conv.total_usage) == before
    assert await store.load("c1") == stored


async def test_nothing_to_compact_is_empty_without_a_call(store: ConversationStore) -> None:
    driver = Compacting(compacted=compaction())
    conv = Conversation(Agent(Client(driver), model=MODEL), store=store)
    outcome = await conv.compact()
    assert outcome.status == "empty"
    assert driver.compact_calls == []


async def test_a_cancelled_compaction_writes_nothing(store: ConversationStore) -> None:
    class Stuck(Compacting):
        async def compact(self, call: ProviderCall) -> ProviderResponse | None:
            await anyio.sleep_forever()
            raise AssertionError("unreachable")

    conv = await two_turns(Stuck("one", "two"), store)
    before, stored = conv.events, await store.load("c1")
    with anyio.move_on_after(0.05):
        await conv.compact()
    assert conv.events == before
    assert await store.load("c1") == stored


async def test_a_second_writer_first_makes_the_compaction_refuse(store: ConversationStore) -> None:
    conv = await two_turns(Compacting("one", "two", compacted=compaction()), store)
    other = await Conversation.load(
        Agent(Client(ScriptedDriver(["elsewhere"])), model=MODEL), store, "c1"
    )
    await other.run("meanwhile")
    before = conv.events
    with pytest.raises(ConcurrentModificationError):
        await conv.compact()
    assert conv.events == before
    stored = await store.load("c1")
    assert stored is not None
    assert [e.message.text for e in stored.document.events][-2:] == ["meanwhile", "elsewhere"]
