"""Every ``threadline.x.y`` the docs name exists: an object you can import, or a name the
library emits (a span attribute, a logger, an event), so prose cannot outlive a move."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
PAGES = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
DOTTED = re.compile(r"\bthreadline(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
# A quoted dotted name in the source: a span attribute, a logger or an event name.
EMITTED = re.compile(r"""["'](threadline(?:\.[A-Za-z_][A-Za-z0-9_]*)+)["']""")


def emitted_names() -> set[str]:
    return {
        name
        for path in (ROOT / "src" / "threadline").rglob("*.py")
        for name in EMITTED.findall(path.read_text(encoding="utf-8"))
    }


def resolves(dotted: str) -> bool:
    """Whether ``dotted`` is a module, or attributes of the longest module it starts with."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        try:
            found: object = importlib.import_module(".".join(parts[:end]))
        except ModuleNotFoundError as exc:
            if exc.name != ".".join(parts[:end]):
                raise  # a module that exists but needs what is not installed
            continue
        try:
            for name in parts[end:]:
                found = getattr(found, name)
        except AttributeError:
            return False
        return True
    return False


def named_in(page: Path) -> set[str]:
    return set(DOTTED.findall(page.read_text(encoding="utf-8")))


def test_the_check_finds_names_and_tells_good_from_bad() -> None:
    assert len(set().union(*map(named_in, PAGES))) > 30
    assert resolves("threadline.counting.set_default_token_counter")
    assert resolves("threadline.stores.sqlite")
    assert not resolves("threadline.set_default_token_counter")
    assert not resolves("threadline.limiting.no_such_handler")


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_dotted_name_a_page_gives_resolves(page: Path) -> None:
    emitted = emitted_names()
    assert (
        sorted(name for name in named_in(page) if name not in emitted and not resolves(name)) == []
    )
