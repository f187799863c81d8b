"""Mapping provider failures to threadline's errors, whatever server sent them."""

from __future__ import annotations

import json

import httpx
import pytest

from threadline import (
    AuthenticationError,
    BadRequestError,
    ContextLengthExceededError,
    ProviderError,
    ProviderResponseError,
    ProviderUnavailableError,
    RateLimitError,
)
from threadline.drivers._http._errors import (
    MAX_BODY_CHARS,
    ErrorMapper,
    ProviderErrorDetails,
    context_length_details,
    parse_error_body,
)
from threadline.drivers._http._sse import StreamProgress

FAKE_KEY = "sk-FAKE-threadline-test-key-0000000000"
mapper = ErrorMapper("openai-chat", secrets=[FAKE_KEY])


@pytest.mark.parametrize(
    ("status", "error"),
    [
        (400, BadRequestError),
        (401, AuthenticationError),
        (403, AuthenticationError),
        (404, BadRequestError),
        (408, ProviderUnavailableError),
        (409, ProviderUnavailableError),
        (413, BadRequestError),
        (422, BadRequestError),
        (429, RateLimitError),
        (500, ProviderUnavailableError),
        (503, ProviderUnavailableError),
        (302, ProviderResponseError),
    ],
)
def test_status_picks_the_error_class(status: int, error: type[ProviderError]) -> None:
    exc = mapper.from_response(status, "", request_id="req_1", reason="Reason")
    assert type(exc) is error
    assert exc.status == status
    assert exc.request_id == "req_1"
    assert exc.provider == "openai-chat"


def test_the_provider_message_becomes_the_exception_message() -> None:
    body = json.dumps({"error": {"message": "model not found", "type": "invalid_request_error"}})
    exc = mapper.from_response(404, body, request_id="req_9")
    assert exc.message == "model not found"
    assert str(exc) == "model not found (openai-chat, status 404, request id req_9)"
    assert exc.body == body


def test_without_a_message_the_status_line_is_used() -> None:
    exc = mapper.from_response(502, "<html>bad gateway</html>", reason="Bad Gateway")
    assert exc.message == "HTTP 502 Bad Gateway"
    assert exc.body == "<html>bad gateway</html>"


def test_long_bodies_are_cut_with_a_note() -> None:
    exc = mapper.from_response(500, "x" * (MAX_BODY_CHARS + 10))
    assert exc.body is not None
    assert exc.body.startswith("x" * MAX_BODY_CHARS)
    assert exc.body.endswith("[10 more characters cut]")


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            {"error": {"message": "m", "type": "t", "code": "c", "param": "p"}},
            ProviderErrorDetails(message="m", type="t", code="c", extra={"param": "p"}),
        ),
        (  # older vLLM: the error object at the top level
            {"object": "error", "message": "m", "type": "BadRequestError", "code": 400},
            ProviderErrorDetails(
                message="m", type="BadRequestError", code=400, extra={"object": "error"}
            ),
        ),
        ({"error": "model 'x' not found"}, ProviderErrorDetails(message="model 'x' not found")),
        ([1, 2], ProviderErrorDetails()),
        ({"error": {"code": True}}, ProviderErrorDetails()),
    ],
)
def test_error_body_shapes_are_understood(body: object, expected: ProviderErrorDetails) -> None:
    assert parse_error_body(json.dumps(body)) == expected


def test_a_body_that_is_not_json_has_no_details() -> None:
    assert parse_error_body("upstream connect error") == ProviderErrorDetails()


CONTEXT_MESSAGES = [
    pytest.param(
        {
            "message": "This model's maximum context length is 8192 tokens. However, your "
            "messages resulted in 9021 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        },
        9021,
        8192,
        id="openai",
    ),
    pytest.param(
        {
            "message": "This model's maximum context length is 2048 tokens. However, you "
            "requested 2600 tokens (2344 in the messages, 256 in the completion). Please "
            "reduce the length of the messages or completion.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        },
        2344,
        2048,
        id="llama-cpp-python / older vllm",
    ),
    pytest.param(
        {
            "message": "This model's maximum context length is 4,096 tokens. However, your "
            "request has 5,000 input tokens. Please reduce the length of the input messages.",
            "type": "BadRequestError",
            "code": 400,
        },
        5000,
        4096,
        id="vllm",
    ),
    pytest.param(
        {
            "code": 400,
            "message": "request (4476 tokens) exceeds the available context size (4096 tokens), "
            "try increasing it",
            "type": "exceed_context_size_error",
            "n_prompt_tokens": 4476,
            "n_ctx": 4096,
        },
        4476,
        4096,
        id="llama.cpp",
    ),
    pytest.param(
        {"code": 400, "message": "the request exceeds the available context size", "type": "x"},
        None,
        None,
        id="llama.cpp older, no numbers",
    ),
    pytest.param(
        {"message": "Requested tokens (5000) exceed context window of 2048"},
        5000,
        2048,
        id="llama-cpp-python raw",
    ),
    pytest.param(
        {
            "message": "Trying to keep the first 6178 tokens when context the overflows. However, "
            "the model is loaded with context length of only 4096 tokens, which is not enough."
        },
        6178,
        4096,
        id="lm studio",
    ),
    pytest.param(
        {"message": "prompt is too long: 201234 tokens > 200000 maximum"},
        201234,
        200000,
        id="anthropic-style",
    ),
    pytest.param(
        {
            "message": "Input validation error: `inputs` tokens + `max_new_tokens` must be "
            "<= 4096. Given: 4000 `inputs` tokens and 500 `max_new_tokens`"
        },
        4000,
        4096,
        id="tgi",
    ),
]


@pytest.mark.parametrize(("error", "prompt_tokens", "context_limit"), CONTEXT_MESSAGES)
def test_context_length_refusals_are_recognised_with_their_numbers(
    error: dict[str, object], prompt_tokens: int | None, context_limit: int | None
) -> None:
    exc = mapper.from_response(400, json.dumps({"error": error}), request_id="req_c")
    assert isinstance(exc, ContextLengthExceededError)
    assert isinstance(exc, BadRequestError)
    assert exc.prompt_tokens == prompt_tokens
    assert exc.context_limit == context_limit
    assert exc.status == 400
    assert exc.request_id == "req_c"


def test_an_ordinary_bad_request_is_not_a_context_error() -> None:
    details = ProviderErrorDetails(message="'temperature' must be <= 2", code="invalid_value")
    assert context_length_details(details) is None
    exc = mapper.from_response(400, json.dumps({"error": {"message": "'temperature' bad"}}))
    assert type(exc) is BadRequestError


def test_a_secret_echoed_by_the_server_is_redacted() -> None:
    body = json.dumps({"error": {"message": f"Incorrect API key provided: {FAKE_KEY}."}})
    exc = mapper.from_response(401, body)
    assert FAKE_KEY not in str(exc)
    assert FAKE_KEY not in repr(exc)
    assert FAKE_KEY not in (exc.body or "")
    assert all(FAKE_KEY not in str(arg) for arg in exc.args)
    assert "[redacted]" in exc.message


def test_short_keys_are_not_redacted_out_of_every_word() -> None:
    short = ErrorMapper("p", secrets=["x"])
    assert short.redact("xyz") == "xyz"
    assert repr(short) == "ErrorMapper(provider='p')"


@pytest.mark.parametrize(
    ("payload", "error"),
    [
        ({"error": {"message": "overloaded", "type": "server_error"}}, ProviderUnavailableError),
        ({"error": {"message": "m", "type": "rate_limit_exceeded"}}, RateLimitError),
        ({"error": {"message": "m", "type": "invalid_request_error"}}, BadRequestError),
        ({"error": {"message": "m", "type": "authentication_error"}}, AuthenticationError),
        ({"error": {"message": "m", "code": 503}}, ProviderUnavailableError),
        ({"error": {"message": "m", "code": 429}}, RateLimitError),
        ({"error": "something broke"}, ProviderUnavailableError),
        (
            {"error": {"message": "context_length_exceeded", "type": "invalid_request_error"}},
            ContextLengthExceededError,
        ),
    ],
)
def test_mid_stream_error_events_are_classified(
    payload: dict[str, object], error: type[ProviderError]
) -> None:
    exc = mapper.from_payload(payload, request_id="req_s")
    assert type(exc) is error
    assert exc.request_id == "req_s"
    assert exc.body is not None


def test_transport_failures_name_what_went_wrong() -> None:
    timeout = mapper.from_transport(httpx.ReadTimeout("read timed out"))
    refused = mapper.from_transport(httpx.ConnectError("[Errno 111] Connection refused"))
    assert isinstance(timeout, ProviderUnavailableError)
    assert "timed out" in timeout.message
    assert "ReadTimeout" in timeout.message
    assert "could not reach the provider" in refused.message
    assert "Connection refused" in refused.message


def test_a_transport_failure_without_a_message_names_its_class_once() -> None:
    error = mapper.from_transport(httpx.ReadError(""))
    assert error.message == "could not reach the provider (ReadError)"
    assert isinstance(error.__cause__, httpx.ReadError)


def test_a_transport_failures_cause_is_a_copy_without_the_request() -> None:
    request = httpx.Request("POST", "https://api.example/v1", headers={"authorization": "x"})
    original = httpx.ConnectError("refused", request=request)
    cause = mapper.from_transport(original).__cause__
    assert type(cause) is httpx.ConnectError
    assert cause is not original
    with pytest.raises(RuntimeError):  # httpx's way of saying "no request here"
        _ = cause.request  # type: ignore[union-attr]


def test_messages_are_bounded_like_bodies() -> None:
    huge = "z" * 1_000_000
    for error in (
        mapper.from_response(400, json.dumps({"error": {"message": huge}})),
        mapper.from_payload({"error": {"message": huge}}),
        mapper.malformed(huge),
        mapper.from_transport(httpx.ReadError(huge)),
    ):
        assert len(str(error)) < 1200
        assert "more characters cut" in str(error)


def test_a_stream_that_stalls_says_it_timed_out_not_that_it_broke_off() -> None:
    progress = StreamProgress("text/event-stream")
    before_the_body = mapper.from_transport(httpx.ReadTimeout("read"), progress=progress)
    first = b"event: message_start\ndata: {}\n\n"
    progress.add(first)
    progress.events = 1
    mid_stream = mapper.from_transport(httpx.ReadTimeout("read"), progress=progress)
    reset = mapper.from_transport(httpx.ReadError("reset"), progress=progress)

    assert before_the_body.message.startswith("the response timed out while its body was read")
    assert mid_stream.message.startswith(f"the stream timed out after 1 event ({len(first)} bytes)")
    assert "broke off" not in before_the_body.message + mid_stream.message
    assert reset.message.startswith(f"the stream broke off after 1 event ({len(first)} bytes)")
