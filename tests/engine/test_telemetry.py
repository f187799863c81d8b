"""OpenTelemetry spans of runs, rounds and tool calls, read back with the SDK's
in-memory exporter, on asyncio and trio."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import anyio
import attrs
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from threadline import (
    Client,
    ContextLengthExceededError,
    MaxRoundsExceededError,
    Message,
    Model,
    ProviderUnavailableError,
    TextDelta,
    ToolCall,
    Usage,
    tool,
)
from threadline import telemetry as threadline_telemetry
from threadline.drivers import ProviderCall, StreamChunk
from threadline.testing import ScriptedDriver

BACKENDS = pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
MODEL = Model("scripted-model", context_size=8192)


class UserTracer:
    """The application's own tracer (spans a tool or a driver makes, spans around a
    run), on the test's provider."""

    provider: TracerProvider | None = None

    def start_as_current_span(self, name: str) -> Any:
        assert self.provider is not None
        return self.provider.get_tracer("the-application").start_as_current_span(name)


USER = UserTracer()


@pytest.fixture
def provider() -> Iterator[TracerProvider]:
    tracer_provider = TracerProvider()
    threadline_telemetry.set_tracer_provider(tracer_provider)
    USER.provider = tracer_provider
    yield tracer_provider
    USER.provider = None
    threadline_telemetry.set_tracer_provider(None)
    threadline_telemetry.capture_content(None)
    tracer_provider.shutdown()


@pytest.fixture
def exporter(provider: TracerProvider) -> InMemorySpanExporter:
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    return memory


def named(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def one(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    (span,) = named(exporter, name)
    return span


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return span.context.span_id


def every_value(spans: Sequence[ReadableSpan]) -> str:
    """Every attribute and event value of ``spans`` as one string, to search."""
    values: list[str] = []
    for span in spans:
        values.extend(str(v) for v in (span.attributes or {}).values())
        for event in span.events:
            values.extend(str(v) for v in (event.attributes or {}).values())
        values.append(str(span.status.description))
    return "\n".join(values)


def calling(*calls: ToolCall) -> Message:
    return Message.assistant(tool_calls=calls)


def history(turns: int, words: int = 50) -> list[Message]:
    messages: list[Message] = []
    for i in range(turns):
        messages.append(Message.user(f"question {i} " + "word " * words))
        messages.append(Message.assistant(f"answer {i} " + "word " * words))
    return messages


@tool
async def add(a: int, b: int) -> int:
    """Add two numbers."""
    with USER.start_as_current_span("inside add"):
        return a + b


@tool
def shout(text: str) -> str:
    """Shout it (a sync tool, so it runs in a worker thread)."""
    with USER.start_as_current_span("inside shout"):
        return text.upper()


@tool
def explode(secret: str) -> str:
    """Fail with the model's argument in the message."""
    raise ValueError(f"cannot use {secret}")


class UsageDriver(ScriptedDriver):
    """A scripted driver that reports a fixed usage and request id, as a real one would."""

    def __init__(self, replies: Sequence[str | Message], usage: Usage) -> None:
        super().__init__(replies)
        self.usage = usage

    async def complete(self, call: ProviderCall) -> Any:
        response = await super().complete(call)
        return attrs.evolve(
            response,
            usage=self.usage,
            model="scripted-model-0613",
            request_id="req-1",
            response_id="r1",
        )


class SpanningDriver(ScriptedDriver):
    """A scripted driver that makes a span of its own per call, as an HTTP client would."""

    async def complete(self, call: ProviderCall) -> Any:
        with USER.start_as_current_span("driver complete"):
            return await super().complete(call)

    @asynccontextmanager
    async def stream(self, call: ProviderCall) -> AsyncIterator[AsyncIterator[StreamChunk]]:
        with USER.start_as_current_span("driver stream opened"):
            pass
        async with super().stream(call) as chunks:
            yield chunks


# -- a run and its rounds -----------------------------------------------------------


@BACKENDS
@pytest.mark.anyio
async def test_a_run_is_an_invoke_agent_span_with_a_chat_client_span_per_round(
    exporter: InMemorySpanExporter,
) -> None:
    driver = ScriptedDriver(
        [calling(ToolCall(id="c1", name="add", arguments='{"a":1,"b":2}')), "3"]
    )
    result = (
        await Client(driver, default_model=MODEL)
        .request()
        .with_prompt("hi")
        .with_tools([add])
        .run()
    )

    run = one(exporter, "invoke_agent")
    rounds = named(exporter, "chat scripted-model")
    assert [r.attributes["threadline.round"] for r in rounds] == [1, 2]
    assert run.kind is SpanKind.INTERNAL
    assert all(r.kind is SpanKind.CLIENT for r in rounds)
    assert {parent_of(r) for r in rounds} == {span_id(run)}
    assert run.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert run.attributes["threadline.rounds"] == 2
    assert run.attributes["gen_ai.usage.input_tokens"] == result.usage.input_tokens
    assert run.attributes["gen_ai.usage.output_tokens"] == result.usage.output_tokens
    first, second = rounds
    assert first.attributes["gen_ai.operation.name"] == "chat"
    assert first.attributes["gen_ai.provider.name"] == "scripted"
    assert first.attributes["gen_ai.request.model"] == "scripted-model"
    assert first.attributes["gen_ai.response.model"] == "scripted-model"
    assert first.attributes["gen_ai.response.finish_reasons"] == ("tool_calls",)
    assert second.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert "gen_ai.request.stream" not in first.attributes
    assert (
        first.attributes["threadline.input_tokens.estimated"]
        == result.rounds[0].estimated_input_tokens
    )
    assert (
        first.attributes["threadline.input_tokens.reported"]
        == result.rounds[0].reported_input_tokens
    )
    assert first.attributes["threadline.budget.prompt_tokens"] == 8192 - 4096
    assert first.attributes["threadline.context_retry"] is False
    assert run.status.status_code is StatusCode.UNSET
    assert "threadline.cancelled" not in run.attributes


@pytest.mark.anyio
async def test_reported_input_tokens_include_the_cached_ones(
    exporter: InMemorySpanExporter,
) -> None:
    usage = Usage(
        input_tokens=1200, output_tokens=30, cached_input_tokens=1000, reasoning_tokens=12
    )
    driver = UsageDriver(["ok"], usage)
    await (
        Client(driver, default_model=MODEL).request().with_prompt("hi").with_temperature(0.2).run()
    )

    chat = one(exporter, "chat scripted-model")
    assert chat.attributes["gen_ai.usage.input_tokens"] == 1200
    assert chat.attributes["gen_ai.usage.cache_read.input_tokens"] == 1000
    assert chat.attributes["gen_ai.usage.output_tokens"] == 30
    assert chat.attributes["gen_ai.usage.reasoning.output_tokens"] == 12
    assert chat.attributes["gen_ai.response.model"] == "scripted-model-0613"
    assert chat.attributes["gen_ai.response.id"] == "r1"
    assert chat.attributes["threadline.request_id"] == "req-1"
    assert chat.attributes["gen_ai.request.temperature"] == 0.2
    assert chat.attributes["threadline.input_tokens.reported"] == 1200


@BACKENDS
@pytest.mark.anyio
async def test_the_callers_span_is_the_runs_parent_and_a_drivers_span_nests_in_its_round(
    exporter: InMemorySpanExporter,
) -> None:
    driver = SpanningDriver(["one", "two"])
    client = Client(driver, default_model=MODEL)
    with USER.start_as_current_span("handle request") as outer:
        await client.request().with_prompt("hi").run()
        async with client.request().with_prompt("again").stream() as events:
            async for event in events:
                # No threadline span is current in the consumer's code between events.
                assert trace.get_current_span() is outer
                if isinstance(event, TextDelta):
                    with USER.start_as_current_span("consumer work"):
                        pass

    handler = one(exporter, "handle request")
    runs = named(exporter, "invoke_agent")
    chats = named(exporter, "chat scripted-model")
    assert [parent_of(r) for r in runs] == [span_id(handler)] * 2
    assert parent_of(one(exporter, "driver complete")) == span_id(chats[0])
    assert parent_of(one(exporter, "driver stream opened")) == span_id(chats[1])
    assert {parent_of(s) for s in named(exporter, "consumer work")} == {span_id(handler)}


# -- tools --------------------------------------------------------------------------


@BACKENDS
@pytest.mark.anyio
async def test_tool_calls_are_execute_tool_spans_under_the_run_with_their_own_spans_inside(
    exporter: InMemorySpanExporter,
) -> None:
    driver = ScriptedDriver(
        [
            calling(
                ToolCall(id="c1", name="add", arguments='{"a":1,"b":2}'),
                ToolCall(id="c2", name="shout", arguments='{"text":"hey"}'),
            ),
            "done",
        ]
    )
    client = Client(driver, default_model=MODEL)
    await client.request().with_prompt("go").with_tools([add, shout]).run()

    run = one(exporter, "invoke_agent")
    added, shouted = one(exporter, "execute_tool add"), one(exporter, "execute_tool shout")
    for span, name, call_id in ((added, "add", "c1"), (shouted, "shout", "c2")):
        assert span.kind is SpanKind.INTERNAL
        assert parent_of(span) == span_id(run)
        assert span.attributes["gen_ai.operation.name"] == "execute_tool"
        assert span.attributes["gen_ai.tool.name"] == name
        assert span.attributes["gen_ai.tool.call.id"] == call_id
        assert span.attributes["gen_ai.tool.type"] == "function"
        assert span.attributes["threadline.round"] == 1
        assert span.status.status_code is StatusCode.UNSET
    assert added.attributes["gen_ai.tool.description"] == "Add two numbers."
    # Each tool ran in a task of the run's task group (shout in a worker thread too).
    assert parent_of(one(exporter, "inside add")) == span_id(added)
    assert parent_of(one(exporter, "inside shout")) == span_id(shouted)


@BACKENDS
@pytest.mark.anyio
async def test_a_failing_tool_is_an_error_span_that_keeps_its_message_out(
    exporter: InMemorySpanExporter,
) -> None:
    driver = ScriptedDriver(
        [
            calling(
                ToolCall(id="c1", name="explode", arguments='{"secret":"hunter2"}'),
                ToolCall(id="c2", name="missing", arguments="{}"),
            ),
            "sorry",
        ]
    )
    await (
        Client(driver, default_model=MODEL).request().with_prompt("go").with_tools([explode]).run()
    )

    failed = one(exporter, "execute_tool explode")
    unknown = one(exporter, "execute_tool missing")
    assert failed.status.status_code is StatusCode.ERROR
    assert failed.attributes["error.type"] == "ValueError"
    assert unknown.status.status_code is StatusCode.ERROR
    assert unknown.attributes["error.type"] == "threadline.tools.ToolArgumentsError"
    assert "hunter2" not in every_value(exporter.get_finished_spans())
    # The run itself went on: the model saw the errors and answered.
    assert one(exporter, "invoke_agent").status.status_code is StatusCode.UNSET


# -- streaming ----------------------------------------------------------------------


@BACKENDS
@pytest.mark.anyio
async def test_a_streamed_run_has_the_same_spans_ended_when_the_stream_ends(
    exporter: InMemorySpanExporter,
) -> None:
    driver = ScriptedDriver(
        [calling(ToolCall(id="c1", name="add", arguments='{"a":2,"b":2}')), "four"]
    )
    request = Client(driver, default_model=MODEL).request().with_prompt("2+2").with_tools([add])
    async with request.stream() as events:
        async for _ in events:
            pass

    run = one(exporter, "invoke_agent")
    chats = named(exporter, "chat scripted-model")
    assert run.attributes["threadline.streaming"] is True
    assert run.attributes["threadline.rounds"] == 2
    assert len(chats) == 2
    assert all(c.attributes["gen_ai.request.stream"] is True for c in chats)
    assert all(c.attributes["gen_ai.response.time_to_first_chunk"] >= 0 for c in chats)
    assert chats[1].attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert parent_of(one(exporter, "execute_tool add")) == span_id(run)
    assert not any("threadline.cancelled" in s.attributes for s in exporter.get_finished_spans())


@BACKENDS
@pytest.mark.anyio
async def test_leaving_a_stream_early_ends_its_spans_marked_cancelled(
    exporter: InMemorySpanExporter,
) -> None:
    driver = ScriptedDriver(["a long answer in several pieces"])
    async with Client(driver, default_model=MODEL).request().with_prompt("hi").stream() as events:
        async for event in events:
            if isinstance(event, TextDelta):
                break

    run, chat = one(exporter, "invoke_agent"), one(exporter, "chat scripted-model")
    for span in (run, chat):
        assert span.end_time is not None
        assert span.attributes["threadline.cancelled"] is True
        assert span.status.status_code is StatusCode.UNSET
    assert "gen_ai.response.model" not in chat.attributes


@BACKENDS
@pytest.mark.anyio
async def test_a_cancelled_run_ends_its_spans_tool_spans_included(
    exporter: InMemorySpanExporter,
) -> None:
    started = anyio.Event()

    @tool
    async def wait() -> str:
        """Wait forever."""
        started.set()
        await anyio.sleep_forever()
        return "never"

    driver = ScriptedDriver([calling(ToolCall(id="c1", name="wait")), "never"])
    request = Client(driver, default_model=MODEL).request().with_prompt("go").with_tools([wait])
    async with anyio.create_task_group() as group:
        group.start_soon(request.run)
        await started.wait()
        group.cancel_scope.cancel()

    for name in ("invoke_agent", "execute_tool wait"):
        span = one(exporter, name)
        assert span.attributes["threadline.cancelled"] is True
        assert span.status.status_code is StatusCode.UNSET
    assert "threadline.cancelled" not in one(exporter, "chat scripted-model").attributes


# -- limiting and the context-length retry ------------------------------------------


@pytest.mark.anyio
async def test_a_round_that_dropped_units_says_how_many_and_which_handler(
    exporter: InMemorySpanExporter,
) -> None:
    driver = ScriptedDriver(["ok"])
    result = await (
        Client(driver, default_model=MODEL)
        .request()
        .with_messages(history(20))
        .with_prompt("latest")
        .with_max_context_tokens(1500)
        .with_output_reserve_tokens(500)
        .run()
    )
    (step,) = result.limiting
    assert step.dropped

    chat = one(exporter, "chat scripted-model")
    assert chat.attributes["threadline.budget.prompt_tokens"] == 1000
    assert chat.attributes["threadline.limiting.units_dropped"] == len(step.dropped)
    assert chat.attributes["threadline.limiting.handlers"] == ("drop_oldest_units",)
    assert chat.attributes["threadline.limiting.tokens_before"] == step.tokens_before
    assert chat.attributes["threadline.input_tokens.estimated"] == step.tokens_after
    assert chat.attributes["threadline.limiting.sent_over_budget"] is False
    (event,) = chat.events
    assert event.name == "threadline.limiting.handler"
    assert event.attributes["threadline.limiting.handler"] == "drop_oldest_units"
    assert event.attributes["threadline.limiting.phase"] == "pre"
    assert event.attributes["threadline.limiting.units_dropped"] == len(step.dropped)
    run = one(exporter, "invoke_agent")
    assert run.attributes["threadline.budget.limit"] == 1500
    assert run.attributes["threadline.budget.reserve"] == 500
    assert run.attributes["threadline.limiting.units_dropped"] == len(step.dropped)


@BACKENDS
@pytest.mark.anyio
async def test_a_round_retried_after_a_context_length_refusal_says_so(
    exporter: InMemorySpanExporter,
) -> None:
    refusal = ContextLengthExceededError(
        "maximum context length is 2000 tokens", prompt_tokens=3000, context_limit=2000
    )
    driver = ScriptedDriver([refusal, "fits now"])
    result = await (
        Client(driver, default_model=MODEL)
        .request()
        .with_messages(history(20))
        .with_prompt("q")
        .run()
    )

    chat = one(exporter, "chat scripted-model")
    assert chat.attributes["threadline.context_retry"] is True
    assert chat.status.status_code is StatusCode.UNSET
    assert result.budget is not None
    assert chat.attributes["threadline.budget.prompt_tokens"] == result.budget.prompt_tokens
    assert chat.attributes["threadline.budget.prompt_tokens"] < 8192 - 4096
    assert chat.attributes["threadline.limiting.units_dropped"] > 0
    assert chat.attributes["gen_ai.response.finish_reasons"] == ("stop",)
    assert one(exporter, "invoke_agent").attributes["threadline.context_retries"] == 1


# -- errors -------------------------------------------------------------------------


@BACKENDS
@pytest.mark.anyio
async def test_a_provider_error_is_recorded_on_the_round_and_the_run(
    exporter: InMemorySpanExporter,
) -> None:
    driver = ScriptedDriver([ProviderUnavailableError("the provider is down", status=503)])
    with pytest.raises(ProviderUnavailableError):
        await Client(driver, default_model=MODEL).request().with_prompt("q").run()

    for span in (one(exporter, "chat scripted-model"), one(exporter, "invoke_agent")):
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes["error.type"] == "threadline.ProviderUnavailableError"
        assert "the provider is down" in (span.status.description or "")
        (event,) = [e for e in span.events if e.name == "exception"]
        assert event.attributes["exception.type"].endswith("ProviderUnavailableError")
        assert span.end_time is not None


@pytest.mark.anyio
async def test_running_out_of_rounds_fails_the_run_not_its_rounds(
    exporter: InMemorySpanExporter,
) -> None:
    loop = calling(ToolCall(id="c", name="add", arguments='{"a":1,"b":1}'))
    driver = ScriptedDriver([loop, loop])
    request = Client(driver, default_model=MODEL).request().with_prompt("q").with_tools([add])
    with pytest.raises(MaxRoundsExceededError):
        await request.with_max_rounds(2).run()

    run = one(exporter, "invoke_agent")
    assert run.status.status_code is StatusCode.ERROR
    assert run.attributes["error.type"] == "threadline.MaxRoundsExceededError"
    chats = named(exporter, "chat scripted-model")
    assert [c.status.status_code for c in chats] == [StatusCode.UNSET] * 2


# -- message content ----------------------------------------------------------------


async def tool_run(driver: ScriptedDriver) -> None:
    request = (
        Client(driver, default_model=MODEL)
        .request()
        .with_system("You are a calculator.")
        .with_prompt("what is 20 plus 22?")
        .with_tools([add])
    )
    await request.run()


def tool_script() -> ScriptedDriver:
    return ScriptedDriver(
        [calling(ToolCall(id="c1", name="add", arguments='{"a":20,"b":22}')), "It is 42."]
    )


@pytest.mark.anyio
async def test_no_message_content_is_recorded_by_default(
    exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(threadline_telemetry.CONTENT_ENV, raising=False)
    await tool_run(tool_script())

    spans = exporter.get_finished_spans()
    values = every_value(spans)
    for words in ("calculator", "20 plus 22", "It is 42", '"a":20'):
        assert words not in values
    for span in spans:
        assert not {
            "gen_ai.input.messages",
            "gen_ai.output.messages",
            "gen_ai.tool.call.arguments",
            "gen_ai.tool.call.result",
        } & set(span.attributes)


@pytest.mark.anyio
async def test_message_content_is_recorded_when_the_user_opts_in(
    exporter: InMemorySpanExporter,
) -> None:
    threadline_telemetry.capture_content(True)
    await tool_run(tool_script())

    first, second = named(exporter, "chat scripted-model")
    sent = json.loads(first.attributes["gen_ai.input.messages"])
    assert sent == [
        {"role": "system", "parts": [{"type": "text", "content": "You are a calculator."}]},
        {"role": "user", "parts": [{"type": "text", "content": "what is 20 plus 22?"}]},
    ]
    assert json.loads(first.attributes["gen_ai.output.messages"]) == [
        {
            "role": "assistant",
            "parts": [
                {"type": "tool_call", "id": "c1", "name": "add", "arguments": {"a": 20, "b": 22}}
            ],
            "finish_reason": "tool_calls",
        }
    ]
    resent = json.loads(second.attributes["gen_ai.input.messages"])
    assert resent[-1] == {
        "role": "tool",
        "parts": [{"type": "tool_call_response", "id": "c1", "response": "42"}],
        "name": "add",
    }
    assert json.loads(second.attributes["gen_ai.output.messages"])[0]["parts"] == [
        {"type": "text", "content": "It is 42."}
    ]
    added = one(exporter, "execute_tool add")
    assert added.attributes["gen_ai.tool.call.arguments"] == '{"a":20,"b":22}'
    assert added.attributes["gen_ai.tool.call.result"] == "42"


@pytest.mark.anyio
async def test_the_conventions_environment_variable_opts_in_too(
    exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(threadline_telemetry.CONTENT_ENV, "true")
    await tool_run(tool_script())
    assert "gen_ai.input.messages" in named(exporter, "chat scripted-model")[0].attributes

    exporter.clear()
    threadline_telemetry.capture_content(False)  # the explicit setting wins
    await tool_run(tool_script())
    assert "gen_ai.input.messages" not in named(exporter, "chat scripted-model")[0].attributes
