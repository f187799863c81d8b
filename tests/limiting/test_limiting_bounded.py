"""A transcript a bound proves fits is limited without tokenizing it, as the full step
would limit it (hypothesis), and its ledger still reports the exact count."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from threadline import Budget, Message, Tool, ToolCall, Usage
from threadline._result import RoundRecord
from threadline.counting import BuiltinTokenCounter

# The bound and the step that uses it are private rooms.
from threadline.counting._costs import marks_of
from threadline.counting._deferred import Deferred
from threadline.limiting import drop_oldest_units
from threadline.limiting._engine import apply_limits
from threadline.limiting._ledger import LimitingOutcome

TOOLS = (Tool(name="lookup", description="Find a thing.", parameters={"type": "object"}),)


class Unbounded:
    """The built-in counter's counts without its bound: the step always counts."""

    def __init__(self, counter: BuiltinTokenCounter) -> None:
        self._counter = counter

    def message_tokens(self, message: Message) -> int:
        return self._counter.message_tokens(message)

    def overhead_tokens(self, tools: Sequence[Tool] = ()) -> int:
        return self._counter.overhead_tokens(tools)

    def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        return self._counter.count(messages, tools)


texts = st.text(
    st.one_of(
        st.sampled_from("the quick brown fox, 42 times!\n"),
        st.characters(codec="utf-8"),
        st.sampled_from("日本語 émigré 🙂 ﷽"),
    ),
    max_size=60,
)


@st.composite
def transcripts(draw: st.DrawFn) -> list[Message]:
    """A system message, answered turns (some with a tool exchange), a last question."""
    messages = [Message.system(draw(texts) or "Be terse.")]
    for turn in range(draw(st.integers(0, 8))):
        messages.append(Message.user(draw(texts) or "?"))
        if draw(st.booleans()):
            call = ToolCall(id=f"c{turn}", name="lookup", arguments=draw(texts))
            messages.append(Message.assistant(tool_calls=[call]))
            messages.append(Message.tool(f"c{turn}", draw(texts)))
        messages.append(Message.assistant(draw(texts) or "ok"))
    messages.append(Message.user(draw(texts) or "and now?"))
    return messages


def _copies(messages: list[Message]) -> list[Message]:
    """Equal messages no counter has priced."""
    return [
        Message(
            role=m.role,
            content=m.content,
            tool_calls=m.tool_calls,
            tool_call_id=m.tool_call_id,
            name=m.name,
        )
        for m in messages
    ]


def _limit(messages: list[Message], counter: object, budget: Budget | None) -> LimitingOutcome:
    outcomes: list[LimitingOutcome] = []

    async def limit() -> None:
        # Kept, not returned: asyncio may print a task's result, which would read the count.
        outcomes.append(
            await apply_limits(
                messages,
                tools=TOOLS,
                counter=counter,  # type: ignore[arg-type]
                budget=budget,
                pre=drop_oldest_units(None),
                round=1,
            )
        )

    anyio.run(limit)
    return outcomes[0]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    transcript=transcripts(),
    share=st.one_of(st.none(), st.floats(0.3, 6.0)),
)
def test_the_bounded_step_sends_and_reports_what_the_full_step_does(
    transcript: list[Message], share: float | None
) -> None:
    counter = BuiltinTokenCounter()
    fresh = _copies(transcript)
    exact = BuiltinTokenCounter().count(_copies(transcript), TOOLS)
    budget = None if share is None else Budget(limit=max(2, int(exact * share)), reserve=1)
    # The bounded step sees messages never priced: it decides on the bound alone.
    bounded = _limit(fresh, counter, budget)
    full = _limit(_copies(transcript), Unbounded(BuiltinTokenCounter()), budget)
    assert bounded.messages == full.messages
    assert bounded.sources == full.sources
    assert bounded.prompt_index == full.prompt_index
    ours, theirs = bounded.record, full.record
    assert [(r.handler, r.phase) for r in ours.handlers] == [
        (r.handler, r.phase) for r in theirs.handlers
    ]
    assert ours.tokens_before == theirs.tokens_before
    assert ours.tokens_after == theirs.tokens_after
    assert ours.estimated_tokens == theirs.estimated_tokens
    assert ours.report == theirs.report
    assert ours.sent_over_budget == theirs.sent_over_budget
    assert ours.counted_by == theirs.counted_by
    assert ours == theirs


def test_a_history_far_below_its_budget_is_not_tokenized_until_its_count_is_read() -> None:
    history = [
        Message.user(f"question {i}: what did the committee decide?")
        if i % 2 == 0
        else Message.assistant(f"answer {i}: it agreed on the next steps.")
        for i in range(400)
    ]
    transcript = [*history, Message.user("And then?")]
    outcome = _limit(transcript, BuiltinTokenCounter(), Budget(limit=1_000_000, reserve=4096))
    assert outcome.messages == tuple(transcript)
    assert not outcome.record.limited
    assert set(marks_of(transcript)) == {0}  # nothing priced: no text tokenized
    expected = BuiltinTokenCounter().count(_copies(transcript), TOOLS)
    assert outcome.record.tokens_after == expected
    assert outcome.record.report.total_tokens == expected
    assert min(marks_of(transcript)) > 0  # reading the count priced them


def test_a_history_whose_bound_passes_the_budget_is_counted_and_cut_exactly() -> None:
    # ~3 bytes per token: the bound (bytes) is over the budget, the count is not,
    # so the step must count before deciding, and it sends everything.
    transcript = [Message.user("word " * 200), Message.assistant("word " * 200)]
    transcript.append(Message.user("again?"))
    exact = BuiltinTokenCounter().count(_copies(transcript), TOOLS)
    budget = Budget(limit=exact + 1, reserve=1)
    assert BuiltinTokenCounter().messages_tokens_bound(transcript) > budget.prompt_tokens
    outcome = _limit(transcript, BuiltinTokenCounter(), budget)
    assert outcome.messages == tuple(transcript)
    assert outcome.record.tokens_after == exact
    # One token less and the oldest unit goes.
    tighter = _limit(_copies(transcript), BuiltinTokenCounter(), Budget(limit=exact, reserve=1))
    assert tighter.record.limited
    assert tighter.record.tokens_after <= exact - 1


@settings(max_examples=300, deadline=None)
@given(transcript=transcripts())
def test_the_bound_is_never_under_the_count_and_is_the_count_once_priced(
    transcript: list[Message],
) -> None:
    counter = BuiltinTokenCounter()
    exact = sum(map(BuiltinTokenCounter().message_tokens, _copies(transcript)))
    assert counter.messages_tokens_bound(transcript) >= exact
    counter.count(transcript)
    assert counter.messages_tokens_bound(transcript) == exact


class WordsAsTokens:
    """An encoding of the caller's that counts more tokens than bytes: a bytes bound
    would be wrong for it."""

    def encode_ordinary(self, text: str) -> list[int]:
        return [0] * (2 * len(text) + 1)


@pytest.mark.parametrize("text", ["", "ab", "日本"])
def test_with_an_encoding_of_the_callers_the_bound_is_the_count(text: str) -> None:
    counter = BuiltinTokenCounter(encoding=WordsAsTokens())
    messages = [Message.user(text or "x"), Message.assistant(text or "y")]
    assert counter.messages_tokens_bound(messages) == counter.count(messages, ()) - 3


def test_a_record_counted_later_pickles_and_copies_as_its_numbers() -> None:
    import copy
    import pickle

    transcript = [Message.user("hello there"), Message.assistant("hi"), Message.user("and?")]
    record = _limit(transcript, BuiltinTokenCounter(), Budget(limit=10_000, reserve=100)).record
    expected = BuiltinTokenCounter().count(_copies(transcript), TOOLS)
    restored = pickle.loads(pickle.dumps(record))
    assert restored.tokens_after == expected
    assert restored == record
    assert copy.deepcopy(record).report == record.report


def test_a_round_counted_later_shows_its_count_under_its_public_name() -> None:
    round_record = RoundRecord(
        round=1,
        usage=Usage(input_tokens=40),
        estimated_input_tokens=Deferred(lambda: 42),
        reported_input_tokens=40,
        limiting=None,
        finish_reason="stop",
        tool_calls=(),
    )
    shown = repr(round_record)
    assert "estimated_input_tokens=42," in shown
    assert "_estimated" not in shown
    assert "Deferred" not in shown
