"""``AnchoredCounter``: an exact count of one transcript, carried over to its rewrites.

Near the budget's edge limiting asks an exact counter (a round trip) about
one transcript (what the estimate alone would send), and then has to decide
what to send without asking again for every candidate. An anchored counter
answers for those candidates: the anchor itself counts exactly what the
exact counter said, and any other transcript counts that less what it lacks
of the anchor plus what it has beside it, each priced from the local
estimate and scaled by how far the estimate was from the exact count.

A single ratio does not hold for every message: o200k and a model's own
tokenizer agree on English and differ threefold on Cyrillic. So the pricing
leans towards too many tokens on both sides, by the margin the estimate is
trusted to (``margin``): a dropped message is taken to save
``floor(min(1, ratio) * (1 - margin) * estimate)`` tokens and one a handler
adds (a summary) to cost ``ceil(max(1, ratio) * (1 + margin) * estimate)``. What
is sent is then at most the anchored count, as long as no message's own ratio
falls below ``min(1, ratio) * (1 - margin)``; the run's context-length retry
covers the rest.

Calibration anchors the same way on the provider's last report, which is an
exact count of the previous prompt (see ``_calibration``); there the pricing
is the calibration's own, not this margin.

Messages are matched by value, their origin aside: the prompt of one request
is the same message as the history of the next.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from threadline._messages import Message, Origin
from threadline.counting._protocol import is_incremental
from threadline.counting._scaling import scaled

if TYPE_CHECKING:
    from threadline.counting._protocol import TokenCounter
    from threadline.tools._tools import Tool

__all__ = ["AnchoredCounter", "message_key"]


class AnchoredCounter:
    """Counts any transcript from the exact count of one, ``anchor`` (an
    ``IncrementalTokenCounter``).

    ``exact_tokens`` is the exact count of ``anchor`` sent with ``tools``;
    ``estimate`` is the local counter whose per-message costs are scaled: a
    message of the anchor is taken to cost ``floor(dropped_ratio * estimate)``
    (what leaving it out saves), any other ``ceil(added_ratio * estimate)``.
    ``count(anchor, tools) == exact_tokens``. :meth:`near_budget` sets the
    ratios the way limiting does after an exact count.
    """

    __slots__ = (
        "_added_ratio",
        "_anchor_costs",
        "_base",
        "_dropped_ratio",
        "_estimate",
        "_exact_tokens",
        "_tools",
    )

    def __init__(
        self,
        estimate: TokenCounter,
        anchor: Sequence[Message],
        tools: Sequence[Tool],
        *,
        exact_tokens: int,
        dropped_ratio: float,
        added_ratio: float,
    ) -> None:
        self._estimate = estimate
        self._exact_tokens = exact_tokens
        self._tools = tuple(tools)
        self._dropped_ratio = dropped_ratio
        self._added_ratio = added_ratio
        shares = [self._share(m) for m in anchor]
        self._anchor_costs: dict[Message, int] = {
            message_key(m): share for m, share in zip(anchor, shares, strict=True)
        }
        self._base = exact_tokens - sum(shares)

    @classmethod
    def near_budget(
        cls,
        estimate: TokenCounter,
        anchor: Sequence[Message],
        tools: Sequence[Tool],
        *,
        exact_tokens: int,
        margin: float,
    ) -> AnchoredCounter:
        """The counter limiting prices with after an exact count: leaning towards too
        many tokens by ``margin`` on both sides (see the module docstring)."""
        estimated = estimate.count(anchor, tools)
        ratio = exact_tokens / estimated if estimated > 0 else 1.0
        return cls(
            estimate,
            anchor,
            tools,
            exact_tokens=exact_tokens,
            dropped_ratio=min(1.0, ratio) * (1.0 - margin),
            added_ratio=max(1.0, ratio) * (1.0 + margin),
        )

    @property
    def exact_tokens(self) -> int:
        """The exact count of the anchor transcript."""
        return self._exact_tokens

    @property
    def estimate(self) -> TokenCounter:
        """The local counter whose costs are scaled."""
        return self._estimate

    def _estimated_cost(self, message: Message) -> int:
        if is_incremental(self._estimate):
            return self._estimate.message_tokens(message)
        return self._estimate.count([message], ()) - self._estimate.count([], ())

    def _share(self, message: Message) -> int:
        """What leaving ``message`` of the anchor out saves."""
        return math.floor(self._dropped_ratio * self._estimated_cost(message))

    def _added(self, message: Message) -> int:
        """What ``message``, not in the anchor, costs."""
        return scaled(self._estimated_cost(message), self._added_ratio)

    def message_tokens(self, message: Message) -> int:
        """What ``message`` adds: its share of the exact count when it is in the anchor,
        otherwise its estimate scaled up."""
        share = self._anchor_costs.get(message_key(message))
        if share is not None:
            return share
        return self._added(message)

    def overhead_tokens(self, tools: Sequence[Tool] = ()) -> int:
        """The part of the exact count no anchored message accounts for, with tools
        other than the anchor's priced like added messages."""
        tools = tuple(tools)
        if tools == self._tools:
            return self._base
        estimate = self._estimate
        change = estimate.count([], tools) - estimate.count([], self._tools)
        if change >= 0:
            return self._base + scaled(change, self._added_ratio)
        return self._base - math.floor(-change * self._dropped_ratio)

    def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        """The anchored count of ``messages`` and ``tools``."""
        return self.overhead_tokens(tools) + sum(self.message_tokens(m) for m in messages)

    def __repr__(self) -> str:
        return (
            f"AnchoredCounter(exact_tokens={self._exact_tokens}, "
            f"messages={len(self._anchor_costs)}, estimate={self._estimate!r})"
        )


def message_key(message: Message) -> Message:
    """What a message is matched by: its value, its origin aside."""
    return message.with_origin(Origin.SEED)
