"""clear_tool_results and clear_thinking: every turn kept, old bulk sent cleared, in batches."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from threadline import (
    Budget,
    HandlerError,
    InvalidRequestError,
    Message,
    Reasoning,
    Role,
    Tool,
    ToolCall,
)
from threadline.limiting import (
    TokenLimitEvent,
    cache_stable_units,
    check_integrity,
    clear_thinking,
    clear_tool_results,
)

# The engine itself is private; its one-step entry point is what a round runs.
from threadline.limiting._engine import apply_limits
from threadline.limiting._ledger import LimitingOutcome

pytestmark = pytest.mark.anyio


class WordCounter:
    """Incremental: 3 tokens per message plus one per word (and per reasoning word)."""

    def message_tokens(self, message: Message) -> int:
        reasoning = len(message.reasoning.text.split()) if message.reasoning else 0
        return 3 + len(message.text.split()) + len(message.tool_calls) + reasoning

    def overhead_tokens(self, tools: Sequence[Tool] = ()) -> int:
        return 2

    def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        return sum(self.message_tokens(m) for m in messages) + self.overhead_tokens(tools)


def turn(t: int, words: int = 200) -> list[Message]:
    """A question, a tool call, its result of ``words`` words, and an answer."""
    call = ToolCall(id=f"c{t}", name="read_file", arguments=f'{{"n": {t}}}')
    return [
        Message.user(f"question {t}"),
        Message.assistant(tool_calls=[call]),
        Message.tool(f"c{t}", f"result {t} " + "data " * words, name="read_file"),
        Message.assistant(f"answer {t}"),
    ]


def conversation(turns: int, words: int = 200) -> list[Message]:
    messages = [Message.system("be brief")]
    for t in range(turns):
        messages += turn(t, words)
    return [*messages, Message.user("the prompt now")]


async def limit(
    messages: Sequence[Message], prompt_tokens: int, pre: object, post: object = None
) -> LimitingOutcome:
    return await apply_limits(
        messages,
        counter=WordCounter(),
        budget=Budget(limit=prompt_tokens + 10, reserve=10),
        pre=pre,  # type: ignore[arg-type]
        post=post,  # type: ignore[arg-type]
    )


def results(messages: Sequence[Message]) -> list[str]:
    return [m.text for m in messages if m.role is Role.TOOL]


async def test_old_results_are_sent_as_a_note_naming_the_tool_and_its_tokens() -> None:
    messages = conversation(10)
    outcome = await limit(messages, 2_000, clear_tool_results(keep=3))

    sent = results(outcome.messages)
    cleared = [text for text in sent if text.startswith("[tool result cleared")]
    assert sent[-3:] == results(messages)[-3:]  # the newest three as they were
    assert cleared
    assert all("read_file returned 205 tokens" in text for text in cleared)
    assert outcome.record.tokens_after <= 2_000 * 0.6
    check_integrity(outcome.messages)
    # Every other message is the very one given: only the results' content changed.
    assert [m for m in outcome.messages if m.role is not Role.TOOL] == [
        m for m in messages if m.role is not Role.TOOL
    ]
    assert [m.tool_call_id for m in outcome.messages if m.role is Role.TOOL] == [
        f"c{t}" for t in range(10)
    ]


async def test_the_ledger_lists_what_was_cleared_not_dropped() -> None:
    messages = conversation(10)
    outcome = await limit(messages, 2_000, clear_tool_results(keep=3))
    record = outcome.record

    assert record.dropped == []
    assert [c.call_id for c in record.cleared] == [f"c{t}" for t in range(len(record.cleared))]
    first = record.cleared[0]
    assert (first.index, first.what, first.tool, first.tokens) == (
        3,
        "tool result",
        "read_file",
        205,
    )
    assert record.handlers[0].cleared_messages == len(record.cleared)
    assert f"cleared {len(record.cleared)} messages" in record.summary()


async def test_a_transcript_that_fits_is_left_as_it_is() -> None:
    messages = conversation(3)
    outcome = await limit(messages, 10_000, clear_tool_results())
    assert outcome.messages == tuple(messages)
    assert outcome.record.cleared == ()


async def test_the_live_exchange_and_small_results_are_never_cleared() -> None:
    call = ToolCall(id="live", name="read_file")
    messages = [
        *conversation(6)[:-1],
        Message.user("q", origin="turn"),
        Message.assistant(tool_calls=[call], origin="turn"),
        Message.tool("live", "big " * 400, name="read_file", origin="turn"),
    ]
    messages.insert(5, Message.user("small one"))
    small = ToolCall(id="small", name="stat")
    messages[6:6] = [Message.assistant(tool_calls=[small]), Message.tool("small", "ok " * 20)]
    messages.insert(8, Message.assistant("fine"))
    outcome = await limit(messages, 1_200, clear_tool_results(keep=0, min_tokens=50))

    sent = {m.tool_call_id: m.text for m in outcome.messages if m.role is Role.TOOL}
    assert sent["live"] == "big " * 400  # pinned: the model has not seen it yet
    assert sent["small"] == "ok " * 20  # under min_tokens
    assert sent["c0"].startswith("[tool result cleared")
    check_integrity(outcome.messages)


async def test_the_same_results_are_cleared_again_and_no_more_until_the_budget_is_reached() -> None:
    handler = clear_tool_results(keep=2)
    messages = conversation(10)
    first = await limit(messages, 1_600, handler)
    # A new turn of the same size: the old cut still fits, so the prefix holds.
    grown = [*messages[:-1], *turn(10), messages[-1]]
    second = await limit(grown, 1_600, handler)
    assert second.messages[: len(first.messages) - 1] == first.messages[:-1]
    assert len(second.record.cleared) == len(first.record.cleared)
    # Enough turns later, a new batch: down to the mark again, in one step.
    later = [*messages[:-1], *(m for t in range(10, 14) for m in turn(t)), messages[-1]]
    third = await limit(later, 1_600, handler)
    assert len(third.record.cleared) > len(first.record.cleared) + 1
    assert third.record.tokens_after <= 1_600 * 0.6


async def test_a_batch_that_cannot_reach_the_mark_is_left_to_the_post_handler() -> None:
    messages = conversation(10)
    # keep=8: clearing two results cannot bring 2,200 tokens down to 600.
    outcome = await limit(messages, 1_000, clear_tool_results(keep=8), cache_stable_units())
    assert outcome.record.cleared == ()
    assert [run.handler for run in outcome.record.handlers] == [
        "clear_tool_results",
        "cache_stable_units",
    ]
    assert outcome.record.tokens_after <= 1_000 * 0.6
    check_integrity(outcome.messages)


async def test_clearing_composes_with_a_cut_as_post() -> None:
    messages = conversation(30)
    outcome = await limit(messages, 2_000, clear_tool_results(keep=3), cache_stable_units())
    check_integrity(outcome.messages)
    assert outcome.record.tokens_after <= 2_000
    assert outcome.messages[-1] == messages[-1]


async def test_old_reasoning_is_cleared_but_never_the_current_cycle() -> None:
    thought = Reasoning(text="thinking " * 100, provider_reasoning=b'{"type": "reasoning"}')
    messages: list[Message] = [Message.system("be brief")]
    for t in range(6):
        messages += [
            Message.user(f"q{t}"),
            Message.assistant(f"a{t}", reasoning=thought),
        ]
    call = ToolCall(id="now", name="read_file")
    messages += [
        Message.user("now", origin="turn"),
        Message.assistant(tool_calls=[call], reasoning=thought, origin="turn"),
        Message.tool("now", "fine", origin="turn"),
        Message.assistant(tool_calls=[ToolCall(id="again", name="read_file")], reasoning=thought),
        Message.tool("again", "fine"),
    ]
    outcome = await limit(messages, 700, clear_thinking(keep=1))

    replies = [m for m in outcome.messages if m.role is Role.ASSISTANT]
    assert [m.reasoning is None for m in replies[:6]] == [True] * 5 + [False]
    assert all(m.reasoning == thought for m in replies[6:])  # this run's cycle
    assert [m.text for m in replies[:6]] == [f"a{t}" for t in range(6)]
    assert {c.what for c in outcome.record.cleared} == {"reasoning"}
    check_integrity(outcome.messages)


def test_bad_arguments_are_refused_naming_them() -> None:
    with pytest.raises(InvalidRequestError, match="keep"):
        clear_tool_results(keep=-1)
    with pytest.raises(InvalidRequestError, match="min_tokens"):
        clear_tool_results(min_tokens=-5)
    with pytest.raises(InvalidRequestError, match="low_water"):
        clear_thinking(low_water=0)
    with pytest.raises(InvalidRequestError, match=r"\['path'\]"):
        clear_tool_results(placeholder="cleared {path}")
    with pytest.raises(InvalidRequestError, match="format string"):
        clear_tool_results(placeholder="cleared {tool")


async def test_a_placeholder_of_ones_own_is_filled_in() -> None:
    handler = clear_tool_results(keep=1, placeholder="({tokens} tokens of {tool}, {call_id})")
    outcome = await limit(conversation(6), 800, handler)
    assert "(205 tokens of read_file, c0)" in results(outcome.messages)[0]


def test_event_clear_refuses_a_pinned_message_or_a_changed_shape() -> None:
    messages = conversation(2)
    event = TokenLimitEvent(messages, budget_tokens=10, counter=WordCounter())
    result = messages[3]
    with pytest.raises(InvalidRequestError, match="pinned"):
        event.clear(len(messages) - 1, Message.user("x"), reason="r", tokens=1)
    with pytest.raises(InvalidRequestError, match="tool call id"):
        event.clear(3, Message.tool("other", "x", name="read_file"), reason="r", tokens=1)
    with pytest.raises(InvalidRequestError, match="reason"):
        event.clear(3, Message.tool("c0", "x", name="read_file"), reason=" ", tokens=1)
    event.clear(3, Message.tool("c0", "x", name="read_file"), reason="why", tokens=200)
    assert event.messages[3].text == "x"
    assert messages[3] is result


async def test_the_engine_refuses_a_cleared_message_moved_elsewhere() -> None:
    async def mover(event: TokenLimitEvent) -> None:
        event.clear(3, Message.tool("c0", "x", name="read_file"), reason="why", tokens=1)
        cleared = event.messages[3]
        others = [m for m in event.messages if m is not cleared]
        # The result now stands after the other exchange's result: not where it was.
        event.messages = [*others[:7], cleared, *others[7:]]

    with pytest.raises(HandlerError):
        await limit(conversation(3), 50, mover)


def test_a_compaction_outcome_of_ones_own_is_checked() -> None:
    event = TokenLimitEvent(conversation(1), budget_tokens=10, counter=WordCounter())
    with pytest.raises(InvalidRequestError, match="status"):
        event.note_compaction("weird", covered_messages=1, covered_tokens=1)  # type: ignore[arg-type]
