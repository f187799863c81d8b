"""The benchmarks run as shipped: each in a nox session, `nox -s bench` with no test extra."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEST_ONLY = ("pytest", "_pytest", "hypothesis", "respx", "pexpect")


def _bench_session_scripts() -> list[str]:
    """The names in noxfile.py's ``BENCHMARKS``, which `nox -s bench` runs."""
    tree = ast.parse((ROOT / "noxfile.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]) == "BENCHMARKS":
            names: list[str] = list(ast.literal_eval(node.value))
            return names
    raise AssertionError("noxfile.py has no BENCHMARKS")


def test_every_benchmark_is_run_by_a_nox_session() -> None:
    noxfile = (ROOT / "noxfile.py").read_text(encoding="utf-8")
    listed = set(_bench_session_scripts())
    scripts = sorted(path.stem for path in (ROOT / "benchmarks").glob("bench_*.py"))
    assert [s for s in scripts if s not in listed and f"benchmarks/{s}.py" not in noxfile] == []


@pytest.mark.parametrize("script", _bench_session_scripts())
def test_a_benchmark_of_nox_bench_imports_no_test_only_package(script: str) -> None:
    # The bench extra installs none of them: blocked here, an import of one fails.
    probe = (
        "import importlib.util, sys\n"
        f"for name in {TEST_ONLY!r}:\n"
        "    sys.modules[name] = None\n"
        f"sys.path[:0] = [{str(ROOT / 'benchmarks')!r}]\n"
        f"path = {str(ROOT / 'benchmarks' / f'{script}.py')!r}\n"
        "spec = importlib.util.spec_from_file_location('bench', path)\n"
        "module = importlib.util.module_from_spec(spec)\n"
        "sys.modules['bench'] = module\n"
        "spec.loader.exec_module(module)\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
