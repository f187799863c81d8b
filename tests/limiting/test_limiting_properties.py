"""The invariants of limiting, for any valid transcript and any budget (hypothesis)."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import anyio
import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from threadline import Budget, Message, Origin, Role, Tool, ToolCall
from threadline.counting import TokenCounter
from threadline.limiting import (
    TokenLimitEvent,
    TokenLimitHandler,
    TranscriptIntegrityError,
    Unit,
    cache_stable_units,
    check_integrity,
    drop_oldest_units,
    split_units,
)

# The invariants are properties of the engine itself, a private room.
from threadline.limiting._engine import apply_limits
from threadline.limiting._ledger import LimitingOutcome

# -- counters --------------------------------------------------------------------------


class WordCounter:
    """Incremental: 3 per message plus one per word and per call; 2 per reply, 10 per tool."""

    def message_tokens(self, message: Message) -> int:
        return 3 + len(message.text.split()) + len(message.tool_calls)

    def overhead_tokens(self, tools: Sequence[Tool] = ()) -> int:
        return 2 + 10 * len(tools)

    def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        return sum(self.message_tokens(m) for m in messages) + self.overhead_tokens(tools)


class LumpyCounter:
    """Plain (no ``message_tokens``) and not additive: every fourth message costs 4 more."""

    def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        words = sum(len(m.text.split()) + len(m.tool_calls) for m in messages)
        return 2 + 10 * len(tools) + 3 * len(messages) + words + 4 * (len(messages) // 4)


COUNTERS = [WordCounter(), LumpyCounter()]

# -- transcripts -----------------------------------------------------------------------


@attrs.frozen
class Scenario:
    messages: tuple[Message, ...]
    prompt_index: int | None
    tools: tuple[Tool, ...]


@st.composite
def scenarios(draw: st.DrawFn) -> Scenario:
    """A valid transcript: seed turns, then this run's prompt and tool rounds.

    Seed turns hold a question, maybe injections, 0-2 tool exchanges of 1-4
    results and usually an answer; later system messages come between turns.
    The run holds the prompt, 0-3 tool exchanges (the last one live) and maybe
    unanswered injections. Every text and call id is unique.
    """
    serial = itertools.count()

    def text(tag: str) -> str:
        return " ".join([f"{tag}{next(serial)}"] * draw(st.integers(1, 12)))

    def tool_exchange(origin: Origin) -> list[Message]:
        ids = [f"call{next(serial)}" for _ in range(draw(st.integers(1, 4)))]
        results = [Message.tool(i, text("result"), origin=origin) for i in ids]
        calls = [ToolCall(id=i, name="lookup", arguments='{"q": 1}') for i in ids]
        return [
            Message.assistant(
                draw(st.sampled_from(["", "let me check"])), tool_calls=calls, origin=origin
            ),
            *draw(st.permutations(results)),
        ]

    def injection() -> Message:
        role = draw(st.sampled_from([Role.USER, Role.SYSTEM]))
        return Message(role=role, content=text("inject"), origin=Origin.INJECTION)

    messages: list[Message] = []
    if draw(st.booleans()):
        messages.append(Message.system(text("system")))
    for _ in range(draw(st.integers(0, 8))):
        if draw(st.integers(0, 5)) == 0:
            messages.append(Message.system(text("later-system")))
        messages.append(Message.user(text("question")))
        for _ in range(draw(st.integers(0, 1))):
            messages.append(injection())
        for _ in range(draw(st.integers(0, 2))):
            messages.extend(tool_exchange(Origin.SEED))
        if draw(st.integers(0, 5)) > 0:
            messages.append(Message.assistant(text("answer")))

    prompt_index = len(messages)
    messages.append(Message.user(text("prompt"), origin=Origin.TURN))
    for _ in range(draw(st.integers(0, 3))):
        messages.extend(tool_exchange(Origin.TURN))
    for _ in range(draw(st.integers(0, 2))):
        messages.append(injection())

    tools = tuple(Tool(name=f"tool{k}") for k in range(draw(st.integers(0, 2))))
    explicit = draw(st.booleans())
    return Scenario(tuple(messages), prompt_index if explicit else None, tools)


def limit(
    scenario: Scenario,
    counter: TokenCounter,
    share: int,
    pre: TokenLimitHandler | None = None,
    post: TokenLimitHandler | None = None,
) -> tuple[LimitingOutcome, list[Unit]]:
    """Limit ``scenario`` to ``share`` percent of its own count (at least 1 token)."""
    prompt_budget = budget_for(scenario, counter, share)

    async def run() -> LimitingOutcome:
        return await apply_limits(
            scenario.messages,
            tools=scenario.tools,
            counter=counter,
            budget=Budget(limit=prompt_budget + 50, reserve=50),
            prompt_index=scenario.prompt_index,
            pre=pre,
            post=post,
        )

    units = split_units(scenario.messages, prompt_index=scenario.prompt_index)
    return anyio.run(run), units


def budget_for(scenario: Scenario, counter: TokenCounter, share: int) -> int:
    return max(1, counter.count(scenario.messages, scenario.tools) * share // 100)


# Percent of the transcript's own count: from "nothing fits" to "all fits".
budgets = st.integers(0, 120)
PROPERTY = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# -- the properties --------------------------------------------------------------------


@pytest.mark.parametrize("counter", COUNTERS, ids=type)
@PROPERTY
@given(scenario=scenarios(), share=budgets)
def test_the_output_is_always_a_whole_transcript(
    counter: TokenCounter, scenario: Scenario, share: int
) -> None:
    outcome, _ = limit(scenario, counter, share)
    check_integrity(outcome.messages)


@pytest.mark.parametrize("counter", COUNTERS, ids=type)
@PROPERTY
@given(scenario=scenarios(), share=budgets)
def test_every_pinned_message_survives(
    counter: TokenCounter, scenario: Scenario, share: int
) -> None:
    outcome, units = limit(scenario, counter, share)
    kept = {id(m) for m in outcome.messages}
    for unit in units:
        if unit.pinned:
            assert all(id(scenario.messages[i]) in kept for i in unit.indices), unit


@pytest.mark.parametrize("counter", COUNTERS, ids=type)
@PROPERTY
@given(scenario=scenarios(), share=budgets)
def test_the_output_is_a_subsequence_of_the_input(
    counter: TokenCounter, scenario: Scenario, share: int
) -> None:
    outcome, _ = limit(scenario, counter, share)
    sources = outcome.sources
    assert None not in sources
    assert list(sources) == sorted(set(sources))  # type: ignore[type-var]
    for message, source in zip(outcome.messages, sources, strict=True):
        assert source is not None
        assert message is scenario.messages[source]


@pytest.mark.parametrize("counter", COUNTERS, ids=type)
@PROPERTY
@given(scenario=scenarios(), share=budgets)
def test_after_any_drop_it_opens_with_a_user_message_after_the_system_message(
    counter: TokenCounter, scenario: Scenario, share: int
) -> None:
    outcome, units = limit(scenario, counter, share)
    if len(outcome.messages) == len(scenario.messages):
        return
    first_system = next(
        (scenario.messages[u.start] for u in units if u.reason == "first system message"), None
    )
    pinned = {id(scenario.messages[i]) for u in units if u.pinned for i in u.indices}
    rest = [m for m in outcome.messages if m is not first_system]
    assert rest, "the current prompt is always kept"
    # Only a pinned message can stand in the way (an unanswered injection
    # just before the prompt); never an answer whose question was dropped.
    assert rest[0].role is Role.USER or id(rest[0]) in pinned
    assert rest[0].role in (Role.USER, Role.SYSTEM)


@pytest.mark.parametrize("counter", COUNTERS, ids=type)
@PROPERTY
@given(scenario=scenarios(), share=budgets)
def test_it_fits_whenever_the_pinned_messages_alone_fit(
    counter: TokenCounter, scenario: Scenario, share: int
) -> None:
    outcome, units = limit(scenario, counter, share)
    pinned_only = [scenario.messages[i] for u in units if u.pinned for i in u.indices]
    sent = counter.count(outcome.messages, scenario.tools)
    assert outcome.record.tokens_after == sent
    prompt_budget = budget_for(scenario, counter, share)
    if counter.count(pinned_only, scenario.tools) <= prompt_budget:
        assert sent <= prompt_budget
        assert not outcome.record.sent_over_budget
    else:
        assert outcome.record.sent_over_budget


@pytest.mark.parametrize("counter", COUNTERS, ids=type)
@PROPERTY
@given(scenario=scenarios(), share=budgets)
def test_a_transcript_that_fits_comes_back_unchanged(
    counter: TokenCounter, scenario: Scenario, share: int
) -> None:
    fits = share >= 100
    outcome, _ = limit(scenario, counter, share)
    if fits:
        assert len(outcome.messages) == len(scenario.messages)
        assert all(a is b for a, b in zip(outcome.messages, scenario.messages, strict=True))
        assert outcome.record.handlers == ()
    else:
        assert [h.handler for h in outcome.record.handlers] == ["drop_oldest_units"]


@pytest.mark.parametrize("counter", COUNTERS, ids=type)
@PROPERTY
@given(scenario=scenarios(), share=budgets)
def test_dropping_is_oldest_first(counter: TokenCounter, scenario: Scenario, share: int) -> None:
    outcome, units = limit(scenario, counter, share)
    kept = set(outcome.sources)
    droppable = [u for u in units if not u.pinned]
    dropped = [u.start not in kept for u in droppable]
    # The dropped droppable units are the oldest ones: a prefix.
    assert dropped == sorted(dropped, reverse=True)
    assert [(d.start, d.end) for d in outcome.record.dropped] == [
        (u.start, u.end) for u, gone in zip(droppable, dropped, strict=True) if gone
    ]


@PROPERTY
@given(scenario=scenarios(), share=budgets)
def test_the_budget_report_adds_up_to_what_is_sent(scenario: Scenario, share: int) -> None:
    counter = WordCounter()
    outcome, _ = limit(scenario, counter, share)
    report = outcome.record.report
    parts = (
        report.system_tokens
        + report.tools_tokens
        + report.history_tokens
        + report.pinned_tokens
        + report.overhead_tokens
    )
    assert parts == report.total_tokens == counter.count(outcome.messages, scenario.tools)
    assert report.overhead_tokens == 2


# -- integrity -------------------------------------------------------------------------


@PROPERTY
@given(scenario=scenarios())
def test_generated_transcripts_are_whole_and_their_units_cover_them(scenario: Scenario) -> None:
    check_integrity(scenario.messages)
    units = split_units(scenario.messages, prompt_index=scenario.prompt_index)
    assert [i for u in units for i in u.indices] == list(range(len(scenario.messages)))


@PROPERTY
@given(scenario=scenarios(), data=st.data())
def test_any_broken_tool_unit_is_caught(scenario: Scenario, data: st.DataObject) -> None:
    messages = list(scenario.messages)
    results = [i for i, m in enumerate(messages) if m.role is Role.TOOL]
    calls = [i for i, m in enumerate(messages) if m.tool_calls]
    if not results:
        return
    breakage = data.draw(st.sampled_from(["drop result", "drop call", "move result", "repeat"]))
    if breakage == "drop result":
        del messages[data.draw(st.sampled_from(results))]
    elif breakage == "drop call":
        del messages[data.draw(st.sampled_from(calls))]
    elif breakage == "move result":
        index = data.draw(st.sampled_from(results))
        result = messages.pop(index)
        # Past at least one message that is not a result of the same exchange.
        later = [i for i in range(index, len(messages)) if messages[i].role is not Role.TOOL]
        if not later:
            messages.insert(data.draw(st.sampled_from(calls)), result)
        else:
            messages.insert(data.draw(st.sampled_from(later)) + 1, result)
    else:
        start = data.draw(st.sampled_from(calls))
        end = start + 1 + len(messages[start].tool_calls)
        messages.extend(messages[start:end])
    with pytest.raises(TranscriptIntegrityError):
        check_integrity(messages)


# -- the same rules under the cache-stable policy --------------------------------------

low_waters = st.sampled_from([0.1, 0.35, 0.6, 0.85, 1.0])


def limit_cache_stable(
    scenario: Scenario, counter: TokenCounter, share: int, low_water: float
) -> tuple[LimitingOutcome, list[Unit], int]:
    """Limit ``scenario`` with ``cache_stable_units(low_water)``; also return the mark."""
    prompt_budget = budget_for(scenario, counter, share)

    async def run() -> LimitingOutcome:
        return await apply_limits(
            scenario.messages,
            tools=scenario.tools,
            counter=counter,
            budget=Budget(limit=prompt_budget + 50, reserve=50),
            pre=cache_stable_units(low_water),
            prompt_index=scenario.prompt_index,
        )

    units = split_units(scenario.messages, prompt_index=scenario.prompt_index)
    return anyio.run(run), units, math.floor(prompt_budget * low_water)


@pytest.mark.parametrize("counter", COUNTERS, ids=type)
@PROPERTY
@given(scenario=scenarios(), share=budgets, low_water=low_waters)
def test_a_cache_stable_cut_keeps_every_unit_rule(
    counter: TokenCounter, scenario: Scenario, share: int, low_water: float
) -> None:
    outcome, units, _mark = limit_cache_stable(scenario, counter, share, low_water)
    check_integrity(outcome.messages)
    kept = {id(m) for m in outcome.messages}
    pinned = [scenario.messages[i] for u in units if u.pinned for i in u.indices]
    assert all(id(m) in kept for m in pinned)
    # A subsequence of the input, message objects unchanged, nothing added.
    sources = outcome.sources
    assert None not in sources
    assert list(sources) == sorted(set(sources))  # type: ignore[type-var]
    if len(outcome.messages) == len(scenario.messages):
        return  # it fitted, or only pinned units were there to keep
    first_system = next(
        (scenario.messages[u.start] for u in units if u.reason == "first system message"), None
    )
    rest = [m for m in outcome.messages if m is not first_system]
    assert rest[0].role is Role.USER or id(rest[0]) in {id(m) for m in pinned}


@pytest.mark.parametrize("counter", COUNTERS, ids=type)
@PROPERTY
@given(scenario=scenarios(), share=budgets, low_water=low_waters)
def test_a_cache_stable_cut_reaches_the_mark_whenever_the_pinned_units_alone_do(
    counter: TokenCounter, scenario: Scenario, share: int, low_water: float
) -> None:
    outcome, units, mark = limit_cache_stable(scenario, counter, share, low_water)
    sent = counter.count(outcome.messages, scenario.tools)
    prompt_budget = budget_for(scenario, counter, share)
    pinned_only = [scenario.messages[i] for u in units if u.pinned for i in u.indices]
    pinned_tokens = counter.count(pinned_only, scenario.tools)
    if counter.count(scenario.messages, scenario.tools) <= prompt_budget:
        assert outcome.messages == scenario.messages  # it fits: untouched
    elif pinned_tokens <= mark:
        assert sent <= mark
    elif pinned_tokens <= prompt_budget:
        assert sent <= prompt_budget


@pytest.mark.parametrize("counter", COUNTERS, ids=type)
@PROPERTY
@given(scenario=scenarios(), share=budgets, low_water=low_waters)
def test_a_cache_stable_cut_drops_oldest_first_and_at_least_what_the_sliding_window_drops(
    counter: TokenCounter, scenario: Scenario, share: int, low_water: float
) -> None:
    outcome, units, _ = limit_cache_stable(scenario, counter, share, low_water)
    kept = set(outcome.sources)
    droppable = [u for u in units if not u.pinned]
    dropped = [u.start not in kept for u in droppable]
    assert dropped == sorted(dropped, reverse=True)
    assert [(d.start, d.end) for d in outcome.record.dropped] == [
        (u.start, u.end) for u, gone in zip(droppable, dropped, strict=True) if gone
    ]
    sliding, _ = limit(scenario, counter, share)
    assert kept <= set(sliding.sources)


class RebateCounter(WordCounter):
    """Incremental, and a tool result earns a rebate: costs that are not all positive."""

    def message_tokens(self, message: Message) -> int:
        return super().message_tokens(message) - (6 if message.role is Role.TOOL else 0)


@pytest.mark.parametrize("counter", [WordCounter(), RebateCounter()], ids=type)
@PROPERTY
@given(scenario=scenarios(), share=budgets, as_post=st.booleans())
def test_the_built_in_pre_taken_directly_leaves_what_it_leaves_through_an_event(
    counter: WordCounter, scenario: Scenario, share: int, as_post: bool
) -> None:
    # The engine takes drop_oldest_units(None) without building an event; the same
    # handler hidden behind a wrapper goes through the event, and must agree in full.
    built_in = drop_oldest_units(None)

    async def through_an_event(event: TokenLimitEvent) -> None:
        await built_in(event)  # type: ignore[misc]

    through_an_event.__qualname__ = "drop_oldest_units"
    direct, _ = limit(scenario, counter, share, built_in, built_in if as_post else None)
    evented, _ = limit(
        scenario, counter, share, through_an_event, through_an_event if as_post else None
    )
    assert len(direct.messages) == len(evented.messages)
    assert all(a is b for a, b in zip(direct.messages, evented.messages, strict=True))
    assert direct.sources == evented.sources
    assert direct.prompt_index == evented.prompt_index
    assert direct.record == evented.record
    assert list(direct.record.dropped) == list(evented.record.dropped)
