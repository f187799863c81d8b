"""What AnthropicDriver reads: messages, the documented stream events, errors, count_tokens."""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
import respx

from threadline import (
    AuthenticationError,
    BadRequestError,
    ContextLengthExceededError,
    Message,
    Model,
    ProviderResponseError,
    ProviderUnavailableError,
    RateLimitError,
    Usage,
)
from threadline.drivers import (
    AnthropicDriver,
    ProviderCall,
    ReasoningChunk,
    ResponseDone,
    RetryPolicy,
    StreamChunk,
    TextChunk,
    ToolCallChunk,
)

pytestmark = pytest.mark.anyio

BASE = "https://anthropic.example"
URL = f"{BASE}/v1/messages"
KEY = "sk-ant-api03-very-secret-key"
MODEL = Model("claude-test")
CALL = ProviderCall(model=MODEL, messages=(Message.user("hi"),))
NO_WAIT = RetryPolicy(max_retries=2, initial_delay=0, jitter=0)


def sse(*events: tuple[str, dict[str, Any]]) -> bytes:
    return b"".join(
        f"event: {name}\ndata: {json.dumps(data)}\n\n".encode() for name, data in events
    )


def ev(kind: str, **fields: Any) -> tuple[str, dict[str, Any]]:
    return kind, {"type": kind, **fields}


def start(usage: dict[str, int]) -> tuple[str, dict[str, Any]]:
    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "claude-x"}
    return ev("message_start", message={**message, "content": [], "usage": usage})


def block(index: int, content_block: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    return ev("content_block_start", index=index, content_block=content_block)


def delta(index: int, **payload: Any) -> tuple[str, dict[str, Any]]:
    return ev("content_block_delta", index=index, delta=payload)


TOOL_USE_STREAM = sse(
    start({"input_tokens": 10, "cache_read_input_tokens": 5, "output_tokens": 1}),
    block(0, {"type": "thinking", "thinking": "", "signature": ""}),
    delta(0, type="thinking_delta", thinking="The user wants "),
    ev("ping"),
    delta(0, type="thinking_delta", thinking="the weather."),
    delta(0, type="signature_delta", signature="EqQBCkYI"),
    delta(0, type="signature_delta", signature="Bx=="),
    ev("content_block_stop", index=0),
    block(1, {"type": "text", "text": ""}),
    delta(1, type="text_delta", text="Let me "),
    delta(1, type="text_delta", text="check."),
    ev("content_block_stop", index=1),
    block(2, {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {}}),
    delta(2, type="input_json_delta", partial_json=""),
    delta(2, type="input_json_delta", partial_json='{"city": '),
    delta(2, type="input_json_delta", partial_json='"Paris"}'),
    ev("content_block_stop", index=2),
    ev("some_future_event", detail="ignored"),
    ev(
        "message_delta",
        delta={"stop_reason": "tool_use", "stop_sequence": None},
        usage={"output_tokens": 42},
    ),
    ev("message_stop"),
)


async def read_stream(driver: AnthropicDriver, call: ProviderCall = CALL) -> list[StreamChunk]:
    async with driver.stream(call) as chunks:
        return [chunk async for chunk in chunks]


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_a_stream_with_thinking_text_and_tool_use_assembles_exactly() -> None:
    with respx.mock() as mock:
        route = mock.post(URL).mock(
            return_value=httpx.Response(
                200, content=TOOL_USE_STREAM, headers={"content-type": "text/event-stream"}
            )
        )
        async with AnthropicDriver(base_url=BASE, api_key=KEY) as driver:
            chunks = await read_stream(driver)
    assert json.loads(route.calls.last.request.content)["stream"] is True
    assert [c.text for c in chunks if isinstance(c, ReasoningChunk)] == [
        "The user wants ",
        "the weather.",
    ]
    assert "".join(c.text for c in chunks if isinstance(c, TextChunk)) == "Let me check."
    tool_chunks = [c for c in chunks if isinstance(c, ToolCallChunk)]
    assert tool_chunks[0] == ToolCallChunk(index=0, id="toolu_1", name="get_weather")
    done = chunks[-1]
    assert isinstance(done, ResponseDone)
    response = done.response
    (call,) = response.message.tool_calls
    assert (call.id, call.name, call.parsed()) == ("toolu_1", "get_weather", {"city": "Paris"})
    assert response.finish_reason == "tool_calls"
    assert response.usage == Usage(input_tokens=15, output_tokens=42, cached_input_tokens=5)
    reasoning = response.message.reasoning
    assert reasoning is not None
    assert reasoning.text == "The user wants the weather."
    assert reasoning.provider == "anthropic:claude-test"
    # signature_delta pieces are appended, never overwritten.
    assert json.loads(reasoning.provider_reasoning) == [
        {"type": "thinking", "thinking": "The user wants the weather.", "signature": "EqQBCkYIBx=="}
    ]


async def test_streamed_thinking_goes_back_byte_for_byte_with_the_tool_result() -> None:
    reply = httpx.Response(
        200, content=TOOL_USE_STREAM, headers={"content-type": "text/event-stream"}
    )
    ok = {"type": "message", "content": [], "stop_reason": "end_turn", "usage": {}}
    with respx.mock() as mock:
        route = mock.post(URL).mock(side_effect=[reply, httpx.Response(200, json=ok)])
        async with AnthropicDriver(base_url=BASE, api_key=KEY) as driver:
            done = (await read_stream(driver))[-1]
            assert isinstance(done, ResponseDone)
            answer = done.response.message
            follow_up = ProviderCall(
                model=MODEL,
                messages=(*CALL.messages, answer, Message.tool("toolu_1", "sunny")),
            )
            await driver.complete(follow_up)
    assert answer.reasoning is not None
    sent = route.calls.last.request.content
    assert answer.reasoning.provider_reasoning[1:-1] in sent


async def test_redacted_thinking_is_kept_whole_and_shows_no_text() -> None:
    body = {
        "type": "message",
        "model": "claude-x",
        "content": [
            {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va3pzix/LafPsn4a"},
            {"type": "text", "text": "Hi."},
        ],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 7, "cache_creation_input_tokens": 2, "output_tokens": 3},
    }
    with respx.mock() as mock:
        mock.post(URL).mock(
            return_value=httpx.Response(200, json=body, headers={"request-id": "req_011"})
        )
        async with AnthropicDriver(base_url=BASE, api_key=KEY) as driver:
            response = await driver.complete(CALL)
    assert response.text == "Hi."
    assert response.request_id == "req_011"
    assert response.model == "claude-x"
    assert response.usage == Usage(input_tokens=9, output_tokens=3)
    assert response.message.reasoning is not None
    assert response.message.reasoning.text == ""
    assert json.loads(response.message.reasoning.provider_reasoning) == [body["content"][0]]


@pytest.mark.parametrize(
    ("stop_reason", "finish_reason"),
    [
        ("end_turn", "stop"),
        ("max_tokens", "length"),
        ("stop_sequence", "stop"),
        ("tool_use", "tool_calls"),
        ("pause_turn", "pause_turn"),
        ("refusal", "content_filter"),
        ("model_context_window_exceeded", "length"),
        ("something_new", "something_new"),
    ],
)
async def test_stop_reasons_map_to_finish_reasons(stop_reason: str, finish_reason: str) -> None:
    body = {"type": "message", "content": [], "stop_reason": stop_reason, "usage": {}}
    with respx.mock() as mock:
        mock.post(URL).mock(return_value=httpx.Response(200, json=body))
        async with AnthropicDriver(base_url=BASE, api_key=KEY) as driver:
            assert (await driver.complete(CALL)).finish_reason == finish_reason


async def test_an_error_event_after_the_200_is_mapped_to_the_error_tree() -> None:
    stream = sse(
        start({"input_tokens": 3, "output_tokens": 0}),
        block(0, {"type": "text", "text": ""}),
        delta(0, type="text_delta", text="Hel"),
        ev("error", error={"type": "overloaded_error", "message": "Overloaded"}),
    )
    with respx.mock() as mock:
        mock.post(URL).mock(
            return_value=httpx.Response(200, content=stream, headers={"request-id": "req_e"})
        )
        async with AnthropicDriver(base_url=BASE, api_key=KEY) as driver:
            with pytest.raises(ProviderUnavailableError, match="Overloaded") as caught:
                await read_stream(driver)
    assert caught.value.request_id == "req_e"


async def test_a_stream_cut_before_message_stop_is_a_response_error() -> None:
    stream = sse(start({"input_tokens": 3}), block(0, {"type": "text", "text": "Hi"}))
    with respx.mock() as mock:
        mock.post(URL).mock(return_value=httpx.Response(200, content=stream))
        async with AnthropicDriver(base_url=BASE, api_key=KEY) as driver:
            with pytest.raises(ProviderResponseError, match="message_stop"):
                await read_stream(driver)


@pytest.mark.parametrize(
    ("message", "prompt_tokens", "context_limit"),
    [
        ("prompt is too long: 200251 tokens > 200000 maximum", 200251, 200000),
        (
            "input length and `max_tokens` exceed context limit: 199759 + 8192 > 200000, "
            "decrease input length or `max_tokens` and try again",
            199759,
            200000,
        ),
    ],
)
async def test_both_context_overflow_forms_carry_their_numbers(
    message: str, prompt_tokens: int, context_limit: int
) -> None:
    body = {"type": "error", "error": {"type": "invalid_request_error", "message": message}}
    with respx.mock() as mock:
        route = mock.post(URL).mock(
            return_value=httpx.Response(400, json=body, headers={"request-id": "req_ctx"})
        )
        async with AnthropicDriver(base_url=BASE, api_key=KEY, retry_policy=NO_WAIT) as driver:
            with pytest.raises(ContextLengthExceededError) as caught:
                await driver.complete(CALL)
    assert route.call_count == 1
    error = caught.value
    assert (error.prompt_tokens, error.context_limit) == (prompt_tokens, context_limit)
    assert (error.status, error.request_id) == (400, "req_ctx")


@pytest.mark.parametrize(
    ("status", "kind", "error_class"),
    [
        (400, "invalid_request_error", BadRequestError),
        (401, "authentication_error", AuthenticationError),
        (403, "permission_error", AuthenticationError),
        (404, "not_found_error", BadRequestError),
        (413, "request_too_large", BadRequestError),
    ],
)
async def test_client_errors_are_not_retried_and_keep_the_request_id(
    status: int, kind: str, error_class: type[Exception]
) -> None:
    body = {"type": "error", "error": {"type": kind, "message": f"{kind} happened"}}
    with respx.mock() as mock:
        route = mock.post(URL).mock(
            return_value=httpx.Response(status, json=body, headers={"request-id": "req_4xx"})
        )
        async with AnthropicDriver(base_url=BASE, api_key=KEY, retry_policy=NO_WAIT) as driver:
            with pytest.raises(error_class, match=f"{kind} happened") as caught:
                await driver.complete(CALL)
    assert route.call_count == 1
    assert getattr(caught.value, "request_id", None) == "req_4xx"


@pytest.mark.parametrize("status", [500, 529])
async def test_server_errors_and_overload_are_retried(status: int) -> None:
    failing = httpx.Response(
        status, json={"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}
    )
    ok = {"type": "message", "content": [{"type": "text", "text": "ok"}], "usage": {}}
    with respx.mock() as mock:
        route = mock.post(URL).mock(side_effect=[failing, httpx.Response(200, json=ok)])
        async with AnthropicDriver(base_url=BASE, api_key=KEY, retry_policy=NO_WAIT) as driver:
            assert (await driver.complete(CALL)).text == "ok"
    assert route.call_count == 2


async def test_x_should_retry_overrides_the_status_rule() -> None:
    refused = httpx.Response(500, json={}, headers={"x-should-retry": "false"})
    with respx.mock() as mock:
        route = mock.post(URL).mock(return_value=refused)
        async with AnthropicDriver(base_url=BASE, api_key=KEY, retry_policy=NO_WAIT) as driver:
            with pytest.raises(ProviderUnavailableError):
                await driver.complete(CALL)
    assert route.call_count == 1

    conflict = httpx.Response(400, json={}, headers={"x-should-retry": "true"})
    ok = {"type": "message", "content": [], "usage": {}}
    with respx.mock() as mock:
        route = mock.post(URL).mock(side_effect=[conflict, httpx.Response(200, json=ok)])
        async with AnthropicDriver(base_url=BASE, api_key=KEY, retry_policy=NO_WAIT) as driver:
            await driver.complete(CALL)
    assert route.call_count == 2


async def test_a_429_names_its_rate_limit_headers_after_the_retries() -> None:
    headers = {
        "retry-after": "0",
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": "2026-01-01T00:00:00Z",
        "request-id": "req_429",
    }
    body = {"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}}
    with respx.mock() as mock:
        route = mock.post(URL).mock(return_value=httpx.Response(429, json=body, headers=headers))
        async with AnthropicDriver(base_url=BASE, api_key=KEY, retry_policy=NO_WAIT) as driver:
            with pytest.raises(RateLimitError) as caught:
                await driver.complete(CALL)
    assert route.call_count == 3
    assert "anthropic-ratelimit-requests-remaining=0" in str(caught.value)
    assert caught.value.request_id == "req_429"


async def test_the_key_never_leaks_into_reprs_errors_or_logs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    echo = {"type": "error", "error": {"type": "authentication_error", "message": f"bad key {KEY}"}}
    with respx.mock() as mock:
        mock.post(URL).mock(return_value=httpx.Response(401, json=echo))
        async with AnthropicDriver(base_url=BASE, api_key=KEY) as driver:
            assert KEY not in repr(driver)
            with pytest.raises(AuthenticationError) as caught:
                await driver.complete(CALL)
    error = caught.value
    for text in (str(error), repr(error), error.body or "", caplog.text):
        assert KEY not in text
    assert "[redacted]" in str(error)


async def test_count_tokens_posts_the_body_without_max_tokens() -> None:
    call = ProviderCall(
        model=MODEL, messages=(Message.system("s"), Message.user("hi")), max_output_tokens=50
    )
    with respx.mock() as mock:
        route = mock.post(f"{URL}/count_tokens").mock(
            return_value=httpx.Response(200, json={"input_tokens": 17})
        )
        async with AnthropicDriver(base_url=BASE, api_key=KEY) as driver:
            assert await driver.count_tokens(call) == 17
            counter = driver.exact_token_counter(MODEL)
            assert await counter.count(call.messages) == 17
    sent = json.loads(route.calls.last.request.content)
    assert "max_tokens" not in sent
    assert sent["system"] == [{"type": "text", "text": "s"}]
    assert sent["messages"] == [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]


async def test_a_stream_answered_in_one_piece_still_yields_its_text() -> None:
    body = {"type": "message", "content": [{"type": "text", "text": "whole"}], "usage": {}}
    with respx.mock() as mock:
        mock.post(URL).mock(return_value=httpx.Response(200, json=body))
        async with AnthropicDriver(base_url=BASE, api_key=KEY) as driver:
            chunks = await read_stream(driver)
    assert [type(c) for c in chunks] == [TextChunk, ResponseDone]


async def test_an_unknown_event_is_skipped_before_its_data_is_read() -> None:
    # The API asks clients to skip event types they do not know: their data
    # need not be JSON at all.
    stream = sse(start({"input_tokens": 3}), block(0, {"type": "text", "text": ""}))
    stream += b"event: some_future_event\ndata: not json, and not ours to read\n\n"
    stream += sse(
        delta(0, type="text_delta", text="Hi"),
        ev("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 1}),
        ev("message_stop"),
    )
    with respx.mock() as mock:
        mock.post(URL).mock(
            return_value=httpx.Response(
                200, content=stream, headers={"content-type": "text/event-stream"}
            )
        )
        async with AnthropicDriver(base_url=BASE, api_key=KEY) as driver:
            chunks = await read_stream(driver)
    done = chunks[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.message.text == "Hi"


class _StallAfter(httpx.AsyncByteStream):
    """A body that sends ``sent`` and then stalls until the read time-out."""

    def __init__(self, sent: bytes) -> None:
        self._sent = sent

    async def __aiter__(self) -> AsyncIterator[bytes]:
        yield self._sent
        raise httpx.ReadTimeout("timed out reading the body")


async def test_a_stream_that_stalls_after_its_first_event_says_it_timed_out() -> None:
    first = sse(start({"input_tokens": 3}))
    with respx.mock() as mock:
        mock.post(URL).mock(
            return_value=httpx.Response(
                200, stream=_StallAfter(first), headers={"content-type": "text/event-stream"}
            )
        )
        async with AnthropicDriver(base_url=BASE, api_key=KEY) as driver:
            with pytest.raises(ProviderUnavailableError) as caught:
                await read_stream(driver)
    message = caught.value.message
    assert message.startswith(f"the stream timed out after 1 event ({len(first):,} bytes)")
    assert "broke off" not in message
    assert "ReadTimeout" in message
