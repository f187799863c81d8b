"""A server that echoes the API key inside a response the driver cannot parse: no copy of the
key may be reachable from the error raised, through its chain, attributes or traceback."""

from __future__ import annotations

import logging

import pytest

from threadline import NOT_GIVEN, Client, Message, Model, ProviderError, ThreadlineError
from threadline.drivers import (
    AnthropicDriver,
    GeminiDriver,
    HTTPConnection,
    OpenAIChatDriver,
    OpenAIResponsesDriver,
    RetryPolicy,
)

from .reach import assert_unreachable, reachable_texts
from .server import (
    Act,
    FaultServer,
    Html,
    Json,
    Raw,
    Reset,
    Status,
    chunked,
    response_head,
    sse_event,
)

pytestmark = pytest.mark.anyio

KEY = "sk-echoed-secret-0123456789abcdef"
SECRET = KEY.encode()
MODEL = Model("fault-model", context_size=8192)
STREAM_HEAD = response_head(200, {"content-type": "text/event-stream"})
CHUNKED_HEAD = response_head(
    200, {"content-type": "text/event-stream", "transfer-encoding": "chunked"}
)
FIRST_EVENT = sse_event({"id": "c", "model": "m", "choices": [{"index": 0, "delta": {}}]})

ECHOES: dict[str, Act] = {
    # httpx's RemoteProtocolError quotes the line it could not parse.
    "an illegal header line": Raw([b"HTTP/1.1 200 OK\r\nan echo of " + SECRET + b"\r\n\r\n"]),
    "an illegal status line": Raw([b"HTTP/1.1 2x0 " + SECRET + b"\r\n\r\n"]),
    "an illegal chunk header mid-stream": Raw(
        [CHUNKED_HEAD, chunked(FIRST_EVENT)[: -len(b"0\r\n\r\n")], b"zz " + SECRET + b"\r\n"]
    ),
    # A JSONDecodeError keeps the whole body in its doc.
    "a body that is not JSON": Status(200, f"upstream: {KEY}", {"content-type": "text/plain"}),
    "an HTML page": Html(f"<html><body>proxy login for {KEY}</body></html>"),
    "a stream event that is not JSON": Raw([STREAM_HEAD, b"data: oops " + SECRET + b"\n\n"]),
    "an error event that is not JSON": Raw(
        [STREAM_HEAD, b"event: error\ndata: denied " + SECRET + b"\n\n"]
    ),
    "a reset after echoing the key": Reset(before=STREAM_HEAD + b"data: {" + SECRET),
    "a 401 echoing the key": Json({"error": {"message": f"bad key {KEY}"}}, 401),
    "a megabyte error echoing the key at both ends": Json(
        {"error": {"message": f"{KEY} {'x' * 1_000_000} {KEY}"}}, 400
    ),
    "a 502 page echoing the key": Status(502, f"<h1>bad gateway</h1>{KEY}", {}),
}


def drivers(url: str, timeout: object = NOT_GIVEN) -> dict[str, object]:
    policy = RetryPolicy(max_retries=0)
    connection = HTTPConnection(api_key=KEY, retry_policy=policy, timeout=timeout)  # type: ignore[arg-type]
    return {
        "openai": OpenAIChatDriver(url, connection=connection),
        "anthropic": AnthropicDriver(base_url=url, connection=connection),
        "openai-responses": OpenAIResponsesDriver(url, connection=connection),
        "gemini": GeminiDriver(base_url=url, connection=connection),
    }


async def consume(driver: object, mode: str) -> None:
    async with Client(driver, default_model=MODEL) as client:  # type: ignore[arg-type]
        request = client.request().with_messages([Message.user("hi")])
        if mode == "run":
            await request.run()
            return
        async with request.stream() as events:
            async for _ in events:
                pass


async def failure(driver: object, mode: str) -> ProviderError:
    with pytest.raises(ProviderError) as caught:
        await consume(driver, mode)
    return caught.value


@pytest.mark.parametrize("mode", ["run", "stream"])
@pytest.mark.parametrize("driver_name", ["openai", "anthropic", "openai-responses", "gemini"])
@pytest.mark.parametrize("echo", sorted(ECHOES))
async def test_no_copy_of_an_echoed_key_is_reachable_from_the_error(
    server: FaultServer,
    caplog: pytest.LogCaptureFixture,
    echo: str,
    driver_name: str,
    mode: str,
) -> None:
    server.script(ECHOES[echo])
    caplog.set_level(logging.DEBUG, logger="threadline")
    # aiohttp (the default pool on asyncio) waits out the read time-out on an illegal
    # chunk header, quoting nothing: a short one here (test_http_aiohttp proves it).
    timeout = 2.0 if echo == "an illegal chunk header mid-stream" else NOT_GIVEN
    error = await failure(drivers(server.url, timeout=timeout)[driver_name], mode)
    assert_unreachable(KEY, error)
    logging.getLogger("an.application").error("the model failed", exc_info=error)
    # threadline's log lines and an application's logging.exception; httpcore's own DEBUG
    # trace quotes what the server sent, which is the server's word, not threadline's.
    ours = [r for r in caplog.records if r.name.startswith(("threadline", "an.application"))]
    assert ours
    assert all(KEY not in caplog.handler.format(record) for record in ours)


async def test_a_transport_failure_keeps_no_request_and_so_no_key_header(
    server: FaultServer,
) -> None:
    # No echo at all: httpx's exception still holds the request, whose headers hold the key.
    server.script(Reset())
    error = await failure(drivers(server.url)["openai"], "run")
    assert error.__cause__ is not None  # a copy of httpx's error, of its class
    assert_unreachable(KEY, error)


def test_the_walk_finds_what_is_hidden_in_a_chain() -> None:
    # The helper itself can fail: a key in a suppressed context's attribute is found.
    hidden = ValueError("outer")
    inner = KeyError("inner")
    inner.doc = {"headers": [("authorization", f"Bearer {KEY}".encode())]}  # type: ignore[attr-defined]
    hidden.__context__ = inner
    hidden.__suppress_context__ = True
    group = ExceptionGroup("many", [ThreadlineError("fine"), hidden])
    paths = [path for path, text in reachable_texts(group) if SECRET in _as_bytes(text)]
    assert paths
    assert all("exceptions" in path and "__context__" in path for path in paths)
    with pytest.raises(AssertionError, match="reachable at"):
        assert_unreachable(KEY, group)


def _as_bytes(text: str | bytes) -> bytes:
    return text.encode() if isinstance(text, str) else text
