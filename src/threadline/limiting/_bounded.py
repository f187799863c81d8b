"""Limiting a transcript that a bound proves fits: nothing is tokenized to decide.

A limiting step runs no handler and asks no exact count while the
transcript's count stays at or under a threshold (the budget, or the point
near it where the exact counter is asked). A ``BoundedTokenCounter`` bounds
that count from above without tokenizing (a plain text's UTF-8 length; see
``BuiltinTokenCounter.messages_tokens_bound``), so a first request carrying a
long history that is far from its model's window (every 1M-token model, for
hours) is decided on the bound, in one pass over the messages.

The ledger still reports the request counter's own numbers: the record's
counts and budget report are made the first time they are read
(``counting._deferred``), from the same count the full step would make. What
is sent, and what the record says, are the full step's: only when the counting
happens moves. Anything the bound cannot settle (a count over the threshold,
a handler that runs every round, an exact count asked always) takes the full
step.
"""

from __future__ import annotations

from collections.abc import Sequence

from threadline._messages import Message
from threadline.counting._deferred import Deferred
from threadline.counting._protocol import TokenCounter, is_bounded
from threadline.limiting._budget import Budget, BudgetReport, budget_report
from threadline.limiting._ledger import LimitingOutcome, LimitingRecord
from threadline.limiting._units import checked_unit_starts, current_prompt_index, pinned_messages
from threadline.tools._tools import Tool

__all__ = ["bounded_outcome"]


def bounded_outcome(
    messages: Sequence[Message],
    *,
    tools: Sequence[Tool],
    counter: TokenCounter,
    budget: Budget | None,
    round: int,
    prompt_index: int | None,
    threshold: float,
) -> LimitingOutcome | None:
    """The outcome of a step that runs no handler, when the counter's bound proves the
    count is at most ``threshold`` (at most the budget's prompt tokens), or there is
    no budget; ``None`` otherwise, and for a counter that cannot bound, for the full
    step. A count read from the record later raises what counting raises
    (``TokenizerDataError``: the vocabulary is damaged).

    Raises:
        TranscriptIntegrityError: ``messages`` is broken (as the full step).
        InvalidRequestError: ``prompt_index`` is outside the transcript.
    """
    if not is_bounded(counter):
        return None
    if budget is not None:
        bound = counter.messages_tokens_bound(messages) + counter.overhead_tokens(tools)
        if bound > threshold:
            return None
    sent = tuple(messages)
    checked_unit_starts(sent)  # a broken transcript fails here, as in the full step
    prompt_at = current_prompt_index(sent, prompt_index)
    held = (sent, tuple(tools), counter, budget, prompt_at)
    report = Deferred(lambda: _report(*held))
    total = Deferred(lambda: report.get().total_tokens)
    record = LimitingRecord.unchanged(
        round=round,
        budget_tokens=budget.prompt_tokens if budget is not None else None,
        tokens=total,
        report=report,
        counter=counter,
    )
    return LimitingOutcome(
        messages=sent, record=record, sources=range(len(sent)), prompt_index=prompt_at
    )


def _report(
    messages: tuple[Message, ...],
    tools: tuple[Tool, ...],
    counter: TokenCounter,
    budget: Budget | None,
    prompt_index: int | None,
) -> BudgetReport:
    """What the full step reports for ``messages`` when no handler runs."""
    # One count first: it prices the transcript in batches, so the report's costs
    # per message are then looked up, not tokenized one by one.
    total = counter.count(messages, tools)
    return budget_report(
        messages,
        tools=tools,
        counter=counter,
        pinned=pinned_messages(messages, prompt_index=prompt_index),
        budget=budget,
        total_tokens=total,
        starts=checked_unit_starts(messages),  # again, rather than kept until read
    )
