"""Limiting: fit a transcript to its prompt budget without ever breaking it.

One limiting step (:func:`apply_limits`) per round:

1. check the transcript's integrity and count it;
2. over budget: run the Pre handler (unset: ``drop_oldest_units(None)``);
3. recount; still over budget: run the Post handler (no default);
4. recount; still over budget: send it anyway, with a warning on the
   ``threadline.limiting`` logger. A too-big transcript is better than a
   malformed one; the provider has the last word.

A handler gets a :class:`TokenLimitEvent` whose ``messages`` is a copy; what
it leaves there is what is sent. The engine adopts a rewrite only when the
handler returns normally, the rewrite passes
:func:`~threadline.limiting._units.check_integrity`, and every pinned message is still
there (by value and in order, see :func:`~threadline.limiting._units.match_messages`);
otherwise it raises :class:`HandlerError` and keeps its own transcript. A
handler that raises aborts with its own error.
"""

from __future__ import annotations

import inspect
import itertools
import logging
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from typing import Literal, TypeAlias

import attrs

from threadline._errors import HandlerError, InvalidRequestError, TranscriptIntegrityError
from threadline._messages import Message, Role
from threadline.counting._protocol import TokenCounter, is_incremental, is_token_counter
from threadline.limiting._budget import Budget, BudgetReport, budget_report, message_costs
from threadline.limiting._units import (
    PinReason,
    Unit,
    UnitKind,
    check_integrity,
    current_prompt_index,
    match_messages,
    pinned_messages,
    pinned_units,
    unit_kind,
    unit_starts,
)
from threadline.tools._tools import Tool

__all__ = [
    "DroppedUnit",
    "HandlerRun",
    "LimitingOutcome",
    "LimitingRecord",
    "TokenLimitEvent",
    "TokenLimitHandler",
    "apply_limits",
    "drop_oldest_units",
]

logger = logging.getLogger("threadline.limiting")

Phase: TypeAlias = Literal["pre", "post"]


class TokenLimitEvent:
    """What a limiting handler is given when the transcript is over budget.

    ``messages`` is a copy of the transcript: rewrite it in place or assign a
    new list; whatever is left is what is sent. ``tools``, ``budget_tokens``
    (the prompt budget), ``round`` and ``counter`` are read-only.
    ``estimated_tokens`` is the count when the handler was called;
    :meth:`is_over_budget` recounts and refreshes it.

    Build one yourself to test a handler::

        event = TokenLimitEvent(messages, budget_tokens=1_000, counter=my_counter)
        await my_handler(event)

    ``prompt_index`` marks the current prompt as in
    :func:`~threadline.limiting._units.split_units`; the engine passes ``pinned``
    instead, which wins when given.
    """

    __slots__ = (
        "_budget_tokens",
        "_checked",
        "_counter",
        "_drop_notes",
        "_layout_cache",
        "_pinned",
        "_round",
        "_snapshot",
        "_tools",
        "estimated_tokens",
        "messages",
    )

    def __init__(
        self,
        messages: Iterable[Message],
        *,
        budget_tokens: int,
        counter: TokenCounter,
        tools: Iterable[Tool] = (),
        round: int = 0,
        estimated_tokens: int | None = None,
        prompt_index: int | None = None,
        pinned: Mapping[int, PinReason] | None = None,
    ) -> None:
        self.messages: list[Message] = list(messages)
        self._snapshot = tuple(self.messages)
        self._tools = tuple(tools)
        self._budget_tokens = budget_tokens
        self._counter = counter
        self._round = round
        if pinned is None:
            pinned = pinned_messages(self._snapshot, prompt_index=prompt_index)
        self._pinned: Mapping[int, PinReason] = dict(pinned)
        self._checked = False  # the engine sets it: it checked the snapshot already
        self._layout_cache: _Layout | None = None
        self._drop_notes: dict[int, str] = {}
        if estimated_tokens is None:
            estimated_tokens = counter.count(self.messages, self._tools)
        self.estimated_tokens: int = estimated_tokens

    @property
    def tools(self) -> tuple[Tool, ...]:
        """The tools sent with the transcript (their schemas count)."""
        return self._tools

    @property
    def budget_tokens(self) -> int:
        """The prompt budget: the most the transcript and tools may take."""
        return self._budget_tokens

    @property
    def round(self) -> int:
        """The round of the run (1 for the first provider call of a run)."""
        return self._round

    @property
    def counter(self) -> TokenCounter:
        """The request's token counter."""
        return self._counter

    def is_over_budget(self) -> bool:
        """Recount ``messages`` and ``tools``, refresh ``estimated_tokens``, compare."""
        self.estimated_tokens = self._counter.count(self.messages, self._tools)
        return self.estimated_tokens > self._budget_tokens

    def units(self) -> list[Unit]:
        """The units of ``messages`` as they are now, each marked pinned or droppable.

        A message stays pinned while it is still there, in the same order
        (see :func:`~threadline.limiting._units.match_messages`).

        Raises:
            TranscriptIntegrityError: the current ``messages`` are broken.
        """
        starts, pinned = self._layout()
        ends = [*starts[1:], len(self.messages)]
        return [
            Unit(kind=unit_kind(self.messages[start]), start=start, end=end, reason=pinned.get(k))
            for k, (start, end) in enumerate(zip(starts, ends, strict=True))
        ]

    def _layout(self) -> _Layout:
        """Unit starts and pinned units (by unit number) of ``messages`` as they are now."""
        if self._unchanged():
            if self._layout_cache is None:
                if not self._checked:
                    check_integrity(self._snapshot)
                starts = unit_starts(self._snapshot)
                self._layout_cache = (starts, pinned_units(starts, self._pinned))
            return self._layout_cache
        check_integrity(self.messages)
        sources = match_messages(self._snapshot, self.messages)
        pinned = {
            at: self._pinned[source]
            for at, source in enumerate(sources)
            if source is not None and source in self._pinned
        }
        starts = unit_starts(self.messages)
        return starts, pinned_units(starts, pinned)

    def _unchanged(self) -> bool:
        messages, snapshot = self.messages, self._snapshot
        return len(messages) == len(snapshot) and all(
            a is b for a, b in zip(messages, snapshot, strict=True)
        )

    def _drop_note(self, index: int) -> str | None:
        return self._drop_notes.get(index)

    def note_drop(self, index: int, reason: str) -> None:
        """Say why the message at ``index`` (of ``messages`` as handed over) was dropped.

        The engine puts the reason in the limiting ledger next to the unit.
        """
        self._drop_notes[index] = reason

    def __repr__(self) -> str:
        return (
            f"TokenLimitEvent(round={self._round}, messages={len(self.messages)}, "
            f"estimated_tokens={self.estimated_tokens}, budget_tokens={self._budget_tokens})"
        )


_Layout: TypeAlias = tuple[list[int], dict[int, PinReason]]

TokenLimitHandler: TypeAlias = Callable[[TokenLimitEvent], Awaitable[None] | None]
"""A limiting handler: ``async def handler(event) -> None`` or a plain function."""


def handler_name(handler: object) -> str:
    """How the ledger and errors name a handler: its qualified name, else its type's."""
    name = getattr(handler, "__qualname__", None)
    if isinstance(name, str):
        return name
    return type(handler).__qualname__


# -- the built-in handler --------------------------------------------------------------


def drop_oldest_units(counter: TokenCounter | None = None) -> TokenLimitHandler:
    """Build the built-in handler: drop droppable units, oldest first, until it fits.

    ``counter`` prices the messages; ``None`` uses the event's counter (the
    request's), which is what you want unless you price with another one.

    The handler drops whole units only, and never a pinned one. Once it has
    dropped anything, it goes on until the transcript after the first system
    message opens with a user message. A transcript that already fits is left
    as it is (the very same list). Each message is priced once and the
    savings are summed, so the cost is linear in the transcript's length;
    with a counter that is not an :class:`IncrementalTokenCounter`, per-message
    costs are estimated and the result is verified with a real count.

    Example::

        request.pre_max_tokens_reached(summarize).post_max_tokens_reached(
            drop_oldest_units(None)
        )

    Raises:
        InvalidRequestError: ``counter`` is not a token counter.
    """
    if counter is not None and not is_token_counter(counter):
        raise InvalidRequestError(
            f"drop_oldest_units takes a TokenCounter or None, not {type(counter).__name__}"
        )

    async def handler(event: TokenLimitEvent) -> None:
        _drop_oldest(event, counter if counter is not None else event.counter)

    handler.__name__ = handler.__qualname__ = "drop_oldest_units"
    return handler


def _drop_oldest(event: TokenLimitEvent, counter: TokenCounter) -> None:
    messages = event.messages
    tools = event.tools
    budget = event.budget_tokens
    costs, overhead = message_costs(counter, messages, tools)
    exact = is_incremental(counter)
    if exact:
        total = sum(costs) + overhead
    elif counter is event.counter and event._unchanged():
        total = event.estimated_tokens  # the engine's own count of this very list
    else:
        total = counter.count(messages, tools)
    if total <= budget:
        return

    starts, pinned = event._layout()
    ends = [*starts[1:], len(messages)]
    prefix = list(itertools.accumulate(costs, initial=0))
    droppable = [k for k in range(len(starts)) if k not in pinned]
    first_system = next((k for k, r in pinned.items() if r is PinReason.FIRST_SYSTEM), None)
    dropped = [False] * len(starts)
    taken = 0  # droppable[:taken] are dropped: always the oldest ones
    front = 0  # no unit before this one can open the kept transcript
    excess = total - budget
    over_budget = f"oldest droppable unit while {total} > {budget} tokens"
    opening = "dropped so that the transcript opens with a user message"
    while True:
        freed = 0
        while freed < excess and taken < len(droppable):
            k = droppable[taken]
            dropped[k] = True
            freed += prefix[ends[k]] - prefix[starts[k]]
            taken += 1
            event.note_drop(starts[k], over_budget)
        # The first kept unit besides the first system message must be a user
        # message: droppable units in the way go too, a pinned one stops it.
        while front < len(starts):
            if dropped[front] or front == first_system:
                front += 1
                continue
            if front in pinned or messages[starts[front]].role is Role.USER:
                break
            dropped[front] = True  # units go oldest first: this is droppable[taken]
            taken += 1
            event.note_drop(starts[front], opening)
            front += 1
        kept = _kept_messages(messages, starts, ends, dropped)
        if exact:
            break
        total = counter.count(kept, tools)
        if total <= budget or taken == len(droppable):
            break
        excess = total - budget
    event.messages = kept


def _kept_messages(
    messages: Sequence[Message], starts: list[int], ends: list[int], dropped: list[bool]
) -> list[Message]:
    kept: list[Message] = []
    run_start: int | None = None  # copy runs of kept units in one slice each
    for k, gone in enumerate(dropped):
        if gone:
            if run_start is not None:
                kept.extend(messages[run_start : starts[k]])
                run_start = None
        elif run_start is None:
            run_start = starts[k]
    if run_start is not None:
        kept.extend(messages[run_start : ends[-1]])
    return kept


# -- the ledger ------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class DroppedUnit:
    """A unit of the round's input transcript that a handler removed.

    ``start`` and ``end`` index the transcript given to :func:`apply_limits`
    (``messages[start:end]``); ``roles`` are its messages' roles; ``handler``
    names the handler and ``phase`` says whether it ran as Pre or Post;
    ``reason`` is what the handler noted, or the budget it was fighting.
    """

    handler: str
    phase: Phase
    kind: UnitKind
    start: int
    end: int
    roles: tuple[Role, ...]
    reason: str


@attrs.frozen(kw_only=True)
class HandlerRun:
    """One handler call: the counts around it and how much it changed."""

    handler: str
    phase: Phase
    tokens_before: int
    tokens_after: int
    dropped_messages: int
    added_messages: int


@attrs.frozen(kw_only=True)
class LimitingRecord:
    """What one limiting step did, for the run's ledger (``RunResult.limiting``).

    ``tokens_before``/``tokens_after`` are the counts of the transcript given
    and sent; ``budget_tokens`` the prompt budget (``None``: no budget, no
    limiting); ``handlers`` the handlers that ran, in order; ``dropped`` the
    units they removed, oldest first within each handler;
    ``sent_over_budget`` whether what is sent is still over the budget;
    ``report`` where the tokens of what is sent went.
    """

    round: int
    budget_tokens: int | None
    tokens_before: int
    tokens_after: int
    handlers: tuple[HandlerRun, ...]
    dropped: tuple[DroppedUnit, ...]
    sent_over_budget: bool
    report: BudgetReport

    @property
    def limited(self) -> bool:
        """True when any handler ran."""
        return bool(self.handlers)


@attrs.frozen(kw_only=True)
class LimitingOutcome:
    """The transcript to send and the record of how it was made.

    ``sources[i]`` is the index in the input of ``messages[i]`` (``None`` for
    a message a handler added, such as a summary); ``prompt_index`` is where
    the current prompt now sits (``None`` when there is none).
    """

    messages: tuple[Message, ...]
    record: LimitingRecord
    sources: tuple[int | None, ...]
    prompt_index: int | None


# -- the engine ------------------------------------------------------------------------


async def apply_limits(
    messages: Sequence[Message],
    *,
    tools: Sequence[Tool] = (),
    counter: TokenCounter,
    budget: Budget | None,
    pre: TokenLimitHandler | None = None,
    post: TokenLimitHandler | None = None,
    round: int = 0,
    prompt_index: int | None = None,
) -> LimitingOutcome:
    """Run one limiting step: count, Pre, recount, Post, recount.

    ``budget`` ``None`` sends the transcript as it is. ``pre`` unset is
    ``drop_oldest_units(None)``; a ``pre`` given replaces it outright.
    ``post`` has no default. ``prompt_index`` is the position of the current
    prompt (see :func:`~threadline.limiting._units.split_units` for what it pins).
    ``messages`` is never modified.

    Raises:
        TranscriptIntegrityError: ``messages`` itself is broken.
        HandlerError: a handler left a broken transcript, or dropped or
            changed a pinned message.
        Exception: whatever a handler raised, unchanged.
    """
    state = _Limiting(tuple(messages), tuple(tools), counter, budget, round, prompt_index)
    if budget is not None:
        handlers: tuple[tuple[Phase, TokenLimitHandler | None], ...] = (
            ("pre", pre if pre is not None else drop_oldest_units(None)),
            ("post", post),
        )
        for phase, handler in handlers:
            if handler is not None and state.tokens > budget.prompt_tokens:
                await state.run(phase, handler, budget)
    return state.outcome()


class _Limiting:
    """The engine's own transcript through one limiting step."""

    def __init__(
        self,
        messages: tuple[Message, ...],
        tools: tuple[Tool, ...],
        counter: TokenCounter,
        budget: Budget | None,
        round: int,
        prompt_index: int | None,
    ) -> None:
        check_integrity(messages)
        self.original = messages
        self.tools = tools
        self.counter = counter
        self.budget = budget
        self.round = round
        self.prompt_index = current_prompt_index(messages, prompt_index)
        self.pinned: dict[int, PinReason] = pinned_messages(messages, prompt_index=prompt_index)
        self.original_starts = unit_starts(messages)
        self.current: list[Message] = list(messages)
        self.sources: list[int | None] = list(range(len(messages)))
        self.tokens_before = self.tokens = counter.count(messages, tools)
        self.runs: list[HandlerRun] = []
        self.dropped: list[DroppedUnit] = []

    async def run(self, phase: Phase, handler: TokenLimitHandler, budget: Budget) -> None:
        name = handler_name(handler)
        event = TokenLimitEvent(
            self.current,
            budget_tokens=budget.prompt_tokens,
            counter=self.counter,
            tools=self.tools,
            round=self.round,
            estimated_tokens=self.tokens,
            pinned=self.pinned,
        )
        event._checked = True
        result = handler(event)
        if inspect.isawaitable(result):
            await result
        rewrite, matches, removed = self._checked_rewrite(event, name)
        reason = f"over budget: {self.tokens} > {budget.prompt_tokens} tokens"
        self._record_drops(name, phase, removed, event, reason)
        self.pinned = {
            at: self.pinned[source]
            for at, source in enumerate(matches)
            if source is not None and source in self.pinned
        }
        self.sources = [self.sources[m] if m is not None else None for m in matches]
        self.current = rewrite
        before, self.tokens = self.tokens, self.counter.count(rewrite, self.tools)
        self.runs.append(
            HandlerRun(
                handler=name,
                phase=phase,
                tokens_before=before,
                tokens_after=self.tokens,
                dropped_messages=len(removed),
                added_messages=matches.count(None),
            )
        )

    def _checked_rewrite(
        self, event: TokenLimitEvent, name: str
    ) -> tuple[list[Message], list[int | None], list[int]]:
        output: object = event.messages
        if not isinstance(output, list | tuple):
            raise HandlerError(
                f"limiting handler {name!r} left event.messages as a "
                f"{type(output).__name__}; it must be a list of Message",
                handler=name,
            )
        rewrite = list(output)
        for index, message in enumerate(rewrite):
            if not isinstance(message, Message):
                raise HandlerError(
                    f"limiting handler {name!r} left a {type(message).__name__} at message "
                    f"{index}; only Message objects can be sent",
                    handler=name,
                    index=index,
                )
        try:
            check_integrity(rewrite)
        except TranscriptIntegrityError as exc:
            raise HandlerError(
                f"limiting handler {name!r} left a broken transcript: message {exc.index}: "
                f"{exc.reason}",
                handler=name,
                index=exc.index,
            ) from exc
        matches = match_messages(self.current, rewrite)
        removed: list[int] = []
        expected = 0
        for source in matches:
            if source is not None:
                removed.extend(range(expected, source))
                expected = source + 1
        removed.extend(range(expected, len(self.current)))
        for index in removed:
            reason = self.pinned.get(index)
            if reason is not None:
                message = self.current[index]
                raise HandlerError(
                    f"limiting handler {name!r} dropped or changed the {reason.value} "
                    f"(message {index} of the transcript it was given, {message.role.value}); "
                    "pinned messages must be kept as they are",
                    handler=name,
                )
        return rewrite, matches, removed

    def _record_drops(
        self,
        name: str,
        phase: Phase,
        removed: list[int],
        event: TokenLimitEvent,
        default_reason: str,
    ) -> None:
        # Attribute removed messages to units of the round's input; a message
        # an earlier handler added has no unit there and is left out. Sources
        # only grow along the transcript, so one walk over the units does it.
        starts = self.original_starts
        found: list[tuple[int, str | None]] = []  # (unit number, noted reason)
        k = 0
        for index in removed:
            source = self.sources[index]
            if source is None:
                continue
            while k + 1 < len(starts) and starts[k + 1] <= source:
                k += 1
            note = event._drop_note(index)
            if found and found[-1][0] == k:
                if found[-1][1] is None:
                    found[-1] = (k, note)
            else:
                found.append((k, note))
        for k, note in found:
            start = starts[k]
            end = starts[k + 1] if k + 1 < len(starts) else len(self.original)
            unit = self.original[start:end]
            self.dropped.append(
                DroppedUnit(
                    handler=name,
                    phase=phase,
                    kind=unit_kind(unit[0]),
                    start=start,
                    end=end,
                    roles=tuple(m.role for m in unit),
                    reason=note or default_reason,
                )
            )

    def outcome(self) -> LimitingOutcome:
        budget = self.budget
        over = budget is not None and self.tokens > budget.prompt_tokens
        if over and budget is not None:
            starts = unit_starts(self.current)
            only_pinned = len(pinned_units(starts, self.pinned)) == len(starts)
            logger.warning(
                "round %d: sending %d tokens over the prompt budget of %d tokens (%s); "
                "the provider may refuse it",
                self.round,
                self.tokens,
                budget.prompt_tokens,
                "only pinned messages are left"
                if only_pinned
                else "the limiting handlers left droppable units in place",
            )
        report = budget_report(
            self.current,
            tools=self.tools,
            counter=self.counter,
            pinned=self.pinned,
            budget=budget,
            total_tokens=self.tokens,
        )
        record = LimitingRecord(
            round=self.round,
            budget_tokens=budget.prompt_tokens if budget is not None else None,
            tokens_before=self.tokens_before,
            tokens_after=self.tokens,
            handlers=tuple(self.runs),
            dropped=tuple(self.dropped),
            sent_over_budget=over,
            report=report,
        )
        prompt_at = None
        if self.prompt_index is not None:
            prompt_at = next(
                (at for at, src in enumerate(self.sources) if src == self.prompt_index), None
            )
        return LimitingOutcome(
            messages=tuple(self.current),
            record=record,
            sources=tuple(self.sources),
            prompt_index=prompt_at,
        )
