"""Whether a reply's output tokens agree with the prompts' reports: an F-test.

A provider reports a prompt's tokens and a reply's. A reply of text alone is
its text as the vocabulary spells it, so the fit by class takes the replies in
(``_slopes.fit``). But a provider may count its replies otherwise than its
prompts (an o200k estimate of the output beside a real count of the prompt),
and such replies, agreeing among themselves, would pull the slopes from what
the prompts say. Then the prompts' residuals grow when the replies join the
fit, more than the parameters the replies settle would make them grow by
chance: :func:`worse_by_chance` is the F-test of that growth.
"""

from __future__ import annotations

import math

import attrs

__all__ = ["Residuals", "worse_by_chance"]


@attrs.frozen
class Residuals:
    """What a fit leaves of one kind of step (the prompts', the replies'): the noise
    per token (pulled towards the prior's while the steps are few), the weighed sum
    of the squared residuals, and the steps left free (their number less the
    parameters the fit spent on them)."""

    noise: float
    squares: float
    free: float


def worse_by_chance(alone: Residuals, joined: Residuals) -> float:
    """How likely chance alone makes the prompts' residuals grow from ``alone`` to
    ``joined``, when the replies join the fit (an F-test): the parameters the replies
    settle for the prompts (``alone.free`` less than ``joined.free``) against the
    freedom left without them. 1 where the residuals did not grow."""
    settled = joined.free - alone.free
    if settled <= 1e-6 or alone.free < 1.0 or joined.squares <= alone.squares:
        return 1.0
    if alone.squares <= 0.0:
        return 0.0
    statistic = (joined.squares - alone.squares) / settled / (alone.squares / alone.free)
    return _beta_regularized(
        alone.free / 2, settled / 2, alone.free / (alone.free + settled * statistic)
    )


def _beta_regularized(a: float, b: float, x: float) -> float:
    """The regularized incomplete beta function I_x(a, b), by its continued fraction
    (Lentz's method), the symmetry taken where that converges faster."""
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    if x > (a + 1) / (a + b + 2):
        return 1.0 - _beta_regularized(b, a, 1.0 - x)
    front = math.exp(
        math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    )
    tiny = 1e-300
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1)
    d = 1.0 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 200):
        for numerator in (
            m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
            -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1)),
        ):
            d = 1.0 + numerator * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= c * d
        if abs(c * d - 1.0) < 1e-12:
            break
    return front * fraction / a
