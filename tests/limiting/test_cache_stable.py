"""The cache-stable handler, rule by rule: a deep cut, whole units, a stable prefix."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import pytest

from threadline import Budget, InvalidRequestError, Message, Role, Tool, ToolCall
from threadline.limiting import (
    DEFAULT_LOW_WATER,
    CacheStableUnits,
    cache_stable_units,
    check_integrity,
)

# The engine itself is private; its one-step entry point is what a round runs.
from threadline.limiting._engine import apply_limits
from threadline.limiting._ledger import LimitingOutcome

pytestmark = pytest.mark.anyio


class WordCounter:
    """Incremental: 3 tokens per message plus one per word; 2 per reply."""

    def message_tokens(self, message: Message) -> int:
        return 3 + len(message.text.split()) + len(message.tool_calls)

    def overhead_tokens(self, tools: Sequence[Tool] = ()) -> int:
        return 2 + 10 * len(tools)

    def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        return sum(self.message_tokens(m) for m in messages) + self.overhead_tokens(tools)


class PlainCounter:
    """Not incremental, and not a sum: every fourth message costs 4 more."""

    def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        words = sum(len(m.text.split()) + len(m.tool_calls) for m in messages)
        return 2 + 3 * len(messages) + words + 4 * (len(messages) // 4)


def turns(count: int, *, words: int = 6, start: int = 0) -> list[Message]:
    """``count`` question-and-answer turns, every message ``words`` words long (+ a tag)."""
    messages: list[Message] = []
    for t in range(start, start + count):
        messages.append(Message.user(f"q{t} " + "word " * (words - 1)))
        messages.append(Message.assistant(f"a{t} " + "word " * (words - 1)))
    return messages


async def limit(
    messages: Sequence[Message], prompt_tokens: int, handler: object, counter: object = None
) -> LimitingOutcome:
    return await apply_limits(
        messages,
        counter=counter or WordCounter(),  # type: ignore[arg-type]
        budget=Budget(limit=prompt_tokens + 10, reserve=10),
        pre=handler,  # type: ignore[arg-type]
        prompt_index=len(messages) - 1,
    )


def transcript(history: int) -> list[Message]:
    return [Message.system("be brief"), *turns(history), Message.user("the prompt now")]


async def test_a_transcript_that_fits_is_left_as_it_is() -> None:
    messages = transcript(4)
    outcome = await limit(messages, 1_000, cache_stable_units())
    assert outcome.messages == tuple(messages)
    assert outcome.record.handlers == ()


async def test_over_budget_it_cuts_down_to_the_low_water_mark_not_just_under_the_budget() -> None:
    messages = transcript(20)  # 2 + 5 + 40 * 9 + 6 = 373 tokens
    counter = WordCounter()
    outcome = await limit(messages, 300, cache_stable_units(0.5), counter)
    sent = counter.count(outcome.messages)
    assert sent <= 150
    # Whole units, oldest first: one more turn would have fit over the mark.
    assert sent + 18 > 150
    check_integrity(outcome.messages)
    assert outcome.messages[0] == messages[0]
    assert outcome.messages[1].role is Role.USER
    assert outcome.messages[-1] == messages[-1]


async def test_the_sliding_window_cuts_just_under_the_budget_for_comparison() -> None:
    messages = transcript(20)
    counter = WordCounter()
    outcome = await limit(messages, 300, cache_stable_units(1.0), counter)
    assert 300 - 18 < counter.count(outcome.messages) <= 300


async def test_the_ledger_says_it_was_a_cache_stable_cut_and_to_which_mark() -> None:
    outcome = await limit(transcript(20), 300, cache_stable_units(0.5))
    record = outcome.record
    assert [h.handler for h in record.handlers] == ["cache_stable_units"]
    assert record.dropped
    assert {d.handler for d in record.dropped} == {"cache_stable_units"}
    assert record.dropped[0].reason == (
        "cache-stable cut: 373 > 300 tokens, down to the low-water mark of 150 tokens "
        "(50% of the budget)"
    )


async def test_the_kept_transcript_opens_with_a_user_message() -> None:
    # A tool exchange and an answer stand right where the cut would stop.
    messages = [
        Message.system("s"),
        *turns(6),
        Message.user("look it up"),
        Message.assistant("", tool_calls=[ToolCall(id="c1", name="find")]),
        Message.tool("c1", "found " * 30),
        Message.assistant("done " * 30),
        *turns(2, start=10),
        Message.user("prompt"),
    ]
    outcome = await limit(messages, 140, cache_stable_units(0.6))
    check_integrity(outcome.messages)
    assert outcome.messages[1].role is Role.USER
    reasons = {d.reason for d in outcome.record.dropped}
    assert "dropped so that the transcript opens with a user message" in reasons


async def test_pinned_units_stay_even_when_they_alone_pass_the_mark() -> None:
    messages = [
        Message.system("system " * 40),
        *turns(3),
        Message.user("prompt " * 40),
    ]
    outcome = await limit(messages, 100, cache_stable_units(0.5))
    assert outcome.messages == (messages[0], messages[-1])
    assert outcome.record.tokens_after > 50  # over the mark, which only pinned units pass
    assert not outcome.record.sent_over_budget


async def test_with_a_plain_counter_the_cut_is_verified_with_real_counts() -> None:
    counter = PlainCounter()
    messages = transcript(20)
    outcome = await limit(messages, 300, cache_stable_units(0.5), counter)
    assert counter.count(outcome.messages) <= 150
    check_integrity(outcome.messages)


async def test_its_own_counter_prices_the_cut() -> None:
    outcome = await limit(transcript(20), 300, cache_stable_units(0.5, counter=PlainCounter()))
    assert PlainCounter().count(outcome.messages) <= 150


async def test_appended_turns_after_a_cut_keep_the_prefix_until_the_budget_is_reached() -> None:
    """The caller sends back what was sent, plus the new turn: no cut, the same prefix."""
    handler = cache_stable_units(0.5)
    history = [Message.system("be brief"), *turns(20)]
    sent: list[tuple[Message, ...]] = []
    cuts = 0
    for t in range(20, 60):
        prompt = Message.user(f"q{t} " + "word " * 5)
        outcome = await limit([*history, prompt], 300, handler)
        cuts += outcome.record.limited
        sent.append(outcome.messages)
        history = [*outcome.messages, Message.assistant(f"a{t} " + "word " * 5)]
    # 150 tokens of room between the mark and the budget: a cut every ~8 turns.
    assert 3 <= cuts <= 6
    stable = sum(1 for before, after in itertools.pairwise(sent) if after[: len(before)] == before)
    assert stable == len(sent) - 1 - (cuts - 1)


async def test_a_cut_with_nothing_droppable_changes_nothing() -> None:
    messages = [Message.system("system " * 80), Message.user("prompt " * 80)]
    outcome = await limit(messages, 50, cache_stable_units())
    assert outcome.messages == tuple(messages)


def test_the_handler_knows_its_mark_and_shows_it() -> None:
    handler = cache_stable_units()
    assert isinstance(handler, CacheStableUnits)
    assert handler.low_water == DEFAULT_LOW_WATER == 0.6
    assert repr(handler) == "cache_stable_units(low_water=0.6)"


@pytest.mark.parametrize("low_water", [0, -0.1, 1.5, True, "0.5", None])
def test_a_low_water_mark_outside_the_budget_is_refused(low_water: object) -> None:
    with pytest.raises(InvalidRequestError, match="low_water"):
        cache_stable_units(low_water)  # type: ignore[arg-type]


def test_a_counter_that_is_not_a_counter_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="TokenCounter"):
        cache_stable_units(0.5, counter="words")  # type: ignore[arg-type]


class ServerCount:
    """A provider's exact count: 30% more than the word counter's, on every message."""

    def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        return 13 * WordCounter().count(messages, tools) // 10


async def test_near_the_budget_the_mark_is_reached_on_the_exact_count_not_overshot() -> None:
    messages = transcript(30)  # 553 tokens by the estimate, within 10% of the budget
    server = ServerCount()  # 718 by the server's count: over the budget of 600
    outcome = await apply_limits(
        messages,
        counter=WordCounter(),
        budget=Budget(limit=610, reserve=10),
        pre=cache_stable_units(0.6),
        prompt_index=len(messages) - 1,
        exact_counter=server,
        exact_margin=0.1,
    )
    assert outcome.record.counted_by == "exact"
    sent = server.count(outcome.messages)
    # Down to the mark of 360 on the server's count, give or take a turn (24 tokens),
    # not to the third of the budget that pricing each drop at 90% of its estimate
    # (where the server counts 130%) would leave.
    assert 360 - 24 <= sent <= 360
