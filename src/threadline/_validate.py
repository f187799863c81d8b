"""The one place argument checks live.

Every check raises :class:`InvalidRequestError` with one message style, naming
the argument and the value it got::

    max_rounds must be an int of 1 or more, not 0

A check returns the value it accepted, so a caller reads
``self.limit = positive_int("limit", limit)``. :func:`attrs_check` turns a check
into an attrs field validator.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NoReturn, TypeVar

from threadline._errors import InvalidRequestError

__all__ = [
    "attrs_check",
    "callable_or_none",
    "fail",
    "finite_number_or_none",
    "int_at_least",
    "int_or_none",
    "is_int",
    "non_negative_int",
    "positive_int",
    "positive_int_or_none",
    "positive_seconds_or_none",
    "problem",
]

_T = TypeVar("_T")


def is_int(value: object) -> bool:
    """An ``int`` that is not a ``bool`` (``True`` is no token count)."""
    return isinstance(value, int) and not isinstance(value, bool)


def problem(name: str, expected: str, value: object) -> str:
    """The one message style: ``"{name} must be {expected}, not {value!r}"``."""
    shown = repr(value)
    if len(shown) > 80:
        shown = shown[:77] + "..."
    return f"{name} must be {expected}, not {shown}"


def fail(name: str, expected: str, value: object) -> NoReturn:
    """Raise the :class:`InvalidRequestError` of :func:`problem`."""
    raise InvalidRequestError(problem(name, expected, value))


def int_at_least(name: str, value: Any, minimum: int) -> int:
    """``value`` when it is an int of ``minimum`` or more."""
    if not is_int(value) or value < minimum:
        fail(name, f"an int of {minimum} or more", value)
    checked: int = value
    return checked


def positive_int(name: str, value: Any) -> int:
    """``value`` when it is an int of 1 or more (a token count, a size)."""
    if not is_int(value) or value <= 0:
        fail(name, "a positive int", value)
    checked: int = value
    return checked


def non_negative_int(name: str, value: Any) -> int:
    """``value`` when it is an int of 0 or more."""
    return int_at_least(name, value, 0)


def positive_int_or_none(name: str, value: Any) -> int | None:
    """``value`` when it is ``None`` or a positive int."""
    return None if value is None else positive_int(name, value)


def int_or_none(name: str, value: Any) -> int | None:
    """``value`` when it is ``None`` or an int."""
    if value is not None and not is_int(value):
        fail(name, "an int or None", value)
    checked: int | None = value
    return checked


def finite_number_or_none(name: str, value: Any) -> float | None:
    """``value`` when it is ``None`` or a finite int or float (never a bool)."""
    if value is None:
        return None
    if not (isinstance(value, int | float) and not isinstance(value, bool)) or not math.isfinite(
        value
    ):
        fail(name, "a finite number or None", value)
    checked: float = value
    return checked


def positive_seconds_or_none(name: str, value: Any) -> float | None:
    """``value`` when it is ``None`` or a finite number of seconds above 0 (a time limit)."""
    if value is None:
        return None
    if (
        not (isinstance(value, int | float) and not isinstance(value, bool))
        or not math.isfinite(value)
        or value <= 0
    ):
        fail(name, "a positive number of seconds or None", value)
    checked: float = value
    return checked


def callable_or_none(name: str, value: _T) -> _T:
    """``value`` when it is ``None`` or callable."""
    if value is not None and not callable(value):
        fail(name, "a callable or None", value)
    return value


def attrs_check(check: Callable[[str, Any], object]) -> Callable[[object, Any, Any], None]:
    """An attrs validator that runs ``check(field name, value)``."""

    def validate(instance: object, attribute: Any, value: Any) -> None:
        check(attribute.name, value)

    return validate
