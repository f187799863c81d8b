"""Every page in docs/ runs as written.

A page's ```python blocks run, in page order, as one script in an empty
folder, with no network and no API key; a block of ``>>>`` lines is a
doctest and runs as one. Blocks fenced ```py are fragments (a line of a
builder, code that needs a real provider) and are not run. The site
(mkdocs.yml) documents every public package in docs/reference/.
"""

from __future__ import annotations

import doctest
import importlib.util
import os
import pkgutil
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import threadline
from needs import require_or_skip

DOCS = Path(__file__).parents[2] / "docs"
EXAMPLES = DOCS.parent / "examples"
PAGES = sorted(DOCS.glob("*.md"))
REFERENCE = DOCS / "reference"
# Subpackages with a page of their own in the guide rather than an API reference,
# and rooms of private modules whose public names are published from threadline.
NOT_IN_REFERENCE = {"threadline.cli", "threadline.conversation", "threadline.engine"}
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)

# Pages whose examples load the local model: they run with the integration tests.
NEEDS_LOCAL_MODEL = {"local.md"}
# Pages whose examples start an MCP server: they need the mcp extra (a failure in CI).
NEEDS_MCP = {"tools.md"}


def script_blocks(page: Path) -> list[str]:
    return [b for b in BLOCK.findall(page.read_text(encoding="utf-8")) if ">>>" not in b]


def has_doctest(page: Path) -> bool:
    return ">>>" in page.read_text(encoding="utf-8")


def test_there_are_pages_to_check() -> None:
    assert len(PAGES) >= 5
    assert any(script_blocks(page) for page in PAGES)


@pytest.mark.parametrize(
    "page",
    [
        pytest.param(p, id=p.name, marks=[pytest.mark.integration])
        if p.name in NEEDS_LOCAL_MODEL
        else pytest.param(p, id=p.name)
        for p in PAGES
        if script_blocks(p)
    ],
)
def test_the_page_runs(page: Path, tmp_path: Path) -> None:
    if page.name in NEEDS_MCP and importlib.util.find_spec("mcp") is None:
        require_or_skip(f"{page.name} starts an MCP server: pip install -e '.[mcp]'")
    # A page names the examples as a reader of the repository finds them: examples/...
    shutil.copytree(EXAMPLES, tmp_path / "examples")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "ANTHROPIC_"))}
    result = subprocess.run(
        [sys.executable, "-c", "\n\n".join(script_blocks(page))],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, f"{page.name} failed:\n{result.stderr[-3000:]}"


@pytest.mark.parametrize("page", [p for p in PAGES if has_doctest(p)], ids=lambda p: p.name)
def test_the_page_doctests_hold(page: Path) -> None:
    result = doctest.testfile(str(page), module_relative=False, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0


def test_every_public_package_has_an_api_reference() -> None:
    packages = {"threadline"} | {
        f"threadline.{module.name}"
        for module in pkgutil.iter_modules(threadline.__path__)
        if not module.name.startswith("_")
    }
    documented = {
        line.removeprefix(":::").strip()
        for page in REFERENCE.glob("*.md")
        for line in page.read_text(encoding="utf-8").splitlines()
        if line.startswith(":::")
    }
    assert packages - NOT_IN_REFERENCE <= documented, "add a page to docs/reference/"
