"""The built-in limiting handler: :func:`drop_oldest_units`, a sliding window by units.

It uses only the public face of :class:`~threadline.limiting.TokenLimitEvent`
(``units()``, ``drop_units()``, the counter, tools and budget), so a handler
of your own can do everything it does.
"""

from __future__ import annotations

import bisect
import itertools
from array import array
from collections.abc import Mapping, Sequence

from threadline._errors import InvalidRequestError
from threadline._messages import Message, Role
from threadline.counting._protocol import TokenCounter, is_token_counter
from threadline.limiting._event import TokenLimitEvent, TokenLimitHandler, priced
from threadline.limiting._traits import HandlerTraits, with_traits
from threadline.limiting._units import PinReason, UnitKind, Units, pinned_units, spans_of

__all__ = ["drop_oldest_units", "slide_cut"]

_OPENING = "dropped so that the transcript opens with a user message"

# On the event's counter, what it keeps is the newest stretch of units that fits,
# wherever the transcript starts: the engine may cut so itself (slide_cut).
_SLIDES = HandlerTraits(slides_one_unit=True)


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
    # With a counter of its own its prices are not the event's: no promise then.
    return with_traits(handler, _SLIDES) if counter is None else handler


def _drop_oldest(event: TokenLimitEvent, counter: TokenCounter) -> None:
    messages = event.messages
    tools = event.tools
    budget = event.budget_tokens
    costs, total, exact = priced(event, counter)
    if total <= budget:
        return
    window = _Window(event.units(pinned=False), event.units(pinned=True), costs)
    over_budget = _over_budget(total, budget)
    excess = total - budget
    while True:
        window.drop_oldest(excess, over_budget)
        window.open_at_a_user_message()
        if exact:
            break
        total = counter.count(window.kept(messages), tools)
        if total <= budget or window.all_dropped():
            break
        excess = total - budget
    # Newest run first: a drop moves only what follows it, so the older
    # units keep the positions the listing gave them.
    for units, reason in reversed(window.dropped()):
        event.drop_units(units, reason=reason)


def slide_cut(
    messages: Sequence[Message],
    starts: list[int],
    pinned: Mapping[int, PinReason],
    costs: list[int],
    total: int,
    budget: int,
) -> tuple[list[tuple[int, int]], list[tuple[int, int, str]]]:
    """The handler's cut of ``messages``, over ``budget``, whose units begin at
    ``starts`` and whose ``costs`` sum to ``total`` exactly (less the overhead):
    the ``(start, end)`` spans it removes, touching ones joined, and why, as
    ``(start, end, reason)`` over the same positions.

    What :class:`_Window` finds through an event's units, found here on unit
    numbers and the few pinned units alone, for the engine, which holds the
    starts and costs already and takes a handler that declares
    ``slides_one_unit`` (``drop_oldest_units(None)``) without an event (see
    ``_engine``): listing the units, making the window and dropping
    each run cost more than the cut itself on a short transcript. A property
    test holds the two to the same outcome and ledger.
    """
    size, count = len(messages), len(starts)
    held = pinned_units(starts, pinned)
    kept = sorted(held)  # a few: the system message, the prompt, the live exchange
    spans = [(starts[k], starts[k + 1] if k + 1 < count else size) for k in kept]
    cost_before = _Prefixes(costs).before
    # The tokens of the first j pinned units.
    kept_before = list(itertools.accumulate((sum(costs[s:e]) for s, e in spans), initial=0))

    def freed(k: int) -> int:  # the tokens of the droppable units before unit k
        at = starts[k] if k < count else size
        return cost_before(at) - kept_before[bisect.bisect_left(kept, k)]

    excess = total - budget
    if _none_negative(costs):  # more units never free fewer tokens
        taken = bisect.bisect_left(range(count + 1), excess, key=freed)
    else:
        taken = next((k for k in range(count + 1) if freed(k) >= excess), count)
    taken = min(taken, count)
    # Then up to the first user message, unless a pinned unit opens what is kept.
    openers = [start for (start, _), k in zip(spans, kept, strict=True) if held[k] is not _SYSTEM]
    opened, front = taken, 0  # no unit before message `front` can open the kept transcript
    while opened < count:
        if opened not in held:
            start = starts[opened]
            at = bisect.bisect_left(openers, front)
            if (at < len(openers) and openers[at] < start) or messages[start].role is _USER:
                break
            front = starts[opened + 1] if opened + 1 < count else size
        opened += 1
    return _removals(
        spans,
        starts[taken] if taken < count else size,
        starts[opened] if opened < count else size,
        _over_budget(total, budget),
    )


def _removals(
    pinned: list[tuple[int, int]], over_until: int, until: int, over_budget: str
) -> tuple[list[tuple[int, int]], list[tuple[int, int, str]]]:
    """Messages ``[0, until)`` less the ``pinned`` spans, as removed spans and notes:
    those before ``over_until`` went for ``over_budget``, the rest to open at a user message."""
    removed: list[tuple[int, int]] = []
    at = 0
    for start, end in [*pinned, (until, until)]:
        start = min(start, until)
        if at < start:
            removed.append((at, start))
        at = max(at, end)
        if at >= until:
            break
    notes: list[tuple[int, int, str]] = []
    for start, end in removed:
        if start < over_until:
            notes.append((start, min(end, over_until), over_budget))
        if end > over_until:
            notes.append((max(start, over_until), end, _OPENING))
    return removed, notes


def _over_budget(total: int, budget: int) -> str:
    return f"oldest droppable unit while {total} > {budget} tokens"


# Read on every step; a module global is found quicker than an enum's member.
_SYSTEM = PinReason.FIRST_SYSTEM
_USER = Role.USER


class _Prefixes:
    """What the messages before a position cost, summed when asked from the nearest
    position already summed below it: a bisection's probes add up to one pass over
    the costs at most, with no running total made for every message."""

    __slots__ = ("costs", "summed", "summed_at")

    def __init__(self, costs: Sequence[int]) -> None:
        self.costs = costs
        self.summed = {0: 0}  # where asked
        self.summed_at = [0]  # those positions, ascending

    def before(self, position: int) -> int:
        summed = self.summed
        cost = summed.get(position)
        if cost is None:
            at = bisect.bisect_right(self.summed_at, position)
            below = self.summed_at[at - 1]
            cost = summed[below] + sum(self.costs[below:position])
            summed[position] = cost
            self.summed_at.insert(at, position)
        return cost


def _none_negative(costs: Sequence[int]) -> bool:
    """Whether no cost is negative."""
    try:
        # An unsigned array takes ints without comparing them one by one, and
        # refuses a negative one: three times quicker than min() on a long list.
        array("Q", costs)
    except (OverflowError, TypeError):  # a negative (or huge) int, or not ints at all
        return min(costs, default=0) >= 0
    return True


class _Window:
    """Which droppable units go, oldest first, and why.

    What goes is always ``droppable[:taken]``; ``runs`` splits it into
    stretches that went for the same reason. The oldest units that free
    enough tokens are found by bisection over what they free, so only a few
    units are ever read, however many go. What the messages before a point
    cost is summed when the bisection asks, from the nearest point already
    summed below it: the bisection's halving steps add up to one pass over
    the costs at most, and no running total is kept for every message.
    """

    def __init__(self, droppable: Units, pinned: Units, costs: Sequence[int]) -> None:
        self.droppable = droppable
        # Where each droppable unit starts, read from the listing's own column: the
        # bisection below reads a dozen of them, and making a Unit for each would cost more.
        self.starts = spans_of(droppable)[0]
        self.costs = costs
        self.cost_before = _Prefixes(costs).before
        self.pinned = list(pinned)  # a few: the system message, the prompt, the live exchange
        self.pinned_starts = [unit.start for unit in self.pinned]
        self.pinned_before = list(  # the tokens of the first k pinned units
            itertools.accumulate((sum(costs[u.start : u.end]) for u in self.pinned), initial=0)
        )
        # Pinned units that open what is kept when they come first: all but
        # the first system message, which always stays in front.
        self.openers = [u.start for u in self.pinned if u.reason is not PinReason.FIRST_SYSTEM]
        self.monotone = _none_negative(costs)  # more units never free fewer tokens
        self.taken = 0
        self.front = 0  # no unit before this message can open the kept transcript
        self.runs: list[tuple[int, int, str]] = []  # droppable[begin:end] went for a reason

    def drop_oldest(self, excess: int, reason: str) -> None:
        """Drop the oldest droppable units still kept until they free ``excess`` tokens."""
        begin = self.taken
        target = self._freed(begin) + excess
        last = len(self.droppable)
        if self.monotone:
            taken = bisect.bisect_left(range(last + 1), target, lo=begin, key=self._freed)
        else:
            taken = next((k for k in range(begin, last + 1) if self._freed(k) >= target), last)
        self.taken = min(taken, last)
        self._went(begin, self.taken, reason)

    def open_at_a_user_message(self) -> None:
        """Drop what stands between the first system message and the first user message.

        A pinned unit stops it: it stays where it is, and opens what is kept.
        """
        droppable, openers = self.droppable, self.openers
        begin = self.taken
        while self.taken < len(droppable):
            oldest = droppable[self.taken]  # the oldest droppable unit still kept
            at = bisect.bisect_left(openers, self.front)
            if at < len(openers) and openers[at] < oldest.start:
                break
            if oldest.kind is UnitKind.USER:
                break
            self.taken += 1
            self.front = oldest.end
        self._went(begin, self.taken, _OPENING)

    def all_dropped(self) -> bool:
        return self.taken == len(self.droppable)

    def kept(self, messages: Sequence[Message]) -> list[Message]:
        """What is left of ``messages`` once the dropped units are gone."""
        cut = self._start(self.taken)  # every droppable unit before it is gone
        kept: list[Message] = []
        for unit in self.pinned:
            if unit.start < cut:
                kept.extend(messages[unit.start : unit.end])
        kept.extend(messages[cut:])
        return kept

    def dropped(self) -> list[tuple[Units, str]]:
        """The dropped units in order, in runs that share a reason."""
        return [(self.droppable[begin:end], reason) for begin, end, reason in self.runs]

    def _start(self, k: int) -> int:
        """Where the ``k``-th droppable unit starts (the end of the transcript past the last)."""
        starts = self.starts
        return starts[k] if k < len(starts) else len(self.costs)

    def _freed(self, k: int) -> int:
        """The tokens of the ``k`` oldest droppable units."""
        start = self._start(k)
        pinned = bisect.bisect_left(self.pinned_starts, start)  # pinned units before it
        return self.cost_before(start) - self.pinned_before[pinned]

    def _went(self, begin: int, end: int, reason: str) -> None:
        if end == begin:
            return
        runs = self.runs
        if runs and runs[-1][2] == reason:
            runs[-1] = (runs[-1][0], end, reason)
        else:
            runs.append((begin, end, reason))
