"""Streaming Chat Completions: chunks, assembly, errors mid-stream, on asyncio and trio."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterable
from typing import Any

import anyio.lowlevel
import httpx
import pytest
import respx

from threadline import (
    ContextLengthExceededError,
    Message,
    Model,
    ProviderResponseError,
    ProviderUnavailableError,
    RateLimitError,
    Reasoning,
    ToolCall,
    Usage,
)
from threadline.drivers import (
    OpenAIChatDriver,
    ProviderCall,
    ReasoningChunk,
    ResponseDone,
    RetryPolicy,
    StreamChunk,
    TextChunk,
    ToolCallChunk,
)

BASE = "https://llm.example/v1"
URL = f"{BASE}/chat/completions"
CALL = ProviderCall(model=Model("qwen3"), messages=(Message.user("hi"),))
BACKENDS = pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])


class FakeClock:
    def __init__(self) -> None:
        self.waits: list[float] = []

    def now(self) -> float:
        return 0.0

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)


def event(payload: Any) -> bytes:
    return f"data: {json.dumps(payload)}\n\n".encode()


def delta(**fields: Any) -> dict[str, Any]:
    return {"id": "chatcmpl-s", "model": "qwen3-4b", "choices": [{"index": 0, "delta": fields}]}


def finish(reason: str) -> dict[str, Any]:
    return {"model": "qwen3-4b", "choices": [{"index": 0, "delta": {}, "finish_reason": reason}]}


USAGE = {
    "model": "qwen3-4b",
    "choices": [],
    "usage": {
        "prompt_tokens": 9,
        "completion_tokens": 12,
        "prompt_tokens_details": {"cached_tokens": 4},
        "completion_tokens_details": {"reasoning_tokens": 5},
    },
}


def pieces(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


class Body(httpx.AsyncByteStream):
    """A response body delivered in the given reads; records how far it was read."""

    def __init__(self, chunks: Iterable[bytes], *, then: Exception | None = None) -> None:
        self.chunks = list(chunks)
        self.then = then
        self.sent = 0
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        for chunk in self.chunks:
            await anyio.lowlevel.checkpoint()  # as a network read would
            self.sent += 1
            yield chunk
        if self.then is not None:
            raise self.then

    async def aclose(self) -> None:
        self.closed = True


def sse_response(body: Body, status: int = 200, **headers: str) -> httpx.Response:
    return httpx.Response(
        status, stream=body, headers={"content-type": "text/event-stream", **headers}
    )


def transport(*replies: httpx.Response) -> tuple[httpx.AsyncClient, list[httpx.Request]]:
    seen: list[httpx.Request] = []
    queue = list(replies)

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return queue.pop(0)

    return httpx.AsyncClient(transport=httpx.MockTransport(handler)), seen


async def collect(driver: OpenAIChatDriver, call: ProviderCall = CALL) -> list[StreamChunk]:
    async with driver.stream(call) as chunks:
        return [chunk async for chunk in chunks]


async def collect_into(driver: OpenAIChatDriver, received: list[StreamChunk]) -> None:
    async with driver.stream(CALL) as chunks:
        async for chunk in chunks:
            received.append(chunk)


TOOL_STREAM = b"".join(
    [
        b": OPENROUTER PROCESSING\n\n",
        event(delta(role="assistant", reasoning_content="Need ")),
        event(delta(reasoning_content="the weather.")),
        event(delta(content="Checking")),
        event(delta(content=" now.")),
        event(
            delta(
                tool_calls=[
                    {
                        "index": 0,
                        "id": "call_p",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": ""},
                    }
                ]
            )
        ),
        event(delta(tool_calls=[{"index": 0, "function": {"arguments": '{"city": '}}])),
        event(
            delta(
                tool_calls=[
                    {
                        "index": 1,
                        "id": "call_r",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
                    }
                ]
            )
        ),
        event(delta(tool_calls=[{"index": 0, "function": {"arguments": '"Paris"}'}}])),
        event(finish("tool_calls")),
        event(USAGE),
        b"data: [DONE]\n\n",
    ]
)


@pytest.mark.anyio
@BACKENDS
@pytest.mark.parametrize("read_size", [1, 7, 64, 100_000])
async def test_a_stream_split_anywhere_yields_chunks_then_the_assembled_response(
    anyio_backend: str, read_size: int
) -> None:
    body = Body(pieces(TOOL_STREAM, read_size))
    client, seen = transport(sse_response(body, **{"x-request-id": "req_s"}))
    async with client, OpenAIChatDriver(BASE, http_client=client) as driver:
        chunks = await collect(driver)

    request_body = json.loads(seen[0].content)
    assert request_body["stream"] is True
    assert request_body["stream_options"] == {"include_usage": True}
    assert seen[0].headers["accept"] == "text/event-stream"
    assert chunks[:-1] == [
        ReasoningChunk(text="Need "),
        ReasoningChunk(text="the weather."),
        TextChunk(text="Checking"),
        TextChunk(text=" now."),
        ToolCallChunk(index=0, id="call_p", name="get_weather", arguments=""),
        ToolCallChunk(index=0, arguments='{"city": '),
        ToolCallChunk(index=1, id="call_r", name="get_weather", arguments='{"city": "Rome"}'),
        ToolCallChunk(index=0, arguments='"Paris"}'),
    ]
    done = chunks[-1]
    assert isinstance(done, ResponseDone)
    response = done.response
    assert response.text == "Checking now."
    assert response.message.reasoning == Reasoning(
        text="Need the weather.", provider="openai-chat:qwen3"
    )
    assert response.message.tool_calls == (
        ToolCall(id="call_p", name="get_weather", arguments='{"city": "Paris"}'),
        ToolCall(id="call_r", name="get_weather", arguments='{"city": "Rome"}'),
    )
    assert response.finish_reason == "tool_calls"
    assert response.usage == Usage(
        input_tokens=9, output_tokens=12, cached_input_tokens=4, reasoning_tokens=5
    )
    assert response.model == "qwen3-4b"
    assert response.request_id == "req_s"
    assert response.response_id == "chatcmpl-s"
    assert body.closed


@pytest.mark.anyio
@BACKENDS
async def test_stream_works_through_respx_too(
    anyio_backend: str, respx_mock: respx.MockRouter
) -> None:
    data = event(delta(content="hel")) + event(delta(content="lo")) + event(finish("stop"))
    respx_mock.post(URL).mock(return_value=sse_response(Body(pieces(data, 5))))
    async with OpenAIChatDriver(BASE, max_retries=0) as driver:
        chunks = await collect(driver)
    assert [c.text for c in chunks if isinstance(c, TextChunk)] == ["hel", "lo"]
    assert isinstance(chunks[-1], ResponseDone)
    assert chunks[-1].response.text == "hello"
    assert chunks[-1].response.finish_reason == "stop"


@pytest.mark.anyio
async def test_stream_usage_can_be_turned_off_for_servers_that_reject_it() -> None:
    client, seen = transport(sse_response(Body([event(finish("stop"))])))
    async with client, OpenAIChatDriver(BASE, http_client=client, stream_usage=False) as driver:
        await collect(driver)
    assert "stream_options" not in json.loads(seen[0].content)


STREAM_FAILURES: list[Any] = [
    pytest.param(
        [event(delta(content="par")), b'data: {"choices": [\n\n'],
        ProviderResponseError,
        "a stream event is not JSON",
        id="malformed json",
    ),
    pytest.param(
        [event(delta(content="par")), event({"choices": [{"delta": {"content": 5}}]})],
        ProviderResponseError,
        "delta.content should be a string",
        id="wrong shape",
    ),
    pytest.param(
        [event(["not", "an", "object"])],
        ProviderResponseError,
        "a stream event should be a JSON object",
        id="event not object",
    ),
    pytest.param(
        [event(delta(content="par"))],
        ProviderResponseError,
        "ended before the response was complete",
        id="cut short",
    ),
    pytest.param(
        [
            event(delta(tool_calls=[{"index": 0, "function": {"arguments": "{}"}}])),
            event(finish("tool_calls")),
        ],
        ProviderResponseError,
        "tool call 0 never got a name",
        id="nameless tool call",
    ),
    pytest.param(
        [
            event(delta(content="par")),
            event({"error": {"message": "overloaded", "type": "server_error"}}),
        ],
        ProviderUnavailableError,
        "overloaded",
        id="error event",
    ),
    pytest.param(
        [event(delta(content="par")), b"event: error\ndata: quota gone for rate_limit\n\n"],
        ProviderUnavailableError,
        "quota gone",
        id="error event with text data",
    ),
    pytest.param(
        [event({"error": {"message": "slow down", "code": 429}})],
        RateLimitError,
        "slow down",
        id="error event with a status code",
    ),
    pytest.param(
        [
            event(
                {
                    "error": {
                        "code": 400,
                        "message": "request (5000 tokens) exceeds the available context "
                        "size (4096 tokens)",
                        "type": "exceed_context_size_error",
                    }
                }
            )
        ],
        ContextLengthExceededError,
        "exceeds the available context size",
        id="context error event",
    ),
]


@pytest.mark.anyio
@BACKENDS
@pytest.mark.parametrize(("reads", "error", "complaint"), STREAM_FAILURES)
async def test_a_broken_stream_raises_a_clear_error_and_closes(
    anyio_backend: str,
    reads: list[bytes],
    error: type[Exception],
    complaint: str,
) -> None:
    # Whatever follows the failure (here, more data and [DONE]) is never read.
    trailer = [event(delta(content="never seen")), b"data: [DONE]\n\n"]
    body = Body(reads if "ended before" in complaint else [*reads, *trailer])
    client, seen = transport(sse_response(body, **{"x-request-id": "req_b"}))
    received: list[StreamChunk] = []
    async with client, OpenAIChatDriver(BASE, http_client=client) as driver:
        with pytest.raises(error, match=complaint) as info:
            await collect_into(driver, received)
    assert getattr(info.value, "request_id", None) == "req_b"
    assert not any(isinstance(chunk, ResponseDone) for chunk in received)
    assert len(seen) == 1  # nothing is retried once the body started
    assert body.closed


@pytest.mark.anyio
@BACKENDS
async def test_a_connection_lost_mid_stream_is_not_retried(anyio_backend: str) -> None:
    clock = FakeClock()
    body = Body([event(delta(content="half"))], then=httpx.ReadError("connection reset"))
    client, seen = transport(sse_response(body), sse_response(Body([event(finish("stop"))])))
    async with client, OpenAIChatDriver(BASE, http_client=client, clock=clock) as driver:
        received: list[StreamChunk] = []
        with pytest.raises(ProviderUnavailableError, match="connection reset"):
            await collect_into(driver, received)
    assert received == [TextChunk(text="half")]
    assert len(seen) == 1
    assert clock.waits == []


@pytest.mark.anyio
@BACKENDS
async def test_a_stream_is_retried_before_the_first_byte(anyio_backend: str) -> None:
    clock = FakeClock()
    busy = Body([b'{"error": {"message": "busy"}}'])
    client, seen = transport(
        httpx.Response(503, stream=busy, headers={"retry-after": "2"}),
        httpx.Response(429, stream=Body([b""]), headers={"retry-after-ms": "300"}),
        sse_response(Body([event(delta(content="ok")), event(finish("stop"))])),
    )
    async with client, OpenAIChatDriver(BASE, http_client=client, clock=clock) as driver:
        chunks = await collect(driver)
    assert len(seen) == 3
    assert clock.waits == [2.0, 0.3]
    assert busy.closed
    assert isinstance(chunks[-1], ResponseDone)
    assert chunks[-1].response.text == "ok"


@pytest.mark.anyio
async def test_a_stream_refused_up_front_raises_on_entering() -> None:
    client, _ = transport(httpx.Response(429, stream=Body([b'{"error": "too many"}'])))
    policy = RetryPolicy(max_retries=0)
    async with client, OpenAIChatDriver(BASE, http_client=client, retry_policy=policy) as driver:
        with pytest.raises(RateLimitError, match="too many"):
            async with driver.stream(CALL):
                pytest.fail("the context must not be entered")  # pragma: no cover


@pytest.mark.anyio
@BACKENDS
async def test_leaving_early_closes_the_connection(anyio_backend: str) -> None:
    body = Body([event(delta(content=str(i))) for i in range(100)])
    client, _ = transport(sse_response(body))
    async with (
        client,
        OpenAIChatDriver(BASE, http_client=client) as driver,
        driver.stream(CALL) as chunks,
    ):
        async for chunk in chunks:
            assert chunk == TextChunk(text="0")
            break
    assert body.closed
    assert body.sent < 100


@pytest.mark.anyio
async def test_stream_without_done_but_with_finish_reason_completes() -> None:
    body = Body([event(delta(content="fine")), event(finish("length"))])
    client, _ = transport(sse_response(body))
    async with client, OpenAIChatDriver(BASE, http_client=client) as driver:
        chunks = await collect(driver)
    assert isinstance(chunks[-1], ResponseDone)
    assert chunks[-1].response.finish_reason == "length"


@pytest.mark.anyio
async def test_tool_call_pieces_without_index_are_assembled() -> None:
    data = b"".join(
        [
            event(delta(tool_calls=[{"id": "a", "function": {"name": "f", "arguments": "{"}}])),
            event(delta(tool_calls=[{"function": {"arguments": "}"}}])),
            event(delta(tool_calls=[{"id": "b", "function": {"name": "g", "arguments": "{}"}}])),
            event(finish("tool_calls")),
        ]
    )
    client, _ = transport(sse_response(Body([data])))
    async with client, OpenAIChatDriver(BASE, http_client=client) as driver:
        chunks = await collect(driver)
    done = chunks[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.message.tool_calls == (
        ToolCall(id="a", name="f", arguments="{}"),
        ToolCall(id="b", name="g", arguments="{}"),
    )


@pytest.mark.anyio
async def test_a_server_that_ignores_stream_true_still_yields_the_response() -> None:
    whole = {
        "model": "m",
        "choices": [{"message": {"content": "all at once"}, "finish_reason": "stop"}],
    }
    client, _ = transport(httpx.Response(200, json=whole))
    async with client, OpenAIChatDriver(BASE, http_client=client) as driver:
        chunks = await collect(driver)
    # Stream consumers still see the text, as one delta, then the whole response.
    assert [type(c).__name__ for c in chunks] == ["TextChunk", "ResponseDone"]
    assert chunks[0].text == "all at once"  # type: ignore[union-attr]
    assert isinstance(chunks[1], ResponseDone)
    assert chunks[1].response.text == "all at once"
