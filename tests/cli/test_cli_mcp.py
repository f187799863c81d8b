"""``threadline chat --mcp COMMAND``: an MCP server's tools in the command's conversation.

Runs the FastMCP test server of tests/tools/mcp_servers/; skipped without
``mcp`` (a failure in CI, where THREADLINE_REQUIRE_INTEGRATION=1).
"""

from __future__ import annotations

import importlib.util
import shlex
import sys
from pathlib import Path

import pytest

from needs import require_or_skip
from test_cli import errors, invoke
from threadline import Message, ToolCall
from threadline.testing import ScriptedDriver

pytestmark = pytest.mark.integration

TOOLBOX = Path(__file__).parents[1] / "tools" / "mcp_servers" / "toolbox.py"


@pytest.fixture(autouse=True)
def _needs_mcp() -> None:
    if importlib.util.find_spec("mcp") is None:
        require_or_skip("the mcp package is not installed: pip install -e '.[mcp]'")


def test_mcp_servers_tools_are_offered_and_run() -> None:
    call = ToolCall(id="c1", name="add", arguments='{"a": 20, "b": 22}')
    driver = ScriptedDriver([Message.assistant(tool_calls=[call]), "It is 42."])
    command = shlex.join([sys.executable, str(TOOLBOX)])
    run = invoke("chat", "--no-save", "--mcp", command, "--once", "20 + 22?", driver=driver)
    assert run.code == 0, run.err
    assert "It is 42." in run.out
    offered = [tool.name for tool in driver.calls[0].tools]
    assert "add" in offered
    assert "weather" in offered
    assert "42" in driver.calls[1].messages[-1].text


def test_an_mcp_server_that_cannot_start_is_one_clear_error(tmp_path: Path) -> None:
    script = tmp_path / "broken_server.py"
    script.write_text("raise SystemExit('no token configured')\n")
    command = shlex.join([sys.executable, str(script)])
    run = invoke("chat", "--no-save", "--mcp", command, "--once", "hi", driver=ScriptedDriver([]))
    assert run.code != 0
    (error,) = errors(run)
    assert "broken_server.py" in error
    assert "could not start" in error
    assert "no token configured" in run.err
