"""A count made when it is first read: what a ledger holds when nothing needed it yet.

Limiting decides on a bound when the bound alone proves a transcript fits
(``BoundedTokenCounter``); the exact numbers the ledger reports for that round
are then made the first time someone reads them, not on the request's path.
A ``Deferred`` is the value's stand-in inside a frozen record: the record's
property reads it through :func:`resolved`, so a user only ever sees the
number. It compares, hashes and prints as its value.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Generic, TypeVar

__all__ = ["Deferred", "resolved"]

T = TypeVar("T")


class Deferred(Generic[T]):
    """A value made by ``make`` on first read, then kept; ``make`` (and what it holds,
    such as a transcript) is let go once it has run.

    Two threads reading it at once may both run ``make``: it is a pure count,
    so both get the same value.
    """

    __slots__ = ("_make", "_value")

    def __init__(self, make: Callable[[], T]) -> None:
        self._make: Callable[[], T] | None = make
        self._value: T | None = None

    def get(self) -> T:
        make = self._make
        if make is None:
            return self._value  # type: ignore[return-value]  # set before _make was let go
        value = make()
        self._value = value
        self._make = None
        return value

    def __eq__(self, other: object) -> bool:
        return self.get() == resolved(other)

    def __hash__(self) -> int:
        return hash(self.get())

    def __repr__(self) -> str:
        return repr(self.get())

    def __reduce__(self) -> tuple[Callable[[T], T], tuple[T]]:
        # Pickled (or deep-copied) as its value: what made it is not data.
        return _itself, (self.get(),)


def _itself(value: T) -> T:
    return value


def resolved(value: T | Deferred[T]) -> T:
    """``value`` itself, or what a :class:`Deferred` makes of it."""
    if type(value) is Deferred:
        return value.get()
    return value  # type: ignore[return-value]  # not a Deferred: the value itself
