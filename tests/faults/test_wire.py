"""The HTTP drivers against a server that garbles the wire, for real, on asyncio and trio:
byte order marks and UTF-8 characters split across TCP segments, an HTML page where a
stream belongs, a reset mid-stream, a megabyte of error text."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

from threadline import (
    BadRequestError,
    Client,
    Message,
    Model,
    ProviderError,
    ProviderResponseError,
    ProviderUnavailableError,
    TextDelta,
)
from threadline.drivers import (
    AnthropicDriver,
    GeminiDriver,
    OpenAIChatDriver,
    OpenAIResponsesDriver,
    RetryPolicy,
)

from .server import FaultServer, Html, Json, Sse, sse_event

pytestmark = pytest.mark.anyio

KEY = "sk-fault-wire-0123456789abcdef"
NO_RETRY = RetryPolicy(max_retries=0)
MODEL = Model("fault-model", context_size=8192)
PAUSE = 0.02
"""Between the server's writes, so that each piece arrives as a read of its own."""


def openai_events(*texts: str) -> list[bytes]:
    def chunk(delta: dict[str, str], finish: str | None = None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return sse_event({"id": "c", "model": "fault-model", "choices": [choice]})

    return [*(chunk({"content": text}) for text in texts), chunk({}, "stop"), b"data: [DONE]\n\n"]


def anthropic_events(*texts: str) -> list[bytes]:
    def event(kind: str, **fields: Any) -> bytes:
        return sse_event({"type": kind, **fields}, event=kind)

    message = {"id": "msg_1", "type": "message", "role": "assistant", "model": "fault-model"}
    usage = {"input_tokens": 3, "output_tokens": 1}
    return [
        event("message_start", message={**message, "content": [], "usage": usage}),
        event("content_block_start", index=0, content_block={"type": "text", "text": ""}),
        *(
            event("content_block_delta", index=0, delta={"type": "text_delta", "text": text})
            for text in texts
        ),
        event("content_block_stop", index=0),
        event("message_delta", delta={"stop_reason": "end_turn"}, usage={"output_tokens": 2}),
        event("message_stop"),
    ]


def responses_events(*texts: str) -> list[bytes]:
    def event(kind: str, **fields: Any) -> bytes:
        return sse_event({"type": kind, **fields}, event=kind)

    item = {"id": "msg_1", "type": "message", "role": "assistant", "content": []}
    whole = {**item, "content": [{"type": "output_text", "text": "".join(texts)}]}
    done = {"object": "response", "status": "completed", "model": "fault-model", "output": [whole]}
    return [
        event("response.created", response={**done, "status": "in_progress", "output": []}),
        event("response.output_item.added", output_index=0, item=item),
        *(
            event("response.output_text.delta", output_index=0, item_id="msg_1", delta=text)
            for text in texts
        ),
        event("response.output_item.done", output_index=0, item=whole),
        event("response.completed", response=done),
    ]


def gemini_events(*texts: str) -> list[bytes]:
    def chunk(parts: list[dict[str, Any]], finish: str | None = None) -> bytes:
        candidate: dict[str, Any] = {"content": {"role": "model", "parts": parts}, "index": 0}
        if finish:
            candidate["finishReason"] = finish
        return sse_event({"candidates": [candidate], "modelVersion": "fault-model"})

    usage = {"promptTokenCount": 3, "candidatesTokenCount": 2, "totalTokenCount": 5}
    last = chunk([{"text": "", "thoughtSignature": "c2lnbmF0dXJl"}], "STOP")
    last = last.replace(b"}\n\n", b',"usageMetadata":' + json.dumps(usage).encode() + b"}\n\n", 1)
    return [*(chunk([{"text": text}]) for text in texts), last]


@dataclass(frozen=True)
class Wire:
    """One HTTP driver and the events its protocol streams."""

    name: str
    driver: Callable[..., Any]
    events: Callable[..., list[bytes]]
    opening_events: int
    """How many events a stream sends before its first text."""


WIRES = {
    "openai": Wire(
        "openai",
        lambda url, **options: OpenAIChatDriver(url, api_key=KEY, retry_policy=NO_RETRY, **options),
        openai_events,
        0,
    ),
    "anthropic": Wire(
        "anthropic",
        lambda url, **options: AnthropicDriver(
            base_url=url, api_key=KEY, retry_policy=NO_RETRY, **options
        ),
        anthropic_events,
        2,
    ),
    "openai-responses": Wire(
        "openai-responses",
        lambda url, **options: OpenAIResponsesDriver(
            url, api_key=KEY, retry_policy=NO_RETRY, **options
        ),
        responses_events,
        2,
    ),
    "gemini": Wire(
        "gemini",
        lambda url, **options: GeminiDriver(
            base_url=url, api_key=KEY, retry_policy=NO_RETRY, **options
        ),
        gemini_events,
        0,
    ),
}


@pytest.fixture(params=sorted(WIRES))
def wire(request: pytest.FixtureRequest) -> Wire:
    return WIRES[request.param]


async def streamed_text(wire: Wire, server: FaultServer, **options: Any) -> str:
    async with Client(wire.driver(server.url, **options), default_model=MODEL) as client:
        request = client.request().with_messages([Message.user("hi")])
        pieces = []
        async with request.stream() as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    pieces.append(event.text)
    return "".join(pieces)


async def answer(wire: Wire, server: FaultServer) -> str:
    async with Client(wire.driver(server.url), default_model=MODEL) as client:
        return (await client.request().with_messages([Message.user("hi")]).run()).text


# --- byte order marks and split characters ---------------------------------------------


async def test_a_bom_in_a_segment_of_its_own_is_dropped(wire: Wire, server: FaultServer) -> None:
    server.script(Sse([b"\xef\xbb\xbf", *wire.events("Hel", "lo")], pause=PAUSE))
    assert await streamed_text(wire, server) == "Hello"


@pytest.mark.parametrize("cut", [1, 2])
async def test_a_bom_split_across_segments_is_dropped(
    wire: Wire, server: FaultServer, cut: int
) -> None:
    bom = b"\xef\xbb\xbf"
    first, *rest = wire.events("Hel", "lo")
    server.script(
        Sse([bom[:cut], bom[cut:], *wire.events("Hel", "lo")], pause=PAUSE),
        Sse([bom[:cut], bom[cut:] + first, *rest], pause=PAUSE),
    )
    assert await streamed_text(wire, server) == "Hello"
    assert await streamed_text(wire, server) == "Hello"


async def test_utf8_characters_split_across_segments_arrive_whole(
    wire: Wire, server: FaultServer
) -> None:
    text = "café ☕ naïve"
    # ensure_ascii=False puts the characters' own UTF-8 bytes on the wire, to be cut.
    body = b"".join(wire.events(text)).replace(
        json.dumps(text).encode(), json.dumps(text, ensure_ascii=False).encode()
    )
    cuts = [
        body.index("é".encode()) + 1,
        body.index("☕".encode()) + 1,
        body.index("☕".encode()) + 2,
    ]
    pieces = [body[start:end] for start, end in zip([0, *cuts], [*cuts, len(body)], strict=True)]
    server.script(Sse(pieces, pause=PAUSE))
    assert await streamed_text(wire, server) == text


# --- what is not an event stream ---------------------------------------------------------


async def test_an_html_page_answering_a_stream_is_named_and_shown(
    wire: Wire, server: FaultServer
) -> None:
    page = "<html><body><h1>Sign in to the corporate proxy</h1>" + "<p>x</p>" * 10_000
    server.script(Html(page + "</body></html>"))
    with pytest.raises(ProviderResponseError) as caught:
        await streamed_text(wire, server)
    message = str(caught.value)
    assert "answered with text/html, not an event stream" in message
    assert "Sign in to the corporate proxy" in message
    assert len(message) < 500


async def test_an_html_page_answering_a_plain_request_is_named_and_shown(
    wire: Wire, server: FaultServer
) -> None:
    server.script(Html("<html><body>Bad gateway, try later</body></html>"))
    with pytest.raises(ProviderResponseError, match=r"\(text/html\) is not JSON: .*Bad gateway"):
        await answer(wire, server)


# --- streams that stop early ---------------------------------------------------------------


async def test_a_reset_mid_stream_says_how_far_the_stream_got(
    wire: Wire, server: FaultServer
) -> None:
    sent = wire.events("Hel", "lo")[: wire.opening_events + 2]
    server.script(Sse(sent, reset_after=True))
    # httpx's pool: aiohttp's (the default on asyncio) reads a reset that ends a body
    # with neither a length nor chunks as its end (the next test).
    with pytest.raises(ProviderUnavailableError) as caught:
        await streamed_text(wire, server, transport="httpx")
    error = caught.value
    count = wire.opening_events + 2
    size = len(b"".join(sent))
    assert f"the stream broke off after {count} events ({size:,} bytes)" in error.message
    assert "could not reach" not in error.message
    assert re.search(r"\((ReadError|RemoteProtocolError)\b", error.message), error.message
    assert error.status == 200
    assert isinstance(error.__cause__, httpx.TransportError)  # the class is kept
    assert len(server.requests) == 1  # a stream that began is never replayed


async def test_a_reset_mid_stream_fails_on_the_default_transport_too(
    wire: Wire, server: FaultServer
) -> None:
    sent = wire.events("Hel", "lo")[: wire.opening_events + 2]
    server.script(Sse(sent, reset_after=True))
    with pytest.raises((ProviderUnavailableError, ProviderResponseError)) as caught:
        await streamed_text(wire, server)
    count = wire.opening_events + 2
    assert f"after {count} events ({len(b''.join(sent)):,} bytes)" in caught.value.message
    assert len(server.requests) == 1


async def test_a_stream_closed_early_says_how_many_events_came(
    wire: Wire, server: FaultServer
) -> None:
    server.script(Sse(wire.events("Hel", "lo")[: wire.opening_events + 1]))
    with pytest.raises(ProviderResponseError) as caught:
        await streamed_text(wire, server)
    assert "the stream ended before the response was complete" in caught.value.message
    assert f"after {wire.opening_events + 1} event" in caught.value.message


# --- bounded messages -------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["run", "stream"])
async def test_a_megabyte_error_message_gives_a_short_error(
    wire: Wire, server: FaultServer, mode: str
) -> None:
    huge = "the model refused: " + "x" * 1_000_000
    server.script(
        Json({"type": "error", "error": {"type": "invalid_request_error", "message": huge}}, 400)
    )
    with pytest.raises(BadRequestError) as caught:
        await (answer(wire, server) if mode == "run" else streamed_text(wire, server))
    error = caught.value
    assert str(error).startswith("the model refused: xxx")
    assert len(str(error)) < 1200
    assert len(repr(error)) < 1200
    assert "more characters cut" in str(error)
    assert error.body is not None
    assert len(error.body) < 4200


async def test_a_megabyte_error_event_mid_stream_gives_a_short_error(
    wire: Wire, server: FaultServer
) -> None:
    huge = {"type": "error", "error": {"type": "overloaded_error", "message": "y" * 1_000_000}}
    server.script(Sse([*wire.events("Hel")[: wire.opening_events + 1], sse_event(huge, "error")]))
    with pytest.raises(ProviderError) as caught:
        await streamed_text(wire, server)
    assert len(str(caught.value)) < 1200
