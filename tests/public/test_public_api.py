"""The public face: a small top level, documented subpackages, honest module names."""

from __future__ import annotations

import importlib
import subprocess
import sys
import types

import pytest

import threadline

SUBPACKAGES = (
    "threadline.counting",
    "threadline.drivers",
    "threadline.limiting",
    "threadline.serialization",
    "threadline.stores",
    "threadline.testing",
    "threadline.tools",
)


def test_the_top_level_names_are_exactly_all() -> None:
    # httpx's rule: nothing public sits at the top level unless __all__ lists it
    # (subpackages are namespaces, not names). The names load on first use, so
    # each is used first: what is left over would be a name nobody listed.
    for name in threadline.__all__:
        getattr(threadline, name)
    public = {
        name
        for name, value in vars(threadline).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == {name for name in threadline.__all__ if not name.startswith("__")}


def test_the_top_level_stays_small() -> None:
    assert len(threadline.__all__) <= 45


@pytest.mark.parametrize("package", ["threadline", *SUBPACKAGES])
def test_every_listed_name_exists(package: str) -> None:
    module = importlib.import_module(package)
    assert [name for name in module.__all__ if not hasattr(module, name)] == []


@pytest.mark.parametrize("package", ["threadline", *SUBPACKAGES])
def test_public_names_report_the_package_they_are_documented_under(package: str) -> None:
    module = importlib.import_module(package)
    wrong = []
    for name in module.__all__:
        value = getattr(module, name)
        defined_in = getattr(value, "__module__", None)
        if not isinstance(value, type) and not callable(value):
            continue
        if defined_in is None or not defined_in.startswith("threadline"):
            continue
        # A name may be documented at the top level and in a subpackage; a
        # public module of its own (threadline.drivers.openai_chat) is fine too.
        if defined_in == package or defined_in == "threadline":
            continue
        if "._" not in defined_in and not defined_in.endswith("._"):
            continue
        wrong.append(f"{name}: {defined_in}")
    assert wrong == []


def test_message_reports_the_top_level() -> None:
    assert threadline.Message.__module__ == "threadline"
    assert threadline.Budget.__module__ == "threadline"
    assert threadline.limiting.TokenLimitEvent.__module__ == "threadline.limiting"


def test_the_version_comes_from_the_package_metadata() -> None:
    from importlib.metadata import version

    assert threadline.__version__ == version("threadline")


def test_import_threadline_loads_no_driver_no_store_and_no_sqlite() -> None:
    code = (
        "import sys, threadline; "
        "loaded = [m for m in ('sqlite3', 'threadline.stores.sqlite', "
        "'threadline.stores.memory', 'threadline.drivers.openai_chat', "
        "'threadline.drivers.local', 'threadline.cli') if m in sys.modules]; "
        "print(loaded)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_lazy_subpackages_still_hand_out_their_members() -> None:
    from threadline.drivers import OpenAIChatDriver, RetryPolicy
    from threadline.stores import MemoryStore, SQLiteStore

    assert OpenAIChatDriver.__name__ == "OpenAIChatDriver"
    assert RetryPolicy.__module__ == "threadline.drivers"
    assert {MemoryStore.__name__, SQLiteStore.__name__} == {"MemoryStore", "SQLiteStore"}
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = threadline.drivers.Nope  # type: ignore[attr-defined]


def _loaded_after(code: str, modules: tuple[str, ...]) -> list[str]:
    """Which of ``modules`` a fresh interpreter has loaded after running ``code``."""
    probe = f"import sys\n{code}\nprint([m for m in {modules!r} if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return [name.strip("' ") for name in out.stdout.strip()[1:-1].split(",") if name.strip()]


HEAVY = ("pydantic", "genai_prices", "httpx", "httpcore", "anyio", "attrs", "cattrs", "tiktoken")


def test_import_threadline_loads_no_heavy_dependency() -> None:
    # Every public name loads on first use: a CLI or a serverless start that
    # only imports the package pays for none of these.
    assert _loaded_after("import threadline", HEAVY) == []


def test_a_top_level_name_loads_its_module_on_first_use() -> None:
    assert _loaded_after("from threadline import Message", ("attrs", "httpx")) == ["attrs"]
