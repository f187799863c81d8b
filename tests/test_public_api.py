"""The public face: one import, complete and sorted."""

from __future__ import annotations

import importlib
import pkgutil

import threadline


def test_all_is_sorted() -> None:
    assert threadline.__all__ == sorted(threadline.__all__)


def test_all_names_exist() -> None:
    missing = [name for name in threadline.__all__ if not hasattr(threadline, name)]
    assert missing == []


def test_every_public_class_of_the_private_modules_is_exported() -> None:
    # A class a private module lists in its own __all__ is something users
    # meet (in a result, an event, an error), so it must be reachable from the
    # top level or from its public subpackage.
    public_subpackages = {"threadline.counting", "threadline.drivers", "threadline.stores"}
    private = [
        info.name
        for info in pkgutil.iter_modules(threadline.__path__, "threadline.")
        if info.name.rsplit(".", 1)[1].startswith("_") and not info.name.endswith("__main__")
    ]
    unexported: list[str] = []
    for name in private:
        module = importlib.import_module(name)
        for exported in getattr(module, "__all__", ()):
            if exported in INTERNAL or not isinstance(getattr(module, exported), type):
                continue
            if not hasattr(threadline, exported) and not any(
                hasattr(importlib.import_module(sub), exported) for sub in public_subpackages
            ):
                unexported.append(f"{name}.{exported}")
    assert unexported == []


def test_nothing_is_defined_in_the_package_itself() -> None:
    for name in threadline.__all__:
        value = getattr(threadline, name)
        module = getattr(value, "__module__", None)
        if module is not None:
            assert module != "threadline", name


# Names private modules share between themselves; not part of the public face.
INTERNAL = frozenset(
    {
        "LimitingOutcome",
        "Transcript",
    }
)
