"""The limiting engine: fit a transcript to its prompt budget without ever breaking it.

One limiting step (:func:`apply_limits`) per round:

1. check the transcript's integrity and count it;
2. over budget: run the Pre handler (unset: ``drop_oldest_units(None)``);
3. recount; still over budget: run the Post handler (no default);
4. recount; still over budget: send it anyway, with a warning on the
   ``threadline.limiting`` logger. A too-big transcript is better than a
   malformed one; the provider has the last word.

A handler gets a :class:`~threadline.limiting.TokenLimitEvent` whose
``messages`` is a copy; what it leaves there is what is sent. The engine
adopts a rewrite only when the handler returns normally, the rewrite passes
:func:`~threadline.limiting._units.check_integrity`, and every pinned message
is still there (by value and in order, see
:func:`~threadline.limiting._units.match_messages`); otherwise it raises
:class:`HandlerError` and keeps its own transcript. A handler that raises
aborts with its own error. What was dropped, by which handler and why, goes
into the ledger (:mod:`threadline.limiting._ledger`).

Exact only near the boundary: the step decides on the estimate (calibrated,
when the run is), and only when that estimate comes within ``exact_margin``
of the budget, or over it, does it ask the exact counter (a round trip), once,
for what the estimate alone would send. That count then decides: the
handlers see an :class:`~threadline.counting.AnchoredCounter` that counts
that transcript exactly and prices what they drop from it or keep beside it
from the estimate, leaning towards too many tokens. An exact counter that
fails leaves the decision to the estimate, with a warning.
"""

from __future__ import annotations

import bisect
import functools
import inspect
import logging
from collections.abc import Mapping, Sequence
from typing import NoReturn, cast

from threadline._errors import HandlerError, ThreadlineError, TranscriptIntegrityError
from threadline._messages import Message, Role
from threadline.counting._anchored import AnchoredCounter
from threadline.counting._calibration import calibrated_estimate
from threadline.counting._protocol import TokenCounter, is_incremental
from threadline.counting._resolution import ExactCounter
from threadline.limiting._bounded import bounded_outcome
from threadline.limiting._budget import Budget, budget_report, message_costs
from threadline.limiting._defaults import DEFAULT_REQUEST_HANDLER
from threadline.limiting._drop_oldest import slide_cut
from threadline.limiting._drops import Drops, starts_after, units_dropped
from threadline.limiting._event import (
    TokenLimitEvent,
    TokenLimitHandler,
    certified_sources,
    checked_event,
    compaction_log,
    drop_log,
    handler_name,
    removed_spans,
    replacements,
)
from threadline.limiting._incremental import CheckedHistory, quick_outcome
from threadline.limiting._ledger import (
    ClearedMessage,
    CompactionOutcome,
    CountedBy,
    DroppedUnits,
    HandlerRun,
    LimitingOutcome,
    LimitingRecord,
    Phase,
    estimate_kind,
)
from threadline.limiting._traits import traits_of
from threadline.limiting._units import (
    PinReason,
    checked_unit_starts,
    current_prompt_index,
    match_messages,
    pinned_messages,
    pinned_units,
)
from threadline.tools._tools import Tool

__all__ = ["apply_limits"]

logger = logging.getLogger("threadline.limiting")

_OPENING = (
    "dropped so that the transcript opens with a user message (the handler left a reply first)"
)


async def apply_limits(
    messages: Sequence[Message],
    *,
    tools: Sequence[Tool] = (),
    counter: TokenCounter,
    budget: Budget | None,
    pre: TokenLimitHandler | None = None,
    post: TokenLimitHandler | None = None,
    round: int = 1,
    prompt_index: int | None = None,
    exact_counter: ExactCounter | None = None,
    exact_margin: float | None = None,
    exact_always: bool = False,
    history: CheckedHistory | None = None,
) -> LimitingOutcome:
    """Run one limiting step: count, Pre, recount, Post, recount.

    ``budget`` ``None`` sends the transcript as it is. ``pre`` unset is
    ``drop_oldest_units(None)``; a ``pre`` given replaces it outright.
    ``post`` has no default. ``prompt_index`` is the position of the current
    prompt (see :func:`~threadline.limiting._units.split_units` for what it pins).
    ``messages`` is never modified. ``exact_counter`` is asked when the
    estimate is over ``(1 - exact_margin)`` times the budget (``None``
    either way: never), or always when ``exact_always`` (an estimate not yet
    calibrated for this model says little about the distance). ``history``
    is a conversation's word for the history inside ``messages`` (see
    ``_incremental``): when no handler has to run, the step is then taken
    without walking it.

    Raises:
        TranscriptIntegrityError: ``messages`` itself is broken.
        HandlerError: a handler left a broken transcript, or dropped or
            changed a pinned message.
        Exception: whatever a handler raised, unchanged.
    """
    every_round = pre is not None and traits_of(pre).runs_every_round
    if history is not None and not every_round:
        quick = quick_outcome(
            messages,
            tools=tools,
            counter=counter,
            budget=budget,
            round=round,
            prompt_index=prompt_index,
            history=history,
            exact_margin=(1.0 if exact_always else exact_margin)
            if exact_counter is not None
            else None,
            sliding=handler_name(pre) if post is None and traits_of(pre).slides_one_unit else None,
        )
        if quick is not None:
            return quick
    threshold = _decided_below(budget, exact_margin if exact_counter is not None else None)
    if not every_round and not (exact_always and exact_counter is not None):
        bounded = bounded_outcome(
            messages,
            tools=tools,
            counter=counter,
            budget=budget,
            round=round,
            prompt_index=prompt_index,
            threshold=threshold,
        )
        if bounded is not None:
            return bounded
    state = _Limiting(list(messages), tuple(tools), counter, budget, round, prompt_index)
    if budget is not None:
        first = pre if pre is not None else DEFAULT_REQUEST_HANDLER
        if exact_counter is not None and exact_margin is not None:
            built_in = first if pre is None else None
            await state.count_exactly(
                exact_counter, exact_margin, budget, built_in, always=exact_always
            )
        handlers: tuple[tuple[Phase, TokenLimitHandler | None], ...] = (
            ("pre", first),
            ("post", post),
        )
        for phase, handler in handlers:
            over = state.tokens > budget.prompt_tokens
            if handler is not None and (over or (phase == "pre" and every_round)):
                await state.run(phase, handler, budget)
    return state.outcome()


def _decided_below(budget: Budget | None, exact_margin: float | None) -> float:
    """The count at or under which a step runs no handler and asks no exact count."""
    if budget is None:
        return float("inf")
    if exact_margin is None:
        return budget.prompt_tokens
    return budget.prompt_tokens * (1 - exact_margin)


class _Limiting:
    """The engine's own transcript through one limiting step."""

    __slots__ = (
        "budget",
        "cleared",
        "compactions",
        "costs",
        "counted_by",
        "counter",
        "current",
        "drops",
        "estimated_tokens",
        "exact_candidate",
        "exact_tokens",
        "original",
        "original_starts",
        "pinned",
        "prompt_index",
        "round",
        "runs",
        "sources",
        "starts",
        "tokens",
        "tokens_before",
        "tools",
    )

    def __init__(
        self,
        messages: list[Message],
        tools: tuple[Tool, ...],
        counter: TokenCounter,
        budget: Budget | None,
        round: int,
        prompt_index: int | None,
    ) -> None:
        """``messages`` is the step's own copy of its input, which nothing changes:
        the first transcript and, for the ledger, the original."""
        self.original_starts = checked_unit_starts(messages)
        # Where the units of the current transcript start: carried across each
        # rewrite, so no step walks a transcript twice to find them.
        self.starts = self.original_starts
        self.original = messages
        self.tools = tools
        self.counter = counter
        self.budget = budget
        self.round = round
        self.prompt_index = current_prompt_index(messages, prompt_index)
        self.pinned: dict[int, PinReason] = pinned_messages(
            messages, prompt_index=self.prompt_index
        )
        self.current = messages  # replaced by each rewrite, never changed in place
        self.sources: Sequence[int | None] = range(len(messages))
        # With an incremental counter each message is priced once, here: the
        # recount after a handler and the budget report sum these costs.
        self.costs: list[int] | None = None
        if is_incremental(counter):
            self.costs, overhead = message_costs(counter, messages, tools)
            self.tokens = sum(self.costs) + overhead
        else:
            self.tokens = counter.count(messages, tools)
        self.tokens_before = self.tokens
        self.estimated_tokens = self.tokens
        self.exact_tokens: int | None = None
        self.exact_candidate: tuple[Message, ...] | None = None
        self.counted_by: CountedBy = estimate_kind(counter)
        self.runs: list[HandlerRun] = []
        self.drops: list[Drops] = []
        self.cleared: list[ClearedMessage] = []
        self.compactions: list[CompactionOutcome] = []

    async def count_exactly(
        self,
        exact: ExactCounter,
        margin: float,
        budget: Budget,
        built_in: TokenLimitHandler | None,
        *,
        always: bool = False,
    ) -> None:
        """Near the budget (or over it), let the exact count decide.

        What is counted exactly is what the estimate alone would send: the
        transcript when it fits by the estimate; when it does not and Pre is
        the built-in (``built_in``), what the built-in keeps of it by the
        estimate, which this step then adopts. So the exact count anchors
        close to what is sent, and what is still dropped after it is little,
        however long the transcript given. With a Pre of the caller's own,
        the transcript given is counted.
        """
        if not always and self.tokens <= budget.prompt_tokens * (1 - margin):
            return
        if built_in is not None and self.tokens > budget.prompt_tokens:
            await self.run("pre", built_in, budget)
        candidate = tuple(self.current)
        try:
            found = exact.count(candidate, self.tools)
            counted: int = await found if inspect.isawaitable(found) else found
        except ThreadlineError as exc:
            logger.warning(
                "round %d: the exact counter failed (%s); deciding on the estimate of %d tokens",
                self.round,
                exc,
                self.tokens,
            )
            return
        counter = self.counter
        self.estimated_tokens = self.tokens
        # Rewrites are priced from the raw estimate: calibration is superseded here.
        estimate = calibrated_estimate(counter) or counter
        self.counter = AnchoredCounter.near_budget(
            estimate, candidate, self.tools, exact_tokens=counted, margin=margin
        )
        self.costs = None  # priced by the anchored counter from here on
        self.tokens = self.exact_tokens = counted
        self.exact_candidate = candidate
        self.counted_by = "exact"

    async def run(self, phase: Phase, handler: TokenLimitHandler, budget: Budget) -> None:
        name = handler_name(handler)
        if self.costs is not None and traits_of(handler).slides_one_unit:
            self._slide(phase, name, budget.prompt_tokens, self.costs)
            return
        event = checked_event(
            self.current,
            budget_tokens=budget.prompt_tokens,
            counter=self.counter,
            tools=self.tools,
            round=self.round,
            estimated_tokens=self.tokens,
            pinned=self.pinned,
            starts=self.starts,
            costs=self.costs,
        )
        result = handler(event)
        if inspect.isawaitable(result):
            await result
        self.compactions += (
            CompactionOutcome(
                handler=name,
                status=status,
                covered_messages=covered,
                covered_tokens=tokens,
                summary_tokens=summary,
                detail=detail,
            )
            for status, covered, tokens, summary, detail in compaction_log(event)
        )
        certified = certified_sources(event)
        if certified is not None:
            rewrite, matches = list(event.messages), list(certified)
            removed = self._checked_removal(name, cast(list[int], matches), certified)
            starts = starts_after(self.starts, removed)
            added = 0
        else:
            rewrite, matches, removed, starts = self._checked_rewrite(event, name)
            added = matches.count(None)
        reason = f"over budget: {self.tokens} > {budget.prompt_tokens} tokens"
        self._record_drops(name, phase, removed, drop_log(event), reason)
        self._follow(matches, added == 0)
        self.current = rewrite
        self.starts = starts
        before = self.tokens
        costs = self.costs
        if certified is not None and costs is not None and is_incremental(self.counter):
            self.costs = list(map(costs.__getitem__, cast(list[int], matches)))
            self.tokens = sum(self.costs) + self.counter.overhead_tokens(self.tools)
        else:
            self.costs = None
            self.tokens = self.counter.count(rewrite, self.tools)
        dropped = sum(end - start for start, end in removed)
        if removed or added:
            dropped += self._open_at_a_user_message(name, phase)
        cleared = self._record_cleared(event, name, phase)
        self._add_run(name, phase, before, dropped, added, cleared)

    def _slide(self, phase: Phase, name: str, budget: int, costs: list[int]) -> None:
        """``drop_oldest_units(None)``, taken without an event: the cut it makes (see
        :func:`~threadline.limiting._drop_oldest.slide_cut`) from the costs and units
        this step holds, recorded as :meth:`run` records the same cut through one.

        The event would copy the transcript, list its units, price it again and drop
        each run with :meth:`TokenLimitEvent.drop_units`, and the step would then
        check what it left: on a one-shot request of a thousand messages that was
        most of the step's cost, spent on a handler whose output is whole by
        construction.
        """
        current, starts, before = self.current, self.starts, self.tokens
        size = len(current)
        removed: list[tuple[int, int]] = []
        notes: list[tuple[int, int, str]] = []
        if before > budget:
            removed, notes = slide_cut(current, starts, self.pinned, costs, before, budget)
        kept: list[int | None] = []
        rewrite: list[Message] = []
        kept_costs: list[int] = []
        at = 0
        for start, end in [*removed, (size, size)]:
            kept += range(at, start)
            rewrite += current[at:start]
            kept_costs += costs[at:start]
            at = end
        self._record_drops(name, phase, removed, notes, f"over budget: {before} > {budget} tokens")
        self._follow(kept, True)
        self.current = rewrite
        self.starts = starts_after(starts, removed)
        self.costs = kept_costs
        counter = self.counter  # incremental: costs are known only while it is
        self.tokens = (
            sum(kept_costs) + counter.overhead_tokens(self.tools)
            if is_incremental(counter)
            else counter.count(rewrite, self.tools)
        )
        self._add_run(name, phase, before, size - len(rewrite), 0)

    def _open_at_a_user_message(self, name: str, phase: Phase) -> int:
        """Complete a handler's rewrite as the built-in handlers cut: what it left between
        the first system message and the first user message (or pinned unit) is dropped
        too, and the ledger names it, so no handler sends a transcript that opens with
        an answer to nothing. Returns how many messages went.

        Raises:
            HandlerError: what stands there is a message the handler added (the engine
                drops only what it was given), or no user message is left to open with.
        """
        current, starts = self.current, self.starts
        held = pinned_units(starts, self.pinned)
        first = 1 if held.get(0) is PinReason.FIRST_SYSTEM else 0
        k = first
        while k < len(starts) and k not in held and current[starts[k]].role is not Role.USER:
            k += 1
        if k == first:
            return 0
        start = starts[first]
        end = starts[k] if k < len(starts) else len(current)
        added = next((i for i in range(start, end) if self.sources[i] is None), None)
        if k == len(starts) or added is not None:
            at = start if added is None else added
            what = f"{current[at].role.value} message{'' if added is None else ' it added'}"
            raise HandlerError(
                f"limiting handler {name!r} left a transcript that does not open with a user "
                f"message: message {at} ({what}) comes first after the first system message. "
                "A transcript opens with a user message there, so the engine drops what a "
                "handler left before one; it never drops what a handler added, nor everything",
                handler=name,
                index=at,
            )
        removed = [(start, end)]
        self._record_drops(name, phase, removed, [], _OPENING)
        self._follow([*range(start), *range(end, len(current))], True)
        self.current = current[:start] + current[end:]
        self.starts = starts_after(starts, removed)
        counter, costs = self.counter, self.costs
        if costs is not None and is_incremental(counter):
            self.costs = costs[:start] + costs[end:]
            self.tokens = sum(self.costs) + counter.overhead_tokens(self.tools)
        else:
            self.costs = None
            self.tokens = counter.count(self.current, self.tools)
        return end - start

    def _add_run(
        self, name: str, phase: Phase, before: int, dropped: int, added: int, cleared: int = 0
    ) -> None:
        """Record one handler's run, which left the transcript at ``self.tokens``."""
        self.runs.append(
            HandlerRun(
                handler=name,
                phase=phase,
                tokens_before=before,
                tokens_after=self.tokens,
                dropped_messages=dropped,
                added_messages=added,
                cleared_messages=cleared,
            )
        )

    def _record_cleared(self, event: TokenLimitEvent, name: str, phase: Phase) -> int:
        """Put the messages the handler cleared (and that are still sent) in the ledger;
        return how many. Their sources already point at the messages they replace."""
        replaced = replacements(event)
        if not replaced:
            return 0
        entries = []
        for position, message in enumerate(self.current):
            found = replaced.get(id(message))
            if found is None:
                continue
            _, replacement, what, tokens, reason = found
            at = self.sources[position]
            entries.append(
                ClearedMessage(
                    handler=name,
                    phase=phase,
                    index=-1 if at is None else at,
                    what=what,
                    tokens=tokens,
                    reason=reason,
                    tool=replacement.name if what == "tool result" else None,
                    call_id=replacement.tool_call_id,
                )
            )
        self.cleared += entries
        return len(entries)

    def _follow(self, matches: list[int | None], only_kept: bool) -> None:
        """Carry what is pinned, and where each message came from, over to the rewrite."""
        if only_kept:  # matches are the kept indices, ascending: look the few pinned ones up
            kept = cast(list[int], matches)
            self.pinned = {
                bisect.bisect_left(kept, source): reason
                for source, reason in self.pinned.items()
                if _holds(kept, source)
            }
        else:
            self.pinned = {
                at: self.pinned[source]
                for at, source in enumerate(matches)
                if source is not None and source in self.pinned
            }
        sources = self.sources
        if isinstance(sources, range):  # nothing rewritten before: the input's own indices
            self.sources = matches
        elif only_kept:
            self.sources = list(map(sources.__getitem__, cast(list[int], matches)))
        else:
            self.sources = [sources[m] if m is not None else None for m in matches]

    def _checked_removal(
        self, name: str, kept: list[int], sources: Sequence[int | None]
    ) -> list[tuple[int, int]]:
        """What a rewrite made of whole units removed: ``(start, end)`` spans; none pinned.

        ``kept`` are the indices kept, ``sources`` the event's own form of them.
        """
        removed = removed_spans(cast(Sequence[int], sources), len(self.current))
        for index in sorted(self.pinned):
            if not _holds(kept, index):
                self._refuse_pinned_drop(name, index)
        return removed

    def _refuse_pinned_drop(self, name: str, index: int) -> NoReturn:
        reason = self.pinned[index]
        message = self.current[index]
        raise HandlerError(
            f"limiting handler {name!r} dropped or changed the {reason.value} "
            f"(message {index} of the transcript it was given, {message.role.value}); "
            "pinned messages must be kept as they are",
            handler=name,
        )

    def _checked_rewrite(
        self, event: TokenLimitEvent, name: str
    ) -> tuple[list[Message], list[int | None], list[tuple[int, int]], list[int]]:
        """A handler's own rewrite, checked in full: it, where its messages came
        from, what of the given transcript it removed, and where its units start."""
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
            starts = checked_unit_starts(rewrite)
        except TranscriptIntegrityError as exc:
            raise HandlerError(
                f"limiting handler {name!r} left a broken transcript: message {exc.index}: "
                f"{exc.reason}",
                handler=name,
                index=exc.index,
            ) from exc
        replaced = replacements(event)
        probe = rewrite
        if replaced:
            # A cleared message stands for the one it replaces: matched by identity.
            current = self.current
            probe = [current[r[0]] if (r := replaced.get(id(m))) else m for m in rewrite]
        matches = match_messages(self.current, probe)
        if replaced:
            self._check_cleared(name, rewrite, matches, replaced)
        removed: list[tuple[int, int]] = []
        expected = 0
        for source in matches:
            if source is not None:
                if source > expected:
                    removed.append((expected, source))
                expected = source + 1
        if expected < len(self.current):
            removed.append((expected, len(self.current)))
        for start, end in removed:
            for index in range(start, end):
                if index in self.pinned:
                    self._refuse_pinned_drop(name, index)
        return rewrite, matches, removed, starts

    def _check_cleared(
        self,
        name: str,
        rewrite: list[Message],
        matches: list[int | None],
        replaced: Mapping[int, tuple[int, Message, str, int, str]],
    ) -> None:
        """Refuse a cleared message that no longer stands for the one it replaced."""
        for at, message in enumerate(rewrite):
            found = replaced.get(id(message))
            if found is not None and (matches[at] != found[0] or found[0] in self.pinned):
                raise HandlerError(
                    f"limiting handler {name!r} moved or duplicated a message it cleared "
                    f"(message {at}); a cleared message stays where the one it replaces stood",
                    handler=name,
                    index=at,
                )

    def _record_drops(
        self,
        name: str,
        phase: Phase,
        removed: list[tuple[int, int]],
        notes: list[tuple[int, int, str]],
        default_reason: str,
    ) -> None:
        """Keep what the ledger needs to name the dropped units; they are made when read."""
        if removed:
            self.drops.append(Drops(name, phase, removed, self.sources, notes, default_reason))

    def _sent_candidate(self) -> bool:
        candidate = self.exact_candidate
        return (
            candidate is not None
            and len(candidate) == len(self.current)
            and all(a is b for a, b in zip(candidate, self.current, strict=True))
        )

    def outcome(self) -> LimitingOutcome:
        budget = self.budget
        over = budget is not None and self.tokens > budget.prompt_tokens
        starts = self.starts
        if over and budget is not None:
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
            costs=self.costs,
            starts=starts,
        )
        record = LimitingRecord(
            round=self.round,
            budget_tokens=budget.prompt_tokens if budget is not None else None,
            tokens_before=self.tokens_before,
            tokens_after=self.tokens,
            handlers=tuple(self.runs),
            # Made when read, from what they need only (not the whole step's state).
            dropped=DroppedUnits(
                functools.partial(units_dropped, self.drops, self.original, self.original_starts)
            )
            if self.drops
            else DroppedUnits(),
            sent_over_budget=over,
            report=report,
            counted_by=self.counted_by,
            estimated_tokens=self.estimated_tokens,
            exact_tokens=self.exact_tokens,
            exact_tokens_sent=self.exact_tokens if self._sent_candidate() else None,
            cleared=tuple(self.cleared),
            compactions=tuple(self.compactions),
        )
        sources = self.sources
        prompt_at = None
        if self.prompt_index is not None and self.prompt_index in sources:
            prompt_at = sources.index(self.prompt_index)
        return LimitingOutcome(
            messages=tuple(self.current),
            record=record,
            # Nothing rewritten: the range itself, not an int per message.
            sources=sources if isinstance(sources, range) else tuple(sources),
            prompt_index=prompt_at,
        )


def _holds(kept: list[int], index: int) -> bool:
    """Whether ascending ``kept`` holds ``index``."""
    at = bisect.bisect_left(kept, index)
    return at < len(kept) and kept[at] == index
