"""The command line speaks to Gemini with `--provider gemini`, faked at the transport."""

from __future__ import annotations

import io
import json
from pathlib import Path

import httpx
import pytest
import respx

# The driver choice is a function of the private CLI module; the command's own
# tests drive it end to end.
from threadline.cli._app import build_driver, main, parser
from threadline.drivers import GeminiDriver

ROOT = "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash"
KEY = "gemini-cli-key-0123456789"


async def _built(argv: list[str]) -> tuple[object, str, int | None]:
    driver, model, _ = build_driver(parser().parse_args(argv))
    async with driver:
        return driver, model.name, model.context_size


@pytest.mark.anyio
async def test_provider_flag_builds_the_gemini_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("THREADLINE_MODEL", raising=False)
    driver, name, window = await _built(["chat", "--provider", "gemini"])
    assert isinstance(driver, GeminiDriver)
    assert (name, window) == ("gemini-2.5-flash", 1_048_576)
    _, other, other_window = await _built(["chat", "--provider", "gemini", "--model", "gemini-x"])
    assert (other, other_window) == ("gemini-x", 1_048_576)


def test_a_one_shot_chat_streams_from_gemini(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GEMINI_API_KEY", KEY)
    monkeypatch.delenv("THREADLINE_MODEL", raising=False)
    chunks = [
        {"candidates": [{"content": {"role": "model", "parts": [{"text": "Hello"}]}}]},
        {
            "candidates": [
                {
                    "content": {"role": "model", "parts": [{"text": " there."}]},
                    "finishReason": "STOP",
                }
            ],
            "usageMetadata": {"promptTokenCount": 4, "candidatesTokenCount": 2},
        },
    ]
    body = "".join(f"data: {json.dumps(chunk)}\r\n\r\n" for chunk in chunks)
    out, err = io.StringIO(), io.StringIO()
    with respx.mock() as mock:
        route = mock.post(f"{ROOT}:streamGenerateContent").mock(
            return_value=httpx.Response(
                200, text=body, headers={"content-type": "text/event-stream"}
            )
        )
        mock.post(f"{ROOT}:countTokens").mock(
            return_value=httpx.Response(200, json={"totalTokens": 4})
        )
        code = main(
            ["chat", "--provider", "gemini", "--db", str(db), "--once", "Hi"],
            stdin=io.StringIO(""),
            stdout=out,
            stderr=err,
        )
    assert code == 0, err.getvalue()
    assert out.getvalue() == "Hello there.\n"
    sent = route.calls.last.request
    assert sent.headers["x-goog-api-key"] == KEY
    assert KEY not in str(sent.url)
    assert json.loads(sent.content)["contents"][-1] == {"role": "user", "parts": [{"text": "Hi"}]}
    assert KEY not in err.getvalue()
