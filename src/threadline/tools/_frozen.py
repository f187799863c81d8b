"""Read-only JSON containers, so a tool's schema cannot change under a request
that has already counted its tokens.

They stay a dict and a list, so ``json.dumps`` and ``==`` work on them as on
any schema. ``freeze`` makes a read-only copy, ``thaw`` a mutable one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NoReturn

__all__ = ["freeze", "thaw"]


def _read_only(*args: Any, **kwargs: Any) -> NoReturn:
    raise TypeError(
        "a tool's parameters are read-only; call Tool.json_schema() for a mutable copy "
        "and build a new Tool from it"
    )


class _FrozenDict(dict[str, Any]):
    __slots__ = ()
    __setitem__ = __delitem__ = __ior__ = _read_only
    clear = pop = popitem = setdefault = update = _read_only

    def __reduce__(self) -> tuple[Any, ...]:
        return (_FrozenDict, (dict(self),))

    def __copy__(self) -> _FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> _FrozenDict:
        return self


class _FrozenList(list[Any]):
    __slots__ = ()
    __setitem__ = __delitem__ = __iadd__ = __imul__ = _read_only
    append = extend = insert = pop = remove = clear = sort = reverse = _read_only

    def __reduce__(self) -> tuple[Any, ...]:
        return (_FrozenList, (list(self),))

    def __copy__(self) -> _FrozenList:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> _FrozenList:
        return self


def freeze(value: Any) -> Any:
    """A read-only deep copy of a JSON value (tuples become lists)."""
    if isinstance(value, Mapping):
        return _FrozenDict({key: freeze(item) for key, item in value.items()})
    if isinstance(value, list | tuple):
        return _FrozenList(freeze(item) for item in value)
    return value


def thaw(value: Any) -> Any:
    """A mutable deep copy of a frozen JSON value."""
    if isinstance(value, Mapping):
        return {key: thaw(item) for key, item in value.items()}
    if isinstance(value, list):
        return [thaw(item) for item in value]
    return value
