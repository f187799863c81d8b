"""The limiting ledger: what each limiting step did, for ``RunResult.limiting``.

One :class:`LimitingRecord` per round with a budget: the counts around the
step, each :class:`HandlerRun`, each :class:`DroppedUnit` (by which handler,
and why) and the :class:`~threadline.limiting.BudgetReport` of what was
sent. :class:`LimitingOutcome` is what the engine hands the run loop: the
transcript to send and its record.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Literal, TypeAlias, overload

import attrs

from threadline._messages import Message, Role
from threadline.counting._calibration import calibrated_estimate
from threadline.counting._deferred import Deferred, resolved
from threadline.counting._protocol import TokenCounter
from threadline.limiting._budget import BudgetReport
from threadline.limiting._units import UnitKind

__all__ = [
    "ClearedMessage",
    "CompactionOutcome",
    "CompactionStatus",
    "CountedBy",
    "DroppedReasoning",
    "DroppedUnit",
    "DroppedUnits",
    "HandlerRun",
    "LimitingOutcome",
    "LimitingRecord",
    "Phase",
    "ToolCallRepair",
]

Phase: TypeAlias = Literal["pre", "post"]
CountedBy: TypeAlias = Literal["estimate", "calibrated estimate", "exact"]
"""Which count a limiting step decided on."""


@attrs.frozen(kw_only=True)
class DroppedUnit:
    """A unit of the round's input transcript that a handler removed.

    ``start`` and ``end`` index the transcript given to the limiting step
    (``messages[start:end]``); ``roles`` are its messages' roles; ``handler``
    names the handler and ``phase`` says whether it ran as Pre or Post;
    ``reason`` is what the handler said (with ``event.drop_units`` or
    ``event.note_drop``), or the budget it was fighting.
    """

    handler: str
    phase: Phase
    kind: UnitKind
    start: int
    end: int
    roles: tuple[Role, ...]
    reason: str


class DroppedUnits(Sequence[DroppedUnit]):
    """The units a limiting step dropped, in order: a read-only sequence of :class:`DroppedUnit`.

    What ``LimitingRecord.dropped`` holds. A step that drops tens of
    thousands of units records which ones cheaply; the :class:`DroppedUnit`
    values are made the first time the sequence is read, so a ledger nobody
    reads costs little. It compares equal to a list or tuple of the same units.
    """

    __slots__ = ("_make", "_units")

    def __init__(self, make: Callable[[], list[DroppedUnit]] | Sequence[DroppedUnit] = ()) -> None:
        self._units: list[DroppedUnit] | None = None
        self._make: Callable[[], list[DroppedUnit]] | None = None
        if callable(make):
            self._make = make
        else:
            self._units = list(make)

    def _all(self) -> list[DroppedUnit]:
        units = self._units
        if units is None:
            assert self._make is not None
            units = self._units = self._make()
            self._make = None  # what it needed (the transcript) is let go
        return units

    def __len__(self) -> int:
        return len(self._all())

    @overload
    def __getitem__(self, index: int) -> DroppedUnit: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[DroppedUnit]: ...

    def __getitem__(self, index: int | slice) -> DroppedUnit | Sequence[DroppedUnit]:
        if isinstance(index, slice):
            return tuple(self._all()[index])
        return self._all()[index]

    def __iter__(self) -> Iterator[DroppedUnit]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, DroppedUnits | list | tuple):
            return self._all() == list(other)
        return NotImplemented

    def __hash__(self) -> int:
        return hash(tuple(self._all()))

    def __repr__(self) -> str:
        return f"DroppedUnits({self._all()!r})"


def dropped_units(units: Sequence[DroppedUnit] | DroppedUnits) -> DroppedUnits:
    """``units`` as a :class:`DroppedUnits` (the very one when it is one already)."""
    return units if isinstance(units, DroppedUnits) else DroppedUnits(units)


@attrs.frozen(kw_only=True)
class DroppedReasoning:
    """Reasoning replay state left out of a call: another provider or model made it.

    ``index`` is the message's position in what the round sent; ``provider``
    is the ``Reasoning.provider`` it carried (``None``: unnamed); ``sent_to``
    the driver and model the call went to. The message itself was sent.
    """

    index: int
    provider: str | None
    sent_to: str

    def __str__(self) -> str:
        return (
            f"message {self.index}: reasoning from {self.provider or 'an unnamed provider'} "
            f"left out of the call to {self.sent_to}"
        )


@attrs.frozen(kw_only=True)
class ToolCallRepair:
    """A repair of the history's tool units, made because the request asked for it
    (``RequestSettings.repair_interrupted_tool_calls``).

    ``kind`` ``"interrupted"``: the call ``call_id`` to ``tool``, made by message
    ``index``, had no result and got one saying it was interrupted, right after
    the results its exchange had. ``"orphan"``: message ``index``, the result
    for ``call_id`` (``tool`` is ``None``), answered no call made just before it
    and was dropped. ``index`` is the message's position in the transcript as
    it was given (the system message, then the history).
    """

    kind: Literal["interrupted", "orphan"]
    index: int
    call_id: str
    tool: str | None = None

    def __str__(self) -> str:
        if self.kind == "interrupted":
            return (
                f"message {self.index}: tool call {self.call_id!r} ({self.tool}) was "
                "interrupted; a result saying so was added"
            )
        return (
            f"message {self.index}: the tool result for call {self.call_id!r} answered no "
            "call made just before it; it was dropped"
        )


@attrs.frozen(kw_only=True)
class ClearedMessage:
    """A message a handler kept in place but sent with its bulk cleared.

    ``index`` is its position in the transcript given to the limiting step;
    ``what`` is ``"tool result"`` or ``"reasoning"``; ``tool`` and ``call_id``
    name the call a cleared result answered (``None`` for reasoning);
    ``tokens`` is what the cleared content held, as the handler priced it.
    The conversation's history keeps the message whole: only what was sent
    this round is cleared.
    """

    handler: str
    phase: Phase
    index: int
    what: Literal["tool result", "reasoning"]
    tokens: int
    reason: str
    tool: str | None = None
    call_id: str | None = None


CompactionStatus: TypeAlias = Literal[
    "applied", "reused", "empty", "failed", "cancelled", "too long", "unsupported"
]
"""What a compaction came to: ``"applied"`` (a new summary replaced the turns it
covers), ``"reused"`` (a summary written before still covers them), or a no-op:
the summarizer returned nothing (``"empty"``), raised (``"failed"``), ran out of
its time (``"cancelled"``), or wrote more than it may (``"too long"``), or the
driver has no native compaction (``"unsupported"``, ``Conversation.compact()``)."""


@attrs.frozen(kw_only=True)
class CompactionOutcome:
    """What one compaction attempt came to, for the ledger (``LimitingRecord.compactions``).

    A compaction that is not ``applied`` or ``reused`` changed nothing: the
    transcript went on as it was (the Post handler, if any, then cut what did
    not fit), and nothing of it reached the conversation's history.
    ``covered_messages`` and ``covered_tokens`` are what the summary replaces
    (or would have); ``summary_tokens`` what the summary costs (``None``: none
    was written); ``detail`` says why a no-op was one (the error's type and
    message, the length refused).
    """

    handler: str
    status: CompactionStatus
    covered_messages: int
    covered_tokens: int
    summary_tokens: int | None = None
    detail: str = ""

    @property
    def applied(self) -> bool:
        """True when the transcript sent holds a summary in place of the turns covered."""
        return self.status in ("applied", "reused")

    def __str__(self) -> str:
        said = f"{self.handler}: compaction {self.status} ({self.covered_messages} messages"
        said += f", {self.covered_tokens} tokens"
        if self.summary_tokens is not None:
            said += f" -> summary of {self.summary_tokens} tokens"
        said += ")"
        return f"{said}: {self.detail}" if self.detail else said


@attrs.frozen(kw_only=True)
class HandlerRun:
    """One handler call: the counts around it and how much it changed."""

    handler: str
    phase: Phase
    tokens_before: int
    tokens_after: int
    dropped_messages: int
    added_messages: int
    cleared_messages: int = 0


@attrs.frozen(kw_only=True)
class LimitingRecord:
    """What one limiting step did, for the run's ledger (``RunResult.limiting``).

    ``tokens_before``/``tokens_after`` are the counts of the transcript given
    and sent; ``budget_tokens`` the prompt budget (``None``: no budget, no
    limiting); ``handlers`` the handlers that ran, in order; ``dropped`` the
    units they removed, oldest first within each handler;
    ``sent_over_budget`` whether what is sent is still over the budget;
    ``report`` where the tokens of what is sent went.

    Which count decided is ``counted_by``: the request counter's
    ``"estimate"``, the ``"calibrated estimate"`` (scaled by the client's
    calibration), or ``"exact"``, when the estimate came near the budget and
    the exact counter was asked about what the estimate alone would send
    (the transcript given, or the built-in handler's cut of it). Then
    ``exact_tokens`` is that count, ``estimated_tokens`` what the estimate
    said of the same transcript and :attr:`estimate_error` how far it was;
    ``tokens_before`` stays the estimate of the transcript given,
    ``tokens_after`` is counted from the exact count
    (:class:`~threadline.counting.AnchoredCounter`), and ``exact_tokens_sent``
    is the exact count when that very transcript was sent.
    """

    round: int
    """The round of the run, from 1 (the first provider call)."""
    budget_tokens: int | None
    # The counts are made when first read where a bound decided (see counting._deferred).
    _tokens_before: int | Deferred[int] = attrs.field(alias="tokens_before")
    _tokens_after: int | Deferred[int] = attrs.field(alias="tokens_after")
    handlers: tuple[HandlerRun, ...]
    dropped: Sequence[DroppedUnit] = attrs.field(converter=dropped_units)
    sent_over_budget: bool
    _report: BudgetReport | Deferred[BudgetReport] = attrs.field(alias="report")
    counted_by: CountedBy = "estimate"
    _estimated_tokens: int | Deferred[int] | None = attrs.field(
        default=None, alias="estimated_tokens"
    )
    exact_tokens: int | None = None
    """The exact count taken, when the exact counter was asked."""
    exact_tokens_sent: int | None = None
    """The exact count of what was sent, when it is what was counted exactly."""
    cleared: tuple[ClearedMessage, ...] = ()
    """The messages kept in place with their bulk cleared (``clear_tool_results``,
    ``clear_thinking``), oldest first within each handler."""
    compactions: tuple[CompactionOutcome, ...] = ()
    """What each compaction a handler tried this round came to (``summarize_oldest``):
    applied, reused, or a no-op and why."""

    @classmethod
    def unchanged(
        cls,
        *,
        round: int,
        budget_tokens: int | None,
        tokens: int | Deferred[int],
        report: BudgetReport | Deferred[BudgetReport],
        counter: TokenCounter,
    ) -> LimitingRecord:
        """The record of a round that sent the transcript as given: no handler ran,
        ``tokens`` counted by ``counter``'s estimate (fitting the budget)."""
        return cls(
            round=round,
            budget_tokens=budget_tokens,
            tokens_before=tokens,
            tokens_after=tokens,
            handlers=(),
            dropped=(),
            sent_over_budget=False,
            report=report,
            counted_by=estimate_kind(counter),
            estimated_tokens=tokens,
        )

    @property
    def tokens_before(self) -> int:
        """The count of the transcript given."""
        return resolved(self._tokens_before)

    @property
    def tokens_after(self) -> int:
        """The count of the transcript sent."""
        return resolved(self._tokens_after)

    @property
    def report(self) -> BudgetReport:
        """Where the tokens of what is sent went."""
        return resolved(self._report)

    @property
    def estimated_tokens(self) -> int | None:
        """The estimate (calibrated, when it was) of the transcript given, or of what
        was counted exactly."""
        estimated = self._estimated_tokens
        return None if estimated is None else resolved(estimated)

    def tokens_sent(self) -> int | Deferred[int]:
        """:attr:`tokens_after`, or what makes it when it is read (internal: the run
        hands it on to its round's record without making it)."""
        return self._tokens_after

    @property
    def limited(self) -> bool:
        """True when any handler ran."""
        return bool(self.handlers)

    def summary(self) -> str:
        """One line for a person: what was dropped, by which handler, and the
        tokens before → after against the budget.

        Example: ``round 2: drop_oldest_units (pre) dropped 3 units (2 user,
        1 tool_exchange; 5 messages); 9120 → 7900 tokens, budget 8000``.
        """
        head = f"round {self.round}: "
        if self.budget_tokens is None:
            return f"{head}no budget, nothing limited; {self.tokens_after} tokens sent"
        counts = f"{self.tokens_before} → {self.tokens_after} tokens, budget {self.budget_tokens}"
        if self.counted_by != "estimate":
            counts += f", counted by {self.counted_by}"
        if self.sent_over_budget:
            counts += ", still over budget (only pinned messages left)"
        if not self.handlers:
            return f"{head}nothing dropped; {counts}"
        return f"{head}{'; '.join(self._handler_summary(run) for run in self.handlers)}; {counts}"

    def _handler_summary(self, run: HandlerRun) -> str:
        units = [u for u in self.dropped if u.handler == run.handler and u.phase == run.phase]
        did = f"{run.handler} ({run.phase})"
        cleared = [c for c in self.cleared if c.handler == run.handler and c.phase == run.phase]
        tried = [c for c in self.compactions if c.handler == run.handler]
        if not units and not run.dropped_messages and not run.added_messages and not cleared:
            if tried and tried[-1].status not in ("applied", "reused"):
                return f"{did} changed nothing ({tried[-1]})"
            return f"{did} changed nothing"
        if not units and not run.dropped_messages and not run.added_messages:
            tokens = sum(c.tokens for c in cleared)
            plural = "s" if len(cleared) != 1 else ""
            return f"{did} cleared {len(cleared)} message{plural} ({tokens} tokens)"
        kinds: dict[str, int] = {}
        for unit in units:
            kinds[unit.kind.value] = kinds.get(unit.kind.value, 0) + 1
        detail = ", ".join(f"{n} {kind}" for kind, n in kinds.items())
        said = f"{did} dropped {len(units)} unit{'s' if len(units) != 1 else ''}"
        said += f" ({detail}; {run.dropped_messages} messages)" if units else ""
        if run.added_messages:
            said += f", added {run.added_messages} message{'s' if run.added_messages != 1 else ''}"
        return said

    def __str__(self) -> str:
        return self.summary()

    def __repr__(self) -> str:
        # The messages stay out: the full record is in the fields.
        return (
            f"LimitingRecord(round={self.round}, budget_tokens={self.budget_tokens}, "
            f"tokens_before={self.tokens_before}, tokens_after={self.tokens_after}, "
            f"handlers={[f'{h.handler}:{h.phase}' for h in self.handlers]}, "
            f"dropped={len(self.dropped)}, counted_by={self.counted_by!r})"
        )

    @property
    def estimate_error(self) -> float | None:
        """How far the estimate was from the exact count, as a fraction of it
        (``-0.04``: 4% under); ``None`` when no exact count was taken."""
        if self.exact_tokens is None or self.estimated_tokens is None or not self.exact_tokens:
            return None
        return (self.estimated_tokens - self.exact_tokens) / self.exact_tokens


def estimate_kind(counter: TokenCounter) -> CountedBy:
    """How ``counter`` estimates: ``"calibrated estimate"`` when the client's
    calibration scales it, else ``"estimate"``."""
    return "estimate" if calibrated_estimate(counter) is None else "calibrated estimate"


@attrs.frozen(kw_only=True)
class LimitingOutcome:
    """The transcript to send and the record of how it was made.

    ``sources[i]`` is the index in the input of ``messages[i]`` (``None`` for
    a message a handler added, such as a summary); ``prompt_index`` is where
    the current prompt now sits (``None`` when there is none). A transcript
    left as it was has ``range(len(messages))``, which costs nothing to make.
    """

    messages: tuple[Message, ...]
    record: LimitingRecord
    sources: Sequence[int | None]
    prompt_index: int | None
