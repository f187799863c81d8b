"""OpenAIChatDriver failures: mapping, retries with their waits, and the API key never leaking."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator

import httpx
import pytest
import respx

from threadline import (
    AuthenticationError,
    BadRequestError,
    ContextLengthExceededError,
    Message,
    Model,
    ProviderError,
    ProviderResponseError,
    ProviderUnavailableError,
    RateLimitError,
)
from threadline.drivers import OpenAIChatDriver, ProviderCall, RetryPolicy

FAKE_KEY = "sk-FAKE-threadline-test-key-do-not-use-42"
BASE = "https://llm.example/v1"
URL = f"{BASE}/chat/completions"
CALL = ProviderCall(model=Model("gpt-test"), messages=(Message.user("hi"),))
OK = {"model": "gpt-test", "choices": [{"message": {"content": "ok"}, "finish_reason": "stop"}]}
EXACT = RetryPolicy(max_retries=3, initial_delay=1.0, max_delay=4.0, jitter=0.0)


class FakeClock:
    def __init__(self) -> None:
        self.waits: list[float] = []

    def now(self) -> float:
        return 1_800_000_000.0

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)


def exception_chain(exc: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        yield current
        current = current.__cause__ or current.__context__


def assert_key_absent(exc: BaseException) -> None:
    for link in exception_chain(exc):
        assert FAKE_KEY not in str(link)
        assert FAKE_KEY not in repr(link)
        assert all(FAKE_KEY not in repr(arg) for arg in link.args)
        if isinstance(link, ProviderError):
            assert FAKE_KEY not in (link.body or "")
            assert FAKE_KEY not in link.message


@pytest.mark.anyio
async def test_waits_between_retries_follow_the_policy(respx_mock: respx.MockRouter) -> None:
    clock = FakeClock()
    route = respx_mock.post(URL).mock(
        side_effect=[
            httpx.Response(500),
            httpx.ConnectError("refused"),
            httpx.Response(429, headers={"retry-after": "2.5"}),
            httpx.Response(200, json=OK),
        ]
    )
    async with OpenAIChatDriver(BASE, api_key=FAKE_KEY, retry_policy=EXACT, clock=clock) as d:
        response = await d.complete(CALL)
    assert response.text == "ok"
    assert route.call_count == 4
    assert clock.waits == [1.0, 2.0, 2.5]


@pytest.mark.anyio
async def test_max_retries_overrides_the_policy_count(respx_mock: respx.MockRouter) -> None:
    clock = FakeClock()
    route = respx_mock.post(URL).mock(return_value=httpx.Response(503))
    async with OpenAIChatDriver(
        BASE, api_key=FAKE_KEY, retry_policy=EXACT, max_retries=1, clock=clock
    ) as driver:
        with pytest.raises(ProviderUnavailableError):
            await driver.complete(CALL)
    assert route.call_count == 2
    assert clock.waits == [1.0]


@pytest.mark.anyio
async def test_rate_limit_after_all_retries(respx_mock: respx.MockRouter) -> None:
    clock = FakeClock()
    body = {"error": {"message": "Rate limit reached", "type": "requests"}}
    respx_mock.post(URL).mock(
        return_value=httpx.Response(429, json=body, headers={"x-request-id": "req_rl"})
    )
    async with OpenAIChatDriver(BASE, api_key=FAKE_KEY, retry_policy=EXACT, clock=clock) as d:
        with pytest.raises(RateLimitError) as info:
            await d.complete(CALL)
    assert clock.waits == [1.0, 2.0, 4.0]
    assert info.value.status == 429
    assert info.value.request_id == "req_rl"
    assert info.value.message == "Rate limit reached"
    assert json.loads(info.value.body or "") == body


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("status", "error"),
    [(400, BadRequestError), (401, AuthenticationError), (404, BadRequestError)],
)
async def test_no_retry_on_client_errors(
    respx_mock: respx.MockRouter, status: int, error: type[ProviderError]
) -> None:
    clock = FakeClock()
    route = respx_mock.post(URL).mock(return_value=httpx.Response(status))
    async with OpenAIChatDriver(BASE, api_key=FAKE_KEY, retry_policy=EXACT, clock=clock) as d:
        with pytest.raises(error):
            await d.complete(CALL)
    assert route.call_count == 1
    assert clock.waits == []


@pytest.mark.anyio
async def test_context_length_error_carries_the_reported_numbers(
    respx_mock: respx.MockRouter,
) -> None:
    body = {
        "error": {
            "message": "This model's maximum context length is 16385 tokens. However, your "
            "messages resulted in 17020 tokens. Please reduce the length of the messages.",
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }
    respx_mock.post(URL).mock(
        return_value=httpx.Response(400, json=body, headers={"x-request-id": "req_ctx"})
    )
    async with OpenAIChatDriver(BASE, api_key=FAKE_KEY) as driver:
        with pytest.raises(ContextLengthExceededError) as info:
            await driver.complete(CALL)
    assert info.value.prompt_tokens == 17020
    assert info.value.context_limit == 16385
    assert info.value.status == 400
    assert info.value.request_id == "req_ctx"
    assert info.value.provider == "openai-chat"


def test_the_key_is_not_in_the_repr() -> None:
    driver = OpenAIChatDriver(BASE + "?api-key=QUERY-SECRET", api_key=FAKE_KEY)
    text = repr(driver)
    assert FAKE_KEY not in text
    assert "QUERY-SECRET" not in text
    assert text == "OpenAIChatDriver(base_url='https://llm.example/v1', api_key=<set>)"
    assert FAKE_KEY not in repr(vars(driver).get("_api_key"))


@pytest.mark.anyio
async def test_the_key_never_leaks_into_errors_or_logs(
    respx_mock: respx.MockRouter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    clock = FakeClock()
    echo = {"error": {"message": f"Incorrect API key provided: {FAKE_KEY}", "code": "bad_key"}}
    respx_mock.post(URL).mock(
        side_effect=[
            httpx.Response(503, text=f"upstream said {FAKE_KEY}"),
            httpx.Response(401, json=echo),
            httpx.ConnectError(f"cannot connect with {FAKE_KEY}"),
            httpx.ConnectError("refused"),
            httpx.Response(200, json={"error": {"message": f"late {FAKE_KEY}"}}),
            httpx.Response(200, content=f"not json {FAKE_KEY}".encode()),
        ]
    )
    policy = RetryPolicy(max_retries=1, jitter=0.0)
    raised: list[BaseException] = []
    async with OpenAIChatDriver(BASE, api_key=FAKE_KEY, retry_policy=policy, clock=clock) as d:
        for _ in range(4):
            with pytest.raises(ProviderError) as info:
                await d.complete(CALL)
            raised.append(info.value)
        assert FAKE_KEY not in repr(d)
        assert FAKE_KEY not in str(d)

    assert [type(e) for e in raised] == [
        AuthenticationError,  # 503 retried, then 401 echoing the key
        ProviderUnavailableError,  # connection failures, the first one naming the key
        ProviderUnavailableError,  # an error object with status 200
        ProviderResponseError,  # a body that is not JSON
    ]
    for exc in raised:
        assert_key_absent(exc)
    assert "[redacted]" in str(raised[0])
    assert any(r.name == "threadline.http" for r in caplog.records)
    for record in caplog.records:
        assert FAKE_KEY not in record.getMessage()
        assert FAKE_KEY not in repr(record.args)
    assert FAKE_KEY not in caplog.text


@pytest.mark.anyio
async def test_the_key_never_leaks_from_a_failing_stream(
    respx_mock: respx.MockRouter, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    error_event = json.dumps({"error": {"message": f"key {FAKE_KEY} revoked", "code": 401}})
    respx_mock.post(URL).mock(
        return_value=httpx.Response(
            200,
            content=f"data: {error_event}\n\n".encode(),
            headers={"content-type": "text/event-stream"},
        )
    )
    async with OpenAIChatDriver(BASE, api_key=FAKE_KEY) as driver:
        with pytest.raises(AuthenticationError) as info:
            async with driver.stream(CALL) as chunks:
                await anext(chunks)
    assert_key_absent(info.value)
    assert FAKE_KEY not in caplog.text


@pytest.mark.anyio
async def test_a_key_given_as_an_authorization_header_is_redacted_when_echoed(
    respx_mock: respx.MockRouter,
) -> None:
    echo = {"error": {"message": f"Incorrect API key provided: {FAKE_KEY}.", "code": "bad"}}
    respx_mock.post(URL).mock(return_value=httpx.Response(401, json=echo))
    driver = OpenAIChatDriver(BASE, default_headers={"Authorization": f"Bearer {FAKE_KEY}"})
    async with driver:
        with pytest.raises(AuthenticationError) as info:
            await driver.complete(CALL)
    assert_key_absent(info.value)
    assert "[redacted]" in str(info.value)
