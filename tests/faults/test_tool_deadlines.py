"""Tools that hang: a time limit per tool and per request, and a cancel that returns at once.

A blocking sync tool here waits on a ``threading.Event`` the test sets at the
end, so each test proves that control came back while the worker thread was
still blocked, and then lets the thread finish.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import anyio
import anyio.from_thread
import pytest

from threadline import (
    Agent,
    Client,
    InvalidRequestError,
    Message,
    Model,
    RequestSettings,
    Tool,
    ToolCall,
    ToolResultEvent,
    tool,
)
from threadline.testing import ScriptedDriver

pytestmark = pytest.mark.anyio

MODEL = Model("scripted", context_size=8192)


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set when the test ends, so a blocked worker thread always finishes."""
    event = threading.Event()
    yield event
    event.set()


def blocking_tool(release: threading.Event, **options: float) -> Tool:
    def wait_for_release() -> str:
        """Blocks its thread until the test releases it."""
        release.wait(30)
        return "released"

    return tool(wait_for_release, **options)  # type: ignore[arg-type]


def calls(name: str) -> Message:
    return Message.assistant(tool_calls=[ToolCall(id="call_1", name=name, arguments="{}")])


def client(*replies: str | Message) -> tuple[Client, ScriptedDriver]:
    driver = ScriptedDriver(list(replies))
    return Client(driver, default_model=MODEL), driver


async def test_cancelling_a_run_returns_while_a_sync_tool_still_blocks(
    release: threading.Event,
) -> None:
    entered = anyio.Event()

    @tool
    def wait_for_release() -> str:
        """Blocks its thread until the test releases it."""
        anyio.from_thread.run_sync(entered.set)
        release.wait(30)
        return "released"

    chat, _ = client(calls("wait_for_release"), "never reached")
    request = chat.request().with_tools([wait_for_release]).with_prompt("go")
    async with anyio.create_task_group() as group:
        group.start_soon(request.run)
        with anyio.fail_after(10):
            await entered.wait()
        cancelled_at = time.monotonic()
        group.cancel_scope.cancel()
    elapsed = time.monotonic() - cancelled_at
    assert elapsed < 10, f"control came back {elapsed:.1f} s after the cancel"
    assert not release.is_set()


async def test_a_tool_past_its_own_time_limit_is_an_error_the_model_reads(
    release: threading.Event,
) -> None:
    slow = blocking_tool(release, timeout=0.2)
    chat, driver = client(calls(slow.name), "Sorry, the lookup timed out.")
    with anyio.fail_after(5):
        result = await chat.request().with_tools([slow]).with_prompt("go").run()
    assert result.text == "Sorry, the lookup timed out."
    sent = driver.calls[1].messages[-1]
    assert sent.text == (
        "error: the tool did not finish within its time limit of 0.2 s and was given up on"
    )
    assert not release.is_set()


async def test_the_request_default_applies_to_tools_without_their_own(
    release: threading.Event,
) -> None:
    slow = blocking_tool(release)
    chat, _ = client(calls(slow.name), "ok")
    events = []
    with anyio.fail_after(5):
        request = chat.request().with_tools([slow]).with_tool_timeout(0.2).with_prompt("go")
        async with request.stream() as stream:
            events = [event async for event in stream if isinstance(event, ToolResultEvent)]
    (result,) = events
    assert result.is_error
    assert "time limit of 0.2 s" in result.message.text


async def test_a_tool_of_its_own_time_limit_wins_over_the_default() -> None:
    @tool(timeout=5)
    async def quick() -> str:
        await anyio.sleep(0.3)
        return "done"

    chat, driver = client(calls("quick"), "ok")
    with anyio.fail_after(5):
        await chat.request().with_tools([quick]).with_tool_timeout(0.05).with_prompt("go").run()
    assert driver.calls[1].messages[-1].text == "done"


async def test_an_agent_default_time_limit_reaches_its_runs(release: threading.Event) -> None:
    slow = blocking_tool(release)
    chat, driver = client(calls(slow.name), "ok")
    agent = Agent(chat, tools=[slow], settings=RequestSettings(tool_timeout=0.2))
    with anyio.fail_after(5):
        await agent.run("go")
    assert "time limit" in driver.calls[1].messages[-1].text


async def test_an_async_tool_past_its_time_limit_is_cancelled() -> None:
    finished = []

    @tool(timeout=0.1)
    async def sleepy() -> str:
        await anyio.sleep(30)
        finished.append(True)
        return "never"

    with anyio.fail_after(5):
        outcome = await sleepy.invoke(ToolCall(id="c", name="sleepy", arguments="{}"))
    assert outcome.is_error
    assert isinstance(outcome.exception, TimeoutError)
    assert finished == []


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf"), "1", True])
def test_a_time_limit_must_be_a_positive_number_of_seconds(value: object) -> None:
    def noop() -> None:
        """Does nothing."""

    with pytest.raises(InvalidRequestError, match="timeout"):
        tool(timeout=value)(noop)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="tool_timeout"):
        RequestSettings(tool_timeout=value)  # type: ignore[arg-type]
