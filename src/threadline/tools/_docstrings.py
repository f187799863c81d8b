"""Descriptions from docstrings: the text a tool's schema shows the model.

``parse_docstring`` reads a function's (or an attrs class's) description and
per-argument descriptions from Google, reST and NumPy style docstrings.
"""

from __future__ import annotations

import inspect
import re

__all__ = ["parse_docstring"]

_GOOGLE_SECTION = re.compile(r"^(\s*)([A-Z][A-Za-z ]*):\s*$")
_GOOGLE_PARAMETER_SECTIONS = frozenset(
    {
        "Args",
        "Arguments",
        "Attributes",
        "Keyword Args",
        "Keyword Arguments",
        "Other Parameters",
        "Parameters",
        "Params",
    }
)
_GOOGLE_ENTRY = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_REST_FIELD = re.compile(r"^:(\w+)(?:\s+([^:]*?))?\s*:\s*(.*)$")
_REST_PARAMETER_FIELDS = frozenset(
    {"param", "parameter", "arg", "argument", "key", "keyword", "var", "ivar", "cvar"}
)
_NUMPY_RULE = re.compile(r"^\s*-{3,}\s*$")
_NUMPY_ENTRY = re.compile(r"^([\w, *]+?)\s*(?::.*)?$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a docstring into its description and per-argument descriptions.

    Reads Google (``Args:``), reST (``:param name:``) and NumPy
    (``Parameters`` over a dashed rule) sections. The description is the text
    before the first section.
    """
    lines = inspect.cleandoc(doc).splitlines() if doc else []
    description: list[str] = []
    arguments: dict[str, str] = {}
    index = 0
    while index < len(lines) and not _starts_section(lines, index):
        description.append(lines[index])
        index += 1
    while index < len(lines):
        line = lines[index]
        if index + 1 < len(lines) and _NUMPY_RULE.match(lines[index + 1]):
            index = _read_numpy(lines, index, arguments)
        elif line.lstrip().startswith(":"):
            index = _read_rest(lines, index, arguments)
        elif match := _GOOGLE_SECTION.match(line):
            index = _read_google(lines, index, len(match[1]), match[2], arguments)
        else:
            index += 1
    return "\n".join(description).strip(), arguments


def _starts_section(lines: list[str], index: int) -> bool:
    line = lines[index]
    if line.startswith(":") and _REST_FIELD.match(line):
        return True
    if index + 1 < len(lines) and line.strip() and _NUMPY_RULE.match(lines[index + 1]):
        return True
    match = _GOOGLE_SECTION.match(line)
    return match is not None and not match[1]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _collapse(parts: list[str]) -> str:
    return " ".join(" ".join(parts).split())


def _read_google(
    lines: list[str], index: int, header_indent: int, title: str, out: dict[str, str]
) -> int:
    collect = title in _GOOGLE_PARAMETER_SECTIONS
    index += 1
    entry_indent: int | None = None
    name: str | None = None
    text: list[str] = []
    while index < len(lines):
        line = lines[index]
        if line.strip():
            indent = _indent(line)
            if indent <= header_indent:
                break
            entry_indent = indent if entry_indent is None else entry_indent
            match = _GOOGLE_ENTRY.match(line.strip()) if indent == entry_indent else None
            if match:
                if collect and name:
                    out[name] = _collapse(text)
                name, text = match[1], [match[2]]
            elif name:
                text.append(line.strip())
        index += 1
    if collect and name:
        out[name] = _collapse(text)
    return index


def _read_rest(lines: list[str], index: int, out: dict[str, str]) -> int:
    match = _REST_FIELD.match(lines[index].strip())
    index += 1
    text = [match[3]] if match else []
    while index < len(lines) and lines[index].strip() and not lines[index].lstrip().startswith(":"):
        text.append(lines[index].strip())
        index += 1
    if match and match[1] in _REST_PARAMETER_FIELDS and match[2]:
        out[match[2].split()[-1]] = _collapse(text)
    return index


def _read_numpy(lines: list[str], index: int, out: dict[str, str]) -> int:
    collect = lines[index].strip() in {"Parameters", "Other Parameters", "Attributes"}
    base = _indent(lines[index])
    index += 2
    names: list[str] = []
    text: list[str] = []

    def flush() -> None:
        for name in names:
            out[name] = _collapse(text)

    while index < len(lines):
        line = lines[index]
        if index + 1 < len(lines) and _NUMPY_RULE.match(lines[index + 1]):
            break
        if line.strip():
            if _indent(line) <= base:
                if collect:
                    flush()
                match = _NUMPY_ENTRY.match(line.strip())
                names = [n.strip(" *") for n in match[1].split(",")] if match else []
                text = []
            else:
                text.append(line.strip())
        index += 1
    if collect:
        flush()
    return index
