"""What OpenAIResponsesDriver reads from a stream: the documented event sequences, and failures."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import respx

from threadline import (
    Client,
    ContextLengthExceededError,
    FinalResult,
    Message,
    Model,
    ProviderResponseError,
    ProviderUnavailableError,
    Usage,
)
from threadline.drivers import (
    OpenAIResponsesDriver,
    ProviderCall,
    ReasoningChunk,
    ResponseDone,
    RetryPolicy,
    StreamChunk,
    TextChunk,
    ToolCallChunk,
)

pytestmark = pytest.mark.anyio

BASE = "https://responses.example/v1"
URL = f"{BASE}/responses"
MODEL = Model("gpt-test")
CALL = ProviderCall(model=MODEL, messages=(Message.user("Weather in Paris?"),))
NO_WAIT = RetryPolicy(max_retries=2, initial_delay=0, jitter=0)

REASONING_DONE: dict[str, Any] = {
    "id": "rs_1",
    "type": "reasoning",
    "summary": [{"type": "summary_text", "text": "Wants the weather."}],
    "encrypted_content": "gAAAAABo-encrypted==",
}
CALL_DONE: dict[str, Any] = {
    "id": "fc_1",
    "type": "function_call",
    "status": "completed",
    "arguments": '{"city":"Paris"}',
    "call_id": "call_1",
    "name": "get_weather",
}
USAGE = {
    "input_tokens": 90,
    "input_tokens_details": {"cached_tokens": 10},
    "output_tokens": 40,
    "output_tokens_details": {"reasoning_tokens": 24},
    "total_tokens": 130,
}


def sse(*events: dict[str, Any]) -> bytes:
    return b"".join(
        f"event: {event['type']}\ndata: {json.dumps(event)}\n\n".encode() for event in events
    )


def ev(kind: str, sequence: int, **fields: Any) -> dict[str, Any]:
    return {"type": kind, "sequence_number": sequence, **fields}


def response(status: str, output: list[dict[str, Any]], **fields: Any) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "model": "gpt-test-2026",
        "status": status,
        "output": output,
        "usage": USAGE,
        **fields,
    }


# A reasoning item with a summary, then a function call, as the API documents them.
TOOL_ROUND = sse(
    ev("response.created", 0, response=response("in_progress", [])),
    ev("response.in_progress", 1, response=response("in_progress", [])),
    ev(
        "response.output_item.added",
        2,
        output_index=0,
        item={"id": "rs_1", "type": "reasoning", "summary": []},
    ),
    ev(
        "response.reasoning_summary_part.added",
        3,
        item_id="rs_1",
        output_index=0,
        summary_index=0,
        part={"type": "summary_text", "text": ""},
    ),
    ev(
        "response.reasoning_summary_text.delta",
        4,
        item_id="rs_1",
        output_index=0,
        summary_index=0,
        delta="Wants ",
    ),
    ev(
        "response.reasoning_summary_text.delta",
        5,
        item_id="rs_1",
        output_index=0,
        summary_index=0,
        delta="the weather.",
    ),
    ev(
        "response.reasoning_summary_text.done",
        6,
        item_id="rs_1",
        output_index=0,
        summary_index=0,
        text="Wants the weather.",
    ),
    ev("response.output_item.done", 7, output_index=0, item=REASONING_DONE),
    ev(
        "response.output_item.added",
        8,
        output_index=1,
        item={**CALL_DONE, "status": "in_progress", "arguments": ""},
    ),
    ev(
        "response.function_call_arguments.delta",
        9,
        item_id="fc_1",
        output_index=1,
        delta='{"city":',
    ),
    ev(
        "response.function_call_arguments.delta",
        10,
        item_id="fc_1",
        output_index=1,
        delta='"Paris"}',
    ),
    ev("response.some_future_event", 11, detail="ignored"),
    ev(
        "response.function_call_arguments.done",
        12,
        item_id="fc_1",
        output_index=1,
        arguments='{"city":"Paris"}',
    ),
    ev("response.output_item.done", 13, output_index=1, item=CALL_DONE),
    ev(
        "response.completed",
        14,
        response=response("completed", [REASONING_DONE, CALL_DONE]),
    ),
)


def streamed(content: bytes) -> httpx.Response:
    return httpx.Response(200, content=content, headers={"content-type": "text/event-stream"})


async def read(driver: OpenAIResponsesDriver, call: ProviderCall = CALL) -> list[StreamChunk]:
    async with driver.stream(call) as chunks:
        return [chunk async for chunk in chunks]


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_reasoning_and_tool_round_streams_and_assembles_exactly() -> None:
    with respx.mock() as mock:
        route = mock.post(URL).mock(return_value=streamed(TOOL_ROUND))
        async with OpenAIResponsesDriver(BASE) as driver:
            chunks = await read(driver)
    assert json.loads(route.calls.last.request.content)["stream"] is True
    assert [c.text for c in chunks if isinstance(c, ReasoningChunk)] == ["Wants ", "the weather."]
    assert [c for c in chunks if isinstance(c, ToolCallChunk)] == [
        ToolCallChunk(index=0, id="call_1", name="get_weather"),
        ToolCallChunk(index=0, arguments='{"city":'),
        ToolCallChunk(index=0, arguments='"Paris"}'),
    ]
    done = chunks[-1]
    assert isinstance(done, ResponseDone)
    reply = done.response
    (call,) = reply.message.tool_calls
    assert (call.id, call.name, call.parsed()) == ("call_1", "get_weather", {"city": "Paris"})
    assert reply.finish_reason == "tool_calls"
    assert reply.usage == Usage(
        input_tokens=90, output_tokens=40, cached_input_tokens=10, reasoning_tokens=24
    )
    reasoning = reply.message.reasoning
    assert reasoning is not None
    # The encrypted content arrives on output_item.done, and is kept.
    assert json.loads(reasoning.provider_reasoning) == REASONING_DONE
    assert reasoning.text == "Wants the weather."
    assert reasoning.provider == "openai-responses:gpt-test"


async def test_streamed_reasoning_goes_back_byte_for_byte_with_the_tool_result() -> None:
    final = response(
        "completed", [{"type": "message", "content": [{"type": "output_text", "text": "Sunny."}]}]
    )
    with respx.mock() as mock:
        route = mock.post(URL)
        route.side_effect = [streamed(TOOL_ROUND), httpx.Response(200, json=final)]
        async with OpenAIResponsesDriver(BASE) as driver:
            chunks = await read(driver)
            done = chunks[-1]
            assert isinstance(done, ResponseDone)
            message = done.response.message
            messages = (*CALL.messages, message, Message.tool("call_1", "sunny"))
            reply = await driver.complete(ProviderCall(model=MODEL, messages=messages))
    assert reply.text == "Sunny."
    assert message.reasoning is not None
    assert message.reasoning.provider_reasoning in route.calls.last.request.content


async def test_text_streamed_without_indexes_or_a_final_output_is_assembled() -> None:
    # llama.cpp's server: deltas keyed by item_id only, and no output in the last event.
    body = sse(
        {"type": "response.created", "response": {"id": "r", "status": "in_progress"}},
        {
            "type": "response.output_item.added",
            "item": {"id": "msg_1", "type": "message", "role": "assistant", "content": []},
        },
        {"type": "response.output_text.delta", "item_id": "msg_1", "delta": "Hel"},
        {"type": "response.output_text.delta", "item_id": "msg_1", "delta": "lo"},
        {"type": "response.completed", "response": {"id": "r", "status": "completed"}},
    )
    with respx.mock() as mock:
        mock.post(URL).mock(return_value=streamed(body))
        async with OpenAIResponsesDriver(BASE) as driver:
            chunks = await read(driver)
    assert [c for c in chunks if isinstance(c, TextChunk)] == [
        TextChunk(text="Hel"),
        TextChunk(text="lo"),
    ]
    done = chunks[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.text == "Hello"
    assert done.response.finish_reason == "stop"


async def test_an_incomplete_stream_ends_with_finish_reason_length() -> None:
    message = {
        "id": "msg_1",
        "type": "message",
        "content": [{"type": "output_text", "text": "Par"}],
    }
    body = sse(
        ev("response.output_item.added", 0, output_index=0, item={**message, "content": []}),
        ev("response.output_text.delta", 1, item_id="msg_1", output_index=0, delta="Par"),
        ev("response.output_item.done", 2, output_index=0, item=message),
        ev(
            "response.incomplete",
            3,
            response=response(
                "incomplete", [message], incomplete_details={"reason": "max_output_tokens"}
            ),
        ),
    )
    with respx.mock() as mock:
        mock.post(URL).mock(return_value=streamed(body))
        async with OpenAIResponsesDriver(BASE) as driver:
            chunks = await read(driver)
    done = chunks[-1]
    assert isinstance(done, ResponseDone)
    assert (done.response.text, done.response.finish_reason) == ("Par", "length")


CONTEXT_ERROR = ev(
    "error",
    1,
    code="context_length_exceeded",
    message="Your input exceeds the context window of this model.",
    param="input",
)


@pytest.mark.parametrize(
    ("events", "error", "complaint"),
    [
        pytest.param(
            [CONTEXT_ERROR], ContextLengthExceededError, "context window", id="error event"
        ),
        pytest.param(
            [
                ev(
                    "response.failed",
                    1,
                    response=response(
                        "failed", [], error={"code": "server_error", "message": "it broke"}
                    ),
                )
            ],
            ProviderUnavailableError,
            "it broke",
            id="response.failed",
        ),
        pytest.param([], ProviderResponseError, "ended before", id="no terminal event"),
    ],
)
async def test_a_failing_stream_raises_after_the_200(
    events: list[dict[str, Any]], error: type[Exception], complaint: str
) -> None:
    start = ev("response.created", 0, response=response("in_progress", []))
    with respx.mock() as mock:
        route = mock.post(URL).mock(return_value=streamed(sse(start, *events)))
        async with OpenAIResponsesDriver(BASE, retry_policy=NO_WAIT) as driver:
            with pytest.raises(error, match=complaint):
                await read(driver)
    assert route.call_count == 1


async def test_a_context_error_mid_stream_tightens_the_run_and_retries() -> None:
    ok = sse(
        ev(
            "response.completed",
            0,
            response=response(
                "completed",
                [{"type": "message", "content": [{"type": "output_text", "text": "fits"}]}],
            ),
        )
    )
    refused = sse(ev("response.created", 0, response=response("in_progress", [])), CONTEXT_ERROR)
    history = [Message.user(f"question {i} " * 20) for i in range(20)]
    with respx.mock() as mock:
        route = mock.post(URL)
        route.side_effect = [streamed(refused), streamed(ok)]
        # Near the tightened budget, limiting asks the server's own count.
        mock.post(f"{URL}/input_tokens").mock(
            side_effect=lambda request: httpx.Response(
                200, json={"input_tokens": len(request.content) // 4}
            )
        )
        async with OpenAIResponsesDriver(BASE) as driver:
            request = (
                Client(driver, default_model=Model("gpt-test", context_size=100_000))
                .request()
                .with_messages(history)
                .with_prompt("q")
            )
            async with request.stream() as events:
                seen = [event async for event in events]
    final = seen[-1]
    assert isinstance(final, FinalResult)
    assert final.result.text == "fits"
    assert final.result.rounds[0].context_retry is True
    first, second = (json.loads(call.request.content)["input"] for call in route.calls)
    assert len(second) < len(first)


async def test_a_json_answer_to_a_stream_request_still_streams() -> None:
    whole = response(
        "completed", [{"type": "message", "content": [{"type": "output_text", "text": "Hi"}]}]
    )
    with respx.mock() as mock:
        mock.post(URL).respond(json=whole)
        async with OpenAIResponsesDriver(BASE) as driver:
            chunks = await read(driver)
    assert chunks[0] == TextChunk(text="Hi")
    assert isinstance(chunks[-1], ResponseDone)


async def test_deltas_naming_only_the_item_id_find_an_item_added_by_index() -> None:
    item = {"id": "msg_9", "type": "message", "role": "assistant", "content": []}
    body = sse(
        {"type": "response.output_item.added", "output_index": 0, "item": item},
        {"type": "response.output_text.delta", "item_id": "msg_9", "delta": "Hi"},
        {"type": "response.completed", "response": {"status": "completed"}},
    )
    with respx.mock() as mock:
        mock.post(URL).mock(return_value=streamed(body))
        async with OpenAIResponsesDriver(BASE) as driver:
            chunks = await read(driver)
    done = chunks[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.text == "Hi"


async def test_a_delta_for_an_item_never_added_is_malformed() -> None:
    body = sse({"type": "response.output_text.delta", "item_id": "msg_x", "delta": "Hi"})
    with respx.mock() as mock:
        mock.post(URL).mock(return_value=streamed(body))
        async with OpenAIResponsesDriver(BASE) as driver:
            with pytest.raises(ProviderResponseError, match="never added"):
                await read(driver)


@pytest.mark.parametrize("line_end", [b"\n", b"\r\n"])
@pytest.mark.parametrize("size", [1, 7, 64, 10_000])
async def test_a_stream_read_in_any_pieces_assembles_the_same(line_end: bytes, size: int) -> None:
    """Events split across reads, several in one read, CR LF line ends: one answer."""

    class Pieces(httpx.AsyncByteStream):
        async def __aiter__(self) -> AsyncIterator[bytes]:
            body = TOOL_ROUND.replace(b"\n", line_end)
            for start in range(0, len(body), size):
                yield body[start : start + size]

    def answer(request: httpx.Request) -> httpx.Response:
        headers = {"content-type": "text/event-stream"}
        return httpx.Response(200, headers=headers, stream=Pieces())

    with respx.mock() as mock:
        mock.post(URL).mock(return_value=streamed(TOOL_ROUND))
        async with OpenAIResponsesDriver(BASE) as driver:
            whole = await read(driver)
    async with httpx.AsyncClient(transport=httpx.MockTransport(answer)) as http:
        pieces = await read(OpenAIResponsesDriver(BASE, http_client=http))
    assert pieces == whole
    assert isinstance(pieces[-1], ResponseDone)
