"""``threadline chat --base-url`` against a real llama.cpp server (llama-cpp-python's).

This server does not report its window, so the chat says so and how to set it;
with ``--max-context-tokens`` set to the server's window the budget holds
against the real thing: old turns are dropped, and a prompt that cannot fit is
refused before it is sent.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration


def chat(llama_server: str, db: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "THREADLINE_"))}
    command = [sys.executable, "-m", "threadline", "chat", "--base-url", llama_server]
    return subprocess.run(
        [*command, "--db", str(db), *argv], env=env, capture_output=True, text=True, timeout=300
    )


def test_an_unknown_window_is_said_plainly_and_how_to_set_it(
    llama_server: str, tmp_path: Path
) -> None:
    done = chat(llama_server, tmp_path / "c.db", "--max-output-tokens", "16", "--once", "Hi!")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()
    assert f"the window of smollm2-135m-instruct at {llama_server} is unknown" in done.stderr
    assert "set --max-context-tokens N" in done.stderr


def test_limiting_against_the_servers_small_window(llama_server: str, tmp_path: Path) -> None:
    db = tmp_path / "c.db"
    # The server's window is 2,048; keep to 400 of it so a few turns fill it.
    flags = ("--conversation", "small", "--max-context-tokens", "400")
    statuses = []
    for topic in ("the sea", "the mountains", "the desert", "the forest"):
        # About 110 tokens a prompt: by the third turn the prompts alone are over budget.
        prompt = f"Describe {topic} in two sentences. " + "Please be vivid. " * 25
        done = chat(llama_server, db, *flags, "--once", prompt)
        assert done.returncode == 0, done.stderr
        statuses.append(done.stderr.splitlines()[0])
    # A quarter of 400 is kept for each answer; the rest is the budget.
    assert all("of 300 budget tokens" in s and "100 kept for the answer" in s for s in statuses)
    assert re.search(r"dropped the (oldest turn|\d+ oldest turns)", statuses[-1]), statuses
    # The budget flag was saved: the next turn keeps to it with no flag given.
    again = chat(llama_server, db, "--conversation", "small", "--once", "And the sky?")
    assert again.returncode == 0, again.stderr
    assert "of 300 budget tokens" in again.stderr


def test_a_prompt_bigger_than_the_window_is_refused_naming_the_flag(
    llama_server: str, tmp_path: Path
) -> None:
    done = chat(
        llama_server, tmp_path / "c.db", "--max-context-tokens", "2048", "--once", "word " * 3000
    )
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1, done.stderr
    assert re.match(
        r"threadline: error: your prompt is [\d,]+ tokens; this window allows 1,536 "
        r"\(2,048 less 512 kept for the answer\): shorten it, or raise --max-context-tokens",
        done.stderr,
    )
