"""What a run returns: the response, the transcript, and what each round cost."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Generic, cast

import attrs
from typing_extensions import TypeVar

from threadline._messages import Message, Usage
from threadline._provider import ProviderResponse
from threadline.counting._deferred import Deferred, resolved

if TYPE_CHECKING:
    from threadline.limiting._budget import Budget
    from threadline.limiting._ledger import DroppedReasoning, LimitingRecord, ToolCallRepair
    from threadline.limiting._prefix import CacheReport, SentPrompt

__all__ = ["OutputT", "RoundRecord", "RunResult"]

OutputT = TypeVar("OutputT", default=str)
"""The type of ``RunResult.output``: the request's ``output_type``, else ``str``."""

_TEXT: Any = object()
"""``RunResult``'s output of a run without an ``output_type``: its text."""


@attrs.frozen(kw_only=True)
class RoundRecord:
    """One provider call: what it cost and what limiting did before it.

    ``estimated_input_tokens`` is the request counter's estimate of what was
    sent; ``calibrated_input_tokens`` that estimate scaled by the client's
    calibration (``None`` without one); ``exact_input_tokens`` the exact
    counter's count of what was sent (``None`` when it was not asked, or was
    asked before limiting dropped something); ``reported_input_tokens`` what
    the provider billed (``None`` when it did not say). All side by side, so
    the gap is visible: :attr:`estimate_error`.
    """

    round: int
    """The round of the run, from 1 (the first provider call)."""
    usage: Usage
    # Made when first read where limiting decided on a bound (see counting._deferred).
    _estimated_input_tokens: int | Deferred[int] = attrs.field(alias="estimated_input_tokens")
    reported_input_tokens: int | None
    limiting: LimitingRecord | None
    """The limiting step of this round; without a budget it only counted
    (``budget_tokens`` ``None``, and :attr:`budget_reason` says why)."""
    budget_reason: str = ""
    """Where the request's budget came from (limit and reserve), or why it has
    none: ``Request.budget_resolution().reason``."""
    finish_reason: str
    tool_calls: int
    context_retry: bool = False
    """True when the provider refused the first send as too long and the round retried."""
    retry_limiting: LimitingRecord | None = None
    """The second limiting step of a round that retried after a context-length
    refusal; its indices refer to the transcript the first step left."""
    retry_reason: str | None = None
    """For a retried round: what the provider reported and the budget the retry
    was limited to (a reserve shrunk to fit the provider's limit is said here)."""
    calibrated_input_tokens: int | None = None
    exact_input_tokens: int | None = None
    reasoning_dropped: tuple[DroppedReasoning, ...] = ()
    """Reasoning replay state left out of this round's call because another
    provider or model produced it (the messages themselves were sent)."""
    replay_notes: tuple[str, ...] = ()
    """What the driver did to stored replay state to send this round's call
    (``ProviderResponse.replay_notes``): a placeholder signature it put where the
    provider demands one, a signature it left off a part that was changed."""
    tool_calls_repaired: tuple[ToolCallRepair, ...] = ()
    """The first round's: what the request's repair of interrupted tool calls
    changed in the history before anything was sent
    (``RequestSettings.repair_interrupted_tool_calls``)."""
    output_error: str | None = None
    """For a run with an ``output_type``: why this round's final answer failed it
    (``"$.total: field 'total' is required"``), when it did and a repair round followed."""
    cache: CacheReport | None = None
    """Why the cache missed, or that it could hit: how this round's prompt relates to
    the round's before it (in a conversation, the previous turn's last round), the
    share of the prompt the provider served from its cache, and its own diagnosis."""

    @property
    def estimated_input_tokens(self) -> int:
        """The request counter's estimate of what was sent."""
        return resolved(self._estimated_input_tokens)

    def __repr__(self) -> str:
        # Written out so a count made when first read shows under its public name.
        names = (a.alias or a.name for a in attrs.fields(RoundRecord))
        return f"RoundRecord({', '.join(f'{n}={getattr(self, n)!r}' for n in names)})"

    @property
    def decided_input_tokens(self) -> int:
        """The best count threadline had of what was sent: exact, else calibrated, else
        the estimate."""
        for count in (self.exact_input_tokens, self.calibrated_input_tokens):
            if count is not None:
                return count
        return self.estimated_input_tokens

    @property
    def estimate_error(self) -> float | None:
        """How far :attr:`decided_input_tokens` was from the provider's report, as a
        fraction of the report (``-0.04``: 4% under); ``None`` without a report."""
        reported = self.reported_input_tokens
        if not reported:
            return None
        return (self.decided_input_tokens - reported) / reported

    @property
    def cached_input_tokens(self) -> int:
        """The input tokens the provider says it served from its prompt cache (0 when
        it did not say); with ``reported_input_tokens``, the share the cache took."""
        return self.usage.cached_input_tokens


@attrs.frozen(kw_only=True)
class RunResult(Generic[OutputT]):
    """The outcome of ``Request.run()``.

    ``messages`` is the whole transcript as it stands after the run, each
    message with its origin; limiting may have removed seed messages from it,
    so use :meth:`new_messages` (never a slice offset) for what to persist.
    :attr:`output` is the validated value of the request's ``output_type``
    (``RunResult[Invoice]``), or the text when it has none; :attr:`text` is
    always the raw text of the final answer.
    """

    response: ProviderResponse
    messages: tuple[Message, ...]
    rounds: tuple[RoundRecord, ...]
    budget: Budget | None
    turn_messages: tuple[Message, ...]
    """This run's own messages (origin ``TURN``) in order, even ones a later
    round's limiting left out."""
    _output: Any = attrs.field(default=_TEXT, alias="output", repr=False)

    @property
    def output(self) -> OutputT:
        """The final answer as a value of the request's ``output_type``, validated;
        without one, the answer's text."""
        if self._output is _TEXT:
            return cast("OutputT", self.response.text)
        return cast("OutputT", self._output)

    last_prompt: SentPrompt | None = None
    """What the last round sent (messages and tools): a conversation compares its
    next turn's prompt with it (``RoundRecord.cache``)."""

    @property
    def text(self) -> str:
        """The final reply's text (the raw JSON of a structured answer)."""
        return self.response.text

    @property
    def output_repairs(self) -> int:
        """How many repair rounds the structured answer took (0: it was valid at once)."""
        return sum(record.output_error is not None for record in self.rounds)

    @property
    def usage(self) -> Usage:
        """Usage summed over every round."""
        total = Usage()
        for record in self.rounds:
            total = total + record.usage
        return total

    @property
    def budget_reason(self) -> str:
        """Where the run's budget came from, or why it had none (see ``RoundRecord``)."""
        return self.rounds[0].budget_reason if self.rounds else ""

    @property
    def limiting(self) -> tuple[LimitingRecord, ...]:
        """Each round's limiting steps in order (two in a round that retried after
        a context-length refusal); a round without a budget has one that only counted."""
        steps = (step for r in self.rounds for step in (r.limiting, r.retry_limiting))
        return tuple(step for step in steps if step is not None)

    @property
    def reasoning_dropped(self) -> tuple[DroppedReasoning, ...]:
        """Reasoning left out of the first call that left it out: produced by
        another provider or model (later rounds leave out the same; see
        ``RoundRecord.reasoning_dropped``)."""
        return next((r.reasoning_dropped for r in self.rounds if r.reasoning_dropped), ())

    @property
    def tool_calls_repaired(self) -> tuple[ToolCallRepair, ...]:
        """What the repair of interrupted tool calls changed in the history (see
        ``RoundRecord.tool_calls_repaired``); empty when nothing needed it or it was off."""
        return self.rounds[0].tool_calls_repaired if self.rounds else ()

    def limiting_summary(self) -> str:
        """One line for a person about the whole run's ledger: the budget (or why
        there was none), and what each limiting step that ran dropped.

        Example: ``2 rounds, prompt budget 8000: round 1: drop_oldest_units (pre)
        dropped 2 units (1 user, 1 assistant; 2 messages); 9120 → 7900 tokens,
        budget 8000``. Each step's own line is ``str(record)``.
        """
        count = len(self.rounds)
        line = f"{count} round{'s' if count != 1 else ''}"
        if self.budget is None:
            reason = self.budget_reason or "none resolved"
            line += f", no budget ({reason}), nothing limited"
        else:
            steps = [str(step) for step in self.limiting if step.limited]
            line += f", prompt budget {self.budget.prompt_tokens}: "
            line += "; ".join(steps) if steps else "nothing dropped"
        retried = sum(record.context_retry for record in self.rounds)
        if retried:
            line += f"; {retried} round{'s' if retried != 1 else ''} retried as too long"
        repaired = self.tool_calls_repaired
        if repaired:
            interrupted = sum(repair.kind == "interrupted" for repair in repaired)
            line += (
                f"; {interrupted} interrupted tool call(s) repaired, "
                f"{len(repaired) - interrupted} orphan result(s) dropped"
            )
        if self.output_repairs:
            line += f"; {self.output_repairs} repair round(s) for an answer that failed its type"
        if self.reasoning_dropped:
            line += (
                f"; reasoning of {len(self.reasoning_dropped)} message(s) left out "
                "(another provider or model made it)"
            )
        return line

    def new_messages(self) -> list[Message]:
        """The messages this run added (origin ``TURN``): the prompt, replies, tool results.

        Injected messages (origin ``INJECTION``) are never included.
        """
        return list(self.turn_messages)
