"""Keep modules readable in one sitting and functions short enough to see whole.

Fails when a module in src/ passes MAX_MODULE_LINES lines or a function's body
(its docstring left out) passes MAX_FUNCTION_LINES lines. Run by `.ci/run` and
the nox `lint` session.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60


def function_lines(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    body = node.body
    first = body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(first.value, ast.Constant)
        and isinstance(first.value.value, str)
        and len(body) > 1
    ):
        body = body[1:]
    end = node.end_lineno or node.lineno
    return end - body[0].lineno + 1


def problems(root: Path) -> list[str]:
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        lines = text.count("\n")
        if lines > MAX_MODULE_LINES:
            found.append(f"{path}: {lines} lines (at most {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                size = function_lines(node)
                if size > MAX_FUNCTION_LINES:
                    found.append(
                        f"{path}:{node.lineno}: {node.name} is {size} lines"
                        f" (at most {MAX_FUNCTION_LINES})"
                    )
    return found


def main() -> int:
    root = Path(sys.argv[1] if len(sys.argv) > 1 else "src")
    found = problems(root)
    for line in found:
        print(line)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
