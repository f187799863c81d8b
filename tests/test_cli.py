"""The ``threadline`` command, invoked in process (CliRunner-style) and in a terminal."""

from __future__ import annotations

import io
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

import httpx
import pytest
import respx

from threadline import Message, Model
from threadline.cli import main
from threadline.serialization import dumps_messages, loads_conversation
from threadline.testing import ScriptedDriver

MODEL = Model("scripted", context_size=4096)


class Run:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err


def invoke(*argv: str, driver: ScriptedDriver | None = None, stdin: str = "") -> Run:
    out, err = io.StringIO(), io.StringIO()

    def factory(args: Any) -> tuple[ScriptedDriver, Model, int | None]:
        assert driver is not None
        return driver, MODEL, 256

    code = main(
        list(argv),
        stdin=io.StringIO(stdin),
        stdout=out,
        stderr=err,
        driver_factory=factory if driver is not None else None,
    )
    return Run(code, out.getvalue(), err.getvalue())


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "conversations.sqlite3"


@pytest.fixture(autouse=True)
def no_provider_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "THREADLINE_PROVIDER", "THREADLINE_DB"):
        monkeypatch.delenv(name, raising=False)


# -- chat --once ---------------------------------------------------------------------------


def test_once_prints_the_answer_and_a_status_line_and_persists_the_turn(db: Path) -> None:
    driver = ScriptedDriver(["Hello, Ada."])
    run = invoke("chat", "--db", str(db), "--conversation", "c1", "--once", "Hi", driver=driver)
    assert run.code == 0, run.err
    assert run.out == "Hello, Ada.\n"
    assert "budget" in run.err
    assert "reserve" in run.err
    assert "dropped 0 unit(s)" in run.err

    again = ScriptedDriver(["You are Ada."])
    second = invoke(
        "chat", "--db", str(db), "--conversation", "c1", "--once", "Who am I?", driver=again
    )
    assert second.code == 0, second.err
    assert [m.text for m in again.calls[0].messages] == ["Hi", "Hello, Ada.", "Who am I?"]


def test_once_reads_the_prompt_from_standard_input(db: Path) -> None:
    driver = ScriptedDriver(["from stdin"])
    run = invoke("chat", "--db", str(db), "--once", driver=driver, stdin="a piped prompt\n")
    assert run.code == 0, run.err
    assert driver.calls[0].messages[-1].text == "a piped prompt\n"


def test_once_with_an_empty_prompt_is_one_clear_error(db: Path) -> None:
    run = invoke("chat", "--db", str(db), "--once", driver=ScriptedDriver([]), stdin="  ")
    assert run.code == 1
    assert run.err.count("\n") == 1
    assert "needs a prompt" in run.err


def test_status_line_counts_the_units_limiting_dropped(db: Path) -> None:
    long = "word " * 300
    driver = ScriptedDriver([long, long, "short"])
    for prompt in ("one " * 200, "two " * 200):
        invoke("chat", "--db", str(db), "--conversation", "c", "--once", prompt, driver=driver)
    run = invoke(
        "chat",
        "--db",
        str(db),
        "--conversation",
        "c",
        "--max-context-tokens",
        "900",
        "--once",
        "three",
        driver=driver,
    )
    assert run.code == 0, run.err
    assert "dropped 0 unit(s)" not in run.err
    assert "dropped" in run.err


# -- conversations -------------------------------------------------------------------------


def test_conversations_list_show_export_import_and_delete(db: Path, tmp_path: Path) -> None:
    driver = ScriptedDriver(["Fine, thanks."])
    invoke(
        "chat", "--db", str(db), "--conversation", "talk", "--once", "How are you?", driver=driver
    )

    listing = invoke("conversations", "--db", str(db), "list")
    assert listing.code == 0
    assert listing.out.startswith("talk\t2 message(s)")

    shown = invoke("conversations", "--db", str(db), "show", "talk")
    assert shown.out.splitlines() == ["user> How are you?", "assistant> Fine, thanks."]

    exported = invoke("conversations", "--db", str(db), "export", "talk")
    document = loads_conversation(exported.out)
    assert [e.message.text for e in document.events] == ["How are you?", "Fine, thanks."]

    markdown = invoke("conversations", "--db", str(db), "export", "talk", "--format", "markdown")
    assert "# Conversation talk" in markdown.out
    assert "**assistant**" in markdown.out

    saved = tmp_path / "talk.json"
    saved.write_text(exported.out, encoding="utf-8")
    other_db = tmp_path / "other.sqlite3"
    assert invoke("conversations", "--db", str(other_db), "import", str(saved)).code == 0
    again = invoke("conversations", "--db", str(other_db), "export", "talk")
    assert loads_conversation(again.out) == document

    assert invoke("conversations", "--db", str(db), "delete", "talk").code == 0
    gone = invoke("conversations", "--db", str(db), "show", "talk")
    assert gone.code == 1
    assert gone.err == "threadline: error: no conversation with id 'talk'\n"


# -- count ---------------------------------------------------------------------------------


def test_count_prints_tokens_per_message_the_total_and_the_context_needed(tmp_path: Path) -> None:
    path = tmp_path / "messages.json"
    path.write_text(dumps_messages([Message.user("hello world"), Message.assistant("hi")]))
    run = invoke("count", str(path), "--context-size", "8000", "--reserve", "1000")
    assert run.code == 0, run.err
    lines = run.out.splitlines()
    assert "user" in lines[0]
    assert "assistant" in lines[1]
    total = sum(int(line.split()[2]) for line in lines[:2])
    assert f"total: {total + 3} tokens in 2 message(s)" in run.out
    assert f"at least {total + 3 + 1000} tokens" in run.out
    assert "fits a 8000-token context" in run.out


# -- errors: one line, non-zero exit -------------------------------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"format_version": 1, "messages": [{"role": "wizard"', "not valid JSON"),
        ('{"format_version": 99, "messages": []}', "version"),
        (b"\xff\xfe", "not valid JSON"),
    ],
)
def test_a_corrupt_file_is_one_line_and_exit_1(
    tmp_path: Path, content: str | bytes, expected: str
) -> None:
    path = tmp_path / "broken.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    else:
        path.write_text(content)
    run = invoke("count", str(path))
    assert run.code == 1
    assert run.err.startswith("threadline: error: ")
    assert run.err.count("\n") == 1
    assert expected in run.err
    assert "Traceback" not in run.err


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    run = invoke("count", str(tmp_path / "nope.json"))
    assert (run.code, run.err) == (
        1,
        f"threadline: error: no such file: {tmp_path / 'nope.json'}\n",
    )


def test_an_unreachable_server_is_one_line(db: Path) -> None:
    # Port 9 (discard) on loopback: nothing listens there on these machines.
    with respx.mock(assert_all_called=False) as mock:
        mock.post("http://127.0.0.1:9/v1/chat/completions").mock(
            side_effect=httpx.ConnectError("connection refused")
        )
        run = invoke("chat", "--db", str(db), "--base-url", "http://127.0.0.1:9/v1", "--once", "hi")
    assert run.code == 1
    assert run.err.startswith("threadline: error: cannot reach the provider")
    assert run.err.count("\n") == 1


def test_a_bad_key_is_one_line_and_never_shows_the_key(
    db: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-obviously-fake-cli-0000")
    with respx.mock() as mock:
        mock.post("https://api.openai.com/v1/chat/completions").mock(
            return_value=httpx.Response(
                401, json={"error": {"message": "Incorrect API key provided", "code": "invalid"}}
            )
        )
        run = invoke("chat", "--db", str(db), "--once", "hi")
    assert run.code == 1
    assert run.err.startswith("threadline: error: the provider refused the API key")
    assert "sk-test-obviously-fake-cli-0000" not in run.err + run.out


def test_a_usage_mistake_exits_2() -> None:
    run = invoke("chat", "--max-context-tokens", "-3")
    assert run.code == 2


# -- the interactive chat in a real terminal -----------------------------------------------


class _SlowStream(BaseHTTPRequestHandler):
    """An OpenAI-compatible endpoint whose streamed answer takes its time."""

    chunks_sent = 0

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["content-length"]))
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
                gate.wait(0.05)  # pace the answer so Ctrl-C lands in the middle of it
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


def test_ctrl_c_mid_answer_cancels_it_and_the_conversation_is_unchanged(
    slow_server: str, db: Path
) -> None:
    pexpect = pytest.importorskip("pexpect")
    child = pexpect.spawn(
        sys.executable,
        ["-m", "threadline", "chat", "--base-url", slow_server, "--db", str(db)],
        encoding="utf-8",
        timeout=30,
        env={"PATH": "/usr/bin:/bin", "HOME": str(db.parent), "TERM": "dumb"},
    )
    try:
        child.expect("you> ")
        child.sendline("tell me a long story")
        child.expect("tok3 ")  # the answer is streaming
        child.sendintr()
        child.expect(r"answer cancelled; the turn was not saved")
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
    assert "budget" in first.stderr
    second = subprocess.run([*command, "What is my name?"], env=env, capture_output=True, text=True)
    assert second.returncode == 0, second.stderr
    listing = invoke("conversations", "--db", env["THREADLINE_DB"], "show", "demo")
    assert listing.out.count("user> ") == 2
    assert listing.out.count("assistant> ") == 2


def test_the_interactive_chat_reports_a_failed_turn_in_one_line_and_goes_on(
    db: Path, tmp_path: Path
) -> None:
    from threadline import ProviderUnavailableError

    driver = ScriptedDriver([ProviderUnavailableError("the server is down"), "second try works"])
    script = f"hello\n/save {tmp_path / 'missing' / 'x.json'}\nhello again\n/history\n/exit\n"
    run = invoke("chat", "--db", str(db), "--conversation", "c", driver=driver, stdin=script)
    assert run.code == 0, run.err
    assert "Traceback" not in run.err
    # Without a terminal the "you> " prompts go to stderr too, before each line.
    errors = re.findall(r"threadline: error: [^\n]*", run.err)
    assert errors[0] == "threadline: error: cannot reach the provider: the server is down"
    assert errors[1].startswith("threadline: error: no such file")
    assert "second try works" in run.out
    # The failed turn left nothing behind: the history holds only the second one.
    assert run.out.count("user> ") == 1


def test_max_output_tokens_applies_to_the_local_model_too() -> None:
    pytest.importorskip("llama_cpp", reason="pip install 'threadline[local]'")
    from threadline.cli import build_driver, parser

    args = parser().parse_args(["chat", "--provider", "local", "--max-output-tokens", "64"])
    _, model, max_output = build_driver(args)
    assert max_output == 64
    assert model.context_size == 2048
    default = build_driver(parser().parse_args(["chat", "--provider", "local"]))
    assert default[2] == 256


def test_importing_a_conversation_twice_says_it_already_exists(db: Path, tmp_path: Path) -> None:
    invoke(
        "chat",
        "--db",
        str(db),
        "--conversation",
        "dup",
        "--once",
        "hi",
        driver=ScriptedDriver(["x"]),
    )
    exported = invoke("conversations", "--db", str(db), "export", "dup")
    path = tmp_path / "dup.json"
    path.write_text(exported.out, encoding="utf-8")
    run = invoke("conversations", "--db", str(db), "import", str(path))
    assert run.code == 1
    assert "already exists" in run.err


def test_undecodable_input_is_one_clear_line(db: Path) -> None:
    run = invoke("chat", "--db", str(db), "--once", driver=ScriptedDriver([]), stdin="bad \udcff\n")
    assert run.code == 1
    assert "not UTF-8 text" in run.err
    assert run.err.count("\n") == 1
