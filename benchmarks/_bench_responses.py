"""The Responses API half of ``bench_request.py``: canned answers and the clients.

``bench_request.py`` serves these answers from its mock server under the
``/responses-api`` paths and times ``OpenAIResponsesDriver`` against raw httpx
(and the official ``openai`` client's ``responses``, for reference) exactly as
it times the other drivers: same cases, same targets.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
from _bench_threadline import ThreadlineCalls
from httpx_aiohttp import HttpxAiohttpClient

from threadline import Client, Message, Model
from threadline.drivers import OpenAIResponsesDriver, ProviderCall
from threadline.drivers.openai_responses._request import encode_request, new_message_cache

try:
    import openai
except ImportError:  # the reference client is optional
    openai = None  # type: ignore[assignment]

MODEL_NAME = "bench-model"
API_KEY = "bench-key"
MAX_TOKENS = 1024
PATH = "/responses-api/v1"


def _message(text: str) -> dict[str, Any]:
    return {
        "id": "msg_bench",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def _response(output: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "id": "resp_bench",
        "object": "response",
        "model": MODEL_NAME,
        "status": "completed",
        "output": output,
        "usage": {"input_tokens": 12, "output_tokens": 5, "total_tokens": 17},
    }


def response_body(text: str) -> bytes:
    return json.dumps(_response([_message(text)]), separators=(",", ":")).encode()


def stream_events(chunks: int) -> list[bytes]:
    """A text stream of ``chunks`` deltas, framed as chunked transfer encoding."""

    def event(payload: dict[str, Any]) -> bytes:
        data = json.dumps(payload, separators=(",", ":")).encode()
        return b"event: " + payload["type"].encode() + b"\ndata: " + data + b"\n\n"

    texts = [f"tok{i} " for i in range(chunks)]
    empty = {**_message(""), "content": [], "status": "in_progress"}
    events = [
        event({"type": "response.created", "response": {**_response([]), "status": "in_progress"}}),
        event({"type": "response.output_item.added", "output_index": 0, "item": empty}),
    ]
    events += [
        event(
            {
                "type": "response.output_text.delta",
                "item_id": "msg_bench",
                "output_index": 0,
                "content_index": 0,
                "delta": text,
            }
        )
        for text in texts
    ]
    whole = _message("".join(texts))
    events += [
        event({"type": "response.output_item.done", "output_index": 0, "item": whole}),
        event({"type": "response.completed", "response": _response([whole])}),
    ]
    return [b"%x\r\n%s\r\n" % (len(e), e) for e in events] + [b"0\r\n\r\n"]


def same_body(history: list[Message], prompt: str, *, stream: bool) -> dict[str, Any]:
    """The body OpenAIResponsesDriver sends, built by its own wire code, to post raw."""
    call = ProviderCall(
        model=Model(MODEL_NAME),
        messages=(*history, Message.user(prompt)),
        max_output_tokens=MAX_TOKENS,
    )
    encoded = encode_request(call, stream=stream, label=f"openai-responses:{MODEL_NAME}")
    body: dict[str, Any] = json.loads(encoded.body)
    return body


class ResponsesClients(ThreadlineCalls):
    """OpenAIResponsesDriver, raw httpx and the official client, each with its own pool."""

    max_output_tokens = MAX_TOKENS
    new_message_cache = new_message_cache

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}{PATH}"
        self.stream_base = f"http://127.0.0.1:{port}/stream{PATH}"
        self.model = Model(MODEL_NAME, context_size=1_000_000)
        self._open()

    def _driver(self, base: str, **options: Any) -> OpenAIResponsesDriver:
        return OpenAIResponsesDriver(base, api_key=API_KEY, max_retries=0, **options)

    def _open(self) -> None:
        """Every client, each with a new pool."""
        self.driver = self._driver(self.base)
        self.threadline = Client(self.driver, default_model=self.model)
        # First requests' own driver: their new JSON cache must not empty the warm one's.
        self.cold_driver = self._driver(self.base)
        self.threadline_cold = Client(self.cold_driver, default_model=self.model)
        self.threadline_stream = Client(self._driver(self.stream_base), default_model=self.model)
        self.threadline_httpx = Client(
            self._driver(self.base, transport="httpx"), default_model=self.model
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
            "authorization": f"Bearer {API_KEY}",
        }
        self.reference: Any = None
        self.reference_stream: Any = None
        if openai is not None:
            # Its own default pool, as the official client is used.
            self.reference, self.reference_stream = (
                openai.AsyncOpenAI(base_url=base, api_key=API_KEY, max_retries=0)
                for base in (self.base, self.stream_base)
            )

    async def renew(self) -> None:
        """Close every pool and open new ones (see ``_bench_anthropic``)."""
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
            f"{self.base}/responses", content=json.dumps(body).encode(), headers=self.headers
        )
        response.raise_for_status()
        text: str = json.loads(response.content)["output"][0]["content"][0]["text"]
        return text

    async def raw_stream(self, body: dict[str, Any], *, via: str = "httpx") -> str:
        pieces = []
        headers = {**self.headers, "accept": "text/event-stream"}
        async with self.raw_clients[via].stream(
            "POST",
            f"{self.stream_base}/responses",
            content=json.dumps(body).encode(),
            headers=headers,
        ) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                event = json.loads(line[6:])
                if event["type"] == "response.output_text.delta":
                    pieces.append(event["delta"])
                elif event["type"] == "response.completed":
                    break
        return "".join(pieces)

    async def reference_complete(self, items: list[dict[str, Any]]) -> str:
        response = await self.reference.responses.create(
            model=MODEL_NAME, input=items, max_output_tokens=MAX_TOKENS, store=False
        )
        text: str = response.output_text
        return text

    async def reference_consume_stream(self, items: list[dict[str, Any]]) -> str:
        pieces = []
        stream = await self.reference_stream.responses.create(
            model=MODEL_NAME, input=items, max_output_tokens=MAX_TOKENS, store=False, stream=True
        )
        async for event in stream:
            if event.type == "response.output_text.delta":
                pieces.append(event.delta)
        return "".join(pieces)
