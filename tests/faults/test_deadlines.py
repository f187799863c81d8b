"""Deadlines against a server that never stops talking, or never starts, for real.

httpx's timeouts bound each read: a server trickling SSE comments every 0.25 s
keeps a 1 s read timeout happy forever. The request's own ``timeout`` bounds a
provider call as a whole and ``first_token_timeout`` a stream's wait for its
first piece of reply, on asyncio and trio alike.
"""

from __future__ import annotations

import time

import anyio
import httpx
import pytest

from threadline import (
    Agent,
    Client,
    InvalidRequestError,
    Message,
    Model,
    ProviderUnavailableError,
    Request,
    RequestSettings,
    TextDelta,
)
from threadline.drivers import OpenAIChatDriver, RequestTimeoutError, RetryPolicy

from .server import FaultServer, Sse, Stall, Status, Trickle
from .test_provider_faults import KEY, chunk

pytestmark = pytest.mark.anyio

NO_RETRY = RetryPolicy(max_retries=0)
ONE_RETRY = RetryPolicy(max_retries=1, initial_delay=0.0, max_delay=0.0, jitter=0.0)


async def client_for(server: FaultServer, retry_policy: RetryPolicy = NO_RETRY) -> Client:
    # Reads time out after 1 s: the trickle below never lets them.
    driver = OpenAIChatDriver(
        server.url, api_key=KEY, retry_policy=retry_policy, timeout=httpx.Timeout(1.0)
    )
    return Client(driver, default_model=Model("fault-model"))


def ask(client: Client) -> Request:
    return client.request().with_messages([Message.user("hi")])


async def drain(request: Request) -> list[str]:
    pieces = []
    async with request.stream() as events:
        async for event in events:
            if isinstance(event, TextDelta):
                pieces.append(event.text)
    return pieces


async def test_a_trickling_stream_ends_at_the_timeout(server: FaultServer) -> None:
    server.script(Trickle(every=0.25, seconds=30))
    async with await client_for(server) as client:
        started = time.monotonic()
        with pytest.raises(RequestTimeoutError) as caught:
            await drain(ask(client).with_timeout(1.0))
        elapsed = time.monotonic() - started
    assert 0.9 < elapsed < 12, f"the request ended after {elapsed:.1f} s"
    error = caught.value
    assert isinstance(error, ProviderUnavailableError)
    assert (error.limit, error.seconds) == ("timeout", 1.0)
    assert str(error) == "the provider did not finish within the timeout of 1 s (openai-chat)"


async def test_a_stream_with_no_reply_ends_at_the_first_token_timeout(server: FaultServer) -> None:
    server.script(Trickle(every=0.25, seconds=30))
    async with await client_for(server) as client:
        started = time.monotonic()
        with pytest.raises(RequestTimeoutError) as caught:
            await drain(ask(client).with_first_token_timeout(0.5).with_timeout(20))
        elapsed = time.monotonic() - started
    assert elapsed < 12, f"the request ended after {elapsed:.1f} s"
    assert caught.value.limit == "first_token_timeout"
    assert "first_token_timeout of 0.5 s" in str(caught.value)


async def test_a_first_token_ends_the_first_token_limit_but_not_the_whole(
    server: FaultServer,
) -> None:
    server.script(Trickle(every=0.25, seconds=30, first=[chunk("Hel")]))
    async with await client_for(server) as client:
        # The first chunk comes at once, but a loaded machine may take a second to
        # deliver it: the first-token limit is generous, and still ends the request
        # before the whole timeout if the first token did not end it.
        request = ask(client).with_first_token_timeout(2.0).with_timeout(4.0)
        pieces: list[str] = []

        async def collect() -> None:
            async with request.stream() as events:
                async for event in events:
                    if isinstance(event, TextDelta):
                        pieces.append(event.text)

        with pytest.raises(RequestTimeoutError) as caught:
            await collect()
    assert pieces == ["Hel"]
    assert caught.value.limit == "timeout"


async def test_a_stalled_server_ends_a_plain_run_at_the_timeout(server: FaultServer) -> None:
    server.script(Stall(seconds=10))
    async with await client_for(server) as client:
        started = time.monotonic()
        with pytest.raises(RequestTimeoutError):
            await ask(client).with_timeout(0.5).run()
    assert time.monotonic() - started < 3


async def test_a_stream_stalled_before_its_headers_ends_at_the_first_token_timeout(
    server: FaultServer,
) -> None:
    server.script(Stall(seconds=10))
    async with await client_for(server) as client:
        with pytest.raises(RequestTimeoutError) as caught:
            await drain(ask(client).with_first_token_timeout(0.3))
    assert caught.value.limit == "first_token_timeout"


async def test_the_timeout_covers_the_drivers_retries(server: FaultServer) -> None:
    server.script(Status(503, "busy"), Stall(seconds=10))
    async with await client_for(server, ONE_RETRY) as client:
        with pytest.raises(RequestTimeoutError):
            await ask(client).with_timeout(0.8).run()
    assert len(server.requests) == 2


async def test_the_deadline_never_fires_inside_the_callers_own_code(server: FaultServer) -> None:
    # The caller holds the first delta past the whole limit: its own wait
    # finishes, and the limit fires at the next wait on the provider instead.
    server.script(Trickle(every=0.1, seconds=30, first=[chunk("Hel")]))
    finished_own_work = []

    async def slow_caller(request: Request) -> None:
        async with request.stream() as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    await anyio.sleep(0.6)
                    finished_own_work.append(event.text)

    async with await client_for(server) as client:
        with pytest.raises(RequestTimeoutError):
            await slow_caller(ask(client).with_timeout(0.3))
    assert finished_own_work == ["Hel"]


async def test_a_stream_inside_its_limits_is_untouched(server: FaultServer) -> None:
    events = [chunk("Hel"), chunk("lo"), chunk(None, "stop"), b"data: [DONE]\n\n"]
    server.script(Sse(events, pause=0.05))
    async with await client_for(server) as client:
        pieces = await drain(ask(client).with_timeout(10).with_first_token_timeout(5))
    assert "".join(pieces) == "Hello"


async def test_an_agent_default_timeout_reaches_its_conversations(server: FaultServer) -> None:
    server.script(Trickle(every=0.25, seconds=30))
    async with await client_for(server) as client:
        agent = Agent(client, settings=RequestSettings(timeout=0.5))
        with anyio.fail_after(5), pytest.raises(RequestTimeoutError):
            async with agent.stream("hi") as events:
                _ = [event async for event in events]


@pytest.mark.parametrize("name", ["timeout", "first_token_timeout"])
@pytest.mark.parametrize("value", [0, -1.5, float("inf"), "3", True])
def test_a_deadline_must_be_a_positive_number_of_seconds(name: str, value: object) -> None:
    with pytest.raises(InvalidRequestError, match=f"^{name} must be a positive number"):
        RequestSettings(**{name: value})  # type: ignore[arg-type]
