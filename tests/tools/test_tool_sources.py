"""Tool sources in ``tools=`` (what an MCP server is to a request), the per-tool result
cap and the results a tool marks as errors or gives as image parts, through a run."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable

import attrs
import pytest

from threadline import (
    Agent,
    Client,
    ImagePart,
    InvalidRequestError,
    Message,
    Model,
    TextPart,
    ToolCall,
)
from threadline.testing import FunctionDriver, ProviderCall
from threadline.tools import MCPServer, Tool, ToolResult, ToolSource, tool

pytestmark = pytest.mark.anyio

MODEL = Model("function-model", context_size=8192)


class Source(ToolSource):
    def __init__(self, name: str, tools: list[Tool], prefix: str | None = None) -> None:
        self._name, self._tools, self._prefix = name, tuple(tools), prefix

    @property
    def source_name(self) -> str:
        return self._name

    @property
    def prefix(self) -> str | None:
        return self._prefix

    def current_tools(self) -> tuple[Tool, ...]:
        return self._tools


def echo(name: str) -> Tool:
    async def run(**arguments: object) -> str:
        return f"{name} ran"

    return Tool(name=name, function=run)


def calling(*names: str) -> FunctionDriver:
    """A model that calls each tool in ``names``, one round each, then answers."""
    return FunctionDriver(script(*names))


def script(*names: str) -> Callable[[ProviderCall], Message | str]:
    """The replies of :func:`calling`."""

    def reply(call: ProviderCall) -> Message | str:
        done = sum(1 for m in call.messages if m.tool_call_id is not None)
        if done < len(names):
            name = names[done]
            return Message.assistant(tool_calls=[ToolCall(id=f"c{done}", name=name)])
        return "done"

    return reply


def tool_messages(driver: FunctionDriver) -> list[Message]:
    return [m for m in driver.calls[-1].messages if m.tool_call_id is not None]


async def test_a_source_s_tools_are_offered_and_colliding_names_are_prefixed() -> None:
    @tool
    def search(q: str = "") -> str:
        """Local search."""
        return "local"

    docs = Source("docs", [echo("search"), echo("fetch")])
    driver = calling("docs_search", "fetch", "search")
    agent = Agent(Client(driver), model=MODEL, tools=[search, docs])
    assert [t.name for t in agent.tools] == ["search", "docs_search", "fetch"]
    await agent.run("go")
    assert [m.text for m in tool_messages(driver)] == ["search ran", "fetch ran", "local"]


async def test_a_set_prefix_applies_always_and_an_empty_one_never() -> None:
    always = Source("a", [echo("x")], prefix="team")
    assert [t.name for t in Agent(Client(calling()), tools=[always]).tools] == ["team_x"]
    never = Source("b", [echo("x")], prefix="")
    with pytest.raises(InvalidRequestError, match="'x' appears twice"):
        Agent(Client(calling()), tools=[echo("x"), never]).tools  # noqa: B018


async def test_a_source_is_read_when_each_request_is_planned() -> None:
    source = Source("s", [echo("first")])
    driver = calling("first")
    agent = Agent(Client(driver), model=MODEL, tools=[source])
    source._tools = (echo("second"),)
    await agent.run("go")
    assert [t.name for t in driver.calls[0].tools] == ["second"]
    assert tool_messages(driver)[0].text.startswith("error: unknown tool 'first'")


async def test_an_mcp_server_not_entered_is_refused_naming_async_with() -> None:
    server = MCPServer.stdio("python", ["server.py"])
    agent = Agent(Client(calling()), model=MODEL, tools=[server])
    with pytest.raises(InvalidRequestError, match="async with"):
        await agent.run("go")


def test_mcp_server_options_are_checked_where_they_are_given() -> None:
    with pytest.raises(InvalidRequestError, match="url"):
        MCPServer.http("ftp://example.com")
    with pytest.raises(InvalidRequestError, match="max_result_tokens"):
        MCPServer.stdio("python", max_result_tokens=0)
    with pytest.raises(InvalidRequestError, match="env"):
        MCPServer.stdio("python", env={"A": 1})  # type: ignore[dict-item]
    with pytest.raises(InvalidRequestError, match="args"):
        MCPServer.stdio("python", "server.py")


def test_no_repr_shows_headers_env_or_url_secrets() -> None:
    http = MCPServer.http("https://me:pw@mcp.example/x?key=k3y", headers={"Authorization": "s3c"})
    stdio = MCPServer.stdio("python", ["s.py"], env={"TOKEN": "t0k"})
    shown = repr(http) + repr(stdio)
    for secret in ("s3c", "k3y", "pw", "t0k"):
        assert secret not in shown


def long_tool(cap: int | str | None, characters: int = 20_000) -> Tool:
    @tool
    def long() -> str:
        """A long text."""
        return " ".join(f"word{i}" for i in range(characters // 6))

    return attrs.evolve(long, max_result_tokens=cap)


async def test_a_result_over_its_cap_is_cut_once_with_a_marker_and_stays_cut() -> None:
    driver = calling("long", "long")
    await Agent(Client(driver), model=MODEL, tools=[long_tool(100)]).run("go")
    first, second = tool_messages(driver)
    assert "[threadline cut this result:" in first.text
    assert "over this tool's limit of 100]" in first.text
    assert len(first.text) < 1_000
    # Later rounds send the very message that entered the transcript.
    assert driver.calls[1].messages[-1] == first
    assert tool_messages(driver)[0] == first
    assert second.text == first.text


async def test_a_budget_sized_cap_is_a_quarter_of_the_prompt_budget() -> None:
    driver = calling("long")
    await Agent(Client(driver), model=MODEL, tools=[long_tool("budget")]).run("go")
    # 8192 less the 4096 reserve: a 4096-token prompt budget, a 1024-token cap.
    assert "over this tool's limit of 1,024]" in tool_messages(driver)[0].text


async def test_a_result_under_its_cap_and_a_tool_without_one_are_whole() -> None:
    driver = calling("long")
    await Agent(Client(driver), model=MODEL, tools=[long_tool(None)]).run("go")
    assert "threadline cut" not in tool_messages(driver)[0].text
    driver = calling("long")
    await Agent(Client(driver), model=MODEL, tools=[long_tool(10_000, 600)]).run("go")
    assert "threadline cut" not in tool_messages(driver)[0].text


async def test_a_result_marked_as_an_error_is_an_error_result() -> None:
    @tool
    def lookup() -> ToolResult:
        """Looks up."""
        return ToolResult("no such city", is_error=True)

    driver = calling("lookup")
    result = await Agent(Client(driver), model=MODEL, tools=[lookup]).run("go")
    assert tool_messages(driver)[0].text == "error: no such city"
    assert "no such city" in json.dumps([m.text for m in result.messages])


async def test_image_parts_become_a_note_for_a_driver_that_cannot_send_them() -> None:
    @tool
    def chart() -> ToolResult:
        """A chart."""
        return ToolResult((TextPart(text="the chart:"), ImagePart(url="data:image/png;base64,AA")))

    driver = calling("chart")
    await Agent(Client(driver), model=MODEL, tools=[chart]).run("go")
    (message,) = tool_messages(driver)
    assert message.text.startswith("the chart:[the tool returned an image (image/png)")
    assert not any(isinstance(p, ImagePart) for p in message.content)


async def test_image_parts_reach_a_driver_that_takes_images_in_tool_results() -> None:
    class ImageDriver(FunctionDriver):
        def tool_result_images(self, model: Model) -> bool:
            return True

    @tool
    def chart() -> ToolResult:
        """A chart."""
        return ToolResult((TextPart(text="the chart:"), ImagePart(url="data:image/png;base64,AA")))

    driver = ImageDriver(script("chart"))
    await Agent(Client(driver), model=MODEL, tools=[chart]).run("go")
    (message,) = tool_messages(driver)
    assert message.content == (
        TextPart(text="the chart:"),
        ImagePart(url="data:image/png;base64,AA"),
    )


def test_importing_threadline_imports_no_mcp() -> None:
    code = (
        "import sys, threadline, threadline.tools, threadline.cli\n"
        "loaded = [m for m in sys.modules if m == 'mcp' or m.startswith('mcp.')]\n"
        "assert not loaded, loaded\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
