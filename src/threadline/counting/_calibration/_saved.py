"""What a saved conversation keeps of a calibration, per model and tool set.

A document's ``settings["token_calibration"]`` maps each
:func:`~threadline.counting.calibration_key` to either

- a number: the ratio of reported to estimated tokens (what documents held
  before calibration learned by class, and what a key without a fit holds), or
- a mapping ``{"ratio": r, "intercept": c, "slopes": {"latin": b, ...}}``: the
  ratio, and the fit by class (see ``_slopes``): the tokens the provider
  spends beside the messages, and its tokens per estimated token of each class.

A loaded document gives them back to a calibration, so a resumed
conversation prices its first turn as ``c + sum(b * E)``. Values no provider
could have taught (see ``_bounds``) are refused with the field they are in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from threadline.counting._calibration._bounds import (
    MAX_PROMPT_TOKENS,
    MAX_RATIO,
    MIN_RATIO,
    slope_range,
)
from threadline.counting._calibration._classes import CLASSES

__all__ = ["SavedEntry", "SavedValueError", "check_saved", "merged", "ratio_of"]

SavedEntry = float | dict[str, object]
"""One key's saved calibration: a ratio, or a ratio with its fit."""

_RATIOS = (MIN_RATIO, MAX_RATIO)
_INTERCEPTS = (-float(MAX_PROMPT_TOKENS), float(MAX_PROMPT_TOKENS))


class SavedValueError(ValueError):
    """A saved calibration refused; ``field`` is where, below its key (``""``,
    ``".ratio"``, ``".slopes.latin"``)."""

    def __init__(self, reason: str, field: str = "") -> None:
        super().__init__(reason)
        self.field = field


def _number(value: object, what: str, field: str, bounds: tuple[float, float]) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise SavedValueError(f"{what} is a number, not {value!r}", field)
    number = float(value)
    low, high = bounds
    if not (math.isfinite(number) and low <= number <= high):
        shown = "1/128" if low == MIN_RATIO else f"{low:g}"
        raise SavedValueError(f"{what} is from {shown} to {high:g}, not {value!r}", field)
    return number


def check_saved(value: object) -> SavedEntry:
    """``value`` as one key's saved calibration (a copy, its numbers as floats).

    Raises:
        SavedValueError: ``value`` is neither a ratio from 1/128 to 128 nor a mapping
            with such a ``ratio``, an ``intercept`` of at most 10^8 tokens either way
            and ``slopes`` by class, each at most 128 and, for a class of text, at
            least 1/128 (no tokenizer spends nothing on text). Classes this version
            does not know are left out.
    """
    if not isinstance(value, Mapping):
        return _number(value, "a calibration ratio", "", _RATIOS)
    missing = [k for k in ("ratio", "intercept", "slopes") if k not in value]
    if missing:
        raise SavedValueError(
            f"a calibration fit has a ratio, an intercept and slopes; no {missing}"
        )
    ratio = _number(value["ratio"], "a calibration ratio", ".ratio", _RATIOS)
    intercept = _number(value["intercept"], "a calibration intercept", ".intercept", _INTERCEPTS)
    slopes = value["slopes"]
    if not isinstance(slopes, Mapping):
        raise SavedValueError(
            f"a calibration's slopes map classes to numbers, not {slopes!r}", ".slopes"
        )
    known = {
        name: _number(slope, f"the slope of {name!r}", f".slopes.{name}", slope_range(name))
        for name, slope in slopes.items()
        if name in CLASSES
    }
    return {"ratio": ratio, "intercept": intercept, "slopes": known}


def ratio_of(entry: SavedEntry) -> float:
    """The ratio a saved entry holds."""
    if isinstance(entry, float):
        return entry
    ratio = entry["ratio"]
    assert isinstance(ratio, float)
    return ratio


def merged(old: SavedEntry | None, new: SavedEntry) -> SavedEntry:
    """What a document keeps when ``new`` is saved over ``old``: the larger ratio, and
    the newer fit (``old``'s when ``new`` has none)."""
    if old is None:
        return new
    ratio = max(ratio_of(old), ratio_of(new))
    fitted = new if isinstance(new, dict) else old
    if isinstance(fitted, float):
        return ratio
    return {**fitted, "ratio": ratio}
