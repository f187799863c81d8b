"""Scaling a token count by a ratio, rounded up: calibration and anchoring share it."""

from __future__ import annotations

import math

__all__ = ["scaled"]

# A product such as 1.1 * 100 is 110.00000000000001 in binary floating point;
# rounding it up must still give 110.
_EPSILON = 1e-9


def scaled(tokens: int, ratio: float) -> int:
    """``tokens`` times ``ratio``, rounded up (never below a count it should equal)."""
    return max(0, math.ceil(tokens * ratio - _EPSILON))
