"""MkDocs hooks: the few places where GitHub's Markdown and MkDocs' differ.

The pages are read on GitHub too. In a table, GitHub needs a pipe inside
inline code escaped (`` `X \\| None` ``) and shows it unescaped; MkDocs'
tables already keep a pipe inside inline code in its cell and would show the
backslash. So, for the site only, the escape is dropped inside inline code
on table rows.
"""

from __future__ import annotations

import re
from typing import Any

CODE_SPAN = re.compile(r"`[^`\n]+`")


def _unescape_pipes(match: re.Match[str]) -> str:
    return match[0].replace("\\|", "|")


def on_page_markdown(markdown: str, **kwargs: Any) -> str:
    lines = markdown.split("\n")
    fenced = False
    for i, line in enumerate(lines):
        if line.lstrip().startswith(("```", "~~~")):
            fenced = not fenced
        elif not fenced and line.lstrip().startswith("|") and "\\|" in line:
            lines[i] = CODE_SPAN.sub(_unescape_pipes, line)
    return "\n".join(lines)
