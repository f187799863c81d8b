"""history_limit: the window is never smaller than the limit and never opens inside a turn."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from threadline import Agent, Client, Conversation, Message, Model, Role, ToolCall
from threadline.conversation._transcript import Transcript  # private: the index itself
from threadline.limiting import check_integrity
from threadline.serialization import ConversationEvent
from threadline.testing import ScriptedDriver

pytestmark = pytest.mark.anyio

MODEL = Model("scripted-model", context_size=100_000)


def turn(turn_id: int, tool_rounds: int = 0) -> list[ConversationEvent]:
    """A user prompt, ``tool_rounds`` tool exchanges (two calls each), a final answer."""
    messages = [Message.user(f"question {turn_id}")]
    for r in range(tool_rounds):
        ids = [f"t{turn_id}-{r}-{k}" for k in range(2)]
        messages.append(Message.assistant(tool_calls=[ToolCall(id=i, name="lookup") for i in ids]))
        messages.extend(Message.tool(i, f"result {i}") for i in ids)
    messages.append(Message.assistant(f"answer {turn_id}"))
    return [ConversationEvent(message=m, turn_id=turn_id) for m in messages]


def transcript_of(shape: list[int]) -> list[ConversationEvent]:
    return [event for turn_id, rounds in enumerate(shape) for event in turn(turn_id, rounds)]


async def conversation_of(
    shape: list[int], history_limit: int
) -> tuple[Conversation, ScriptedDriver]:
    driver = ScriptedDriver()
    conv = Conversation(Agent(Client(driver), model=MODEL), history_limit=history_limit)
    await conv.replace_events(transcript_of(shape))
    return conv, driver


@given(
    shape=st.lists(st.integers(min_value=0, max_value=3), min_size=0, max_size=12),
    limit=st.integers(min_value=0, max_value=60),
)
def test_the_window_is_the_shortest_whole_turn_suffix_holding_the_limit(
    shape: list[int], limit: int
) -> None:
    events = transcript_of(shape)
    transcript = Transcript(events)

    window = transcript.window(limit)
    start = transcript.window_start(limit)

    assert window == [e.message for e in events[start:]]
    if limit == 0 or limit >= len(events):
        assert start == 0
        return
    assert len(window) >= limit
    assert window[0].role is Role.USER
    check_integrity(window)
    # No later user message would still hold the limit: the window is as short as it can be.
    later_users = [i for i in transcript.user_indices() if i > start]
    assert all(len(events) - i < limit for i in later_users)


async def test_a_limit_on_a_plain_answer_widens_to_its_question() -> None:
    conv, _ = await conversation_of([0, 0, 0], history_limit=3)
    assert [m.text for m in conv.messages] == ["question 1", "answer 1", "question 2", "answer 2"]


async def test_a_cut_on_a_tool_result_widens_to_the_call_and_its_turns_prompt() -> None:
    # Turn 1 is: question, call (2 calls), result, result, answer.
    conv, _ = await conversation_of([0, 1, 0], history_limit=4)
    window = conv.messages
    assert window[0].text == "question 1"
    assert [m.role for m in window] == [
        Role.USER,
        Role.ASSISTANT,
        Role.TOOL,
        Role.TOOL,
        Role.ASSISTANT,
        Role.USER,
        Role.ASSISTANT,
    ]


async def test_zero_and_a_limit_past_the_transcript_send_everything() -> None:
    conv, _ = await conversation_of([0, 1, 0], history_limit=0)
    assert len(conv.messages) == len(conv.events)
    conv.history_limit = 1000
    assert len(conv.messages) == len(conv.events)


async def test_the_window_is_what_the_next_run_sends_and_a_new_limit_applies_next_run() -> None:
    conv, driver = await conversation_of([0, 0, 0], history_limit=2)
    driver.add_replies(["answer 3", "answer 4"])

    await conv.run("question 3")
    assert [m.text for m in driver.calls[0].messages] == ["question 2", "answer 2", "question 3"]

    conv.history_limit = 0
    await conv.run("question 4")
    assert len(driver.calls[1].messages) == len(conv.events) - 1
    assert [e.message.text for e in conv.events][:2] == ["question 0", "answer 0"]


async def test_the_transcript_keeps_every_turn_whatever_the_window() -> None:
    driver = ScriptedDriver([f"answer {i}" for i in range(6)])
    conv = Conversation(Agent(Client(driver), model=MODEL), history_limit=2)
    for i in range(6):
        await conv.run(f"question {i}")

    assert len(conv.events) == 12
    assert conv.turn_count() == 6
    assert len(driver.calls[-1].messages) == 3
    assert conv.messages == tuple(e.message for e in conv.events[-2:])


async def test_the_window_setting_travels_with_the_saved_conversation() -> None:
    conv, _ = await conversation_of([0, 1, 0, 0], history_limit=5)
    restored = Conversation.from_json(conv.agent, conv.to_json())
    assert restored.history_limit == 5
    assert restored.messages == conv.messages
