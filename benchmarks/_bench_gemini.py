"""The Gemini half of ``bench_request.py``: canned ``generateContent`` answers and the clients.

``bench_request.py`` serves these answers from its mock server under the
``/gemini`` paths and times ``GeminiDriver`` against raw httpx exactly as it
times the other drivers: same cases, same targets. No official client is
timed for reference (the Google SDK is not a dependency of the bench extra).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
from _bench_threadline import ThreadlineCalls
from httpx_aiohttp import HttpxAiohttpClient

from threadline import Client, Message, Model
from threadline.drivers import GeminiDriver, ProviderCall
from threadline.drivers.gemini._contents import new_message_cache
from threadline.drivers.gemini._request import encode_request

MODEL_NAME = "bench-model"
API_KEY = "bench-key"
MAX_TOKENS = 1024
PATH = "/gemini/v1beta"
METHOD = f"models/{MODEL_NAME}:generateContent"
STREAM_METHOD = f"models/{MODEL_NAME}:streamGenerateContent?alt=sse"


def _answer(text: str, finish: str | None = "STOP", *, usage: bool = True) -> dict[str, Any]:
    candidate: dict[str, Any] = {
        "content": {"role": "model", "parts": [{"text": text}]},
        "index": 0,
    }
    if finish:
        candidate["finishReason"] = finish
    answer: dict[str, Any] = {"candidates": [candidate], "modelVersion": MODEL_NAME}
    if usage:
        answer["usageMetadata"] = {
            "promptTokenCount": 12,
            "candidatesTokenCount": 5,
            "totalTokenCount": 17,
        }
    return answer


def response_body(text: str) -> bytes:
    return json.dumps(_answer(text), separators=(",", ":")).encode()


def stream_events(chunks: int) -> list[bytes]:
    """A text stream of ``chunks`` pieces, each a whole response chunk, framed as chunked
    transfer encoding; the last carries the finish reason and the usage."""

    def event(payload: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\r\n\r\n"

    events = [event(_answer(f"tok{i} ", None, usage=False)) for i in range(chunks - 1)]
    events.append(event(_answer(f"tok{chunks - 1} ")))
    return [b"%x\r\n%s\r\n" % (len(e), e) for e in events] + [b"0\r\n\r\n"]


def same_body(history: list[Message], prompt: str, *, stream: bool) -> dict[str, Any]:
    """The body GeminiDriver sends, built by its own wire code, to post raw."""
    call = ProviderCall(
        model=Model(MODEL_NAME),
        messages=(*history, Message.user(prompt)),
        max_output_tokens=MAX_TOKENS,
    )
    body: dict[str, Any] = json.loads(encode_request(call, label=f"gemini:{MODEL_NAME}").body)
    return body


class GeminiClients(ThreadlineCalls):
    """GeminiDriver and raw httpx, each with its own pool."""

    max_output_tokens = MAX_TOKENS
    new_message_cache = new_message_cache

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}{PATH}"
        self.stream_base = f"http://127.0.0.1:{port}/stream{PATH}"
        self.model = Model(MODEL_NAME, context_size=1_000_000)
        self.reference: Any = None
        self._open()

    def _driver(self, base: str, **options: Any) -> GeminiDriver:
        return GeminiDriver(base_url=base, api_key=API_KEY, max_retries=0, **options)

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
        # raw httpx twice, on pools of their own: the second is the control (see bench_request).
        self.raw_clients = {
            "httpx": httpx.AsyncClient(timeout=60.0),
            "again": httpx.AsyncClient(timeout=60.0),
            "aiohttp": HttpxAiohttpClient(timeout=60.0),
        }
        self.headers = {
            "accept": "application/json",
            "content-type": "application/json",
            "x-goog-api-key": API_KEY,
        }

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

    async def raw_complete(self, body: dict[str, Any], *, via: str = "httpx") -> str:
        response = await self.raw_clients[via].post(
            f"{self.base}/{METHOD}", content=json.dumps(body).encode(), headers=self.headers
        )
        response.raise_for_status()
        text: str = json.loads(response.content)["candidates"][0]["content"]["parts"][0]["text"]
        return text

    async def raw_stream(self, body: dict[str, Any], *, via: str = "httpx") -> str:
        pieces = []
        headers = {**self.headers, "accept": "text/event-stream"}
        async with self.raw_clients[via].stream(
            "POST",
            f"{self.stream_base}/{STREAM_METHOD}",
            content=json.dumps(body).encode(),
            headers=headers,
        ) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                candidate = json.loads(line[6:])["candidates"][0]
                pieces.append(candidate["content"]["parts"][0]["text"])
                if candidate.get("finishReason"):
                    break
        return "".join(pieces)

    async def _no_reference(self, items: Any) -> str:
        raise AssertionError("no reference client is timed for Gemini")


async def bench(
    port: int,
    history: list[Message],
    prompt: str,
    options: Any,
    family: Callable[..., Awaitable[bool]],
    family_of: Callable[..., Any],
) -> bool:
    """Time the Gemini driver with ``bench_request``'s own ``_family`` and ``_Family``."""
    gemini = GeminiClients(port)
    bodies = (
        same_body([], "Hello", stream=False),
        same_body(history, prompt, stream=False),
        same_body([], "Stream me a story", stream=True),
    )
    try:
        return await family(
            "Gemini generateContent",
            family_of(
                raw_complete=gemini.raw_complete,
                raw_stream=gemini.raw_stream,
                complete=gemini.threadline_complete,
                complete_uncached=gemini.threadline_complete_uncached,
                consume_stream=gemini.threadline_consume_stream,
                reference=None,
                reference_complete=gemini._no_reference,
                reference_stream=gemini._no_reference,
                renew=gemini.renew,
                items="contents",
            ),
            bodies,
            history,
            prompt,
            options,
        )
    finally:
        await gemini.aclose()
