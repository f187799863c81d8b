"""docs/limiting.md: its examples run and print what the page says."""

from __future__ import annotations

import doctest
import re
from pathlib import Path

import pytest

PAGE = Path(__file__).parents[2] / "docs" / "limiting.md"


def python_blocks() -> list[str]:
    return re.findall(r"```py(?:thon)?\n(.*?)```", PAGE.read_text(encoding="utf-8"), flags=re.S)


def test_the_runnable_example_runs_and_shows_pre_then_post(
    capsys: pytest.CaptureFixture[str],
) -> None:
    [example] = [block for block in python_blocks() if "anyio.run(main)" in block]
    exec(compile(example, str(PAGE), "exec"), {"__name__": "docs_limiting_example"})
    printed = capsys.readouterr().out
    assert "Budget(limit=600, reserve=200, prompt_tokens=400)" in printed
    assert "pre: keep_recent_turns" in printed
    assert "post: drop_oldest_units" in printed
    assert "BudgetReport(" in printed


def test_the_interactive_examples_hold() -> None:
    result = doctest.testfile(str(PAGE), module_relative=False, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0


@pytest.mark.anyio
async def test_the_handler_can_be_tested_on_its_own(capsys: pytest.CaptureFixture[str]) -> None:
    [example] = [block for block in python_blocks() if "anyio.run(main)" in block]
    namespace: dict[str, object] = {"__name__": "docs_limiting_example"}
    # Everything but the last line, which would start an event loop of its own.
    exec(compile(example.replace("anyio.run(main)", ""), str(PAGE), "exec"), namespace)
    [snippet] = [block for block in python_blocks() if "await keep_recent_turns" in block]
    body = "async def _snippet():\n" + "".join(f"    {line}\n" for line in snippet.splitlines())
    exec(compile(body, str(PAGE), "exec"), namespace)
    await namespace["_snippet"]()  # type: ignore[operator]
    over, tokens = capsys.readouterr().out.split()
    assert over == "True"  # four turns are still over 400 tokens: Post's job
    assert int(tokens) > 400


def test_the_drop_units_example_shows_the_handler_and_its_reason_in_the_ledger(
    capsys: pytest.CaptureFixture[str],
) -> None:
    [example] = [block for block in python_blocks() if "anyio.run(show_the_ledger)" in block]
    exec(compile(example, str(PAGE), "exec"), {"__name__": "docs_limiting_drop_units"})
    first, *drops = capsys.readouterr().out.splitlines()
    assert first == "483 tokens, 349 sent, budget 400"
    assert drops == [
        f"  forget_old_tool_output dropped the tool_exchange at {start}: "
        "tool output older than the last two lookups"
        for start in (2, 6)
    ]
