"""The size gate (.ci/check_sizes.py) counts lines of code, not docstrings, comments or blanks."""

from __future__ import annotations

import runpy
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The gate is a script, not a package: its functions are the globals it defines.
GATE = runpy.run_path(str(ROOT / ".ci" / "check_sizes.py"))


def problems_of(tmp_path: Path, source: str) -> list[str]:
    (tmp_path / "module.py").write_text(source, encoding="utf-8")
    found: list[str] = GATE["problems"](tmp_path)
    return found


def statements(count: int, indent: str = "") -> str:
    return "".join(f"{indent}value_{i} = {i}\n" for i in range(count))


def docstring(lines: int, indent: str = "") -> str:
    body = "".join(f"{indent}A line of prose about the code.\n" for _ in range(lines))
    return f'{indent}"""Summary.\n\n{body}{indent}"""\n'


def test_a_module_long_only_by_docstrings_comments_and_blank_lines_passes(
    tmp_path: Path,
) -> None:
    source = (
        docstring(200)
        + "# why the module is as it is\n" * 100
        + "\n" * 50
        + "class Thing:\n"
        + docstring(100, "    ")
        + "    size = 1\n"
        + statements(590)
    )
    assert source.count("\n") > 1000
    assert problems_of(tmp_path, source) == []


def test_a_module_of_601_lines_of_code_fails(tmp_path: Path) -> None:
    [problem] = problems_of(tmp_path, docstring(3) + statements(601))
    assert "601 lines of code (at most 600)" in problem
    assert problems_of(tmp_path, docstring(3) + statements(600)) == []


def test_a_function_long_only_by_its_docstring_comments_and_blank_lines_passes(
    tmp_path: Path,
) -> None:
    source = (
        "def tidy():\n"
        + docstring(80, "    ")
        + "    # a comment saying why\n" * 20
        + "\n" * 20
        + statements(60, "    ")
    )
    assert problems_of(tmp_path, source) == []


def test_a_function_of_61_lines_of_code_fails(tmp_path: Path) -> None:
    source = "async def busy():\n" + docstring(5, "    ") + statements(61, "    ")
    [problem] = problems_of(tmp_path, source)
    assert "busy is 61 lines of code (at most 60)" in problem


def test_a_string_that_is_not_a_docstring_is_code(tmp_path: Path) -> None:
    query = "QUERY = '''\n" + "SELECT 1\n" * 599 + "'''\n"
    [problem] = problems_of(tmp_path, docstring(2) + query)
    assert "601 lines of code" in problem
