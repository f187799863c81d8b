"""Reasoning replay rules hold in the run loop, for every driver (SPEC §2)."""

from __future__ import annotations

import pytest

from threadline import (
    Agent,
    Client,
    Conversation,
    InvalidRequestError,
    Message,
    Model,
    Origin,
    Reasoning,
    ToolCall,
    tool,
)
from threadline.limiting import DroppedReasoning
from threadline.serialization import ConversationEvent
from threadline.testing import ScriptedDriver

pytestmark = pytest.mark.anyio

MODEL = Model("fake", context_size=8192)
OURS = "scripted:fake"
THINKING = b'[{"type": "thinking", "thinking": "t", "signature": "sig"}]'

REFUSED = [
    (b"{not json", "not valid JSON"),
    (b'{"type": "text", "text": "I am the assistant"}', '"type": "text"'),
    (b'[{"type": "thinking"}, {"type": "text", "text": "x"}]', '"type": "text"'),
]


def history(reasoning: Reasoning) -> list[Message]:
    return [Message.user("q"), Message.assistant("a", reasoning=reasoning)]


@pytest.mark.parametrize(("state", "complaint"), REFUSED)
async def test_the_test_double_is_never_sent_refused_replay_state(
    state: bytes, complaint: str
) -> None:
    driver = ScriptedDriver(["never"])
    request = Client(driver, default_model=MODEL).request().with_prompt("again")
    request = request.with_messages(history(Reasoning(provider_reasoning=state, provider=OURS)))
    with pytest.raises(InvalidRequestError, match="message 1") as info:
        await request.run()
    assert complaint in str(info.value)
    with pytest.raises(InvalidRequestError, match="message 1"):
        await request.stream().__aenter__()  # refused on entry, before any event
    assert driver.calls == []


async def test_a_reply_with_refused_replay_state_is_not_sent_back() -> None:
    @tool
    def clock() -> str:
        """The time."""
        return "noon"

    bad = Reasoning(provider_reasoning=b'{"type": "text", "text": "x"}', provider=OURS)
    calling = Message.assistant(tool_calls=[ToolCall(id="c1", name="clock")], reasoning=bad)
    driver = ScriptedDriver([calling, "never"])
    request = Client(driver, default_model=MODEL).request().with_prompt("time?")
    with pytest.raises(InvalidRequestError, match='"type": "text"'):
        await request.with_tools([clock]).run()
    assert len(driver.calls) == 1


@pytest.mark.parametrize("state", [b"", b"   ", b"null", THINKING])
async def test_empty_or_well_formed_replay_state_is_sent(state: bytes) -> None:
    driver = ScriptedDriver(["ok"])
    reasoning = Reasoning(provider_reasoning=state, provider=OURS)
    request = Client(driver, default_model=MODEL).request().with_messages(history(reasoning))
    result = await request.with_prompt("again").run()
    assert driver.calls[0].messages[1].reasoning == reasoning
    assert result.reasoning_dropped == ()


@pytest.mark.parametrize("provider", ["anthropic:claude-x", "scripted:another-model", None])
async def test_reasoning_from_another_provider_or_model_is_left_out_and_recorded(
    provider: str | None,
) -> None:
    driver = ScriptedDriver(["one", "two"])
    client = Client(driver, default_model=MODEL)
    reasoning = Reasoning(text="shown", provider_reasoning=THINKING, provider=provider)
    seed = history(reasoning)
    for _ in range(2):  # the same every time: deterministic
        result = await client.request().with_messages(seed).with_prompt("again").run()
        sent = driver.calls[-1].messages[1]
        assert sent.text == "a"
        assert sent.reasoning is not None
        assert not sent.reasoning.has_provider_reasoning()
        assert sent.reasoning.text == "shown"
        dropped = DroppedReasoning(index=1, provider=provider, sent_to=OURS)
        assert result.rounds[0].reasoning_dropped == (dropped,)
        assert result.reasoning_dropped == (dropped,)
        assert "left out of the call to scripted:fake" in str(dropped)
        # The transcript keeps the message as it was; only the call lost the state.
        assert result.messages[1] is seed[1]


async def test_reasoning_of_this_driver_and_model_is_replayed() -> None:
    driver = ScriptedDriver(["ok"])
    reasoning = Reasoning(provider_reasoning=THINKING, provider=OURS)
    request = Client(driver, default_model=MODEL).request().with_messages(history(reasoning))
    result = await request.with_prompt("again").run()
    assert driver.calls[0].messages[1].reasoning == reasoning
    assert result.rounds[0].reasoning_dropped == ()


async def test_a_conversation_leaves_out_foreign_reasoning_of_every_earlier_turn() -> None:
    foreign = Reasoning(text="shown", provider_reasoning=THINKING, provider="anthropic:claude-x")
    ours = Reasoning(text="mine", provider_reasoning=THINKING, provider=OURS)
    replies = [
        Message.assistant("one", reasoning=foreign),
        "two",
        Message.assistant("three", reasoning=ours),
        "four",
    ]
    driver = ScriptedDriver(replies)
    conv = Conversation(Agent(Client(driver), model=MODEL, instructions="Be brief."))
    for prompt in ("a", "b", "c", "d"):
        result = await conv.run(prompt)
    sent = driver.calls[-1].messages  # system, then a, one, b, two, c, three, d
    assert [m.text for m in sent] == ["Be brief.", "a", "one", "b", "two", "c", "three", "d"]
    assert sent[2].reasoning is not None
    assert not sent[2].reasoning.has_provider_reasoning()
    assert sent[6].reasoning == ours
    assert result.reasoning_dropped == (
        DroppedReasoning(index=2, provider="anthropic:claude-x", sent_to=OURS),
    )
    assert conv.events[1].message.reasoning == foreign  # the transcript keeps it


async def test_a_conversation_refuses_replay_state_its_installed_events_hold() -> None:
    bad = Reasoning(provider_reasoning=b"{not json", provider=OURS)
    driver = ScriptedDriver(["never"])
    conv = Conversation(Agent(Client(driver), model=MODEL))
    events = [
        ConversationEvent(message=Message.user("q", origin=Origin.TURN), turn_id=0),
        ConversationEvent(
            message=Message.assistant("a", reasoning=bad, origin=Origin.TURN), turn_id=0
        ),
    ]
    await conv.replace_events(events)
    with pytest.raises(InvalidRequestError, match=r"message 1.*not valid JSON"):
        await conv.run("again")
    assert driver.calls == []
