"""What is sent is what is counted: the replay rules apply before any count is taken."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import pytest

from threadline import (
    Agent,
    Client,
    Conversation,
    Message,
    Model,
    Reasoning,
)
from threadline.counting import BuiltinTokenCounter, DefaultReplayProjection
from threadline.testing import ScriptedDriver
from threadline.tools import Tool

pytestmark = pytest.mark.anyio

MODEL = Model("fake", context_size=100_000)
OURS = "scripted:fake"
THOUGHT = " ".join(f"a long thought number {n}" for n in range(60))
THINKING = f'[{{"type": "thinking", "thinking": "{THOUGHT}", "signature": "sig"}}]'.encode()
COUNTS_STATE = BuiltinTokenCounter(projection=DefaultReplayProjection())


def without_state(messages: Sequence[Message]) -> list[Message]:
    return [
        m
        if m.reasoning is None
        else attrs.evolve(m, reasoning=attrs.evolve(m.reasoning, provider_reasoning=b""))
        for m in messages
    ]


def seeded(provider: str | None) -> list[Message]:
    reasoning = Reasoning(text="shown", provider_reasoning=THINKING, provider=provider)
    return [Message.user("q"), Message.assistant("a", reasoning=reasoning)]


class RecordingExactCounter:
    """An exact counter that remembers what it was asked to count."""

    def __init__(self) -> None:
        self.asked: list[tuple[Message, ...]] = []

    async def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        self.asked.append(tuple(messages))
        return COUNTS_STATE.count(messages, tools)


async def test_reasoning_left_out_for_another_model_is_not_counted() -> None:
    driver = ScriptedDriver(["ok"])
    request = Client(driver, default_model=MODEL, token_counter=COUNTS_STATE).request()
    history = seeded("anthropic:another-model")
    result = await request.with_messages(history).with_prompt("again").run()
    sent = driver.calls[0].messages
    assert sent[1].reasoning is not None
    assert not sent[1].reasoning.has_provider_reasoning()
    record = result.rounds[0]
    assert record.estimated_input_tokens == COUNTS_STATE.count(sent)
    assert record.estimated_input_tokens < COUNTS_STATE.count([*history, Message.user("again")])
    assert record.limiting is not None
    assert record.limiting.tokens_after == record.estimated_input_tokens
    assert result.messages[1] is history[1]  # the transcript keeps the state


async def test_reasoning_of_this_model_is_counted_as_it_is_sent() -> None:
    driver = ScriptedDriver(["ok"])
    request = Client(driver, default_model=MODEL, token_counter=COUNTS_STATE).request()
    history = seeded(OURS)
    result = await request.with_messages(history).with_prompt("again").run()
    sent = driver.calls[0].messages
    assert sent[1] is history[1]
    assert result.rounds[0].estimated_input_tokens == COUNTS_STATE.count(sent)
    assert result.rounds[0].estimated_input_tokens > COUNTS_STATE.count(without_state(sent))


async def test_the_exact_counter_counts_what_is_sent() -> None:
    exact = RecordingExactCounter()
    driver = ScriptedDriver(["ok"])
    client = Client(driver, default_model=MODEL, token_counter=COUNTS_STATE)
    request = client.request().with_exact_token_counter(exact).with_max_context_tokens(4196)
    request = request.with_exact_count_margin(0.99)  # a prompt budget of 100: always near
    result = await request.with_messages(seeded("other:model")).with_prompt("again").run()
    # Without the state it left out, the history fits: nothing is dropped for it.
    assert len(driver.calls[0].messages) == 3
    assert exact.asked == [driver.calls[0].messages]
    assert result.rounds[0].exact_input_tokens == COUNTS_STATE.count(driver.calls[0].messages)


async def test_the_helpers_that_count_outside_a_run_count_what_would_be_sent() -> None:
    driver = ScriptedDriver(["ok"])
    client = Client(driver, default_model=MODEL, token_counter=COUNTS_STATE)
    history = seeded("other:model")
    handed = without_state(history)
    budget = COUNTS_STATE.count([*handed, Message.user("again")]) + 4096
    request = client.request().with_messages(history).with_prompt("again")
    assert not await request.with_max_context_tokens(budget).is_token_limit_reached()
    await request.run()
    foreign = Reasoning(provider_reasoning=THINKING, provider="other:model")
    driver.add_replies([Message.assistant("one", reasoning=foreign)])
    conv = Conversation(Agent(client, model=MODEL))
    await conv.run("q")
    assert conv.model_input[-1].reasoning == foreign
    assert conv.token_estimate() == COUNTS_STATE.count(without_state(conv.model_input))
