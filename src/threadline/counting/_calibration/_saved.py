"""What a saved conversation keeps of a calibration, per model and tool set.

A document's ``settings["token_calibration"]`` maps each
:func:`~threadline.counting.calibration_key` to either

- a number: the ratio of reported to estimated tokens (what documents held
  before calibration learned by class, and what a key without a fit holds), or
- a mapping ``{"ratio": r, "intercept": c, "slopes": {"latin": b, ...}}``: the
  ratio, and the fit by class (see ``_slopes``): the tokens the provider
  spends beside the messages, and its tokens per estimated token of each class.

A loaded document gives them back to a calibration, so a resumed
conversation prices its first turn as ``c + sum(b * E)``. Bad values are
refused with the field they are in.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from threadline.counting._calibration._classes import CLASSES

__all__ = ["SavedEntry", "check_saved", "merged", "ratio_of"]

SavedEntry = float | dict[str, object]
"""One key's saved calibration: a ratio, or a ratio with its fit."""


def _number(value: object, what: str, *, positive: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{what} is a number, not {value!r}")
    number = float(value)
    if not math.isfinite(number) or number < 0 or (positive and number == 0):
        kind = "positive, finite" if positive else "non-negative, finite"
        raise ValueError(f"{what} is a {kind} number, not {value!r}")
    return number


def check_saved(value: object) -> SavedEntry:
    """``value`` as one key's saved calibration (a copy, its numbers as floats).

    Raises:
        ValueError: ``value`` is neither a positive, finite ratio nor a mapping with a
            ``ratio``, a finite ``intercept`` and ``slopes`` of non-negative numbers by
            class. Classes this version does not know are left out.
    """
    if not isinstance(value, Mapping):
        return _number(value, "a calibration ratio", positive=True)
    missing = [k for k in ("ratio", "intercept", "slopes") if k not in value]
    if missing:
        raise ValueError(f"a calibration fit has a ratio, an intercept and slopes; no {missing}")
    ratio = _number(value["ratio"], "a calibration ratio", positive=True)
    intercept = value["intercept"]
    if isinstance(intercept, bool) or not isinstance(intercept, int | float):
        raise ValueError(f"a calibration intercept is a number, not {intercept!r}")
    if not math.isfinite(intercept):
        raise ValueError(f"a calibration intercept is finite, not {intercept!r}")
    slopes = value["slopes"]
    if not isinstance(slopes, Mapping):
        raise ValueError(f"a calibration's slopes map classes to numbers, not {slopes!r}")
    known = {
        name: _number(slope, f"the slope of {name!r}")
        for name, slope in slopes.items()
        if name in CLASSES
    }
    return {"ratio": ratio, "intercept": float(intercept), "slopes": known}


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
