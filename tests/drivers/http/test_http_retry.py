"""The shared retry policy: what retries, how long it waits, and that it never really sleeps."""

from __future__ import annotations

import email.utils
import logging
from collections.abc import AsyncIterator

import httpx
import pytest

from threadline import (
    AuthenticationError,
    BadRequestError,
    ContextLengthExceededError,
    InvalidRequestError,
    ProviderUnavailableError,
    RateLimitError,
)
from threadline.drivers import RetryPolicy
from threadline.drivers._http import (
    DEFAULT_TIMEOUT,
    build_http_client,
    is_retryable_status,
    retry_after_seconds,
    send_with_retries,
)
from threadline.drivers._http._errors import ErrorMapper

NOW = 1_800_000_000.0
EXACT = RetryPolicy(max_retries=4, initial_delay=0.5, max_delay=3.0, jitter=0.0)


class FakeClock:
    """Records every wait and moves time forward instead of sleeping."""

    def __init__(self) -> None:
        self.current = NOW
        self.waits: list[float] = []

    def now(self) -> float:
        return self.current

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.current += seconds


def scripted(*replies: httpx.Response | Exception) -> tuple[httpx.AsyncClient, list[httpx.Request]]:
    """A client whose transport answers with ``replies`` in order and records requests."""
    seen: list[httpx.Request] = []
    queue = list(replies)

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        reply = queue.pop(0)
        if isinstance(reply, Exception):
            raise reply
        return reply

    return httpx.AsyncClient(transport=httpx.MockTransport(handler)), seen


async def send(
    client: httpx.AsyncClient,
    policy: RetryPolicy = EXACT,
    clock: FakeClock | None = None,
    *,
    stream: bool = False,
) -> httpx.Response:
    request = client.build_request("POST", "https://llm.example/v1/chat/completions", json={})
    return await send_with_retries(
        client,
        request,
        policy=policy,
        errors=ErrorMapper("test"),
        clock=clock or FakeClock(),
        stream=stream,
        random_value=lambda: 0.5,
    )


# --- the pure policy -------------------------------------------------------------


@pytest.mark.parametrize("status", [408, 409, 429, 500, 502, 503, 504, 529, 599])
def test_transient_statuses_are_retryable(status: int) -> None:
    assert is_retryable_status(status)


@pytest.mark.parametrize("status", [200, 301, 400, 401, 403, 404, 413, 422, 451, 600])
def test_other_statuses_are_not_retryable(status: int) -> None:
    assert not is_retryable_status(status)


def test_backoff_doubles_and_is_capped() -> None:
    waits = [EXACT.backoff(n, random_value=0.9) for n in range(1, 6)]
    assert waits == [0.5, 1.0, 2.0, 3.0, 3.0]


def test_jitter_only_shortens_the_wait_within_its_share() -> None:
    policy = RetryPolicy(initial_delay=2.0, jitter=0.25)
    assert policy.backoff(1, random_value=0.0) == 2.0
    assert policy.backoff(1, random_value=0.5) == 1.75
    assert 1.5 <= policy.backoff(1, random_value=0.999999) < 2.0


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ({"retry-after-ms": "1500"}, 1.5),
        ({"retry-after": "7"}, 7.0),
        ({"retry-after": "0.25"}, 0.25),
        ({"retry-after-ms": "250", "retry-after": "9"}, 0.25),
        ({"retry-after-ms": "soon", "retry-after": "9"}, 9.0),
        ({"retry-after": email.utils.formatdate(NOW + 30, usegmt=True)}, 30.0),
        ({"retry-after": "Wed, 99 Foo 2024 xx"}, None),
        ({"retry-after": "nan"}, None),
        ({}, None),
    ],
)
def test_retry_after_headers_are_read(headers: dict[str, str], expected: float | None) -> None:
    assert retry_after_seconds(headers, now=NOW) == expected


def test_server_wait_is_used_instead_of_backoff_and_clamped() -> None:
    policy = RetryPolicy(max_retry_after=20.0)
    assert policy.delay(1, headers={"retry-after": "3"}, now=NOW, random_value=0.5) == 3.0
    assert policy.delay(1, headers={"retry-after": "3600"}, now=NOW, random_value=0.5) == 20.0
    past = email.utils.formatdate(NOW - 60, usegmt=True)
    assert policy.delay(1, headers={"retry-after": past}, now=NOW, random_value=0.5) == 0.0
    assert policy.delay(2, headers={}, now=NOW, random_value=0.0) == 1.0


@pytest.mark.parametrize(
    "kwargs",
    [{"max_retries": -1}, {"max_retries": 1.5}, {"initial_delay": -1}, {"jitter": 1.5}],
)
def test_nonsense_policies_are_refused(kwargs: dict[str, float]) -> None:
    with pytest.raises(InvalidRequestError, match="RetryPolicy"):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_built_client_has_model_friendly_timeouts_and_does_not_follow_redirects() -> None:
    client = build_http_client()
    assert client.timeout == DEFAULT_TIMEOUT
    assert client.timeout.read == 600.0
    assert client.timeout.connect == 5.0
    assert client.follow_redirects is False


# --- the send loop -----------------------------------------------------------------


@pytest.mark.anyio
async def test_transient_failures_are_retried_with_the_policy_waits() -> None:
    clock = FakeClock()
    client, seen = scripted(
        httpx.Response(500),
        httpx.Response(503),
        httpx.ConnectError("refused"),
        httpx.Response(502),
        httpx.Response(200, json={"ok": True}),
    )
    response = await send(client, clock=clock)
    assert response.json() == {"ok": True}
    assert len(seen) == 5
    assert clock.waits == [0.5, 1.0, 2.0, 3.0]


@pytest.mark.anyio
async def test_default_policy_waits_are_jittered_within_bounds() -> None:
    clock = FakeClock()
    client, _ = scripted(httpx.Response(503), httpx.Response(503), httpx.Response(200))
    await send_with_retries(
        client,
        client.build_request("POST", "https://llm.example/v1/x"),
        policy=RetryPolicy(),
        errors=ErrorMapper("test"),
        clock=clock,
    )
    first, second = clock.waits
    assert 0.375 <= first <= 0.5
    assert 0.75 <= second <= 1.0


@pytest.mark.anyio
async def test_retry_after_ms_and_retry_after_are_honoured_and_capped() -> None:
    clock = FakeClock()
    policy = RetryPolicy(max_retries=3, jitter=0.0, max_retry_after=10.0)
    client, _ = scripted(
        httpx.Response(429, headers={"retry-after-ms": "1250"}),
        httpx.Response(429, headers={"retry-after": "4"}),
        httpx.Response(503, headers={"retry-after": "86400"}),
        httpx.Response(200),
    )
    await send(client, policy, clock)
    assert clock.waits == [1.25, 4.0, 10.0]


@pytest.mark.anyio
async def test_retry_after_http_date_is_read_against_the_clock() -> None:
    clock = FakeClock()
    date = email.utils.formatdate(NOW + 12, usegmt=True)
    client, _ = scripted(httpx.Response(429, headers={"retry-after": date}), httpx.Response(200))
    await send(client, clock=clock)
    assert clock.waits == [12.0]


@pytest.mark.anyio
async def test_rate_limit_surfaces_after_the_last_retry() -> None:
    clock = FakeClock()
    policy = RetryPolicy(max_retries=2, jitter=0.0)
    client, seen = scripted(*(httpx.Response(429, json={"error": {"message": "slow"}}),) * 3)
    with pytest.raises(RateLimitError) as info:
        await send(client, policy, clock)
    assert len(seen) == 3
    assert clock.waits == [0.5, 1.0]
    assert info.value.status == 429
    assert info.value.message == "slow"


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("status", "error"),
    [(400, BadRequestError), (401, AuthenticationError), (403, AuthenticationError)],
)
async def test_client_errors_are_never_retried(status: int, error: type[Exception]) -> None:
    clock = FakeClock()
    client, seen = scripted(httpx.Response(status), httpx.Response(200))
    with pytest.raises(error):
        await send(client, clock=clock)
    assert len(seen) == 1
    assert clock.waits == []


@pytest.mark.anyio
async def test_a_5xx_saying_the_prompt_is_too_long_is_not_retried() -> None:
    clock = FakeClock()
    body = {"error": {"message": "Requested tokens (5000) exceed context window of 2048"}}
    client, seen = scripted(httpx.Response(500, json=body), httpx.Response(200))
    with pytest.raises(ContextLengthExceededError) as info:
        await send(client, clock=clock)
    assert len(seen) == 1
    assert (info.value.prompt_tokens, info.value.context_limit) == (5000, 2048)


@pytest.mark.anyio
async def test_connection_failures_become_provider_unavailable_after_retries() -> None:
    clock = FakeClock()
    client, seen = scripted(*(httpx.ConnectTimeout("connect timed out"),) * 5)
    with pytest.raises(ProviderUnavailableError, match="timed out") as info:
        await send(client, clock=clock)
    assert len(seen) == 5
    assert clock.waits == [0.5, 1.0, 2.0, 3.0]
    assert info.value.status is None


@pytest.mark.anyio
async def test_a_bad_url_scheme_is_not_retried() -> None:
    clock = FakeClock()
    client, seen = scripted(httpx.UnsupportedProtocol("no scheme"), httpx.Response(200))
    with pytest.raises(ProviderUnavailableError, match="no scheme"):
        await send(client, clock=clock)
    assert len(seen) == 1
    assert clock.waits == []


@pytest.mark.anyio
async def test_zero_retries_fails_at_once() -> None:
    clock = FakeClock()
    client, seen = scripted(httpx.Response(503), httpx.Response(200))
    with pytest.raises(ProviderUnavailableError):
        await send(client, RetryPolicy(max_retries=0), clock)
    assert len(seen) == 1
    assert clock.waits == []


class _Body(httpx.AsyncByteStream):
    """A response body that records whether anyone read it."""

    def __init__(self, chunks: list[bytes]) -> None:
        self.chunks = chunks
        self.read = False
        self.closed = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        self.read = True
        for chunk in self.chunks:
            yield chunk

    async def aclose(self) -> None:
        self.closed = True


@pytest.mark.anyio
async def test_a_stream_is_retried_before_its_body_and_returned_unread() -> None:
    clock = FakeClock()
    failed_body = _Body([b'{"error": {"message": "busy"}}'])
    good_body = _Body([b"data: x\n\n"])
    client, seen = scripted(
        httpx.Response(503, stream=failed_body), httpx.Response(200, stream=good_body)
    )
    response = await send(client, clock=clock, stream=True)
    assert len(seen) == 2
    assert clock.waits == [0.5]
    assert failed_body.closed
    assert not good_body.read
    assert await response.aread() == b"data: x\n\n"
    await response.aclose()


@pytest.mark.anyio
async def test_retries_are_logged_without_headers_or_query(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG, logger="threadline.http")
    client, _ = scripted(
        httpx.Response(429, headers={"x-request-id": "req_42", "retry-after": "1"}),
        httpx.Response(200),
    )
    request = client.build_request(
        "POST",
        "https://llm.example/v1/chat/completions?api-key=QUERYSECRET",
        headers={"authorization": "Bearer HEADERSECRET"},
    )
    await send_with_retries(
        client, request, policy=EXACT, errors=ErrorMapper("test"), clock=FakeClock()
    )
    (record,) = [r for r in caplog.records if r.name == "threadline.http"]
    assert record.levelno == logging.INFO
    text = record.getMessage()
    assert "POST https://llm.example/v1/chat/completions" in text
    assert "status 429" in text
    assert "req_42" in text
    assert "SECRET" not in text
