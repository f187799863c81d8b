"""``threadline chat`` in a real terminal (pexpect) and as a real process.

The interactive tests drive ``python -m threadline chat`` through a pseudo
terminal, so Ctrl-C, Ctrl-D and line editing behave as they do for a user.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from test_cli import invoke

pexpect = pytest.importorskip("pexpect")


class _SlowStream(BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint whose streamed answer takes its time."""

    chunks_sent = 0

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        # A llama.cpp-style model listing with the window the server allocated.
        entry = {"id": "slow", "object": "model", "meta": {"n_ctx": 4096}}
        body = json.dumps({"object": "list", "data": [entry]}).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
        if not self.path.endswith("/chat/completions"):
            # Not llama.cpp's counting endpoints: threadline counts by its estimate.
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.end_headers()
        gate = threading.Event()
        try:
            for index in range(400):
                delta = {"choices": [{"index": 0, "delta": {"content": f"tok{index} "}}]}
                self.wfile.write(f"data: {json.dumps(delta)}\n\n".encode())
                self.wfile.flush()
                type(self).chunks_sent += 1
                gate.wait(0.02)  # pace the answer so Ctrl-C lands in the middle of it
        except (BrokenPipeError, ConnectionResetError):
            return


@pytest.fixture
def slow_server() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _SlowStream)
    _SlowStream.chunks_sent = 0
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    server.shutdown()
    server.server_close()


def _spawn(db: Path, *argv: str) -> Any:
    return pexpect.spawn(
        sys.executable,
        ["-m", "threadline", "chat", "--db", str(db), *argv],
        encoding="utf-8",
        timeout=30,
        env={"PATH": "/usr/bin:/bin", "HOME": str(db.parent), "TERM": "dumb"},
    )


def test_ctrl_c_mid_answer_stops_it_at_once_and_the_conversation_is_unchanged(
    slow_server: str, db: Path
) -> None:
    child = _spawn(db, "--base-url", slow_server, "--conversation", "c")
    try:
        child.expect("window 4,096")  # the server's window, in the banner
        child.expect("you> ")
        child.sendline("tell me a long story")
        child.expect("tok3 ")  # the answer is streaming
        child.sendintr()
        child.expect(r"answer stopped; the turn was not saved")
        # Nothing of the answer is printed after the interrupt: between the echoed ^C
        # and the notice there is no token.
        after_interrupt = child.before.rpartition("^C")[2]
        assert "tok" not in after_interrupt, after_interrupt
        child.expect("you> ")
        child.sendline("/history")
        child.expect(r"\(no turns yet\)")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    listing = invoke("conversations", "--db", str(db), "list")
    # The conversation may exist (its pending prompt was withdrawn) but holds no message.
    assert "1 message" not in listing.out
    assert _SlowStream.chunks_sent < 400


def test_ctrl_d_quits_with_the_way_back(slow_server: str, db: Path) -> None:
    child = _spawn(db, "--base-url", slow_server, "--conversation", "mine")
    try:
        child.expect("Type /help for commands")
        child.expect("you> ")
        child.sendline("/help")
        child.expect("/budget")
        child.expect("you> ")
        child.sendeof()
        child.expect(r"continue it with `threadline chat --conversation mine --db ")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


def test_ctrl_c_at_the_prompt_says_how_to_quit(slow_server: str, db: Path) -> None:
    child = _spawn(db, "--base-url", slow_server)
    try:
        child.expect("you> ")
        child.sendintr()
        child.expect(r"\(Ctrl-D or /exit quits\)")
        child.sendline("/exit")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0


@pytest.mark.integration
def test_once_holds_a_real_conversation_on_the_local_model(tmp_path: Path) -> None:
    pytest.importorskip("llama_cpp", reason="pip install 'threadline[local]'")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "THREADLINE_"))}
    env["THREADLINE_DB"] = str(tmp_path / "local.sqlite3")
    command = [sys.executable, "-m", "threadline", "chat", "--conversation", "demo", "--once"]
    first = subprocess.run(
        [*command, "My name is Ada. Say hello."], env=env, capture_output=True, text=True
    )
    assert first.returncode == 0, first.stderr
    assert first.stdout.strip()
    lines = first.stderr.splitlines()
    assert lines[0] == "(loading the local model… this takes a few seconds)"
    assert re.fullmatch(
        r"\[sent \d+ of 1,792 budget tokens \(server: \d+\) · 256 kept .*\]", lines[1]
    )
    second = subprocess.run([*command, "What is my name?"], env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    listing = invoke("conversations", "--db", env["THREADLINE_DB"], "show", "demo")
    assert listing.out.count("user> ") == 2
    assert listing.out.count("assistant> ") == 2


@pytest.mark.integration
def test_the_local_model_takes_its_window_from_the_flag_and_names_it() -> None:
    pytest.importorskip("llama_cpp", reason="pip install 'threadline[local]'")
    from threadline.cli import build_driver, parser

    args = parser().parse_args(["chat", "--provider", "local", "--max-output-tokens", "64"])
    _, model, max_output = build_driver(args)
    assert (model.context_size, max_output) == (2048, 64)
    default = build_driver(parser().parse_args(["chat", "--provider", "local"]))
    assert default[2] == 256
    small = invoke("chat", "--provider", "local", "--max-context-tokens", "10", "--once", "hi")
    assert small.code == 1
    assert small.err == (
        "threadline: error: --max-context-tokens 10 is too small for the local model (16 or more)\n"
    )
