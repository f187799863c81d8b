"""The cache-stable policy: cut a block at once, then keep the window's start still.

Providers cache prompt prefixes: llama.cpp reuses its KV cache, OpenAI and
Anthropic bill a cached prefix at a tenth of the price. A sliding window
(``drop_oldest_units``) that drops the oldest unit every turn changes the
prompt right after the system message on every turn, so once a conversation
is over budget nothing after the system message is served from cache again.

:func:`cache_stable_units` cuts deeper, down to a *low-water mark* (60% of
the budget by default), so the turns that follow fit without any cut and
the prompt only grows at its end. A :class:`~threadline.Conversation`
keeps the window's start where the cut left it (conversation state, saved
with it) until the budget is reached again; a plain request whose caller
sends ``result.messages`` back as the next history gets the same.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from threadline._errors import InvalidRequestError
from threadline._messages import Message, Role
from threadline.counting._anchored import AnchoredCounter
from threadline.counting._protocol import TokenCounter, is_token_counter
from threadline.limiting._budget import message_costs
from threadline.limiting._event import TokenLimitEvent, priced
from threadline.limiting._traits import HandlerTraits
from threadline.limiting._units import PinReason, Units

if TYPE_CHECKING:
    from threadline.tools._tools import Tool

__all__ = ["DEFAULT_LOW_WATER", "CacheStableUnits", "cache_stable_units"]

DEFAULT_LOW_WATER = 0.6
"""The share of the prompt budget a cache-stable cut leaves, unless told otherwise."""

_OPENING = "dropped so that the transcript opens with a user message"


class CacheStableUnits:
    """The cache-stable handler that :func:`cache_stable_units` builds.

    ``low_water`` is the share of the prompt budget a cut leaves; ``counter``
    prices the messages (``None``: the event's). Every one declares
    ``keeps_stable_prefix``: a conversation whose Pre or Post handler is one
    keeps its window's start between cuts.
    """

    __slots__ = ("__qualname__", "counter", "low_water")
    __threadline_traits__ = HandlerTraits(keeps_stable_prefix=True)

    def __init__(self, low_water: float, counter: TokenCounter | None) -> None:
        self.low_water = low_water
        self.counter = counter
        self.__qualname__ = "cache_stable_units"  # the ledger's name for it

    async def __call__(self, event: TokenLimitEvent) -> None:
        _cut(event, self.counter if self.counter is not None else event.counter, self.low_water)

    def __repr__(self) -> str:
        return f"cache_stable_units(low_water={self.low_water!r})"


def cache_stable_units(
    low_water: float = DEFAULT_LOW_WATER, counter: TokenCounter | None = None
) -> CacheStableUnits:
    """Build the cache-stable handler: when over budget, cut down to ``low_water`` of it.

    Like ``drop_oldest_units`` it drops whole droppable units, oldest first,
    never a pinned one, and then goes on until the transcript after the first
    system message opens with a user message; a transcript that fits is left
    as it is. It stops only once the transcript is at or under
    ``low_water`` times the prompt budget (or nothing droppable is left), so
    the next turns fit as they are appended and their prompt keeps its prefix.
    Each dropped unit's ledger entry says it was a cache-stable cut, from how
    many tokens, to which mark.

    ``low_water`` is a share of the budget, ``0 < low_water <= 1``: 1 cuts
    just under the budget, as the sliding window does; lower values cut less
    often and keep less history right after a cut. ``counter`` prices the
    messages; ``None`` uses the event's.

    Example::

        conv = Conversation(agent, pre_max_tokens_reached=cache_stable_units(0.5))

    Raises:
        InvalidRequestError: ``low_water`` outside ``(0, 1]``, or ``counter``
            is not a token counter.
    """
    checked_batching(low_water, counter, "cache_stable_units")
    return CacheStableUnits(float(low_water), counter)


def checked_batching(low_water: object, counter: object, who: str) -> None:
    """Refuse a low-water mark outside ``(0, 1]`` or a counter that is not one: the
    two settings every handler that cuts in batches (this one, the clearing ones) takes."""
    if (
        isinstance(low_water, bool)
        or not isinstance(low_water, int | float)
        or not 0 < low_water <= 1
    ):
        raise InvalidRequestError(
            f"low_water is a share of the prompt budget, more than 0 and at most 1, "
            f"not {low_water!r}"
        )
    if counter is not None and not is_token_counter(counter):
        raise InvalidRequestError(
            f"{who} takes a TokenCounter or None, not {type(counter).__name__}"
        )


def _cut(event: TokenLimitEvent, counter: TokenCounter, low_water: float) -> None:
    messages = event.messages
    tools = event.tools
    budget = event.budget_tokens
    costs, total, exact = priced(event, counter)
    if total <= budget:
        return
    target = math.floor(budget * low_water)
    units = event.units()
    unit_costs = [sum(costs[u.start : u.end]) for u in units]
    mark_costs = _mark_costs(counter, messages, tools, units, unit_costs)
    droppable = [k for k, unit in enumerate(units) if not unit.pinned]
    if not droppable:
        return
    reason = (
        f"cache-stable cut: {total} > {budget} tokens, down to the low-water mark of "
        f"{target} tokens ({low_water:.0%} of the budget)"
    )
    dropped: dict[int, str] = {}  # unit number -> why
    # ``estimate`` must come under the budget; ``mark`` (the same, unless the counter
    # leans towards too many tokens) down to the low-water mark.
    estimate, mark = total, float(total)
    taken = 0
    while True:
        while (mark > target or estimate > budget) and taken < len(droppable):
            k = droppable[taken]
            taken += 1
            if k not in dropped:
                dropped[k] = reason
                estimate -= unit_costs[k]
                mark -= mark_costs[k]
        opened = _open_at_a_user_message(units, messages, dropped)
        estimate -= sum(unit_costs[k] for k in opened)
        mark -= sum(mark_costs[k] for k in opened)
        if exact or taken == len(droppable):
            break
        estimate = counter.count(_kept(messages, units, dropped), tools)
        mark = float(estimate)
        if estimate <= target:
            break
    # Later runs first: a drop moves only what follows it, so the earlier
    # units keep the positions this listing gave them.
    for first, end, why in reversed(_runs(dropped)):
        event.drop_units(units[first:end], reason=why)


def _mark_costs(
    counter: TokenCounter,
    messages: list[Message],
    tools: Sequence[Tool],
    units: Units,
    unit_costs: list[int],
) -> Sequence[float]:
    """What dropping each unit saves, as the low-water mark is measured.

    Near the budget limiting prices drops from an exact count with a counter
    that leans towards too many tokens (a dropped message saves at most 90% of
    its estimate, even where the provider counts it at three times that). That
    is right for fitting the budget, but aimed at a mark 40% below it, it
    overshoots: a cut on the server's count would keep a third of the budget,
    not 60%. So the mark is measured at the exact count's own ratio to the
    estimate, and the budget still on the leaning price.
    """
    if type(counter) is not AnchoredCounter:
        return unit_costs
    estimated, overhead = message_costs(counter.estimate, messages, tools)
    if sum(estimated) + overhead <= 0:
        return unit_costs
    ratio = counter.count(messages, tools) / (sum(estimated) + overhead)
    return [ratio * sum(estimated[u.start : u.end]) for u in units]


def _open_at_a_user_message(
    units: Units, messages: list[Message], dropped: dict[int, str]
) -> list[int]:
    """Drop the droppable units in front of the first kept user message; return them.

    The first system message stays where it is, and a pinned unit stops the
    walk: it is kept wherever it stands.
    """
    opened = []
    for k, unit in enumerate(units):
        if k in dropped or unit.reason is PinReason.FIRST_SYSTEM:
            continue
        if unit.pinned or messages[unit.start].role is Role.USER:
            break
        dropped[k] = _OPENING
        opened.append(k)
    return opened


def _runs(dropped: dict[int, str]) -> list[tuple[int, int, str]]:
    """The dropped unit numbers as runs ``(first, end, reason)`` of neighbours with one reason."""
    runs: list[tuple[int, int, str]] = []
    for k in sorted(dropped):
        why = dropped[k]
        if runs and runs[-1][1] == k and runs[-1][2] == why:
            runs[-1] = (runs[-1][0], k + 1, why)
        else:
            runs.append((k, k + 1, why))
    return runs


def _kept(messages: list[Message], units: Units, dropped: dict[int, str]) -> list[Message]:
    kept: list[Message] = []
    for k, unit in enumerate(units):
        if k not in dropped:
            kept.extend(messages[unit.start : unit.end])
    return kept
