"""Limiting a conversation's turn without walking the history it vouches for.

A :class:`~threadline.Conversation` checks every turn's messages once, when
the turn joins its transcript; sending the same history again next turn need
not check, split or price it again. :class:`CheckedHistory` is the
conversation's word for that: this run of messages, sent right after the
system message, passed :func:`~threadline.limiting._units.check_integrity`
and holds no system message, so nothing in it is pinned.

:func:`quick_outcome` is the engine's fast path for it: when no handler has
to run (no budget, or the estimate fits and is not near enough to the
budget for the exact counter to be asked) it returns the same outcome as the
full step, from the count (which the counter makes incrementally), the
messages around the history and the tool call ids the history holds. Every
other case (over budget, a counter that does not price messages one by one,
a call id the history already used, a transcript whose history is no longer
the one vouched for) gets ``None``, and the engine takes its full step.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import attrs

from threadline._errors import TranscriptIntegrityError
from threadline._messages import Message, Origin, Role
from threadline._provider import HistorySpan
from threadline.counting._protocol import IncrementalTokenCounter, TokenCounter, is_incremental
from threadline.limiting._budget import Budget, BudgetReport
from threadline.limiting._ledger import (
    DroppedUnit,
    HandlerRun,
    LimitingOutcome,
    LimitingRecord,
    estimate_kind,
)
from threadline.limiting._units import (
    PinReason,
    check_integrity,
    pinned_messages,
    pinned_units,
    unit_kind,
    unit_starts,
)
from threadline.tools._tools import Tool

__all__ = ["CheckedHistory", "HistorySpan", "HistoryTally", "history_tokens", "quick_outcome"]


@attrs.frozen(kw_only=True, eq=False)
class CheckedHistory:
    """History a conversation vouches for: checked as its turns joined, no system message.

    ``messages`` is the history exactly as the request sends it (origin
    ``seed``); ``call_ids`` holds at least every tool call id among them;
    ``offset`` is where it starts in the run's transcript (1 after a system
    message, else 0), which the plan fills in. ``reasoned`` indexes (in
    ``messages``, ascending) every message that carries reasoning, so replay
    checks need not look at the others (``None``: not known). The run hands it to limiting
    only while no handler has rewritten the transcript, so the history is still
    ``transcript[offset:offset + len(messages)]``.
    """

    messages: Sequence[Message]
    """A tuple, or a window onto the conversation's own list of messages (never
    changed where it stands)."""
    call_ids: Collection[str]
    offset: int = 0
    reasoned: tuple[int, ...] | None = None
    source: tuple[object, int] | None = None
    """Whose messages these are: a transcript's token and the event they start at.
    Two histories with one source start alike, the shorter being the start of the
    longer (a transcript only grows; rewritten, it is a new one), so a history
    sent again, grown at its end, is known alike without comparing it. ``None``:
    not known (an edit of the messages must set it so)."""
    tally: HistoryTally | None = None
    """Where the source's histories are counted (see :func:`history_tokens`)."""

    def span(self) -> HistorySpan | None:
        """Where this history stands and whose it is, without its messages (``None``:
        no source)."""
        if self.source is None:
            return None
        return HistorySpan(source=self.source, offset=self.offset, length=len(self.messages))

    def starts_with(self, span: HistorySpan | None) -> bool:
        """Whether this history, at the same place, starts with the history ``span``
        describes: known from their source, no message compared."""
        return span is not None and span.begins(self.span())


class HistoryTally:
    """The tokens of a source's history counted last, so the next one, grown at its
    end, costs its new messages: by which counter, whose history (a source's token
    and start), how many messages and their tokens; set whole by :meth:`keep`. One a
    conversation, kept between turns: slotted fields, not a tuple holding a tuple."""

    __slots__ = ("counter", "length", "start", "token", "tokens")

    def __init__(self) -> None:
        self.counter: IncrementalTokenCounter | None = None
        self.token: object = None
        self.start = self.length = self.tokens = 0

    def keep(
        self, counter: IncrementalTokenCounter, source: tuple[object, int], length: int, tokens: int
    ) -> None:
        """Remember ``tokens`` as the count of ``source``'s first ``length`` messages."""
        self.counter, self.length, self.tokens = counter, length, tokens
        self.token, self.start = source

    def counted(self, counter: IncrementalTokenCounter, source: tuple[object, int]) -> bool:
        """Whether the history counted last was ``source``'s, by ``counter``."""
        return self.counter is counter and self.token is source[0] and self.start == source[1]


def history_tokens(history: CheckedHistory, counter: IncrementalTokenCounter) -> int:
    """``counter.count(history.messages, ())``: from its source's history counted last
    by this very counter, adding the messages after that one's, when there is one."""
    vouched, source, tally = history.messages, history.source, history.tally
    if source is None or tally is None:
        return counter.count(vouched, ())
    if tally.counted(counter, source) and tally.length <= len(vouched):
        # An incremental counter's count is its messages' message_tokens, plus overhead.
        total = tally.tokens + sum(map(counter.message_tokens, vouched[tally.length :]))
    else:
        total = counter.count(vouched, ())
    tally.keep(counter, source, len(vouched), total)
    return total


def quick_outcome(
    messages: Sequence[Message],
    *,
    tools: Sequence[Tool],
    counter: TokenCounter,
    budget: Budget | None,
    round: int,
    prompt_index: int | None,
    history: CheckedHistory,
    exact_margin: float | None,
    sliding: str | None = None,
) -> LimitingOutcome | None:
    """The outcome of a limiting step that runs no handler, or ``None`` for the full step.

    ``exact_margin`` is the margin the exact counter would be asked at
    (``None``: it is not asked). ``sliding`` names the step's only handler when
    it declares ``slides_one_unit`` (see ``_traits``): over budget, its cut is
    then made here too (see :func:`_cut`).
    """
    if prompt_index is None or not is_incremental(counter):
        return None
    start = history.offset
    end = start + len(history.messages)
    if prompt_index < end or prompt_index >= len(messages) or len(messages) < end:
        return None
    vouched = history.messages
    if vouched and (messages[start] is not vouched[0] or messages[end - 1] is not vouched[-1]):
        return None  # not where the caller said (the run stops vouching once a handler ran)
    head, tail = messages[:start], messages[end:]
    pinned = _pinned(head, tail, end, prompt_index, history.call_ids)
    if pinned is None:
        return None
    # The history is counted on its own, the messages around it one by one: its
    # source's tally (else the counter) remembers the history counted last, so next
    # turn's (this one, grown at its end) costs only its new messages.
    total = (
        history_tokens(history, counter)
        + sum(map(counter.message_tokens, head))
        + sum(map(counter.message_tokens, tail))
        + counter.overhead_tokens(tools)
        - counter.overhead_tokens(())
    )
    if budget is not None:
        threshold: float = budget.prompt_tokens
        if exact_margin is not None:
            threshold = min(threshold, budget.prompt_tokens * (1 - exact_margin))
        if total > threshold:
            if sliding is None or exact_margin is not None or len(tail) != 1:
                return None
            return _cut(sliding, messages, start, end, pinned, tools, counter, budget, round, total)
    record = LimitingRecord.unchanged(
        round=round,
        budget_tokens=budget.prompt_tokens if budget is not None else None,
        tokens=total,
        report=_report(head, tail, end, pinned, tools, counter, budget, total),
        counter=counter,
    )
    return LimitingOutcome(
        messages=tuple(messages),
        record=record,
        sources=range(len(messages)),
        prompt_index=prompt_index,
    )


def _pinned(
    head: Sequence[Message],
    tail: Sequence[Message],
    end: int,
    prompt_index: int,
    call_ids: Collection[str],
) -> dict[int, PinReason] | None:
    """What is pinned, as ``pinned_messages`` finds it, from the messages around the
    history alone; ``None`` when they leave the history's word in doubt."""
    if len(head) > 1 or any(m.role is not Role.SYSTEM for m in head):
        return None
    if any(m.role is Role.SYSTEM and m.origin is not Origin.INJECTION for m in tail):
        return None  # a first system message could then stand elsewhere
    try:
        check_integrity(tail)
    except TranscriptIntegrityError:
        return None  # the full step names the message in the whole transcript
    if any(call.id in call_ids for m in tail for call in m.tool_calls):
        return None  # a call id used twice, or only in a part no longer sent
    pinned = {
        end + index: reason
        for index, reason in pinned_messages(tail, prompt_index=prompt_index - end).items()
    }
    if head and head[0].origin is not Origin.INJECTION:
        pinned[0] = PinReason.FIRST_SYSTEM
    return pinned


def _report(
    head: Sequence[Message],
    tail: Sequence[Message],
    end: int,
    pinned: dict[int, PinReason],
    tools: Sequence[Tool],
    counter: TokenCounter,
    budget: Budget | None,
    total: int,
) -> BudgetReport:
    """``budget_report`` of the transcript, priced from the messages around the history:
    the history is all droppable, so it is what the others leave of the total."""
    assert is_incremental(counter)
    system = sum(map(counter.message_tokens, head)) if 0 in pinned else 0
    tools_tokens = counter.overhead_tokens(tools) - counter.overhead_tokens(())
    costs = list(map(counter.message_tokens, tail))
    starts = unit_starts(tail, checked=True)
    reasons = pinned_units(starts, {at - end: reason for at, reason in pinned.items() if at})
    bounds = [*starts, len(tail)]
    pinned_part = sum(
        sum(costs[bounds[k] : bounds[k + 1]]) for k in range(len(starts)) if k in reasons
    )
    overhead = counter.overhead_tokens(())
    return BudgetReport(
        system_tokens=system,
        tools_tokens=tools_tokens,
        history_tokens=total - system - tools_tokens - pinned_part - overhead,
        pinned_tokens=pinned_part,
        overhead_tokens=overhead,
        total_tokens=total,
        reserve_tokens=budget.reserve if budget is not None else None,
        prompt_budget=budget.prompt_tokens if budget is not None else None,
    )


_OPENING = "dropped so that the transcript opens with a user message"


def _cut(
    handler: str,
    messages: Sequence[Message],
    start: int,
    end: int,
    pinned: dict[int, PinReason],
    tools: Sequence[Tool],
    counter: TokenCounter,
    budget: Budget,
    round: int,
    total: int,
) -> LimitingOutcome | None:
    """The cut of ``drop_oldest_units(None)``, which ``handler`` declares it makes (the
    ledger names it), of an over-budget transcript whose history is vouched for and
    whose only message after it is the prompt; ``None`` when the cut would take the
    whole history (the full step then warns as it should).

    Everything in the history is droppable, so the handler drops its oldest
    units until they free the excess, then those before the first user
    message left. Walking from the history's start finds exactly those: the
    step costs what it drops, and the ledger lists the same units, for the
    same reasons.
    """
    assert is_incremental(counter)
    prompt_tokens = budget.prompt_tokens
    dropped, freed, at = _oldest_units(handler, messages, start, end, counter, total, prompt_tokens)
    if at >= end:
        return None
    kept = (*messages[:start], *messages[at:])
    tokens = total - freed
    shift = at - start
    kept_pinned = {index if index < start else index - shift: why for index, why in pinned.items()}
    prompt_index = len(kept) - 1
    record = LimitingRecord(
        round=round,
        budget_tokens=prompt_tokens,
        tokens_before=total,
        tokens_after=tokens,
        handlers=(
            HandlerRun(
                handler=handler,
                phase="pre",
                tokens_before=total,
                tokens_after=tokens,
                dropped_messages=shift,
                added_messages=0,
            ),
        ),
        dropped=tuple(dropped),
        sent_over_budget=tokens > prompt_tokens,
        report=_report(
            kept[:start],
            kept[prompt_index:],
            prompt_index,
            kept_pinned,
            tools,
            counter,
            budget,
            tokens,
        ),
        counted_by=estimate_kind(counter),
        estimated_tokens=total,
    )
    if record.sent_over_budget:
        return None  # the full step says why in its warning
    return LimitingOutcome(
        messages=kept,
        record=record,
        sources=(*range(start), *range(at, len(messages))),
        prompt_index=prompt_index,
    )


def _oldest_units(
    handler: str,
    messages: Sequence[Message],
    start: int,
    end: int,
    counter: TokenCounter,
    total: int,
    prompt_tokens: int,
) -> tuple[list[DroppedUnit], int, int]:
    """The units ``drop_oldest_units`` drops from ``messages[start:end]`` (all droppable),
    the tokens they free, and where what is kept begins; the ledger names ``handler``."""
    assert is_incremental(counter)
    excess = total - prompt_tokens
    over_budget = f"oldest droppable unit while {total} > {prompt_tokens} tokens"
    dropped: list[DroppedUnit] = []
    freed = 0
    at = start
    while at < end and (freed < excess or messages[at].role is not Role.USER):
        reason = over_budget if freed < excess else _OPENING
        unit_end = at + 1
        while unit_end < end and messages[unit_end].role is Role.TOOL:
            unit_end += 1
        unit = messages[at:unit_end]
        freed += sum(map(counter.message_tokens, unit))
        dropped.append(
            DroppedUnit(
                handler=handler,
                phase="pre",
                kind=unit_kind(unit[0]),
                start=at,
                end=unit_end,
                roles=tuple(m.role for m in unit),
                reason=reason,
            )
        )
        at = unit_end
    return dropped, freed, at
