"""What a saved conversation keeps of a calibration, per model and tool set.

A document's ``settings["token_calibration"]`` maps each
:func:`~threadline.counting.calibration_key` to either

- a number: the ratio of reported to estimated tokens (what documents held
  before calibration learned by class, and what a key without a fit holds), or
- a mapping ``{"version": 2, "ratio": r, "intercept": c, "slopes": {"latin":
  b, ...}, "uncertainty": {"latin": u, ...}}``: the ratio, and the fit by
  class (see ``_slopes``): the tokens the provider spends beside the
  messages, its tokens per estimated token of each class, and the standard
  deviation of each of those slopes.

Fits saved before calibration knew its uncertainty have no ``version`` (it
is 1) and no ``uncertainty``, and their ``other`` class held every script
but Latin, Cyrillic and CJK. They still load: their slopes are the fit's,
each as unsure as its prior (so the first turn is priced high), and
``other``'s slope is the new ``other``'s (the scripts it still holds). A
version this one does not know (a newer threadline's) is refused, naming it.

A loaded document gives them back to a calibration, so a resumed
conversation prices its first turn from ``c + sum(b * E)``. Values no provider
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
from threadline.counting._calibration._priors import PRIOR_SLOPES, PRIOR_UNCERTAINTY
from threadline.counting._calibration._slopes import MIN_UNCERTAINTY, PRIOR_NOISE, Posterior

__all__ = [
    "FIT_VERSION",
    "SavedEntry",
    "SavedValueError",
    "check_saved",
    "merged",
    "ratio_of",
    "restored_fit",
    "saved_fit",
]

FIT_VERSION = 2
"""The version of the saved fit this threadline writes (see the module docstring)."""

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
    version = _version(value.get("version", 1))
    ratio = _number(value["ratio"], "a calibration ratio", ".ratio", _RATIOS)
    intercept = _number(value["intercept"], "a calibration intercept", ".intercept", _INTERCEPTS)
    known = {
        name: _number(slope, f"the slope of {name!r}", f".slopes.{name}", slope_range(name))
        for name, slope in _by_class(value["slopes"], "slopes").items()
    }
    checked: dict[str, object] = {
        "version": version,
        "ratio": ratio,
        "intercept": intercept,
        "slopes": known,
    }
    if version >= 2:
        if "uncertainty" not in value:
            raise SavedValueError("a version 2 calibration fit has an uncertainty per class")
        if "noise" in value:
            checked["noise"] = _number(value["noise"], "a calibration's noise", ".noise", _UNSURE)
        checked["uncertainty"] = {
            name: _number(u, f"the uncertainty of {name!r}", f".uncertainty.{name}", _UNSURE)
            for name, u in _by_class(value["uncertainty"], "uncertainty").items()
        }
    return checked


_UNSURE = (0.0, MAX_RATIO)


def _version(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise SavedValueError(f"a calibration fit's version is 1 or 2, not {value!r}", ".version")
    if value > FIT_VERSION:
        raise SavedValueError(
            f"a calibration fit of version {value} was saved by a newer threadline; this one "
            f"reads versions 1 to {FIT_VERSION}",
            ".version",
        )
    return value


def _by_class(value: object, field: str) -> dict[str, object]:
    """``value`` as a mapping of class names, those this version does not know left out."""
    if not isinstance(value, Mapping):
        raise SavedValueError(
            f"a calibration's {field} map classes to numbers, not {value!r}", f".{field}"
        )
    return {str(name): v for name, v in value.items() if name in CLASSES}


def saved_fit(ratio: float, intercept: float, posterior: Posterior) -> dict[str, object]:
    """What a document keeps of one key's fit (the latest version)."""
    return {
        "version": FIT_VERSION,
        "ratio": ratio,
        "intercept": intercept,
        "slopes": dict(zip(CLASSES, posterior.slopes, strict=True)),
        "uncertainty": dict(zip(CLASSES, posterior.uncertainty, strict=True)),
        "noise": posterior.noise,
    }


def restored_fit(entry: Mapping[str, object]) -> tuple[Posterior, float]:
    """The fit a checked saved entry holds (see the module docstring) and its intercept.
    A class the entry does not hold is at its prior; a version 1 fit, and a class
    without a saved uncertainty, is as unsure as the prior."""
    slopes, unsure, intercept = entry["slopes"], entry.get("uncertainty", {}), entry["intercept"]
    noise = entry.get("noise", PRIOR_NOISE)
    assert isinstance(slopes, Mapping)
    assert isinstance(unsure, Mapping)
    assert isinstance(intercept, float)
    assert isinstance(noise, float)
    posterior = Posterior.of(
        tuple(float(slopes.get(k, p)) for k, p in zip(CLASSES, PRIOR_SLOPES, strict=True)),
        tuple(
            max(MIN_UNCERTAINTY, float(unsure.get(k, u)))
            for k, u in zip(CLASSES, PRIOR_UNCERTAINTY, strict=True)
        ),
        max(MIN_UNCERTAINTY, noise),
    )
    return posterior, intercept


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
