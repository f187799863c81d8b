"""``transport="aiohttp"``: both HTTP drivers send through aiohttp's pool, on asyncio only.

respx patches httpx's own transport, which this one replaces, so these tests
talk to a real HTTP/1.1 server on 127.0.0.1 (the standard library's, in a thread).
"""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anyio
import httpx
import pytest

from threadline import (
    Client,
    InvalidRequestError,
    Message,
    Model,
    ProviderUnavailableError,
    TextDelta,
)
from threadline.drivers import (
    AnthropicDriver,
    HTTPConnection,
    OpenAIChatDriver,
    ProviderCall,
    ResponseDone,
)
from threadline.drivers._http import DEFAULT_LIMITS
from threadline.drivers._http._transport import AutoTransport

pytest.importorskip("httpx_aiohttp", reason="the aiohttp extra: pip install -e '.[aiohttp]'")

from threadline.drivers._http._aiohttp import SafeAiohttpTransport

KEY = "sk-FAKE-aiohttp-test-key-0000000000"
MODEL = Model("m", context_size=8192)
WORDS = ["Lis", "bon", "."]


def _chat_answer(body: dict[str, Any]) -> tuple[str, bytes]:
    if not body.get("stream"):
        answer = {
            "model": body["model"],
            "choices": [{"message": {"content": "".join(WORDS)}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 7, "completion_tokens": 3},
        }
        return "application/json", json.dumps(answer).encode()
    events = [{"choices": [{"index": 0, "delta": {"content": word}}]} for word in WORDS]
    events.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
    text = "".join(f"data: {json.dumps(event)}\n\n" for event in events) + "data: [DONE]\n\n"
    return "text/event-stream", text.encode()


def _messages_answer(body: dict[str, Any]) -> tuple[str, bytes]:
    if body.get("stream"):
        start = {"type": "message_start", "message": {"usage": {"input_tokens": 7}}}
        block = {"type": "text", "text": ""}
        events: list[dict[str, Any]] = [
            start,
            {"type": "content_block_start", "index": 0, "content_block": block},
        ]
        events += [
            {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": w}}
            for w in WORDS
        ]
        events.append({"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {}})
        events.append({"type": "message_stop"})
        text = "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)
        return "text/event-stream", text.encode()
    answer = {
        "type": "message",
        "role": "assistant",
        "model": body["model"],
        "content": [{"type": "text", "text": "".join(WORDS)}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 7, "output_tokens": 3},
    }
    return "application/json", json.dumps(answer).encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as model servers do
    seen: list[dict[str, str]]

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        self.seen.append({name.lower(): value for name, value in self.headers.items()})
        status, kind = 200, "application/json"
        if self.path.startswith("/down/"):
            status, payload = 503, b'{"error": {"message": "overloaded, try later"}}'
        elif self.path.endswith("/v1/messages"):
            kind, payload = _messages_answer(body)
        else:
            kind, payload = _chat_answer(body)
        self.send_response(status)
        self.send_header("content-type", kind)
        self.send_header("content-length", str(len(payload)))
        self.send_header("x-request-id", "req_aiohttp")
        self.end_headers()
        self.wfile.write(payload)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def server() -> Iterator[tuple[str, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []
    handler = type("Handler", (_Handler,), {"seen": seen})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}", seen
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join()


@pytest.mark.anyio
async def test_openai_driver_runs_and_streams_over_aiohttp(
    server: tuple[str, list[dict[str, str]]],
) -> None:
    base, seen = server
    driver = OpenAIChatDriver(f"{base}/v1", api_key=KEY, transport="aiohttp")
    async with Client(driver, default_model=MODEL) as client:
        result = await client.request().with_prompt("Capital of Portugal?").run()
        async with client.request().with_prompt("Again, streamed").stream() as events:
            streamed = [event.text async for event in events if isinstance(event, TextDelta)]
        # Sending many at once reuses the pool: every answer arrives whole.
        answers = [await client.request().with_prompt(f"{n}").run() for n in range(5)]
    assert type(driver._client).__name__ == "AiohttpClient"  # the pool really is aiohttp's
    assert (result.text, result.usage.input_tokens, result.response.request_id) == (
        "Lisbon.",
        7,
        "req_aiohttp",
    )
    assert streamed == WORDS
    assert {answer.text for answer in answers} == {"Lisbon."}
    assert seen[0]["authorization"] == f"Bearer {KEY}"
    assert seen[1]["accept"] == "text/event-stream"


@pytest.mark.anyio
async def test_anthropic_driver_completes_and_streams_over_aiohttp(
    server: tuple[str, list[dict[str, str]]],
) -> None:
    base, seen = server
    call = ProviderCall(model=MODEL, messages=(Message.user("Capital of Portugal?"),))
    async with AnthropicDriver(api_key=KEY, base_url=base, transport="aiohttp") as driver:
        response = await driver.complete(call)
        async with driver.stream(call) as chunks:
            last = [chunk async for chunk in chunks][-1]
    assert response.text == "Lisbon."
    assert response.usage.output_tokens == 3
    assert isinstance(last, ResponseDone)
    assert last.response.text == "Lisbon."
    assert seen[0]["x-api-key"] == KEY


@pytest.mark.anyio
async def test_aiohttp_errors_map_to_the_same_tree(
    server: tuple[str, list[dict[str, str]]],
) -> None:
    base, _ = server
    call = ProviderCall(model=MODEL, messages=(Message.user("hi"),))
    async with OpenAIChatDriver(
        f"{base}/down/v1", api_key=KEY, transport="aiohttp", max_retries=0
    ) as driver:
        with pytest.raises(ProviderUnavailableError) as refused:
            await driver.complete(call)
    assert (refused.value.status, refused.value.request_id) == (503, "req_aiohttp")
    assert "overloaded" in str(refused.value.body)

    # Nothing listens on the port any more: a connection failure, not an aiohttp error.
    async with OpenAIChatDriver(
        "http://127.0.0.1:9/v1", api_key=KEY, transport="aiohttp", max_retries=0
    ) as driver:
        with pytest.raises(ProviderUnavailableError) as unreachable:
            await driver.complete(call)
    assert unreachable.value.status is None
    assert KEY not in repr(unreachable.value)


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_aiohttp_refuses_trio_naming_the_cause(
    server: tuple[str, list[dict[str, str]]],
) -> None:
    base, seen = server
    call = ProviderCall(model=MODEL, messages=(Message.user("hi"),))
    async with OpenAIChatDriver(f"{base}/v1", transport="aiohttp") as driver:
        with pytest.raises(
            InvalidRequestError, match=r"only on asyncio.*transport='httpx' or the default 'auto'"
        ):
            await driver.complete(call)
    assert seen == []


def test_without_the_extra_the_error_names_the_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "httpx_aiohttp", None)  # as if not installed
    monkeypatch.delitem(sys.modules, "threadline.drivers._http._aiohttp", raising=False)
    for build in (
        lambda: OpenAIChatDriver(transport="aiohttp"),
        lambda: AnthropicDriver(transport="aiohttp"),
    ):
        with pytest.raises(ImportError, match=r"pip install 'threadline\[aiohttp\]'"):
            build()


def test_transport_is_checked_when_the_driver_is_built() -> None:
    with pytest.raises(InvalidRequestError, match="'auto', 'httpx' or 'aiohttp', not 'curl'"):
        OpenAIChatDriver(transport="curl")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="http_client="):
        AnthropicDriver(http_client=httpx.AsyncClient(), transport="aiohttp")


# --- the default, transport="auto" ----------------------------------------------------------


def _pool_of(driver: OpenAIChatDriver) -> httpx.AsyncBaseTransport:
    transport = driver._client._transport
    assert isinstance(transport, AutoTransport)
    return transport.pool()


def test_the_default_pool_limits_are_httpx_own() -> None:
    # Measured: httpcore scans every pooled connection for every request, and a
    # pool of 100 kept-alive connections cost 2.7x the CPU of httpx's 20 (bench_request).
    assert httpx.Limits(max_connections=100, max_keepalive_connections=20) == DEFAULT_LIMITS
    assert HTTPConnection().transport == "auto"


@pytest.mark.anyio
async def test_the_default_sends_through_aiohttp_on_asyncio(
    server: tuple[str, list[dict[str, str]]],
) -> None:
    base, seen = server
    driver = OpenAIChatDriver(f"{base}/v1", api_key=KEY)
    async with Client(driver, default_model=MODEL) as client:
        result = await client.request().with_prompt("Capital of Portugal?").run()
        assert isinstance(_pool_of(driver), SafeAiohttpTransport)
    assert result.text == "Lisbon."
    assert seen[0]["authorization"] == f"Bearer {KEY}"


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_the_default_falls_back_to_httpx_on_trio(
    server: tuple[str, list[dict[str, str]]],
) -> None:
    base, _ = server
    driver = OpenAIChatDriver(f"{base}/v1", api_key=KEY)
    async with Client(driver, default_model=MODEL) as client:
        result = await client.request().with_prompt("Capital of Portugal?").run()
        async with client.request().with_prompt("Again, streamed").stream() as events:
            streamed = [event.text async for event in events if isinstance(event, TextDelta)]
        assert isinstance(_pool_of(driver), httpx.AsyncHTTPTransport)
    assert (result.text, streamed) == ("Lisbon.", WORDS)


@pytest.mark.anyio
async def test_the_default_falls_back_to_httpx_without_the_package(
    server: tuple[str, list[dict[str, str]]], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "httpx_aiohttp", None)  # as if not installed
    base, _ = server
    driver = OpenAIChatDriver(f"{base}/v1", api_key=KEY)  # built without an error
    async with Client(driver, default_model=MODEL) as client:
        result = await client.request().with_prompt("Capital of Portugal?").run()
        assert isinstance(_pool_of(driver), httpx.AsyncHTTPTransport)
    assert result.text == "Lisbon."


def test_building_a_driver_does_not_import_aiohttp() -> None:
    # aiohttp takes ~200 ms to import: the first request on asyncio pays it, not a
    # driver that is built and never used (a CLI's --help, a test).
    code = (
        "import sys; from threadline.drivers import OpenAIChatDriver; "
        "OpenAIChatDriver('http://127.0.0.1:9/v1'); print('aiohttp' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"


async def _read_all(http: httpx.AsyncClient, port: int) -> None:
    async with http.stream("POST", f"http://127.0.0.1:{port}/", content=b"{}") as response:
        async for _ in response.aiter_bytes():
            pass


@pytest.mark.anyio
async def test_an_aiohttp_failure_arrives_as_an_httpx_error_quoting_nothing() -> None:
    secret = b"sk-ECHOED-0000"

    async def answer_badly(reader: Any, writer: Any) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n7\r\ndata: 1\r\nzz " + secret + b"\r\n"
        )
        await writer.drain()
        writer.close()
        await writer.wait_closed()

    import asyncio  # the test's own server: asyncio is the backend under test

    listener = await asyncio.start_server(answer_badly, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    async with (
        listener,
        httpx.AsyncClient(transport=AutoTransport(ssl.create_default_context())) as http,
    ):
        with pytest.raises(httpx.RemoteProtocolError) as caught:
            await _read_all(http, port)
    assert "ClientResponseError" in str(caught.value)
    assert secret.decode() not in str(caught.value)
    assert caught.value.__context__ is None


@pytest.mark.anyio
async def test_a_body_that_stops_arriving_ends_within_the_read_timeout() -> None:
    # aiohttp's own read time-out does not fire once its parser has refused a chunk
    # header that came after the body began; the transport enforces httpx's.
    import asyncio

    async def begin_then_break(reader: Any, writer: Any) -> None:
        await reader.readuntil(b"\r\n\r\n")
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
            b"transfer-encoding: chunked\r\n\r\n7\r\ndata: 1\r\n"
        )
        await writer.drain()
        await anyio.wait_all_tasks_blocked()
        writer.write(b"zz not a chunk size\r\n")
        await reader.read()  # the client's close
        writer.close()

    listener = await asyncio.start_server(begin_then_break, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    transport = AutoTransport(ssl.create_default_context())
    async with listener, httpx.AsyncClient(transport=transport, timeout=0.5) as http:
        with anyio.fail_after(10), pytest.raises(httpx.TransportError):
            await _read_all(http, port)
