"""Every handler's output opens with a user message after the system message (issue 28 §4)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from threadline import Client, HandlerError, Message, Model, Role, Tool, ToolCall
from threadline.limiting import TokenLimitEvent, UnitKind
from threadline.testing import ScriptedDriver

pytestmark = pytest.mark.anyio

MODEL = Model("fake", context_size=10_000)
OPENING = "opens with a user message"


class WordCounter:
    """3 tokens per message plus one per word; 2 for the reply."""

    def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        return 2 + sum(3 + len(m.text.split()) for m in messages)


HISTORY = [
    Message.user("what is the weather in Paris today"),
    Message.assistant("", tool_calls=[ToolCall(id="c1", name="weather", arguments="{}")]),
    Message.tool("c1", "sunny and warm all day long"),
    Message.assistant("It is sunny and warm in Paris today."),
    Message.user("and in Lisbon"),
    Message.assistant("Lisbon is sunny too."),
]


def keep_system_and_recent(event: TokenLimitEvent) -> None:
    """The seed's example handler, as written: the system message and the last messages."""
    event.messages = [event.messages[0], *event.messages[2:]]


async def run_with(handler: object, driver: ScriptedDriver) -> object:
    request = Client(driver, default_model=MODEL).request().with_system("Be brief.")
    request = request.with_messages(HISTORY).with_prompt("thanks, and tomorrow?")
    request = request.with_token_counter(WordCounter()).with_output_reserve_tokens(0)
    return await request.with_max_context_tokens(50).pre_max_tokens_reached(handler).run()


async def test_a_handler_that_leaves_an_assistant_message_first_has_the_drop_completed() -> None:
    driver = ScriptedDriver(["ok"])
    result = await run_with(keep_system_and_recent, driver)
    sent = driver.calls[0].messages
    assert [m.role for m in sent] == [Role.SYSTEM, Role.USER, Role.ASSISTANT, Role.USER]
    assert sent[1].text == "and in Lisbon"
    step = result.limiting[0]  # type: ignore[attr-defined]
    (run,) = step.handlers
    assert run.handler == "keep_system_and_recent"
    assert run.dropped_messages == 4  # the first question, then the exchange and its answer
    assert run.tokens_after == step.tokens_after == WordCounter().count(sent)
    kinds = [(unit.kind, unit.start, unit.reason) for unit in step.dropped]
    assert kinds[0][:2] == (UnitKind.USER, 1)
    assert kinds[1][:2] == (UnitKind.TOOL_EXCHANGE, 2)
    assert kinds[2][:2] == (UnitKind.ASSISTANT, 4)
    assert all(OPENING in reason for _, _, reason in kinds[1:])
    assert all(unit.handler == "keep_system_and_recent" for unit in step.dropped)


async def test_a_handler_that_puts_a_message_of_its_own_first_is_refused() -> None:
    def assistant_summary_first(event: TokenLimitEvent) -> None:
        summary = Message.assistant("Earlier we talked about the weather.")
        event.messages = [event.messages[0], summary, *event.messages[-3:]]

    driver = ScriptedDriver(["never"])
    with pytest.raises(HandlerError, match=OPENING) as info:
        await run_with(assistant_summary_first, driver)
    assert info.value.handler.endswith("assistant_summary_first")
    assert info.value.index == 1
    assert "assistant message it added" in str(info.value)
    assert driver.calls == []


async def test_a_handler_that_keeps_the_opening_untouched_is_taken_as_it_is() -> None:
    def drop_the_exchange(event: TokenLimitEvent) -> None:
        del event.messages[2:5]

    driver = ScriptedDriver(["ok"])
    result = await run_with(drop_the_exchange, driver)
    sent = driver.calls[0].messages
    assert [m.text for m in sent[1:3]] == ["what is the weather in Paris today", "and in Lisbon"]
    assert result.limiting[0].handlers[0].dropped_messages == 3  # type: ignore[attr-defined]


async def test_a_handler_that_leaves_no_user_message_to_open_with_is_refused() -> None:
    def drop_the_first(event: TokenLimitEvent) -> None:
        del event.messages[1]

    driver = ScriptedDriver(["never"])
    request = Client(driver, default_model=MODEL).request().with_system("Be brief.")
    request = request.with_messages([Message.assistant("one two three"), Message.assistant("four")])
    request = request.with_token_counter(WordCounter()).with_output_reserve_tokens(0)
    request = request.with_max_context_tokens(12).pre_max_tokens_reached(drop_the_first)
    with pytest.raises(HandlerError, match="nor everything") as info:
        await request.run()
    assert info.value.index == 1
    assert driver.calls == []
