"""``AnchoredCounter``: an exact count of one transcript, carried over to its rewrites.

Near the budget's edge limiting asks an exact counter (a round trip) for the
transcript it was given, and then has to decide what to drop without asking
again for every candidate. An anchored counter answers for those candidates:
the anchor itself counts exactly what the exact counter said, and a rewrite
counts that less what it dropped plus what it added, each priced from the
local estimate and scaled by how far the estimate was from the exact count.

A single ratio does not hold for every message: o200k and a model's own
tokenizer agree on English and differ threefold on Cyrillic. So the pricing
leans towards too many tokens on both sides, by the margin the estimate is
trusted to (``margin``): a dropped message is taken to save
``floor(min(1, ratio) * (1 - margin) * estimate)`` tokens and an added one
(a summary) to cost ``ceil(max(1, ratio) * (1 + margin) * estimate)``. What
is sent is then at most the anchored count, as long as no message's own ratio
falls below ``min(1, ratio) * (1 - margin)``; the run's context-length retry
covers the rest.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from threadline.counting._calibration import scaled
from threadline.counting._protocol import is_incremental

if TYPE_CHECKING:
    from threadline._messages import Message
    from threadline.counting._protocol import TokenCounter
    from threadline.tools._tools import Tool

__all__ = ["AnchoredCounter"]


class AnchoredCounter:
    """Counts rewrites of ``anchor`` from its exact count (an ``IncrementalTokenCounter``).

    ``exact_tokens`` is the exact count of ``anchor`` sent with ``tools``;
    ``estimate`` is the local counter whose per-message costs are scaled;
    ``margin`` (0 to 1) how far a single message's estimate may be off.
    ``count(anchor, tools) == exact_tokens``.
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
        margin: float,
    ) -> None:
        self._estimate = estimate
        self._exact_tokens = exact_tokens
        self._tools = tuple(tools)
        estimated = estimate.count(anchor, tools)
        ratio = exact_tokens / estimated if estimated > 0 else 1.0
        self._dropped_ratio = min(1.0, ratio) * (1.0 - margin)
        self._added_ratio = max(1.0, ratio) * (1.0 + margin)
        shares = [math.floor(self._dropped_ratio * self._estimated_cost(m)) for m in anchor]
        # Identity, not equality: an equal message a handler adds is an addition.
        self._anchor_costs: dict[int, tuple[Message, int]] = {
            id(m): (m, share) for m, share in zip(anchor, shares, strict=True)
        }
        self._base = exact_tokens - sum(shares)

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

    def message_tokens(self, message: Message) -> int:
        """What ``message`` adds: its share of the exact count when it is in the anchor,
        otherwise its estimate scaled up."""
        entry = self._anchor_costs.get(id(message))
        if entry is not None and entry[0] is message:
            return entry[1]
        return scaled(self._estimated_cost(message), self._added_ratio)

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
