"""ScriptedDriver's pretend usage: the sum over what was sent, each message priced once."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

import threadline.testing
from threadline import Agent, Client, Conversation, Message, Model
from threadline.counting import estimate_message_tokens
from threadline.drivers import ProviderCall
from threadline.testing import ScriptedDriver

pytestmark = pytest.mark.anyio

MODEL = Model("scripted-model", context_size=1_000_000)


async def test_a_long_conversation_prices_only_the_messages_new_to_each_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    priced: list[Message] = []

    def spy(message: Message) -> int:
        priced.append(message)
        return estimate_message_tokens(message)

    monkeypatch.setattr(threadline.testing, "estimate_message_tokens", spy)
    driver = ScriptedDriver([f"answer {turn}" for turn in range(40)])
    conversation = Conversation(Agent(Client(driver), model=MODEL))
    per_turn = []
    for turn in range(40):
        before = len(priced)
        result = await conversation.run(f"question {turn}")
        per_turn.append(len(priced) - before)
        sent = driver.calls[-1].messages
        assert result.response.usage.input_tokens == sum(map(estimate_message_tokens, sent))
    # A turn prices its prompt, the last turn's two messages again (they come
    # back as seed copies) and its reply: never the history.
    assert per_turn[1:] == [per_turn[1]] * 39
    assert per_turn[1] <= 4


MESSAGES = [Message.user(f"question {i} " * i) for i in range(6)] + [
    Message.assistant(f"answer {i}") for i in range(6)
]


@given(st.lists(st.lists(st.sampled_from(MESSAGES), max_size=8), min_size=1, max_size=6))
def test_input_usage_is_the_sum_over_what_was_sent_however_the_history_was_cut_or_edited(
    calls: list[list[Message]],
) -> None:
    driver = ScriptedDriver(["ok"] * len(calls))

    async def send_all() -> list[int]:
        usages = []
        for sent in calls:
            response = await driver.complete(ProviderCall(model=MODEL, messages=tuple(sent)))
            usages.append(response.usage.input_tokens)
        return usages

    priced = anyio.run(send_all)
    assert priced == [sum(map(estimate_message_tokens, sent)) for sent in calls]


async def test_a_history_edited_in_the_middle_is_priced_as_sent() -> None:
    driver = ScriptedDriver(["ok", "ok"])
    history = [Message.user("a" * 400), Message.assistant("b"), Message.user("c")]
    await driver.complete(ProviderCall(model=MODEL, messages=tuple(history)))
    history[0] = Message.user("short")  # the same place, other content
    response = await driver.complete(ProviderCall(model=MODEL, messages=tuple(history)))
    assert response.usage.input_tokens == sum(map(estimate_message_tokens, history))
