"""Calibration by class: an intercept plus a slope per class of tokens, learned from reports.

A chat template renders a request as a fixed part (its framing, the tool
schemas as it words them: constant for one tool set) plus every message, and
a tokenizer spends on a message's text what that text's script costs it. So
the tokens a provider reports for a prompt ``T`` are close to

    R(T) = c + sum(b[k] * E[k](T))

where ``E[k](T)`` is the o200k estimate of ``T``'s tokens of class ``k``
(:mod:`~threadline.counting._classes`: framing, tool calls, Latin, Cyrillic,
CJK and other text) and ``b[k]`` is what the provider spends per estimated
token of that class. :class:`SlopeFit` learns ``c`` and ``b`` from the
reports of one model and tool set: a least-squares fit of every report
kept, each slope pulled towards 1 by a small ridge so a class seen little
(or not yet) is priced as the estimate prices it.

A transcript is then priced from the last report (:class:`ClassAnchoredCounter`):
the report, less the fitted price of what is gone from its prompt, plus the
fitted price of what is new. What is new is priced :data:`UPWARD_BIAS` high
and what is gone :data:`DROPPED_BIAS` low, so the count leans towards too many tokens.
Everything here is deterministic: the same reports give the same slopes.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from threadline.counting._anchored import AnchoredCounter
from threadline.counting._classes import CLASSES, ClassCounts, message_classes

if TYPE_CHECKING:
    from threadline._messages import Message
    from threadline.counting._protocol import TokenCounter
    from threadline.tools._tools import Tool

__all__ = ["DROPPED_BIAS", "PRIOR_SLOPE", "RIDGE", "UPWARD_BIAS", "ClassAnchoredCounter", "SlopeFit", "fit"]

PRIOR_SLOPE = 1.0
"""The slope of a class no report has told anything about: the estimate's own."""

RIDGE = 4.0
"""How strongly each slope is pulled towards :data:`PRIOR_SLOPE` (as if that many
squared tokens of evidence said so): a class seen in a few tokens is fitted
mostly from them."""

UPWARD_BIAS = 0.015
"""How much higher new text is priced than its fitted price."""

DROPPED_BIAS = 0.005
"""How much lower text gone from the reported prompt is priced than its fitted price
(what leaving it out is taken to save)."""

MAX_OBSERVATIONS = 64
"""The reports a fit is made from, per model and tool set (the latest)."""


class SlopeFit:
    """One model's and tool set's fitted slopes (one per class of :data:`CLASSES`),
    with the last report they price from: its prompt, its class counts, its tokens."""

    __slots__ = ("anchor", "anchor_tokens", "slopes")

    def __init__(
        self, slopes: Sequence[float], anchor: Sequence[Message], anchor_tokens: int
    ) -> None:
        self.slopes = tuple(slopes)
        self.anchor = tuple(anchor)
        self.anchor_tokens = anchor_tokens

    def counter(self, counter: TokenCounter, tools: Sequence[Tool]) -> ClassAnchoredCounter:
        """The counter pricing transcripts sent with ``tools`` from this fit."""
        return ClassAnchoredCounter(
            counter, self.anchor, tools, exact_tokens=self.anchor_tokens, slopes=self.slopes
        )

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={b:.3f}" for k, b in zip(CLASSES, self.slopes, strict=True))
        return f"SlopeFit({shown}, anchor_tokens={self.anchor_tokens})"


def fit(observations: Sequence[tuple[ClassCounts, int]]) -> tuple[float, ...]:
    """The slopes that best explain ``observations`` (class counts, reported tokens)
    as an intercept plus a slope per class: ridge least squares with the intercept
    free, each slope pulled towards :data:`PRIOR_SLOPE` by :data:`RIDGE`; never
    below 0."""
    size = len(CLASSES)
    n = len(observations)
    if n == 0:
        return (PRIOR_SLOPE,) * size
    means = [sum(o[0][k] for o in observations) / n for k in range(size)]
    mean_r = sum(o[1] for o in observations) / n
    centred = [
        ([f - m for f, m in zip(o[0], means, strict=True)], o[1] - mean_r) for o in observations
    ]
    # Solve (X'X + ridge I) (b - prior) = X'(r - X prior): a size x size system.
    matrix = [[RIDGE if i == j else 0.0 for j in range(size)] for i in range(size)]
    vector = [0.0] * size
    for x, r in centred:
        residual = r - PRIOR_SLOPE * sum(x)
        for i in range(size):
            if x[i]:
                vector[i] += x[i] * residual
                row = matrix[i]
                for j in range(size):
                    row[j] += x[i] * x[j]
    delta = _solve(matrix, vector)
    return tuple(max(0.0, PRIOR_SLOPE + d) for d in delta)


def _solve(matrix: list[list[float]], vector: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (the matrix is positive definite)."""
    size = len(vector)
    rows = [[*row, value] for row, value in zip(matrix, vector, strict=True)]
    for col in range(size):
        pivot = max(range(col, size), key=lambda r: abs(rows[r][col]))
        rows[col], rows[pivot] = rows[pivot], rows[col]
        lead = rows[col][col]
        for r in range(col + 1, size):
            factor = rows[r][col] / lead
            if factor:
                rows[r] = [a - factor * b for a, b in zip(rows[r], rows[col], strict=True)]
    solution = [0.0] * size
    for r in range(size - 1, -1, -1):
        known = sum(rows[r][c] * solution[c] for c in range(r + 1, size))
        solution[r] = (rows[r][size] - known) / rows[r][r]
    return solution


class ClassAnchoredCounter(AnchoredCounter):
    """A transcript counted from the last report, what changed priced per class.

    A message of the reported prompt counts its fitted price less
    :data:`DROPPED_BIAS`, rounded to the nearest token (what leaving it out saves),
    any other its fitted price plus :data:`UPWARD_BIAS`, rounded up; the reported
    prompt itself counts exactly the report.
    """

    __slots__ = ("_slopes",)

    def __init__(
        self,
        estimate: TokenCounter,
        anchor: Sequence[Message],
        tools: Sequence[Tool],
        *,
        exact_tokens: int,
        slopes: Sequence[float],
    ) -> None:
        self._slopes = tuple(slopes)
        super().__init__(
            estimate,
            anchor,
            tools,
            exact_tokens=exact_tokens,
            dropped_ratio=1.0 - DROPPED_BIAS,
            added_ratio=1.0 + UPWARD_BIAS,
        )

    @property
    def slopes(self) -> tuple[float, ...]:
        """The fitted slope of each class of :data:`CLASSES`."""
        return self._slopes

    def price(self, message: Message) -> float:
        """``message``'s fitted price: its class counts times the slopes."""
        counts = message_classes(self.estimate, message)
        return sum(b * e for b, e in zip(self._slopes, counts, strict=True))

    def _share(self, message: Message) -> int:
        return math.floor((1.0 - DROPPED_BIAS) * self.price(message) + 0.5)

    def _added(self, message: Message) -> int:
        return max(0, math.ceil((1.0 + UPWARD_BIAS) * self.price(message) - 1e-9))

    def __repr__(self) -> str:
        return (
            f"ClassAnchoredCounter(exact_tokens={self.exact_tokens}, slopes="
            f"{[round(b, 3) for b in self._slopes]}, estimate={self.estimate!r})"
        )
