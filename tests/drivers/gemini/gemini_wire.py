"""What the Gemini driver's tests share: the hand-written wire fixtures and small helpers.

The fixtures (``fixtures/``) are written from the documented wire, not
recorded: see ``fixtures/README.md``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx

from threadline import Model

FIXTURES = Path(__file__).parent / "fixtures"
BASE = "https://gemini.example/v1beta"
KEY = "gemini-test-key-0123456789"
MODEL = Model("gemini-3-flash-preview", context_size=1_048_576)
LABEL = "gemini:gemini-3-flash-preview"
URL = f"{BASE}/models/gemini-3-flash-preview:generateContent"
STREAM_URL = f"{BASE}/models/gemini-3-flash-preview:streamGenerateContent"
COUNT_URL = f"{BASE}/models/gemini-3-flash-preview:countTokens"


def fixture(name: str) -> Any:
    """The parsed JSON of ``fixtures/<name>.json``."""
    return json.loads((FIXTURES / f"{name}.json").read_text(encoding="utf-8"))


def sse(chunks: list[Any]) -> bytes:
    """``chunks`` as ``streamGenerateContent?alt=sse`` sends them: one ``data:`` line each."""
    return b"".join(b"data: " + json.dumps(chunk).encode() + b"\r\n\r\n" for chunk in chunks)


def sse_response(chunks: list[Any]) -> httpx.Response:
    return httpx.Response(200, content=sse(chunks), headers={"content-type": "text/event-stream"})


def sent_body(request: httpx.Request) -> Any:
    return json.loads(request.content)


class FakeClock:
    """Records every wait and moves time forward instead of sleeping."""

    def __init__(self) -> None:
        self.current = 1_800_000_000.0
        self.waits: list[float] = []

    def now(self) -> float:
        return self.current

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.current += seconds
