"""Keep modules readable in one sitting and functions short enough to see whole.

Counts lines of code: lines that hold code, leaving out blank lines, comments
and docstrings (a module's, a class's, a function's). Fails when a module in
src/ has more than MAX_MODULE_LINES lines of code, or a function's body more
than MAX_FUNCTION_LINES. Run by `.ci/run` and the nox `lint` session.
"""

from __future__ import annotations

import ast
import io
import sys
import tokenize
from pathlib import Path

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 60

# Tokens that are not code: a comment, the end of a line, indentation.
NOT_CODE = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
}

DOCUMENTED = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)


def docstring_lines(tree: ast.Module) -> set[int]:
    """The line numbers of every docstring in ``tree``."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, DOCUMENTED) and ast.get_docstring(node, clean=False) is not None:
            docstring = node.body[0]
            lines.update(range(docstring.lineno, (docstring.end_lineno or 0) + 1))
    return lines


def code_lines(text: str, tree: ast.Module) -> set[int]:
    """The line numbers of ``text`` that hold code (a string spanning lines holds all of them)."""
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(text).readline):
        if token.type not in NOT_CODE:
            lines.update(range(token.start[0], token.end[0] + 1))
    return lines - docstring_lines(tree)


def function_lines(node: ast.FunctionDef | ast.AsyncFunctionDef, code: set[int]) -> int:
    """The lines of code of the function's body (its signature and decorators left out)."""
    body = range(node.body[0].lineno, (node.end_lineno or node.lineno) + 1)
    return len(code.intersection(body))


def problems(root: Path) -> list[str]:
    found: list[str] = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        tree = ast.parse(text, filename=str(path))
        code = code_lines(text, tree)
        if len(code) > MAX_MODULE_LINES:
            found.append(f"{path}: {len(code)} lines of code (at most {MAX_MODULE_LINES})")
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                size = function_lines(node, code)
                if size > MAX_FUNCTION_LINES:
                    found.append(
                        f"{path}:{node.lineno}: {node.name} is {size} lines of code"
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
