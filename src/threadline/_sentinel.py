"""``NOT_GIVEN``: tells "the caller did not pass this" apart from ``None`` and ``0``.

An output reserve of ``0`` is a real choice (give the whole limit to the
prompt), so "unset" needs a value of its own::

    def with_output_reserve_tokens(self, n: int | NotGiven = NOT_GIVEN) -> ...:
        if isinstance(n, NotGiven):
            ...
"""

from __future__ import annotations

from typing import Final, Literal

__all__ = ["NOT_GIVEN", "NotGiven"]


class NotGiven:
    """The type of :data:`NOT_GIVEN`; there is only ever one instance.

    It is falsy, so ``value or default`` reads naturally, and it survives
    ``copy`` and ``pickle`` as the same object, so ``is NOT_GIVEN`` holds.
    """

    _instance: NotGiven | None = None

    def __new__(cls) -> NotGiven:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __bool__(self) -> Literal[False]:
        return False

    def __repr__(self) -> str:
        return "NOT_GIVEN"

    def __copy__(self) -> NotGiven:
        return self

    def __deepcopy__(self, memo: object) -> NotGiven:
        return self

    def __reduce__(self) -> str:
        return "NOT_GIVEN"


NOT_GIVEN: Final = NotGiven()
"""The value of an option the caller did not pass."""
