"""``threadline chat`` against OpenAI-compatible servers, faked at the transport with respx.

What the server says about its window decides the budget; errors name the URL
once; the status line flags an answer cut short and shows a known model's cost.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import respx

# The helpers of test_cli.py (invoke runs the command in process).
from test_cli import errors, invoke

URL = "http://127.0.0.1:8080/v1"
OPENAI = "https://api.openai.com/v1"


def answer(text: str, *, finish: str = "stop", prompt_tokens: int = 20) -> httpx.Response:
    chunks: list[dict[str, Any]] = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": text}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": finish}]},
        {
            "choices": [],
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 5, "total_tokens": 25},
        },
    ]
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    return httpx.Response(200, text=body, headers={"content-type": "text/event-stream"})


def llama_cpp_models(*, n_ctx: int | None = None, n_ctx_train: int = 8192) -> httpx.Response:
    meta: dict[str, Any] = {"n_vocab": 49152, "n_ctx_train": n_ctx_train}
    if n_ctx is not None:
        meta["n_ctx"] = n_ctx
    entry = {"id": "smollm2", "object": "model", "owned_by": "llamacpp", "meta": meta}
    return httpx.Response(200, json={"object": "list", "data": [entry]})


def llama_cpp_counts(mock: respx.MockRouter, tokens: int = 20) -> None:
    """llama.cpp's counting endpoints: the prompt the template renders is ``tokens`` long.

    A fresh chat has learned nothing of the model yet, so its first round asks them.
    """
    root = URL.rpartition("/v1")[0]
    mock.post(f"{root}/apply-template").mock(
        return_value=httpx.Response(200, json={"prompt": "<|im_start|>user\nhi<|im_end|>\n"})
    )
    mock.post(f"{root}/tokenize").mock(
        return_value=httpx.Response(200, json={"tokens": list(range(tokens))})
    )


def sent_body(mock: respx.MockRouter) -> dict[str, Any]:
    posts = [c for c in mock.calls if c.request.method == "POST"]
    body: dict[str, Any] = json.loads(posts[-1].request.content)
    return body


def test_the_window_llama_cpp_reports_in_v1_models_sets_the_budget(db: Path) -> None:
    with respx.mock() as mock:
        mock.get(f"{URL}/models").mock(return_value=llama_cpp_models(n_ctx=2048))
        llama_cpp_counts(mock)
        mock.post(f"{URL}/chat/completions").mock(return_value=answer("Hi."))
        run = invoke("chat", "--db", str(db), "--base-url", URL, "--once", "hello")
        body = sent_body(mock)
    assert run.code == 0, run.err
    # A quarter of the 2,048-token window is kept for the answer, and asked for.
    assert "of 1,536 budget tokens" in run.err
    assert "512 kept for the answer" in run.err
    assert body["model"] == "smollm2"  # the server's only model, not gpt-4o-mini
    assert body["max_tokens"] == 512


def test_the_window_in_props_is_used_when_v1_models_does_not_say(db: Path) -> None:
    with respx.mock() as mock:
        mock.get(f"{URL}/models").mock(return_value=llama_cpp_models())
        llama_cpp_counts(mock)
        mock.get("http://127.0.0.1:8080/props").mock(
            return_value=httpx.Response(
                200, json={"default_generation_settings": {"n_ctx": 1024}, "total_slots": 1}
            )
        )
        mock.post(f"{URL}/chat/completions").mock(return_value=answer("Hi."))
        run = invoke("chat", "--db", str(db), "--base-url", URL, "--once", "hello")
    assert run.code == 0, run.err
    assert "of 768 budget tokens" in run.err
    assert "256 kept for the answer" in run.err


def test_the_training_window_alone_is_not_taken_for_the_servers(db: Path) -> None:
    with respx.mock() as mock:
        mock.get(f"{URL}/models").mock(return_value=llama_cpp_models(n_ctx_train=131072))
        mock.get("http://127.0.0.1:8080/props").mock(return_value=httpx.Response(404))
        mock.post(f"{URL}/chat/completions").mock(return_value=answer("Hi."))
        run = invoke("chat", "--db", str(db), "--base-url", URL, "--once", "hello")
    assert run.code == 0, run.err
    assert (
        f"(the window of smollm2 at {URL} is unknown: the server does not report it and the "
        "model catalog does not list the name, so nothing is limited; set "
        "--max-context-tokens N to the server's window)"
    ) in run.err
    assert "no limit: the window is unknown (--max-context-tokens)" in run.err


def test_a_known_model_name_falls_back_to_the_catalog(db: Path) -> None:
    with respx.mock() as mock:
        mock.get(f"{URL}/models").mock(return_value=httpx.Response(404))
        mock.get("http://127.0.0.1:8080/props").mock(return_value=httpx.Response(404))
        mock.post(f"{URL}/chat/completions").mock(return_value=answer("Hi."))
        run = invoke(
            "chat", "--db", str(db), "--base-url", URL, "--model", "gpt-4o-mini", "--once", "hi"
        )
    assert run.code == 0, run.err
    assert "of 123,904 budget tokens" in run.err  # 128,000 less the default 4,096
    assert "$" not in run.err  # a server of your own: no list price


def test_an_answer_cut_by_the_output_limit_is_flagged(db: Path) -> None:
    with respx.mock() as mock:
        mock.get(f"{URL}/models").mock(return_value=llama_cpp_models(n_ctx=2048))
        llama_cpp_counts(mock)
        mock.post(f"{URL}/chat/completions").mock(return_value=answer("Once", finish="length"))
        run = invoke("chat", "--db", str(db), "--base-url", URL, "--once", "a long story")
    assert "answer cut at its length limit (--max-output-tokens)" in run.err


def test_an_unreachable_server_is_one_line_naming_the_url_once(db: Path) -> None:
    with respx.mock() as mock:
        mock.get(f"{URL}/models").mock(side_effect=httpx.ConnectError("connection refused"))
        run = invoke("chat", "--db", str(db), "--base-url", URL, "--once", "hi")
    assert run.code == 1
    assert errors(run) == [
        f"threadline: error: cannot reach {URL}/models (ConnectError: connection refused); "
        "is the server running?"
    ]
    assert run.err.count(URL) == 1
    assert run.err.count("\n") == 1


def test_a_server_that_goes_away_mid_chat_is_named_once(db: Path) -> None:
    with respx.mock() as mock:
        mock.get(f"{URL}/models").mock(return_value=llama_cpp_models(n_ctx=2048))
        llama_cpp_counts(mock)
        mock.post(f"{URL}/chat/completions").mock(
            side_effect=httpx.ConnectError("connection refused")
        )
        run = invoke("chat", "--db", str(db), "--base-url", URL, "--once", "hi")
    assert run.code == 1
    (line,) = errors(run)
    assert line == (
        f"threadline: error: cannot reach {URL} (ConnectError: connection refused); "
        "is the server running?"
    )


def test_a_bad_key_is_one_line_and_never_shows_the_key(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-obviously-fake-cli-0000")
    with respx.mock() as mock:
        mock.post(f"{OPENAI}/chat/completions").mock(
            return_value=httpx.Response(
                401, json={"error": {"message": "Incorrect API key provided", "code": "invalid"}}
            )
        )
        run = invoke("chat", "--db", str(db), "--once", "hi")
    assert run.code == 1
    assert errors(run) == [
        f"threadline: error: {OPENAI} refused the API key ($OPENAI_API_KEY): "
        "Incorrect API key provided"
    ]
    assert "sk-test-obviously-fake-cli-0000" not in run.err + run.out


def test_a_key_refused_while_asking_a_server_is_one_line(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-obviously-fake-cli-0001")
    with respx.mock() as mock:
        mock.get(f"{URL}/models").mock(return_value=httpx.Response(401))
        run = invoke("chat", "--db", str(db), "--base-url", URL, "--once", "hi")
    assert errors(run) == [
        f"threadline: error: {URL}/models refused the API key ($OPENAI_API_KEY): status 401"
    ]
    assert "sk-test-obviously-fake-cli-0001" not in run.err


def test_openai_turns_show_their_list_price(db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-obviously-fake-cli-0002")
    with respx.mock() as mock:
        mock.post(f"{OPENAI}/chat/completions").mock(
            return_value=answer("Hi.", prompt_tokens=20_000)
        )
        run = invoke("chat", "--db", str(db), "--once", "hi")
    assert run.code == 0, run.err
    status = run.err.splitlines()[0]
    assert "of 123,904 budget tokens" in status  # gpt-4o-mini's window, from the catalog
    assert re.search(r" · \$0\.\d+ · 1 turn\]$", status), status


def test_a_stream_that_ends_empty_suggests_the_window(db: Path) -> None:
    with respx.mock() as mock:
        mock.get(f"{URL}/models").mock(return_value=llama_cpp_models())
        mock.get("http://127.0.0.1:8080/props").mock(return_value=httpx.Response(404))
        mock.post(f"{URL}/chat/completions").mock(
            return_value=httpx.Response(200, text="", headers={"content-type": "text/event-stream"})
        )
        run = invoke("chat", "--db", str(db), "--base-url", URL, "--once", "word " * 50)
    assert run.code == 1
    assert errors(run) == [
        f"threadline: error: {URL} ended the answer without a word; if the prompt is long "
        "for the server's window, set --max-context-tokens to it"
    ]
