"""A boundary block (``ReplayRules.boundary``) opens the sent window, for any driver.

The run loop hands a driver only the messages from the latest message whose
sent state holds a boundary block (system messages kept), counts exactly
that, and the conversation's transcript still holds everything.
"""

from __future__ import annotations

import json

import pytest

from threadline import (
    Agent,
    Client,
    Conversation,
    InvalidRequestError,
    Message,
    Model,
    Reasoning,
)
from threadline.drivers import ReplayRules
from threadline.testing import ScriptedDriver

pytestmark = pytest.mark.anyio

MODEL = Model("fake", context_size=100_000)
OURS = "scripted:fake"
RULES = ReplayRules({"reasoning", "compaction"}, boundary={"compaction"})


class WindowDriver(ScriptedDriver):
    """A test double that declares rules with a boundary, as the Responses driver does."""

    def replay_rules(self, model: Model) -> ReplayRules:
        return RULES


def compacted(words: str, provider: str = OURS) -> Message:
    state = json.dumps({"type": "compaction", "id": "cmp", "encrypted_content": "x"})
    reasoning = Reasoning(provider_reasoning=state, provider=provider)
    return Message.assistant(words, reasoning=reasoning)


def test_a_boundary_must_be_a_block_the_rules_send() -> None:
    with pytest.raises(InvalidRequestError, match="boundary"):
        ReplayRules({"reasoning"}, boundary={"compaction"})
    with pytest.raises(InvalidRequestError, match="boundary"):
        ReplayRules(boundary={"compaction"})
    with pytest.raises(InvalidRequestError, match="boundary"):
        ReplayRules({"compaction"}, boundary="compaction")
    assert not RULES.opens_window(b'{"type": "reasoning"}')
    assert RULES.opens_window(b'[{"type": "reasoning"}, {"type": "compaction", "content": "s"}]')
    assert not ReplayRules({"compaction"}).opens_window(b'{"type": "compaction", "content": "s"}')


@pytest.mark.parametrize(
    "block",
    [
        {"type": "compaction"},
        {"type": "compaction", "content": None},  # Anthropic's block when the summary failed
        {"type": "compaction", "content": "  \n"},
        {"type": "compaction", "id": "cmp_1", "encrypted_content": ""},
        {"type": "compaction", "content": [], "cache_control": {"type": "ephemeral"}},
    ],
)
def test_a_boundary_block_that_carries_nothing_opens_no_window(block: dict[str, object]) -> None:
    # The turns before it would reach the model as nothing: a failed compaction is a no-op.
    assert not RULES.opens_window(json.dumps(block).encode())
    assert not RULES.opens_window(json.dumps([{"type": "reasoning"}, block]).encode())
    assert RULES.opens_window(json.dumps([block, {"type": "compaction", "content": "s"}]).encode())


async def test_a_failed_compaction_keeps_the_whole_history_sent() -> None:
    driver = WindowDriver(["fine"])
    failed = Reasoning(provider_reasoning='{"type": "compaction", "content": null}', provider=OURS)
    history = [Message.user("q1"), Message.assistant("a1", reasoning=failed), Message.user("q2")]
    await Client(driver, default_model=MODEL).request().with_messages(history).run()
    assert [m.text for m in driver.calls[0].messages] == ["q1", "a1", "q2"]


async def test_the_driver_is_handed_the_window_and_the_rest_is_kept() -> None:
    driver = WindowDriver(["fine"])
    history = [
        Message.system("be brief"),
        Message.user("old " * 300),
        compacted("first"),
        Message.user("q2"),
        compacted("second"),
        Message.user("q3"),
    ]
    client = Client(driver, default_model=MODEL)
    result = await client.request().with_messages(history).with_prompt("q4").run()
    handed = driver.calls[0].messages
    assert [m.text for m in handed] == ["be brief", "second", "q3", "q4"]
    assert result.rounds[0].estimated_input_tokens < 100  # counted as handed over
    assert result.text == "fine"


async def test_another_model_s_boundary_opens_nothing_and_is_recorded() -> None:
    driver = WindowDriver(["fine"])
    history = [Message.user("q1"), compacted("first", provider="other:model")]
    result = (
        await Client(driver, default_model=MODEL)
        .request()
        .with_messages(history)
        .with_prompt("q2")
        .run()
    )
    assert [m.text for m in driver.calls[0].messages] == ["q1", "first", "q2"]
    assert driver.calls[0].messages[1].reasoning.provider_reasoning == b""  # type: ignore[union-attr]
    assert [note.index for note in result.rounds[0].reasoning_dropped] == [1]


async def test_a_conversation_keeps_every_turn_and_sends_from_the_window() -> None:
    driver = WindowDriver(["one", compacted("two"), "three", "four"])
    chat = Conversation(Agent(Client(driver), model=MODEL, instructions="sys"))
    for turn in range(1, 5):
        await chat.run(f"q{turn}")
    assert [m.text for m in driver.calls[3].messages] == ["sys", "two", "q3", "three", "q4"]
    # Every turn is kept.
    assert [m.text for m in chat.messages][::2] == ["q1", "q2", "q3", "q4"]
