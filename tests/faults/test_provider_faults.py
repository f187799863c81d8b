"""The OpenAI-compatible driver against a server that misbehaves on the wire, for real."""

from __future__ import annotations

import pytest

from threadline import (
    AuthenticationError,
    Client,
    Message,
    Model,
    ProviderUnavailableError,
    RateLimitError,
    TextDelta,
)
from threadline.drivers import OpenAIChatDriver, RetryPolicy

from .server import FaultServer, Json, Reset, Sse, Status, sse_event

pytestmark = pytest.mark.anyio

KEY = "sk-fault-suite-0000000000000000"
FAST = RetryPolicy(max_retries=2, initial_delay=0.0, max_delay=0.0, jitter=0.0)


def completion(text: str) -> dict[str, object]:
    return {
        "id": "chatcmpl-1",
        "model": "fault-model",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": "stop"}
        ],
        "usage": {"prompt_tokens": 9, "completion_tokens": 2, "total_tokens": 11},
    }


def chunk(text: str | None, finish: str | None = None) -> bytes:
    delta = {"content": text} if text is not None else {}
    choice = {"index": 0, "delta": delta, "finish_reason": finish}
    return sse_event({"id": "c", "model": "fault-model", "choices": [choice]})


async def ask(server: FaultServer) -> str:
    driver = OpenAIChatDriver(server.url, api_key=KEY, retry_policy=FAST)
    async with Client(driver, default_model=Model("fault-model")) as client:
        return (await client.request().with_messages([Message.user("hi")]).run()).text


@pytest.mark.parametrize(
    "retry_after", ["0", "0.0", "Wed, 21 Oct 2015 07:28:00 GMT", "not-a-date", ""]
)
async def test_a_429_in_any_retry_after_form_is_retried(
    server: FaultServer, retry_after: str
) -> None:
    server.script(Status(429, "slow down", {"retry-after": retry_after}), Json(completion("ok")))
    assert await ask(server) == "ok"
    assert len(server.requests) == 2


async def test_5xx_then_success_is_retried(server: FaultServer) -> None:
    server.script(Status(502, "<html>bad gateway</html>"), Json(completion("fine")))
    assert await ask(server) == "fine"


async def test_a_reset_before_the_response_is_retried_then_reported(server: FaultServer) -> None:
    server.script(Reset(), Reset(), Reset())
    with pytest.raises(ProviderUnavailableError):
        await ask(server)
    assert len(server.requests) == 3


async def test_rate_limit_after_every_retry_is_a_rate_limit_error(server: FaultServer) -> None:
    server.script(*[Status(429, "no", {"retry-after": "0"})] * 3)
    with pytest.raises(RateLimitError):
        await ask(server)


async def test_an_echoed_key_never_reaches_the_error_text(server: FaultServer) -> None:
    server.script(Json({"error": {"message": f"bad key {KEY}"}}, status=401))
    with pytest.raises(AuthenticationError) as caught:
        await ask(server)
    assert KEY not in str(caught.value)
    assert KEY not in repr(caught.value)


async def test_a_clean_stream_gives_its_text(server: FaultServer) -> None:
    server.script(Sse([chunk("Hel"), chunk("lo"), chunk(None, "stop"), b"data: [DONE]\n\n"]))
    driver = OpenAIChatDriver(server.url, api_key=KEY, retry_policy=FAST)
    async with Client(driver, default_model=Model("fault-model")) as client:
        request = client.request().with_messages([Message.user("hi")])
        pieces = []
        async with request.stream() as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    pieces.append(event.text)
    assert "".join(pieces) == "Hello"
