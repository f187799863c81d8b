"""The Anthropic half of ``bench_request.py``: canned Messages API answers and the clients.

``bench_request.py`` serves these answers from its mock server under the
``/anthropic`` paths and times ``AnthropicDriver`` against raw httpx (and the
official ``anthropic`` client, for reference) exactly as it times the OpenAI
driver: same cases, same targets.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from _bench_threadline import ThreadlineCalls
from httpx_aiohttp import HttpxAiohttpClient

from threadline import Client, Message, Model
from threadline.drivers import AnthropicDriver, ProviderCall
from threadline.drivers.anthropic._request import encode_request, new_message_cache

try:
    import anthropic
except ImportError:  # the reference client is optional
    anthropic = None  # type: ignore[assignment]

MODEL_NAME = "bench-model"
API_KEY = "bench-key"
MAX_TOKENS = 1024


def message_body(text: str) -> bytes:
    return json.dumps(
        {
            "id": "msg_bench",
            "type": "message",
            "role": "assistant",
            "model": MODEL_NAME,
            "content": [{"type": "text", "text": text}],
            "stop_reason": "end_turn",
            "stop_sequence": None,
            "usage": {"input_tokens": 12, "output_tokens": 5},
        },
        separators=(",", ":"),
    ).encode()


def stream_events(chunks: int) -> list[bytes]:
    """A text stream of ``chunks`` deltas, framed as chunked transfer encoding."""

    def event(payload: dict[str, Any]) -> bytes:
        data = json.dumps(payload, separators=(",", ":")).encode()
        return b"event: " + payload["type"].encode() + b"\ndata: " + data + b"\n\n"

    message = {"id": "msg_bench", "type": "message", "role": "assistant", "model": MODEL_NAME}
    events = [
        event(
            {
                "type": "message_start",
                "message": {
                    **message,
                    "content": [],
                    "usage": {"input_tokens": 12, "output_tokens": 1},
                },
            }
        ),
        event(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            }
        ),
    ]
    events += [
        event(
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": f"tok{i} "},
            }
        )
        for i in range(chunks)
    ]
    events += [
        event({"type": "content_block_stop", "index": 0}),
        event(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "end_turn", "stop_sequence": None},
                "usage": {"output_tokens": chunks},
            }
        ),
        event({"type": "message_stop"}),
    ]
    return [b"%x\r\n%s\r\n" % (len(e), e) for e in events] + [b"0\r\n\r\n"]


def same_body(history: list[Message], prompt: str, *, stream: bool) -> dict[str, Any]:
    """The body AnthropicDriver sends, built by its own wire code, to post raw."""
    call = ProviderCall(
        model=Model(MODEL_NAME),
        messages=(*history, Message.user(prompt)),
        max_output_tokens=MAX_TOKENS,
    )
    encoded = encode_request(
        call, stream=stream, label=f"anthropic:{MODEL_NAME}", default_max_tokens=MAX_TOKENS
    )
    body: dict[str, Any] = json.loads(encoded.body)
    return body


class AnthropicClients(ThreadlineCalls):
    """AnthropicDriver, raw httpx and the official client, each with its own pool."""

    max_output_tokens = MAX_TOKENS
    new_message_cache = new_message_cache

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}/anthropic"
        self.stream_base = f"http://127.0.0.1:{port}/stream/anthropic"
        self.model = Model(MODEL_NAME, context_size=1_000_000)
        self._open()

    def _open(self) -> None:
        """Every client, each with a new pool."""
        self.driver = AnthropicDriver(base_url=self.base, api_key=API_KEY, max_retries=0)
        self.threadline = Client(self.driver, default_model=self.model)
        # First requests' own driver: their new JSON cache must not empty the warm one's.
        self.cold_driver = AnthropicDriver(base_url=self.base, api_key=API_KEY, max_retries=0)
        self.threadline_cold = Client(self.cold_driver, default_model=self.model)
        self.threadline_stream = Client(
            AnthropicDriver(base_url=self.stream_base, api_key=API_KEY, max_retries=0),
            default_model=self.model,
        )
        self.threadline_httpx = Client(
            AnthropicDriver(base_url=self.base, api_key=API_KEY, max_retries=0, transport="httpx"),
            default_model=self.model,
        )
        self.http = httpx.AsyncClient(timeout=60.0)
        # raw httpx once more, on a pool of its own: the control (see bench_request).
        self.raw_clients = {
            "httpx": self.http,
            "again": httpx.AsyncClient(timeout=60.0),
            "aiohttp": HttpxAiohttpClient(timeout=60.0),
        }
        self.headers = {
            "accept": "application/json",
            "content-type": "application/json",
            "anthropic-version": "2023-06-01",
            "x-api-key": API_KEY,
        }
        self.reference: Any = None
        self.reference_stream: Any = None
        if anthropic is not None:
            # Its own default pool (the client takes no httpx.AsyncClient of ours).
            self.reference, self.reference_stream = (
                anthropic.AsyncAnthropic(base_url=base, api_key=API_KEY, max_retries=0)
                for base in (self.base, self.stream_base)
            )

    async def renew(self) -> None:
        """Close every pool and open new ones: each timed batch starts from the same state.

        httpx's CPU per request at 50 concurrent grows with the connections in
        its pool (every request scans them all), and how many a pool holds
        depends on its past: how many requests once arrived together, and which
        connections passed their 5 s keep-alive while other clients were timed.
        """
        await self.aclose()
        self._open()

    async def aclose(self) -> None:
        await self.threadline.aclose()
        await self.threadline_cold.aclose()
        await self.threadline_stream.aclose()
        await self.threadline_httpx.aclose()
        for raw in self.raw_clients.values():
            await raw.aclose()
        for client in (self.reference, self.reference_stream):
            if client is not None:
                await client.close()

    async def raw_complete(self, body: dict[str, Any], *, via: str = "httpx") -> str:
        response = await self.raw_clients[via].post(
            f"{self.base}/v1/messages", content=json.dumps(body).encode(), headers=self.headers
        )
        response.raise_for_status()
        text: str = json.loads(response.content)["content"][0]["text"]
        return text

    async def raw_stream(self, body: dict[str, Any], *, via: str = "httpx") -> str:
        pieces = []
        headers = {**self.headers, "accept": "text/event-stream"}
        async with self.raw_clients[via].stream(
            "POST",
            f"{self.stream_base}/v1/messages",
            content=json.dumps(body).encode(),
            headers=headers,
        ) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[6:])
                if (
                    event["type"] == "content_block_delta"
                    and event["delta"]["type"] == "text_delta"
                ):
                    pieces.append(event["delta"]["text"])
                elif event["type"] == "message_stop":
                    break
        return "".join(pieces)

    async def reference_complete(self, messages: list[dict[str, Any]]) -> str:
        message = await self.reference.messages.create(
            model=MODEL_NAME, max_tokens=MAX_TOKENS, messages=messages
        )
        text: str = message.content[0].text
        return text

    async def reference_consume_stream(self, messages: list[dict[str, Any]]) -> str:
        pieces = []
        stream = await self.reference_stream.messages.create(
            model=MODEL_NAME, max_tokens=MAX_TOKENS, messages=messages, stream=True
        )
        async for event in stream:
            if event.type == "content_block_delta" and event.delta.type == "text_delta":
                pieces.append(event.delta.text)
        return "".join(pieces)
