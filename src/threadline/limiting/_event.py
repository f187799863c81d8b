"""What a limiting handler is given: :class:`TokenLimitEvent`, and the handler type.

A handler reads and rewrites ``event.messages``; the event lists the units
of the transcript as it is now (:meth:`TokenLimitEvent.units`), drops whole
units with a reason for the ledger (:meth:`TokenLimitEvent.drop_units`) and
recounts (:meth:`TokenLimitEvent.is_over_budget`). The built-in handlers use
nothing else, so a handler of your own can do all they do.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping, Sequence
from typing import Literal, TypeAlias, get_args, overload

from threadline._errors import InvalidRequestError
from threadline._messages import Message, Role
from threadline._validate import fail
from threadline.counting._protocol import TokenCounter, is_incremental
from threadline.limiting._budget import message_costs
from threadline.limiting._ledger import CompactionStatus
from threadline.limiting._units import (
    PinReason,
    Unit,
    Units,
    check_integrity,
    checked_unit_starts,
    listing,
    match_messages,
    one_run,
    pinned_messages,
    spans_of,
    unit_starts,
)
from threadline.tools._tools import Tool

__all__ = [
    "TokenLimitEvent",
    "TokenLimitHandler",
    "certified_sources",
    "checked_event",
    "compaction_log",
    "drop_log",
    "drop_reasons",
    "handler_name",
    "priced",
    "removed_spans",
    "replacements",
]

# Where the messages of a list came from: for each, its index in the messages
# handed over, or None for a message a handler added.
_Sources: TypeAlias = Sequence[int | None]
_Replacement: TypeAlias = tuple[int, Message, Literal["tool result", "reasoning"], int, str]
_Compaction: TypeAlias = tuple[CompactionStatus, int, int, int | None, str]


def _check_same_shape(message: Message, replacement: Message, index: int) -> None:
    """Refuse a replacement that would change what the transcript's shape rests on."""
    if not isinstance(replacement, Message):
        raise InvalidRequestError(
            f"clear takes a Message to send instead, not {type(replacement).__name__}"
        )
    same = (
        replacement.role is message.role
        and replacement.tool_call_id == message.tool_call_id
        and replacement.name == message.name
        and replacement.tool_calls == message.tool_calls
        and replacement.origin is message.origin
    )
    if not same or message.role not in (Role.TOOL, Role.ASSISTANT):
        raise InvalidRequestError(
            f"clear cannot send message {index} ({message.role.value}) as given: only a tool "
            "result or an assistant message is cleared, keeping its role, tool call id, "
            "name, tool calls and origin"
        )


class TokenLimitEvent:
    """What a limiting handler is given when the transcript is over budget.

    ``messages`` is a copy of the transcript: rewrite it in place or assign a
    new list; whatever is left is what is sent. ``tools``, ``budget_tokens``
    (the prompt budget), ``round`` (from 1: the run's first provider call) and
    ``counter`` are read-only.
    ``estimated_tokens`` is the count when the handler was called;
    :meth:`is_over_budget` recounts and refreshes it. :meth:`units` lists the
    units of ``messages`` as they are now, and :meth:`drop_units` drops some
    of them with a reason that the limiting ledger records.

    Build one yourself to test a handler::

        event = TokenLimitEvent(messages, budget_tokens=1_000, counter=my_counter)
        await my_handler(event)

    ``prompt_index`` marks the current prompt as in
    :func:`~threadline.limiting.split_units`; the engine passes ``pinned``
    instead, which wins when given.
    """

    __slots__ = (
        "_budget_tokens",
        "_checked",
        "_compactions",
        "_costs",
        "_counter",
        "_drop_log",
        "_layout_cache",
        "_pinned",
        "_replaced",
        "_round",
        "_snapshot",
        "_tools",
        "_view",
        "_whole_units",
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
        round: int = 1,
        estimated_tokens: int | None = None,
        prompt_index: int | None = None,
        pinned: Mapping[int, PinReason] | None = None,
    ) -> None:
        snapshot = list(messages)
        if pinned is None:
            pinned = pinned_messages(snapshot, prompt_index=prompt_index)
        self._start(snapshot, tools, budget_tokens, counter, round, dict(pinned))
        if estimated_tokens is None:
            estimated_tokens = counter.count(self.messages, self._tools)
        self.estimated_tokens: int = estimated_tokens

    def _start(
        self,
        snapshot: list[Message],
        tools: Iterable[Tool],
        budget_tokens: int,
        counter: TokenCounter,
        round: int,
        pinned: Mapping[int, PinReason],
    ) -> None:
        """Set the event up over ``snapshot``, a list of its own that nothing changes."""
        self.messages: list[Message] = list(snapshot)
        self._snapshot = snapshot  # never changed: what was handed over
        self._tools = tuple(tools)
        self._budget_tokens = budget_tokens
        self._counter = counter
        self._round = round
        self._pinned: Mapping[int, PinReason] = pinned
        self._checked = False  # checked_event sets it: the engine checked the snapshot
        # Whether messages is still the snapshot less whole units dropped with
        # drop_units: then it is whole by construction (see certified_sources).
        self._whole_units = True
        self._layout_cache: _Layout | None = None
        self._costs: list[int] | None = None  # of the snapshot, when the engine priced it
        # The last list the event made or matched, where its messages came from,
        # and whether every one of them was handed over (no None in the sources).
        self._view: tuple[list[Message], _Sources, bool] = (
            self._snapshot,
            range(len(self._snapshot)),
            True,
        )
        # Why messages were dropped, as said: (first, end, reason) over the
        # indices handed over; a later word on an index overrides an earlier one.
        self._drop_log: list[tuple[int, int, str]] = []
        # Messages cleared in place: id(replacement) -> (index handed over,
        # replacement, what was cleared, its tokens, why).
        self._replaced: dict[int, _Replacement] = {}
        self._compactions: list[_Compaction] = []

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

    def message_costs(self) -> list[int]:
        """What each message of ``messages`` (as it is now) costs, by the event's counter.

        With an :class:`~threadline.counting.IncrementalTokenCounter` the
        costs are exact (the count is their sum plus the counter's overhead);
        with another counter each is estimated as ``count([m]) - count([])``.
        The engine has priced the transcript it hands over already, so asking
        before any change costs no counting.
        """
        if self._costs is not None and _same_messages(self.messages, self._snapshot):
            return list(self._costs)
        costs, _ = message_costs(self._counter, self.messages)
        return costs

    def units(self, *, pinned: bool | None = None) -> Units:
        """The units of ``messages`` as they are now, each marked pinned or droppable.

        ``pinned=True`` lists only the pinned units, ``pinned=False`` only the
        droppable ones. A message stays pinned while it is still there, in
        the same order (see :func:`~threadline.limiting._units.match_messages`).
        The units' positions are those of ``messages`` now: after a change,
        list them again. The result is a :class:`~threadline.limiting.Units`
        sequence, whose units are made as they are read.

        Raises:
            TranscriptIntegrityError: the current ``messages`` are broken.
        """
        messages, starts, pinned_at = self._layout()
        return listing(messages, starts, pinned_at, keep=pinned)

    def drop_units(self, units: Iterable[Unit], *, reason: str) -> None:
        """Remove these units from ``messages`` and say why, for the limiting ledger.

        ``units`` come from :meth:`units` for ``messages`` as they are now
        (a drop moves the positions of what follows, so list them again
        before the next drop); a slice of a :class:`~threadline.limiting.Units`
        is taken as it is, without making its units. The ledger records each
        unit as dropped by the handler that made the call, with ``reason``.
        Like any rewrite, the result is checked when the handler returns:
        dropping a pinned unit, or a made-up range that splits a tool
        exchange, makes the engine refuse it with :class:`~threadline.HandlerError`.

        Example::

            async def drop_old_tool_output(event: TokenLimitEvent) -> None:
                old = [u for u in event.units() if u.kind is UnitKind.TOOL_EXCHANGE]
                event.drop_units(old[:-2], reason="tool output older than two exchanges")

        Raises:
            InvalidRequestError: ``reason`` is not a non-empty str, or an item
                of ``units`` is not a :class:`Unit` within ``messages``.
        """
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidRequestError(f"drop_units needs a reason: a non-empty str, not {reason!r}")
        messages = self.messages
        spans = _spans(units, len(messages))
        if not spans:
            return
        sources, whole = self._sources()
        if self._whole_units:
            self._whole_units = whole and self._checked and self._on_unit_borders(sources, spans)
        kept: list[Message] = []
        pieces: list[tuple[int, int]] = []  # the positions kept, in runs
        at = 0
        for start, end in spans:
            kept.extend(messages[at:start])
            pieces.append((at, start))
            self._log_drop(sources, whole, start, end, reason)
            at = end
        kept.extend(messages[at:])
        pieces.append((at, len(messages)))
        kept_sources: _Sources
        if isinstance(sources, range | _Runs):  # ascending: kept as runs, not index by index
            kept_sources = _Runs.cut(sources, pieces)
        else:
            kept_sources = list(
                itertools.chain.from_iterable(sources[start:end] for start, end in pieces)
            )
        self.messages = kept
        self._view = (list(kept), kept_sources, whole)

    def note_drop(self, index: int, reason: str) -> None:
        """Say why the message at ``index`` (of ``messages`` as handed over) was dropped.

        The engine puts the reason in the limiting ledger next to the unit.
        :meth:`drop_units` does it for you; this is for a handler that
        rewrites ``messages`` itself (a summary in place of old turns, say).
        """
        self._drop_log.append((index, index + 1, reason))

    def clear(self, index: int, replacement: Message, *, reason: str, tokens: int) -> None:
        """Send ``replacement`` in place of ``messages[index]``: the same turn, its bulk cleared.

        For a handler that keeps a message but not all of it: an old tool
        result's content replaced by a short note, an old reply's reasoning left
        out. ``replacement`` keeps what the transcript's shape rests on: the
        role, and for a tool result its ``tool_call_id`` and ``name``, for an
        assistant message its tool calls. ``tokens`` is what the cleared
        content held (the ledger shows it). The ledger records the message as
        cleared, not dropped; the conversation's history keeps it whole.

        Raises:
            InvalidRequestError: ``index`` is outside ``messages``, the message
                is pinned or was added by the handler, ``replacement`` changes
                its shape, or ``reason`` is empty.
        """
        if not isinstance(reason, str) or not reason.strip():
            raise InvalidRequestError(f"clear needs a reason: a non-empty str, not {reason!r}")
        messages = self.messages
        if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(messages):
            raise InvalidRequestError(
                f"clear got index {index!r}, outside the {len(messages)} messages there are now"
            )
        sources, whole = self._sources()
        source = sources[index]
        if source is None or source in self._pinned:
            it = "a message the handler added" if source is None else "a pinned message"
            raise InvalidRequestError(f"clear cannot clear message {index}: it is {it}")
        _check_same_shape(messages[index], replacement, index)
        kept = list(messages)
        kept[index] = replacement
        self.messages = kept
        self._view = (list(kept), sources, whole)
        self._whole_units = False  # a message changed: the engine checks the rewrite
        what: Literal["tool result", "reasoning"] = (
            "tool result" if replacement.role is Role.TOOL else "reasoning"
        )
        self._replaced[id(replacement)] = (source, replacement, what, max(0, tokens), reason)

    def note_compaction(
        self,
        status: CompactionStatus,
        *,
        covered_messages: int,
        covered_tokens: int,
        summary_tokens: int | None = None,
        detail: str = "",
    ) -> None:
        """Say what a compaction came to, for the ledger (``LimitingRecord.compactions``).

        A handler that summarizes reports each attempt, applied or not, so a
        summary that came back empty, failed or too long is seen by the user
        instead of passing silently (see :class:`~threadline.limiting.CompactionOutcome`).

        Raises:
            InvalidRequestError: ``status`` is not a ``CompactionStatus``.
        """
        if status not in get_args(CompactionStatus):
            fail("status", "one of " + ", ".join(map(repr, get_args(CompactionStatus))), status)
        self._compactions.append((status, covered_messages, covered_tokens, summary_tokens, detail))

    def __repr__(self) -> str:
        return (
            f"TokenLimitEvent(round={self._round}, messages={len(self.messages)}, "
            f"estimated_tokens={self.estimated_tokens}, budget_tokens={self._budget_tokens})"
        )

    def _log_drop(self, sources: _Sources, whole: bool, start: int, end: int, reason: str) -> None:
        """Log ``reason`` for ``messages[start:end]``, by where those messages came from."""
        if whole:  # sources only grow: a run of them without a gap is one range
            first, last = sources[start], sources[end - 1]
            if first is not None and last is not None and last - first == end - 1 - start:
                self._drop_log.append((first, last + 1, reason))
                return
        self._drop_log.extend((i, i + 1, reason) for i in sources[start:end] if i is not None)

    def _on_unit_borders(self, sources: _Sources, spans: list[tuple[int, int]]) -> bool:
        """Whether each span of ``messages`` begins and ends at a unit border of the snapshot.

        ``messages`` is the snapshot less whole units, so its units are the
        snapshot's that are left: a span on their borders drops whole units.
        """
        starts = self._snapshot_starts()
        size = len(self._snapshot)
        for start, end in spans:
            first, last = sources[start], sources[end - 1]
            if first is None or last is None:
                return False
            if not _is_start(starts, first) or not (
                last + 1 == size or _is_start(starts, last + 1)
            ):
                return False
        return True

    def _snapshot_starts(self) -> list[int]:
        """Where the units of the (checked) snapshot begin."""
        if self._layout_cache is None:
            starts = unit_starts(self._snapshot, checked=True)
            self._layout_cache = (self._snapshot, starts, self._pinned)
        return self._layout_cache[1]

    def _sources(self) -> tuple[_Sources, bool]:
        """Where each message of ``messages`` came from, and whether all were handed over."""
        known, sources, whole = self._view
        if not _same_messages(self.messages, known):
            self._whole_units = False  # rewritten by hand: only a full check will tell
            sources = match_messages(self._snapshot, self.messages)
            whole = None not in sources
            self._view = (list(self.messages), sources, whole)
        return sources, whole

    def _layout(self) -> _Layout:
        """``messages`` as they are now, where their units start, and what is pinned."""
        if _same_messages(self.messages, self._snapshot):
            if self._layout_cache is None:
                if self._checked:
                    starts = unit_starts(self._snapshot, checked=True)
                else:
                    starts = checked_unit_starts(self._snapshot)
                self._layout_cache = (self._snapshot, starts, self._pinned)
            return self._layout_cache
        check_integrity(self.messages)
        sources, _ = self._sources()
        pinned = self._pinned
        pinned_now = {
            at: pinned[source]
            for at, source in enumerate(sources)
            if source is not None and source in pinned
        }
        messages = self._view[0]  # the same messages, in a list of the event's own
        return messages, unit_starts(messages, checked=True), pinned_now


_Layout: TypeAlias = tuple[list[Message], list[int], Mapping[int, PinReason]]


class _Runs(Sequence[int]):
    """Ascending indices kept as runs of consecutive ones (``range`` objects).

    What is left of the snapshot's indices once units are dropped: a drop
    cuts a few runs, where a list would hold an int for every message kept.
    """

    __slots__ = ("_offsets", "_runs")

    def __init__(self, runs: Iterable[range]) -> None:
        self._runs = [run for run in runs if run]
        self._offsets = list(itertools.accumulate(map(len, self._runs), initial=0))

    @staticmethod
    def cut(sources: range | _Runs, pieces: list[tuple[int, int]]) -> _Runs:
        """The runs of ``sources`` at the positions ``pieces`` (ascending spans)."""
        whole = sources if isinstance(sources, _Runs) else _Runs([sources])
        return _Runs(run for start, end in pieces for run in whole._take(start, end))

    def gaps(self, size: int) -> list[tuple[int, int]]:
        """The ``(start, end)`` spans of ``range(size)`` that no run holds."""
        bounds = [0, *(edge for run in self._runs for edge in (run.start, run.stop)), size]
        return [
            (bounds[k], bounds[k + 1])
            for k in range(0, len(bounds), 2)
            if bounds[k] < bounds[k + 1]
        ]

    def _take(self, start: int, end: int) -> list[range]:
        """The runs holding positions ``start`` to ``end``."""
        runs, offsets = self._runs, self._offsets
        taken: list[range] = []
        k = bisect.bisect_right(offsets, start) - 1
        while start < end:
            base = offsets[k]
            run = runs[k]
            stop = min(end - base, len(run))
            taken.append(run[start - base : stop])
            start = base + stop
            k += 1
        return taken

    def __len__(self) -> int:
        return self._offsets[-1]

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[int]: ...

    def __getitem__(self, index: int | slice) -> int | Sequence[int]:
        if isinstance(index, slice):
            start, stop, step = index.indices(len(self))
            if step != 1:
                return list(self)[index]
            return _Runs(self._take(start, stop))
        size = len(self)
        if index < 0:
            index += size
        if not 0 <= index < size:
            raise IndexError("index out of range")
        k = bisect.bisect_right(self._offsets, index) - 1
        return self._runs[k][index - self._offsets[k]]

    def __iter__(self) -> Iterator[int]:
        return itertools.chain.from_iterable(self._runs)


def removed_spans(sources: Sequence[int], size: int) -> list[tuple[int, int]]:
    """The ``(start, end)`` spans of ``range(size)`` missing from ascending ``sources``."""
    if isinstance(sources, _Runs):
        return sources.gaps(size)
    if isinstance(sources, range):
        return _Runs([sources]).gaps(size)
    bounds = [-1, *sources, size]
    steps = map(operator.sub, itertools.islice(bounds, 1, None), bounds)
    after = itertools.compress(itertools.count(), map(operator.gt, steps, itertools.repeat(1)))
    return [(bounds[k] + 1, bounds[k + 1]) for k in after]


TokenLimitHandler: TypeAlias = Callable[[TokenLimitEvent], Awaitable[None] | None]
"""A limiting handler: ``async def handler(event) -> None`` or a plain function."""


def _spans(units: Iterable[Unit], size: int) -> list[tuple[int, int]]:
    """Where ``units`` lie in ``messages`` of ``size``: sorted spans, touching ones joined.

    A handler may drop tens of thousands of units at once: the checks run
    over whole columns (``map``), not unit by unit, and a slice of a
    :class:`Units` gives its columns without making its units.

    Raises:
        InvalidRequestError: an item is not a :class:`Unit`, or lies outside ``size``.
    """
    if isinstance(units, Units):
        run = one_run(units)
        if run is not None and run[0] >= 0 and run[1] <= size:
            return [run]
        starts, ends = spans_of(units)
    else:
        chosen = list(units)
        if not all(map(isinstance, chosen, itertools.repeat(Unit))):
            stranger = next(unit for unit in chosen if not isinstance(unit, Unit))
            raise InvalidRequestError(
                f"drop_units takes units from event.units(), not {type(stranger).__name__}"
            )
        starts = [unit.start for unit in chosen]
        ends = [unit.end for unit in chosen]
    if not starts:
        return []
    later = starts[1:]
    if not all(map(operator.le, ends, later)):  # out of order or overlapping
        pairs = sorted(zip(starts, ends, strict=True))
        starts, ends = [start for start, _ in pairs], [end for _, end in pairs]
        later = starts[1:]
        ends = list(itertools.accumulate(ends, max))  # join by the furthest end
    if starts[0] < 0 or ends[-1] > size or not all(map(operator.lt, starts, ends)):
        start, end = next(
            (start, end)
            for start, end in zip(starts, ends, strict=True)
            if not 0 <= start < end <= size
        )
        raise InvalidRequestError(
            f"drop_units got a unit at messages[{start}:{end}], outside the "
            f"{size} messages there are now; list the units again after a change"
        )
    # A new span opens where the one before ends short of it.
    gaps = list(itertools.compress(range(1, len(starts)), map(operator.lt, ends, later)))
    opens = [starts[0], *(starts[k] for k in gaps)]
    closes = [*(ends[k - 1] for k in gaps), ends[-1]]
    return list(zip(opens, closes, strict=True))


def _is_start(starts: list[int], index: int) -> bool:
    at = bisect.bisect_left(starts, index)
    return at < len(starts) and starts[at] == index


def _same_messages(messages: Sequence[Message], known: list[Message]) -> bool:
    """Whether ``messages`` holds the messages of ``known``, in the same order.

    Equal messages count as the same, since they are sent the same; a list
    compares them at C speed, by identity first.
    """
    return isinstance(messages, list) and messages == known


def checked_event(
    messages: list[Message],
    *,
    budget_tokens: int,
    counter: TokenCounter,
    tools: Sequence[Tool],
    round: int,
    estimated_tokens: int,
    pinned: Mapping[int, PinReason],
    starts: list[int] | None = None,
    costs: list[int] | None = None,
) -> TokenLimitEvent:
    """The engine's event for a transcript it has checked and counted already.

    ``messages`` becomes the event's snapshot as it is, uncopied: the caller
    never changes that list. ``pinned`` is taken as it is too. ``starts`` are
    its :func:`~threadline.limiting._units.unit_starts` and ``costs`` its
    messages' costs by ``counter``, when known.
    """
    event = TokenLimitEvent.__new__(TokenLimitEvent)
    event._start(messages, tools, budget_tokens, counter, round, pinned)
    event.estimated_tokens = estimated_tokens
    event._checked = True
    event._costs = costs
    if starts is not None:
        event._layout_cache = (event._snapshot, starts, event._pinned)
    return event


def certified_sources(event: TokenLimitEvent) -> _Sources | None:
    """Where each message the handler left came from, when no check is needed.

    That is when the event was made by the engine (its snapshot checked) and
    ``messages`` is the snapshot less whole units dropped with
    :meth:`TokenLimitEvent.drop_units`: such a transcript is whole, made of
    the snapshot's own messages in order. ``None`` otherwise: the engine
    checks the rewrite in full.
    """
    if not (event._checked and event._whole_units):
        return None
    known, sources, whole = event._view
    if not whole or not _same_messages(event.messages, known):
        return None
    return sources


def replacements(event: TokenLimitEvent) -> dict[int, _Replacement]:
    """The messages the handler cleared, by ``id`` of the replacement it left."""
    return dict(event._replaced)


def compaction_log(event: TokenLimitEvent) -> list[_Compaction]:
    """What the handler said its compactions came to, in order."""
    return list(event._compactions)


def drop_log(event: TokenLimitEvent) -> list[tuple[int, int, str]]:
    """Why the handler dropped messages: ``(first, end, reason)`` ranges, later ones win."""
    return list(event._drop_log)


def drop_reasons(event: TokenLimitEvent) -> dict[int, str]:
    """Why the handler dropped messages, by index of what it was handed, where it said."""
    reasons: dict[int, str] = {}
    for first, end, reason in event._drop_log:
        reasons.update(zip(range(first, end), itertools.repeat(reason)))
    return reasons


def handler_name(handler: object) -> str:
    """How the ledger and errors name a handler: its qualified name, else its type's."""
    name = getattr(handler, "__qualname__", None)
    if isinstance(name, str):
        return name
    return type(handler).__qualname__


def priced(event: TokenLimitEvent, counter: TokenCounter) -> tuple[list[int], int, bool]:
    """``(each message's cost, the transcript's total, whether the costs sum to it)``
    by ``counter``, for a built-in handler: the engine's prices of the transcript it
    handed over are taken as they are when ``counter`` is the event's own."""
    messages, tools = event.messages, event.tools
    if counter is event.counter:
        costs = event.message_costs()
    else:
        costs, _ = message_costs(counter, messages)
    if is_incremental(counter):
        return costs, sum(costs) + counter.overhead_tokens(tools), True
    return costs, counter.count(messages, tools), False
