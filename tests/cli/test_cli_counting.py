"""The gap in plain sight: ``threadline chat`` shows its estimate beside the server's count,
``/budget`` explains it, and a llama.cpp server is asked to count exactly."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import httpx
import pytest
import respx

# The helpers of test_cli.py and test_cli_servers.py.
from test_cli import invoke
from test_cli_servers import URL, answer, llama_cpp_counts, llama_cpp_models
from threadline import Model, Usage
from threadline.cli._setup import build_driver  # the driver chat builds, not a public API
from threadline.cli._status import count_words  # the status line's wording, not a public API
from threadline.drivers import OpenAIChatDriver
from threadline.limiting import RoundRecord


def test_the_status_line_shows_estimate_and_server_when_they_differ(db: Path) -> None:
    # A server that cannot count: the estimate decides, and is shown beside the report.
    listing = {"object": "list", "data": [{"id": "m", "object": "model"}]}
    with respx.mock() as mock:
        mock.get(f"{URL}/models").mock(return_value=httpx.Response(200, json=listing))
        mock.get(f"{URL.rpartition('/v1')[0]}/props").mock(return_value=httpx.Response(404))
        mock.post(f"{URL}/chat/completions").mock(return_value=answer("Hi.", prompt_tokens=41))
        run = invoke(
            "chat",
            "--db",
            str(db),
            "--base-url",
            URL,
            "--max-context-tokens",
            "2048",
            "--once",
            "hello there",
        )
    assert run.code == 0, run.err
    found = re.search(r"\[estimate (\d+) · server 41 \(([+-]\d+\.\d)%\) of 1,536 budget", run.err)
    assert found, run.err
    estimate = int(found.group(1))
    assert float(found.group(2)) == round((41 - estimate) / estimate * 100, 1)


def test_a_first_turn_on_llama_cpp_is_counted_exactly_and_shown_beside_the_report(
    db: Path,
) -> None:
    # Nothing learned of the model yet: its own server counts the first turn.
    with respx.mock() as mock:
        mock.get(f"{URL}/models").mock(return_value=llama_cpp_models(n_ctx=2048))
        llama_cpp_counts(mock, tokens=39)
        mock.post(f"{URL}/chat/completions").mock(return_value=answer("Hi.", prompt_tokens=41))
        run = invoke("chat", "--db", str(db), "--base-url", URL, "--once", "hello there")
    assert run.code == 0, run.err
    assert "[exact 39 · server 41 (+5.1%) of 1,536 budget" in run.err


def round_of(decided: int, reported: int | None) -> RoundRecord:
    return RoundRecord(
        round=1,
        usage=Usage(input_tokens=reported or 0),
        estimated_input_tokens=decided,
        reported_input_tokens=reported,
        limiting=None,
        finish_reason="stop",
        tool_calls=0,
    )


@pytest.mark.parametrize(
    ("decided", "reported", "words"),
    [
        (1210, 1264, "estimate 1,210 · server 1,264 (+4.5%)"),
        (1264, 1210, "estimate 1,264 · server 1,210 (-4.3%)"),
        (1264, 1264, "sent 1,264"),
        (1264, None, "sent 1,264"),
    ],
)
def test_the_gap_is_worded_with_thousands_and_its_sign(
    decided: int, reported: int | None, words: str
) -> None:
    assert count_words(round_of(decided, reported)) == words


def test_the_status_line_says_sent_when_the_counts_agree(db: Path) -> None:
    with respx.mock() as mock:
        mock.get(f"{URL}/models").mock(return_value=llama_cpp_models(n_ctx=2048))
        llama_cpp_counts(mock, tokens=41)
        mock.post(f"{URL}/chat/completions").mock(return_value=answer("Hi.", prompt_tokens=41))
        run = invoke("chat", "--db", str(db), "--base-url", URL, "--once", "hi")
    assert "[sent 41 of 1,536 budget tokens (server: 41)" in run.err, run.err


def test_budget_explains_the_last_turns_gap(db: Path) -> None:
    with respx.mock() as mock:
        mock.get(f"{URL}/models").mock(return_value=llama_cpp_models(n_ctx=2048))
        llama_cpp_counts(mock)
        mock.post(f"{URL}/chat/completions").mock(return_value=answer("Hi.", prompt_tokens=41))
        run = invoke("chat", "--db", str(db), "--base-url", URL, stdin="hello\n/budget\n/exit\n")
    assert run.code == 0, run.err
    assert "last turn: the server counted 41 tokens sent" in run.err
    assert re.search(
        r"threadline asked the server for the exact count: 20; its own estimate was \d+",
        run.err,
    ), run.err
    assert "the estimate decides what is dropped" in run.err


def test_budget_before_any_turn_has_no_gap_to_explain(db: Path) -> None:
    with respx.mock() as mock:
        mock.get(f"{URL}/models").mock(return_value=llama_cpp_models(n_ctx=2048))
        run = invoke("chat", "--db", str(db), "--base-url", URL, stdin="/budget\n/exit\n")
    assert "of the 1,536-token budget left" in run.err
    assert "last turn" not in run.err


def _args(**given: object) -> argparse.Namespace:
    values: dict[str, object] = {
        "provider": None,
        "base_url": URL,
        "model": None,
        "max_context_tokens": None,
        "max_output_tokens": None,
    }
    values.update(given)
    return argparse.Namespace(**values)


def test_a_llama_cpp_server_gets_an_exact_counter_and_another_server_does_not() -> None:
    with respx.mock() as mock:
        mock.get(f"{URL}/models").mock(return_value=llama_cpp_models(n_ctx=2048))
        driver, model, _ = build_driver(_args())
    assert isinstance(driver, OpenAIChatDriver)
    assert driver.exact_token_counter(model) is not None

    vllm = {"object": "list", "data": [{"id": "qwen", "max_model_len": 4096}]}
    with respx.mock() as mock:
        mock.get(f"{URL}/models").mock(return_value=httpx.Response(200, json=vllm))
        driver, model, _ = build_driver(_args())
    assert isinstance(driver, OpenAIChatDriver)
    assert driver.exact_token_counter(Model("qwen")) is None
