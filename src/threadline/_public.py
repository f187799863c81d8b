"""Makes a public name report the package it is documented under.

Classes and functions are defined in private modules; a user reading a
traceback, a ``repr`` or the API reference should see ``threadline.Message``,
not ``threadline._messages.Message``.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_members", "publish"]


def publish(namespace: dict[str, Any], names: list[str], package: str) -> None:
    """Set ``__module__`` of each class or function in ``names`` to ``package``.

    The top-level face runs last and a name it publishes keeps ``threadline``.

    attrs classes have their string annotations resolved first, against the
    module that defined them, so cattrs and ``typing.get_type_hints`` keep
    working after the rename.
    """
    if not names:
        return
    # attrs is imported here, not at the top: the top-level package publishes
    # each name on first use, and ``import threadline`` should load no attrs.
    import attrs

    for name in names:
        obj = namespace[name]
        if not isinstance(obj, type) and not callable(obj):
            continue
        module = getattr(obj, "__module__", "") or ""
        # Defined in a private module of threadline's (the top-level face also
        # claims names a subpackage published), and not claimed already.
        private = "._" in module or package == "threadline"
        if not module.startswith("threadline.") or module == package or not private:
            continue
        if isinstance(obj, type) and attrs.has(obj):
            # A class annotated with names imported only for type checking
            # is never structured by cattrs; it keeps its strings.
            with contextlib.suppress(NameError):
                attrs.resolve_types(obj)
        try:
            obj.__module__ = package
        except (AttributeError, TypeError):  # pragma: no cover - builtins, slots
            continue


def lazy_members(
    namespace: dict[str, Any], lazy: Mapping[str, str], all_names: list[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """A package's module ``__getattr__`` and ``__dir__`` for names imported on first use.

    ``lazy`` maps a name to the module that defines it. The first access imports
    that module, publishes the name under the package (``namespace["__name__"]``)
    and keeps it in ``namespace``, so the next access is a plain lookup. The
    package's other names are published at once.
    """
    package = namespace["__name__"]
    publish(namespace, [name for name in all_names if name not in lazy], package)

    def getattr_(name: str) -> Any:
        module = lazy.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        publish({name: value}, [name], package)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted(set(namespace) | set(all_names))

    return getattr_, dir_
