"""The house rules of docs/architecture.md, beyond what import-linter's contracts say."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from collections.abc import Mapping, Set
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "threadline"
TESTS = ROOT / "tests"


def _room(module: str) -> str:
    # A room is a top-level module or a whole subpackage: threadline.limiting._engine
    # lives in threadline.limiting.
    return ".".join(module.split(".")[:2])


def _room_graph() -> dict[str, set[str]]:
    graph = grimp.build_graph("threadline", exclude_type_checking_imports=True)
    rooms: dict[str, set[str]] = {}
    for module in graph.modules:
        targets = rooms.setdefault(_room(module), set())
        for imported in graph.find_modules_directly_imported_by(module):
            if _room(imported) != _room(module) and _room(imported) != "threadline":
                targets.add(_room(imported))
    return rooms


def _find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (cycle := visit(nxt)):
                return cycle
        path.pop()
        state[node] = 2
        return None

    for node in sorted(graph):
        if node not in state and (cycle := visit(node)):
            return cycle
    return None


def _module_graph(package: str = "threadline") -> dict[str, set[str]]:
    # Imports under TYPE_CHECKING count here: a circle drawn only for the type
    # checker is still one a reader has to hold in their head.
    graph = grimp.build_graph(package, exclude_type_checking_imports=False, cache_dir=None)
    return {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}


def test_no_import_cycle_between_rooms() -> None:
    cycle = _find_cycle(_room_graph())
    assert cycle is None, " -> ".join(cycle or ())


def test_no_import_cycle_between_modules_type_only_imports_included() -> None:
    cycle = _find_cycle(_module_graph())
    assert cycle is None, " -> ".join(cycle or ())


def test_the_cycle_check_can_fail() -> None:
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_the_module_cycle_check_sees_a_circle_drawn_for_the_type_checker(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two modules of a throwaway package: one imports the other at run time,
    # which imports it back only under TYPE_CHECKING.
    package = tmp_path / "circle_for_types"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "client.py").write_text("from circle_for_types.request import Request\n")
    (package / "request.py").write_text(
        "from typing import TYPE_CHECKING\n\n"
        "if TYPE_CHECKING:\n"
        "    from circle_for_types.client import Client\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert _find_cycle(_module_graph("circle_for_types")) == [
        "circle_for_types.client",
        "circle_for_types.request",
        "circle_for_types.client",
    ]


def test_every_private_module_is_held_to_the_core_contract() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contract = config["tool"]["importlinter"]["contracts"][0]
    listed = set(contract["source_modules"])
    adapters = set(contract["forbidden_modules"])
    # Every room but the adapters is core: each private top-level module, and
    # each package that is not an adapter (threadline.engine, ...).
    private = {
        f"threadline.{path.stem}"
        for path in SRC.glob("_*.py")
        if path.stem not in {"__init__", "__main__"}
    }
    packages = {f"threadline.{path.parent.name}" for path in SRC.glob("*/__init__.py")}
    assert (private | (packages - adapters)) - listed == set()


def test_modules_and_functions_stay_readable() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "check_sizes.py"), str(SRC)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout


# -- which tests may reach inside a room -------------------------------------------------

# The test modules (paths under tests/) that import a private module of threadline
# (``threadline._x``, ``threadline.pkg._y``) to test a piece on its own; every other
# test goes through the public face, as users do. The check below fails on a module
# that imports one and is not listed, and on a listed one that no longer does, so the
# list stays exact.
MAY_IMPORT_PRIVATE_MODULES = frozenset(
    {
        "cli/test_anthropic_cli.py",
        "cli/test_cli_counting.py",
        "cli/test_gemini_cli.py",
        "cli/test_responses_cli.py",
        "conversation/test_conversation_window.py",
        "conversation/test_transcript_storage.py",
        "counting/test_counting_builtin.py",
        "counting/test_counting_calibration.py",
        "counting/test_counting_classes.py",
        "counting/test_counting_encoding.py",
        "counting/test_counting_lengths.py",
        "counting/test_counting_measured.py",
        "counting/test_counting_replies.py",
        "counting/test_counting_resolution.py",
        "drivers/anthropic/test_anthropic_compaction_window.py",
        "drivers/anthropic/test_anthropic_request.py",
        "drivers/gemini/test_gemini_properties.py",
        "drivers/gemini/test_gemini_replay.py",
        "drivers/http/test_cached_transcripts.py",
        "drivers/http/test_http_aiohttp.py",
        "drivers/http/test_http_errors.py",
        "drivers/http/test_http_retry.py",
        "drivers/http/test_json_cache.py",
        "drivers/http/test_sse.py",
        "drivers/local/test_local_driver.py",
        "drivers/local/test_local_driver_integration.py",
        "drivers/openai_chat/test_openai_chat_encoding.py",
        "drivers/openai_chat/test_openai_chat_request.py",
        "drivers/test_omitted_output.py",
        "engine/test_catalog.py",
        "engine/test_messages.py",
        "engine/test_request_settings.py",
        "limiting/test_budget.py",
        "limiting/test_cache_stable.py",
        "engine/test_cache_misses.py",
        "limiting/test_clearing.py",
        "limiting/test_clearing_properties.py",
        "limiting/test_limiting.py",
        "limiting/test_limiting_bookkeeping.py",
        "limiting/test_limiting_bounded.py",
        "limiting/test_limiting_event.py",
        "limiting/test_limiting_incremental.py",
        "limiting/test_limiting_properties.py",
        "limiting/test_units.py",
        "serialization/test_serialization_documents.py",
        "serialization/test_serialization_parts.py",
        "serialization/test_serialization_roundtrip.py",
        "serialization/test_serialization_versions.py",
        "stores/test_stores_deadlines.py",
        "stores/test_stores_postgres.py",
        "stores/test_stores_redis.py",
        "stores/test_stores_redis_calls.py",
        "stores/test_stores_sqlite.py",
        "tools/test_output_properties.py",
        "tools/test_mcp_results.py",
        "tools/test_tools_schema.py",
    }
)


def _private_module(dotted: str) -> str | None:
    """``threadline.limiting._engine`` for any name at or under it; None for a public name."""
    parts = dotted.split(".")
    if parts[0] != "threadline":
        return None
    for end, part in enumerate(parts[1:], start=2):
        if part.startswith("_") and not (part.startswith("__") and part.endswith("__")):
            return ".".join(parts[:end])
    return None


def private_imports(source: str) -> set[str]:
    """The private modules of threadline that ``source`` imports, wherever the import is."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{alias.name}" for alias in node.names)]
        else:
            continue
        found |= {private for name in names if (private := _private_module(name))}
    return found


def listing_errors(imports: Mapping[str, Set[str]], allowed: Set[str]) -> list[str]:
    """What is wrong with ``allowed``, given each test module's private imports."""
    importing = {module for module, private in imports.items() if private}
    return [
        *(
            f"{module} imports {', '.join(sorted(imports[module]))}: "
            "list it in MAY_IMPORT_PRIVATE_MODULES or go through the public API"
            for module in sorted(importing - allowed)
        ),
        *(
            f"{module} is listed in MAY_IMPORT_PRIVATE_MODULES "
            "but imports no private module (or is gone): take it off the list"
            for module in sorted(allowed - importing)
        ),
    ]


def test_only_the_listed_test_modules_import_private_modules() -> None:
    imports = {
        path.relative_to(TESTS).as_posix(): private_imports(path.read_text(encoding="utf-8"))
        for path in TESTS.rglob("*.py")
    }
    assert listing_errors(imports, MAY_IMPORT_PRIVATE_MODULES) == []


def test_the_private_import_check_can_fail() -> None:
    source = "\n".join(
        [
            "import threadline._messages",
            "from threadline import Message, __version__",
            "from threadline.limiting._engine import apply_limits",
            "from threadline.drivers import _wire",
            "from threadline.serialization import loads_conversation",
            "def later():",
            "    from threadline.cli._app import parser",
        ]
    )
    found = private_imports(source)
    assert found == {
        "threadline._messages",
        "threadline.limiting._engine",
        "threadline.drivers._wire",
        "threadline.cli._app",
    }
    imports = {"a/test_new.py": found, "b/test_public.py": set()}
    assert listing_errors(imports, {"b/test_public.py"}) == [
        "a/test_new.py imports threadline._messages, threadline.cli._app, "
        "threadline.drivers._wire, threadline.limiting._engine: "
        "list it in MAY_IMPORT_PRIVATE_MODULES or go through the public API",
        "b/test_public.py is listed in MAY_IMPORT_PRIVATE_MODULES "
        "but imports no private module (or is gone): take it off the list",
    ]
    assert listing_errors(imports, {"a/test_new.py"}) == []


# --- rooms by idea: a family of modules is a folder; capabilities are declared -----------


def prefix_families(names: Set[str]) -> dict[str, set[str]]:
    """Groups of three or more module names sharing a first word (``_http_errors``,
    ``_http_endpoint``, ``_http``: ``http``); such a family is a folder waiting to be made."""
    families: dict[str, set[str]] = {}
    for name in names:
        families.setdefault(name.lstrip("_").split("_")[0], set()).add(name)
    return {word: group for word, group in families.items() if len(group) >= 3}


def test_no_family_of_sibling_modules_outside_a_folder_of_its_own() -> None:
    found = {}
    for folder in sorted({path.parent for path in SRC.rglob("*.py")}):
        names = {path.stem for path in folder.glob("*.py")} - {"__init__", "__main__"}
        found.update(
            {
                f"{folder.relative_to(SRC)}/{word}": group
                for word, group in prefix_families(names).items()
            }
        )
    assert found == {}


def test_the_family_check_can_fail() -> None:
    names = {"_conversation", "_conversation_state", "_conversation_window", "_messages"}
    assert prefix_families(names) == {
        "conversation": {"_conversation", "_conversation_state", "_conversation_window"}
    }


def capability_probes(source: str) -> list[str]:
    """``getattr``/``hasattr`` calls on a driver or a counter: a capability found by
    probing, where the protocol should declare it (docs/architecture.md)."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"getattr", "hasattr"}
            and node.args
        ):
            target = ast.unparse(node.args[0]).lower()
            if "driver" in target or "counter" in target:
                found.append(f"{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_capability_of_a_driver_or_counter_is_found_by_probing() -> None:
    found = {
        str(path.relative_to(SRC)): probes
        for path in sorted(SRC.rglob("*.py"))
        if (probes := capability_probes(path.read_text(encoding="utf-8")))
    }
    assert found == {}


def test_the_probe_check_can_fail() -> None:
    source = "close = getattr(self.driver, 'aclose', None)\nhasattr(counter, 'for_model')\n"
    assert capability_probes(source) == [
        "1: getattr(self.driver, 'aclose', None)",
        "2: hasattr(counter, 'for_model')",
    ]
