"""Telemetry's setup: free when unused, the opt-ins, the public face, and never a key."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator

import httpx
import pytest
import respx
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import threadline.telemetry
from threadline import AuthenticationError, Client, Model, TextDelta, tool
from threadline.drivers import OpenAIChatDriver

FAKE_KEY = "sk-FAKE-threadline-telemetry-key-0000000000"
BASE = "https://llm.example/v1"
URL = f"{BASE}/chat/completions"
MODEL = Model("gpt-test", context_size=8192)

RUN_WITH_A_TOOL = """
import anyio
from threadline import Client, Message, Model, ToolCall, tool
from threadline.testing import ScriptedDriver

@tool
def add(a: int, b: int) -> int:
    "Add."
    return a + b

async def main():
    driver = ScriptedDriver(
        [Message.assistant(tool_calls=[ToolCall(id="c", name="add", arguments='{"a":1,"b":2}')]),
         "3", "streamed"]
    )
    client = Client(driver, default_model=Model("fake", context_size=8192))
    assert (await client.request().with_prompt("hi").with_tools([add]).run()).text == "3"
    async with client.request().with_prompt("again").stream() as events:
        async for _ in events:
            pass

anyio.run(main)
"""


def python(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip()


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    memory = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    threadline.telemetry.set_tracer_provider(provider)
    yield memory
    threadline.telemetry.set_tracer_provider(None)
    threadline.telemetry.capture_content(None)
    provider.shutdown()


# -- free when unused ---------------------------------------------------------------


def test_runs_never_import_opentelemetry_when_the_application_does_not_use_it() -> None:
    # opentelemetry-api is installed here (the test extra): it must still stay unloaded.
    loaded = python(
        RUN_WITH_A_TOOL
        + "import sys; print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    assert loaded == "[]"


def test_runs_work_where_opentelemetry_is_not_installed() -> None:
    blocked = "import sys; sys.modules['opentelemetry'] = None\n"
    assert python(blocked + RUN_WITH_A_TOOL + "print('ran')") == "ran"


def test_spans_go_to_the_global_provider_of_an_application_that_configured_one() -> None:
    configure = """
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    """
    report = "print(sorted(s.name for s in exporter.get_finished_spans()))"
    names = python(textwrap.dedent(configure) + RUN_WITH_A_TOOL + report)
    expected = ["chat fake"] * 3 + ["execute_tool add"] + ["invoke_agent"] * 2
    assert names == str(expected)


def test_opentelemetry_imported_without_a_provider_makes_no_span_until_one_is_set() -> None:
    # What the official anthropic client does: import opentelemetry.trace, set nothing.
    configure = """
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    """
    # The span module is imported by the first run that makes a span, and only then.
    report = "print('threadline.engine._spans' in sys.modules)\n"
    names = "print(sorted(s.name for s in exporter.get_finished_spans()))"
    out = python(
        "import sys\nimport opentelemetry.trace\n"
        + RUN_WITH_A_TOOL
        + report
        + textwrap.dedent(configure)
        + RUN_WITH_A_TOOL
        + report
        + names
    )
    expected = ["chat fake"] * 3 + ["execute_tool add"] + ["invoke_agent"] * 2
    assert out.splitlines() == ["False", "True", str(expected)]


# -- the opt-ins ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("value", "on"),
    [("true", True), ("TRUE", True), ("span_only", True), ("false", False), ("", False)],
)
def test_the_content_environment_variable_follows_the_convention(
    value: str, on: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", value)
    assert threadline.telemetry.capturing_content() is on


def test_capture_content_takes_a_bool_or_none(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(threadline.telemetry.CONTENT_ENV, raising=False)
    try:
        threadline.telemetry.capture_content(True)
        assert threadline.telemetry.capturing_content() is True
        threadline.telemetry.capture_content(None)
        assert threadline.telemetry.capturing_content() is False
        with pytest.raises(TypeError, match="bool or None"):
            threadline.telemetry.capture_content("yes")  # type: ignore[arg-type]
    finally:
        threadline.telemetry.capture_content(None)


def test_the_public_face_reports_its_package() -> None:
    names = threadline.telemetry.__all__
    assert names == sorted(names)
    for name in names:
        value = getattr(threadline.telemetry, name)
        if callable(value):
            assert value.__module__ == "threadline.telemetry"


# -- never a key ---------------------------------------------------------------------


def every_value(exporter: InMemorySpanExporter) -> str:
    values: list[str] = []
    for span in exporter.get_finished_spans():
        values.append(span.name)
        values.extend(str(v) for v in (span.attributes or {}).values())
        for event in span.events:
            values.extend(str(v) for v in (event.attributes or {}).values())
        values.append(str(span.status.description))
    return "\n".join(values)


@tool
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


TOOL_REPLY = {
    "id": "chatcmpl-1",
    "model": "gpt-test-0613",
    "choices": [
        {
            "index": 0,
            "message": {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "add", "arguments": '{"a": 1, "b": 2}'},
                    }
                ],
            },
            "finish_reason": "tool_calls",
        }
    ],
    "usage": {
        "prompt_tokens": 50,
        "completion_tokens": 5,
        "prompt_tokens_details": {"cached_tokens": 32},
    },
}
TEXT_REPLY = {
    "id": "chatcmpl-2",
    "model": "gpt-test-0613",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "3"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 70, "completion_tokens": 1},
}
STREAM = (
    'data: {"id":"s","model":"gpt-test-0613","choices":[{"index":0,"delta":'
    '{"role":"assistant","content":"Hel"}}]}\n\n'
    'data: {"id":"s","model":"gpt-test-0613","choices":[{"index":0,"delta":'
    '{"content":"lo"},"finish_reason":"stop"}]}\n\n'
    'data: {"id":"s","model":"gpt-test-0613","choices":[],'
    '"usage":{"prompt_tokens":9,"completion_tokens":2}}\n\n'
    "data: [DONE]\n\n"
)


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
@pytest.mark.anyio
async def test_no_span_holds_the_api_key_even_with_content_captured(
    exporter: InMemorySpanExporter, respx_mock: respx.MockRouter
) -> None:
    threadline.telemetry.capture_content(True)
    respx_mock.post(URL).mock(
        side_effect=[
            httpx.Response(200, json=TOOL_REPLY),
            httpx.Response(200, json=TEXT_REPLY),
            httpx.Response(200, text=STREAM, headers={"content-type": "text/event-stream"}),
            httpx.Response(
                401,
                json={"error": {"message": f"Incorrect API key provided: {FAKE_KEY}"}},
            ),
        ]
    )
    async with OpenAIChatDriver(BASE, api_key=FAKE_KEY, max_retries=0) as driver:
        client = Client(driver, default_model=MODEL)
        result = await client.request().with_prompt("1+2?").with_tools([add]).run()
        assert result.text == "3"
        async with client.request().with_prompt("hello").stream() as events:
            assert [e.text async for e in events if isinstance(e, TextDelta)] == ["Hel", "lo"]
        with pytest.raises(AuthenticationError):
            await client.request().with_prompt("again").run()

    values = every_value(exporter)
    assert FAKE_KEY not in values
    assert FAKE_KEY[-12:] not in values
    chats = [s for s in exporter.get_finished_spans() if s.name == "chat gpt-test"]
    assert len(chats) == 4
    first = chats[0].attributes or {}
    assert first["gen_ai.provider.name"] == "openai"
    assert first["gen_ai.response.model"] == "gpt-test-0613"
    assert first["gen_ai.usage.input_tokens"] == 50
    assert first["gen_ai.usage.cache_read.input_tokens"] == 32
    assert "1+2?" in str(first["gen_ai.input.messages"])
    assert (chats[-1].attributes or {})["error.type"] == "threadline.AuthenticationError"
    assert [s.name for s in exporter.get_finished_spans()].count("execute_tool add") == 1
