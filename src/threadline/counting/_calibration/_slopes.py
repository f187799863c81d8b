"""Calibration by class: an intercept plus a slope per class of tokens, learned from reports.

A chat template renders a request as a fixed part (its framing, the tool
schemas as it words them: constant for one tool set) plus every message, and
a tokenizer spends on a message's text what that text's script costs it. So
the tokens a provider reports for a prompt ``T`` are close to

    R(T) = c + sum(b[k] * E[k](T))

where ``E[k](T)`` is the o200k estimate of ``T``'s tokens of class ``k``
(:mod:`~threadline.counting._calibration._classes`: framing, tool calls, Latin, Cyrillic,
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
from threadline.counting._calibration._classes import CLASSES, ClassCounts, message_classes

if TYPE_CHECKING:
    from threadline._messages import Message
    from threadline.counting._protocol import TokenCounter
    from threadline.tools._tools import Tool

__all__ = [
    "DROPPED_BIAS",
    "MAX_OBSERVATIONS",
    "MIN_FIT_REPORTS",
    "PRIOR_SLOPE",
    "PRIOR_SLOPES",
    "RIDGES",
    "UPWARD_BIAS",
    "ClassAnchoredCounter",
    "SlopeFit",
    "fit",
]

PRIOR_SLOPE = 1.0
"""The slope of a text class no report has told anything about: the estimate's own."""

PRIOR_SLOPES = (1.0, 0.25, 1.0, 1.0, 1.0, 1.0)
"""Each class's slope before any report (by :data:`CLASSES`): the estimate's own, but
for tool calls, which some templates render in full and some leave out (llama-cpp-python's
SmolLM2 template shows no call at all): a quarter, until a report says."""

RIDGES = (50.0, 4.0, 400.0, 100.0, 100.0, 100.0)
"""How strongly each slope is pulled towards its prior, as if that many squared tokens
of evidence said so. The first reports of a conversation each add two messages of
mixed scripts, so their classes cannot yet be told apart; the ridges decide how the
surprise is shared until they can: little to Latin text (most tokenizers spend about
what o200k does on it), some to the per-message framing, most to the other scripts
(Cyrillic and CJK cost a tokenizer up to three times o200k's). A class seen in a few
hundred tokens is fitted from them. Measured on three SmolLM2 servers
(docs/counting.md); a new class (tool calls) learns from its first report."""

UPWARD_BIAS = 0.015
"""How much higher new text is priced than its fitted price."""

DROPPED_BIAS = 0.005
"""How much lower text gone from the reported prompt is priced than its fitted price
(what leaving it out is taken to save)."""

MIN_FIT_REPORTS = 2
"""The reports a fit needs before it prices anything: one report cannot tell the
intercept from the slopes (until a second, calibration scales by the ratio)."""

MAX_OBSERVATIONS = 64
"""The reports a fit is made from, per model and tool set (the latest)."""


class SlopeFit:
    """One model's and tool set's fitted slopes (one per class of :data:`CLASSES`),
    with the last report they price from (its prompt and its tokens) and the
    intercept that report implies (its tokens less its messages' fitted price).
    A fit restored from a saved document has no prompt: its anchor is empty and
    its ``anchor_tokens`` the intercept."""

    __slots__ = ("anchor", "anchor_tokens", "intercept", "slopes")

    def __init__(
        self,
        slopes: Sequence[float],
        anchor: Sequence[Message],
        anchor_tokens: int,
        *,
        intercept: float,
    ) -> None:
        self.slopes = tuple(slopes)
        self.anchor = tuple(anchor)
        self.anchor_tokens = anchor_tokens
        self.intercept = intercept

    @classmethod
    def of_report(
        cls,
        slopes: Sequence[float],
        anchor: Sequence[Message],
        anchor_tokens: int,
        counts: ClassCounts,
    ) -> SlopeFit:
        """The fit pricing from one report whose prompt's class counts are ``counts``."""
        price = sum(b * e for b, e in zip(slopes, counts, strict=True))
        return cls(slopes, anchor, anchor_tokens, intercept=anchor_tokens - price)

    @classmethod
    def restored(cls, slopes: Sequence[float], intercept: float) -> SlopeFit:
        """A saved fit: every message priced from the intercept and the slopes."""
        return cls(slopes, (), max(0, round(intercept)), intercept=intercept)

    def counter(self, counter: TokenCounter, tools: Sequence[Tool]) -> ClassAnchoredCounter:
        """The counter pricing transcripts sent with ``tools`` from this fit."""
        return ClassAnchoredCounter(
            counter, self.anchor, tools, exact_tokens=self.anchor_tokens, slopes=self.slopes
        )

    def __repr__(self) -> str:
        shown = ", ".join(f"{k}={b:.3f}" for k, b in zip(CLASSES, self.slopes, strict=True))
        return f"SlopeFit({shown}, anchor_tokens={self.anchor_tokens})"


def fit(
    observations: Sequence[tuple[ClassCounts, int]], prior: Sequence[float] | None = None
) -> tuple[float, ...]:
    """The slopes that best explain ``observations`` (class counts, reported tokens)
    as an intercept plus a slope per class: ridge least squares with the intercept
    free, each slope pulled towards its ``prior`` (default :data:`PRIOR_SLOPES`, a
    saved fit's slopes when one was restored) by its :data:`RIDGES`; never below 0."""
    size = len(CLASSES)
    prior = PRIOR_SLOPES if prior is None else tuple(prior)
    n = len(observations)
    if n == 0:
        return prior
    means = [sum(o[0][k] for o in observations) / n for k in range(size)]
    mean_r = sum(o[1] for o in observations) / n
    centred = [
        ([f - m for f, m in zip(o[0], means, strict=True)], o[1] - mean_r) for o in observations
    ]
    # Solve (X'X + ridge I) (b - prior) = X'(r - X prior): a size x size system.
    matrix = [[RIDGES[i] if i == j else 0.0 for j in range(size)] for i in range(size)]
    vector = [0.0] * size
    for x, r in centred:
        residual = r - sum(p * e for p, e in zip(prior, x, strict=True))
        for i in range(size):
            if x[i]:
                vector[i] += x[i] * residual
                row = matrix[i]
                for j in range(size):
                    row[j] += x[i] * x[j]
    delta = _solve(matrix, vector)
    return tuple(max(0.0, p + d) for p, d in zip(prior, delta, strict=True))


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
