"""MCP servers as tools, against real servers written with the SDK's FastMCP
(tests/tools/mcp_servers/toolbox.py), over stdio and over Streamable HTTP on
127.0.0.1, on asyncio and trio. The model is a FunctionDriver, so no LLM runs.

Skipped when ``mcp`` is not installed, unless THREADLINE_REQUIRE_INTEGRATION=1
(CI), where that is a failure. ``nox -s mcp_lowest`` runs them on the lowest
supported ``mcp``.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import anyio
import httpx
import pytest

from needs import require_or_skip
from servers import free_port
from threadline import Agent, Client, Message, Model, ToolCall
from threadline.testing import FunctionDriver, ProviderCall
from threadline.tools import MCPServer, ToolError, tool

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.integration,
    # On trio, the SDK's Streamable HTTP client leaves its SSE and response generators
    # to the garbage collector when a session closes: the SDK alone does it too
    # (streamable_http_client + ClientSession on trio, no threadline), so it is not ours.
    pytest.mark.filterwarnings(
        "ignore:Exception ignored in. <async_generator object"
        ":pytest.PytestUnraisableExceptionWarning"
    ),
]

TOOLBOX = Path(__file__).with_name("mcp_servers") / "toolbox.py"
MODEL = Model("function-model", context_size=8192)


@pytest.fixture(scope="module", autouse=True)
def _needs_mcp() -> None:
    if importlib.util.find_spec("mcp") is None:
        require_or_skip("the mcp package is not installed: pip install -e '.[mcp]'")


@pytest.fixture
def http_url() -> Iterator[str]:
    """The toolbox over Streamable HTTP, a server of the test's own (mcp 1.10's server
    stops serving after some client disconnects, which would fail the tests after it)."""
    yield from serve_http()


def serve_http() -> Iterator[str]:
    if importlib.util.find_spec("mcp") is None:
        require_or_skip("the mcp package is not installed: pip install -e '.[mcp]'")
    port = free_port()
    process = subprocess.Popen([sys.executable, str(TOOLBOX), "http", str(port)])
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(f"http://127.0.0.1:{port}/", timeout=1)
                break
            except httpx.TransportError:
                if process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("the MCP HTTP test server did not start") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        process.terminate()
        process.wait(timeout=15)


def stdio_server(tmp_path: Path, **options: object) -> MCPServer:
    return MCPServer.stdio(
        sys.executable, [str(TOOLBOX)], env={"MARKS": str(tmp_path / "marks")}, **options
    )


@pytest.fixture(params=["stdio", "http"])
async def server(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[MCPServer]:
    if request.param == "stdio":
        made = stdio_server(tmp_path)
    else:
        made = MCPServer.http(
            request.getfixturevalue("http_url"), headers={"Authorization": "Bearer s3cret"}
        )
    async with made:
        yield made


async def wait_until(condition: Callable[[], bool], seconds: float = 10) -> None:
    """Wait for observable state, polling; fail after ``seconds``."""
    with anyio.fail_after(seconds):
        while True:
            if condition():
                return
            await anyio.sleep(0.02)


def calling(name: str, arguments: dict[str, object]) -> FunctionDriver:
    """A model that calls ``name`` once, then answers with the tool's result text."""

    def reply(call: ProviderCall) -> Message | str:
        last = call.messages[-1]
        if last.tool_call_id is None:
            return Message.assistant(
                tool_calls=[ToolCall(id="c1", name=name, arguments=json.dumps(arguments))]
            )
        return f"the tool said: {last.text}"

    return FunctionDriver(reply)


async def run_one(server: MCPServer, name: str, arguments: dict[str, object], **options: object):
    driver = calling(name, arguments)
    agent = Agent(Client(driver), model=MODEL, tools=[server], **options)  # type: ignore[arg-type]
    result = await agent.run("go")
    tool_message = next(m for m in result.messages if m.tool_call_id == "c1")
    return result, tool_message, driver


async def test_a_tool_round_in_a_conversation_sends_the_servers_schema(server: MCPServer) -> None:
    result, message, driver = await run_one(server, "add", {"a": 2, "b": 3})
    assert "5" in message.text
    assert result.text == f"the tool said: {message.text}"
    offered = {t.name: t for t in driver.calls[0].tools}
    assert offered["add"].json_schema()["properties"]["a"]["type"] == "integer"
    assert offered["add"].json_schema()["required"] == ["a", "b"]
    assert offered["add"].description == "Add two integers."


async def test_structured_content_is_kept_as_json(server: MCPServer) -> None:
    _, message, _ = await run_one(server, "weather", {"city": "Porto"})
    assert json.loads(message.text) == {"city": "Porto", "celsius": 21, "sky": "clear"}


async def test_an_error_result_is_an_error_the_model_reads(server: MCPServer) -> None:
    _, message, _ = await run_one(server, "fail", {"reason": "no such city"})
    assert message.text.startswith("error: ")
    assert "fail" in message.text


async def test_a_slow_tool_hits_the_timeout_and_the_run_goes_on(server: MCPServer) -> None:
    with anyio.fail_after(30):
        result, message, _ = await run_one(server, "slow", {"seconds": 60}, tool_timeout=0.5)
    assert message.text.startswith("error: the tool did not finish within its time limit of 0.5 s")
    assert result.text.startswith("the tool said: error:")
    # The connection still serves the next call.
    _, after, _ = await run_one(server, "add", {"a": 1, "b": 1})
    assert "2" in after.text


async def test_a_cancelled_run_cancels_the_call(tmp_path: Path) -> None:
    marks = tmp_path / "marks"
    async with stdio_server(tmp_path) as server:
        with anyio.move_on_after(1.0) as scope:
            await run_one(server, "slow", {"seconds": 60})
        assert scope.cancelled_caught
        # The server is told (notifications/cancelled) and its tool's handler is cancelled.
        await wait_until(lambda: marks.exists() and "cancelled" in marks.read_text())
        _, after, _ = await run_one(server, "add", {"a": 2, "b": 2})
        assert "4" in after.text


async def test_a_server_killed_mid_call_is_an_error_then_restarted(tmp_path: Path) -> None:
    async with stdio_server(tmp_path) as server:
        _, before, _ = await run_one(server, "pid", {})
        with anyio.fail_after(30):
            _, died, _ = await run_one(server, "die", {})
        assert died.text.startswith("error: ")
        assert "ToolError" in died.text
        assert "stopped during the call to 'die'" in died.text
        assert "started again on the next call" in died.text
        _, after, _ = await run_one(server, "pid", {})
        assert not after.text.startswith("error")
        assert after.text != before.text


async def test_an_http_server_killed_mid_call_is_an_error_result() -> None:
    serving = serve_http()
    url = next(serving)
    try:
        async with MCPServer.http(url) as server:
            with anyio.fail_after(60):
                _, died, _ = await run_one(server, "die", {})
            assert died.text.startswith("error: ")
            assert "ToolError" in died.text
            # The server is gone: the next call tries again and says it could not start.
            _, again, _ = await run_one(server, "add", {"a": 1, "b": 1})
            assert again.text.startswith("error: ")
            assert "could not start" in again.text
    finally:
        serving.close()


async def test_list_changed_relists_the_tools_for_the_next_request(server: MCPServer) -> None:
    # A name of this test's own: the HTTP server is shared by the module's tests.
    late = f"late_{uuid.uuid4().hex[:8]}"
    assert late not in [t.name for t in server.current_tools()]
    await run_one(server, "grow", {"name": late})
    await wait_until(lambda: late in [t.name for t in server.current_tools()])
    _, message, _ = await run_one(server, late, {})
    assert f"{late} arrived late" in message.text


async def test_a_result_over_its_cap_is_cut_once_with_a_marker(tmp_path: Path) -> None:
    async with stdio_server(tmp_path, max_result_tokens=200) as server:
        result, message, driver = await run_one(server, "big", {"characters": 20_000})
    assert "[threadline cut this result:" in message.text
    assert "limit of 200]" in message.text
    assert len(message.text) < 2_000
    # What the model saw in the next round is that very message: cut once, not again.
    assert driver.calls[1].messages[-1] == message
    assert message in result.messages


async def test_a_budget_sized_cap_is_a_quarter_of_the_prompt_budget(tmp_path: Path) -> None:
    async with stdio_server(tmp_path) as server:
        _, message, _ = await run_one(server, "big", {"characters": 40_000})
    assert "[threadline cut this result:" in message.text
    # 8192 context less the 4096 reserve: a 4096-token prompt budget, a 1024-token cap.
    assert "limit of 1,024]" in message.text


async def test_images_become_a_note_for_a_driver_without_images(server: MCPServer) -> None:
    _, message, _ = await run_one(server, "picture", {})
    assert "image (image/png)" in message.text
    assert "left out" in message.text


async def test_the_environment_is_only_what_is_passed_plus_safe_defaults(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-for-servers")
    async with stdio_server(tmp_path) as server:
        _, key, _ = await run_one(server, "env", {"name": "OPENAI_API_KEY"})
        _, marks, _ = await run_one(server, "env", {"name": "MARKS"})
    assert "unset" in key.text
    assert str(tmp_path / "marks") in marks.text


async def test_two_servers_with_one_tool_name_are_prefixed(tmp_path: Path) -> None:
    @tool
    def add(a: int, b: int) -> int:
        """Local add."""
        return a + b

    async with stdio_server(tmp_path, name="box") as server:
        agent = Agent(
            Client(calling("box_add", {"a": 1, "b": 2})), model=MODEL, tools=[add, server]
        )
        names = [t.name for t in agent.tools]
        assert "add" in names
        assert "box_add" in names
        assert "box_weather" not in names
        result = await agent.run("go")
    assert "3" in result.text


async def test_two_servers_with_the_same_tools_are_told_apart_by_name(tmp_path: Path) -> None:
    async with stdio_server(tmp_path, name="one") as one, stdio_server(tmp_path, name="two") as two:
        driver = calling("two_add", {"a": 3, "b": 4})
        result = await Agent(Client(driver), model=MODEL, tools=[one, two]).run("go")
    offered = [t.name for t in driver.calls[0].tools]
    assert "one_add" in offered
    assert "two_weather" in offered
    assert "add" not in offered
    assert "7" in result.text


async def test_a_server_that_cannot_start_names_the_command_and_its_stderr(tmp_path: Path) -> None:
    script = tmp_path / "broken.py"
    script.write_text(
        "import sys\nprint('missing configuration FOO', file=sys.stderr)\nsys.exit(3)\n"
    )
    server = MCPServer.stdio(sys.executable, [str(script)], startup_timeout=20)
    with pytest.raises(ToolError) as caught:
        async with server:
            pass
    assert "broken.py" in str(caught.value)
    assert "could not start" in str(caught.value)
    assert "missing configuration FOO" in str(caught.value)


async def test_header_secrets_appear_in_no_repr_or_error(http_url: str) -> None:
    server = MCPServer.http(http_url + "?token=t0ken", headers={"Authorization": "Bearer s3cret"})
    assert "s3cret" not in repr(server)
    assert "t0ken" not in repr(server)
    async with server:
        result, _message, _ = await run_one(server, "add", {"a": 1, "b": 1})
        assert "s3cret" not in repr(server)
        assert "s3cret" not in repr(result)
    dead = MCPServer.http(
        f"http://me:pw0rd@127.0.0.1:{free_port()}/mcp?token=t0ken", headers={"X-Key": "s3cret"}
    )
    with pytest.raises(ToolError) as caught:
        async with dead:
            pass
    assert "s3cret" not in str(caught.value)
    assert "t0ken" not in str(caught.value)
    assert "pw0rd" not in str(caught.value)
    assert "could not start" in str(caught.value)


async def test_a_server_not_entered_is_refused_when_planned(tmp_path: Path) -> None:
    from threadline import InvalidRequestError

    server = stdio_server(tmp_path)
    agent = Agent(Client(calling("add", {"a": 1, "b": 1})), model=MODEL, tools=[server])
    with pytest.raises(InvalidRequestError, match="not connected"):
        await agent.run("go")
