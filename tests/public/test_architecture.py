"""The house rules of docs/architecture.md, beyond what import-linter's contracts say."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src" / "threadline"


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


def test_no_import_cycle_between_rooms() -> None:
    cycle = _find_cycle(_room_graph())
    assert cycle is None, " -> ".join(cycle or ())


def test_the_cycle_check_can_fail() -> None:
    assert _find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_every_private_module_is_held_to_the_core_contract() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    contract = config["tool"]["importlinter"]["contracts"][0]
    listed = set(contract["source_modules"])
    private = {
        f"threadline.{path.stem}"
        for path in SRC.glob("_*.py")
        if path.stem not in {"__init__", "__main__"}
    } | {f"threadline.{path.parent.name}" for path in SRC.glob("_*/__init__.py")}
    assert private - listed == set()


def test_modules_and_functions_stay_readable() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / ".ci" / "check_sizes.py"), str(SRC)],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 0, out.stdout
