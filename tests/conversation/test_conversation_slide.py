"""Under drop_oldest_units a conversation sends what the last cut left: the same
messages the whole window would have been cut to, turn after turn."""

from __future__ import annotations

import pytest

from threadline import Agent, Client, Conversation, Message, Model, ToolCall
from threadline.counting import ApproximateCounter
from threadline.limiting import TokenLimitEvent, drop_oldest_units
from threadline.testing import ScriptedDriver

pytestmark = pytest.mark.anyio

BUDGET = 300


def _agent(driver: ScriptedDriver, **options: object) -> Agent:
    return Agent(
        Client(driver),
        model=Model("scripted-model", context_size=100_000),
        instructions="You answer in one sentence.",
        max_context_tokens=BUDGET + 50,
        output_reserve_tokens=50,
        token_counter=ApproximateCounter(),
        **options,  # type: ignore[arg-type]
    )


def _replies(turn: int) -> list[str | Message]:
    """A plain answer, or every third turn a tool call and then the answer."""
    answer = f"answer {turn}: " + "cold and windy up there " * (1 + turn % 4)
    if turn % 3:
        return [answer]
    call = ToolCall(id=f"call-{turn}", name="weather", arguments='{"city": "Oslo"}')
    return [Message.assistant(tool_calls=[call]), answer]


async def _weather(city: str) -> str:
    """The weather in a city."""
    return f"{city}: rain " * 5


async def _sent_by(pre: object, turns: int) -> tuple[list[tuple[Message, ...]], int]:
    """What each call was sent, and how many units the last turn's ledger lists as dropped."""
    driver = ScriptedDriver()
    conv = Conversation(_agent(driver, tools=[_weather]), pre_max_tokens_reached=pre)
    for turn in range(turns):
        driver.add_replies(_replies(turn))
        result = await conv.run(f"question {turn}: " + "what about the mountains " * (turn % 5))
    dropped = sum(len(record.dropped) for record in result.limiting)
    return [call.messages for call in driver.calls], dropped


async def test_a_sliding_conversation_sends_what_the_whole_window_is_cut_to() -> None:
    built_in = drop_oldest_units(None)

    async def whole_window(event: TokenLimitEvent) -> None:
        await built_in(event)  # type: ignore[misc]  # the same cut, of the whole window

    sliding, dropped_now = await _sent_by(drop_oldest_units(None), 40)
    reference, dropped_since_the_start = await _sent_by(whole_window, 40)
    assert sliding == reference
    assert len(sliding[-1]) < 40 < 2 * 40  # the budget did cut: 40 turns sent less than 40 messages
    assert dropped_now < dropped_since_the_start  # and the turn sent only what the cut left


async def test_a_larger_budget_brings_back_what_the_slide_left_out() -> None:
    driver = ScriptedDriver()
    conv = Conversation(_agent(driver), pre_max_tokens_reached=drop_oldest_units(None))
    for turn in range(30):
        driver.add_replies([f"answer {turn}: " + "it rains " * 10])
        await conv.run(f"question {turn}: " + "and then " * 10)
    cut = len(driver.calls[-1].messages)
    conv.max_context_tokens = 100_000
    driver.add_replies(["all of it"])
    await conv.run("everything?")
    assert len(driver.calls[-1].messages) == 1 + 60 + 1 > cut
