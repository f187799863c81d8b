"""The ``threadline`` command, invoked in process (CliRunner-style): chat, conversations, count.

The terminal (pexpect) tests are in test_cli_terminal.py, the tests against
servers in test_cli_servers.py; both use :func:`invoke` from here.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import threadline
from threadline import Message, Model
from threadline.cli import main
from threadline.serialization import (
    ConversationDocument,
    dumps_conversation,
    dumps_messages,
    loads_conversation,
)
from threadline.testing import ScriptedDriver

MODEL = Model("scripted", context_size=4096)


class Run:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err


def invoke(
    *argv: str,
    driver: ScriptedDriver | None = None,
    stdin: str = "",
    model: Model = MODEL,
    seen: list[Any] | None = None,
) -> Run:
    """Run the command in process; ``driver`` stands in for the provider (the reply cap is
    ``--max-output-tokens``, else 256, as for the local model); ``seen`` collects the
    arguments the driver was built from."""
    out, err = io.StringIO(), io.StringIO()

    def factory(args: Any) -> tuple[ScriptedDriver, Model, int | None]:
        assert driver is not None
        if seen is not None:
            seen.append(args)
        return driver, model, args.max_output_tokens or 256

    code = main(
        list(argv),
        stdin=io.StringIO(stdin),
        stdout=out,
        stderr=err,
        driver_factory=factory if driver is not None else None,
    )
    return Run(code, out.getvalue(), err.getvalue())


def errors(run: Run) -> list[str]:
    return re.findall(r"threadline: error: [^\n]*", run.err)


# -- chat --once ---------------------------------------------------------------------------


def test_once_prints_the_answer_and_a_status_line_and_persists_the_turn(db: Path) -> None:
    driver = ScriptedDriver(["Hello, Ada."])
    run = invoke("chat", "--db", str(db), "--conversation", "c1", "--once", "Hi", driver=driver)
    assert run.code == 0, run.err
    assert run.out == "Hello, Ada.\n"
    status = run.err.splitlines()[0]
    assert re.fullmatch(
        r"\[(sent \d+ of 3,840 budget tokens \(server: \d+\)|estimate \d+ · server \d+ "
        r"\([+-]\d+\.\d%\) of 3,840 budget tokens) · 256 kept for the answer · "
        r"nothing dropped · 1 turn\]",
        status,
    ), status
    assert f"threadline chat --conversation c1 --db {db}" in run.err

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


def test_status_line_says_which_turns_limiting_dropped(db: Path) -> None:
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
    # A conversation cuts down to 60% of the budget (cache_stable_units): two turns go.
    assert "dropped the 2 oldest turns (4 messages)" in run.err
    assert "unit" not in run.err


# -- conversations -------------------------------------------------------------------------


def test_conversations_list_show_export_import_and_delete(db: Path, tmp_path: Path) -> None:
    driver = ScriptedDriver(["Fine, thanks."])
    invoke(
        "chat", "--db", str(db), "--conversation", "talk", "--once", "How are you?", driver=driver
    )

    listing = invoke("conversations", "--db", str(db), "list")
    assert listing.code == 0
    assert listing.out.startswith("talk\t2 messages\tupdated 2")

    # No action lists, as `llm logs` does.
    assert invoke("conversations", "--db", str(db)).out == listing.out

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
        ('{"format_version": 1, "messages": [{"role": "wizard"', "is not valid JSON"),
        ('{"format_version": 99, "messages": []}', "version 99"),
        (b"\xff\xfe", "is not UTF-8 text"),
        ("", "is empty"),
        ("  \n", "is empty"),
        ('{"hello": 1}', "neither a saved conversation nor a message list"),
        ('"a string"', "neither a saved conversation nor a message list"),
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
    assert str(path) in run.err
    assert "$:" not in run.err
    assert "Traceback" not in run.err


def test_count_of_a_directory_says_it_is_a_directory(tmp_path: Path) -> None:
    run = invoke("count", str(tmp_path))
    assert run.code == 1
    assert run.err == (
        f"threadline: error: {tmp_path} is a directory; count takes a saved conversation "
        "(/save, conversations export) or a JSON message list\n"
    )


def test_a_missing_file_is_one_line(tmp_path: Path) -> None:
    run = invoke("count", str(tmp_path / "nope.json"))
    assert (run.code, run.err) == (
        1,
        f"threadline: error: no such file: {tmp_path / 'nope.json'}\n",
    )


def test_a_usage_mistake_exits_2() -> None:
    run = invoke("chat", "--max-context-tokens", "-3")
    assert run.code == 2


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
    assert errors[0] == "threadline: error: cannot reach the provider (the server is down)"
    assert errors[1].startswith("threadline: error: no such file")
    assert "second try works" in run.out
    # The failed turn left nothing behind: the history holds only the second one.
    assert run.out.count("user> ") == 1


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


# -- budgets a resumed conversation keeps ------------------------------------------------


def test_a_resumed_conversation_keeps_its_system_instructions(db: Path) -> None:
    driver = ScriptedDriver(["first", "second", "third"])
    first = invoke(
        "chat",
        "--db",
        str(db),
        "--conversation",
        "c",
        "--system",
        "Be brief.",
        "--once",
        "hi",
        driver=driver,
    )
    assert first.code == 0, first.err
    again = invoke("chat", "--db", str(db), "--conversation", "c", "--once", "more", driver=driver)
    assert again.code == 0, again.err
    systems = [m.text for m in driver.calls[1].messages if m.role.value == "system"]
    assert systems == ["Be brief."]
    # A new --system on resume wins, and is what is saved from then on.
    invoke(
        "chat",
        "--db",
        str(db),
        "--conversation",
        "c",
        "--system",
        "Be kind.",
        "--once",
        "x",
        driver=driver,
    )
    assert [m.text for m in driver.calls[2].messages if m.role.value == "system"] == ["Be kind."]
    settings = loads_conversation(
        invoke("conversations", "export", "c", "--db", str(db)).out
    ).settings
    assert settings["instructions"] == "Be kind."


def test_a_resumed_conversation_keeps_its_max_output_tokens_and_reserve(db: Path) -> None:
    driver = ScriptedDriver(["first", "second", "third"])
    flags = ("--max-context-tokens", "300", "--max-output-tokens", "100", "--reserve", "120")
    first = invoke(
        "chat", "--db", str(db), "--conversation", "c", *flags, "--once", "hi", driver=driver
    )
    assert first.code == 0, first.err
    assert "of 180 budget tokens" in first.err

    again = invoke("chat", "--db", str(db), "--conversation", "c", "--once", "more", driver=driver)
    assert again.code == 0, again.err
    # 300 - 120, as before; not 300 - 256 because the reply cap was forgotten.
    assert "of 180 budget tokens" in again.err
    assert "120 kept for the answer" in again.err
    assert driver.calls[1].max_output_tokens == 100

    # A flag given on resume wins, and is what is saved from then on.
    changed = invoke(
        "chat",
        "--db",
        str(db),
        "--conversation",
        "c",
        "--reserve",
        "50",
        "--once",
        "x",
        driver=driver,
    )
    assert "of 250 budget tokens" in changed.err
    settings = loads_conversation(
        invoke("conversations", "export", "c", "--db", str(db)).out
    ).settings
    assert settings == {
        "max_context_tokens": 300,
        "output_reserve_tokens": 50,
        "max_output_tokens": 100,
    }


def test_defaults_are_not_saved_with_the_conversation(db: Path) -> None:
    invoke(
        "chat", "--db", str(db), "--conversation", "c", "--once", "hi", driver=ScriptedDriver(["x"])
    )
    document = loads_conversation(invoke("conversations", "export", "c", "--db", str(db)).out)
    assert document.settings == {"max_context_tokens": None}


def test_a_prompt_bigger_than_the_window_is_refused_before_anything_is_sent(db: Path) -> None:
    driver = ScriptedDriver([])
    run = invoke(
        "chat",
        "--db",
        str(db),
        "--max-context-tokens",
        "2048",
        "--once",
        "word " * 3000,
        driver=driver,
    )
    assert run.code == 1
    assert driver.calls == []
    (line,) = errors(run)
    assert re.search(
        r"your prompt is [\d,]+ tokens; this window allows 1,792 \(2,048 less 256", line
    )
    assert "--max-context-tokens" in line
    assert "with_" not in line


def test_a_window_the_reserve_fills_names_the_flags(db: Path) -> None:
    run = invoke(
        "chat",
        "--db",
        str(db),
        "--max-context-tokens",
        "10",
        "--once",
        "hi",
        driver=ScriptedDriver([]),
    )
    assert run.code == 1
    assert errors(run) == [
        "threadline: error: --max-context-tokens 10 leaves no room for the prompt: 256 tokens "
        "are kept for the answer; raise --max-context-tokens or lower --reserve / "
        "--max-output-tokens"
    ]


def test_budget_says_by_how_much_the_history_is_over(db: Path) -> None:
    long = "word " * 300
    driver = ScriptedDriver([long, long])
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
        driver=driver,
        stdin="/budget\n/exit\n",
    )
    assert run.code == 0, run.err
    found = re.search(
        r"over the 644-token budget by ([\d,]+) tokens; the oldest turns will be dropped", run.err
    )
    assert found, run.err
    assert "0 tokens left" not in run.err


def test_budget_says_what_is_left(db: Path) -> None:
    run = invoke("chat", "--db", str(db), driver=ScriptedDriver([]), stdin="/budget\n/exit\n")
    assert re.search(
        r"[\d,]+ of the 3,840-token budget left \(256 more kept for the answer\)", run.err
    )


def test_budget_says_why_the_cache_missed_or_could_hit(db: Path) -> None:
    driver = ScriptedDriver(["one", "two"])
    run = invoke("chat", "--db", str(db), driver=driver, stdin="hi\nagain\n/budget\n/exit\n")
    assert run.code == 0, run.err
    assert re.search(r"round 1: cache: \d+% of the prompt; prefix kept \(1 message\)", run.err)


# -- the chat's own conventions ----------------------------------------------------------


def test_help_in_the_chat_lists_its_commands(db: Path) -> None:
    run = invoke("chat", "--db", str(db), driver=ScriptedDriver([]), stdin="/help\n/exit\n")
    assert run.code == 0, run.err
    for command in ("/help", "/history", "/budget", "/reset", "/save FILE", "/exit"):
        assert command in run.err
    unknown = invoke("chat", "--db", str(db), driver=ScriptedDriver([]), stdin="/nope\n")
    assert "(unknown command /nope; /help lists them)" in unknown.err


def test_end_of_input_prints_the_way_back_like_once(db: Path) -> None:
    run = invoke(
        "chat",
        "--db",
        str(db),
        "--conversation",
        "keep",
        driver=ScriptedDriver(["hi"]),
        stdin="hello\n",
    )
    assert run.code == 0, run.err
    assert run.err.rstrip().endswith(
        f"(conversation keep: continue it with `threadline chat --conversation keep --db {db}`)"
    )


def test_continue_and_last_resume_the_most_recent_conversation(db: Path) -> None:
    driver = ScriptedDriver(["a", "b", "c", "d"])
    for name in ("older", "newer"):
        invoke(
            "chat", "--db", str(db), "--conversation", name, "--once", f"in {name}", driver=driver
        )
    for flag in ("--continue", "--last"):
        run = invoke("chat", "--db", str(db), flag, "--once", "and now?", driver=driver)
        assert run.code == 0, run.err
        assert "conversation newer:" in run.err
    assert [m.text for m in driver.calls[-1].messages][:2] == ["in newer", "b"]


def test_continue_with_nothing_saved_starts_a_new_conversation(db: Path) -> None:
    run = invoke(
        "chat", "--db", str(db), "--continue", "--once", "hi", driver=ScriptedDriver(["x"])
    )
    assert run.code == 0, run.err
    assert f"(no earlier conversation in {db}; starting a new one)" in run.err


def test_no_save_answers_and_writes_nothing(db: Path) -> None:
    run = invoke("chat", "--db", str(db), "--no-save", "--once", "hi", driver=ScriptedDriver(["x"]))
    assert (run.code, run.out) == (0, "x\n")
    assert "(nothing was saved: --no-save)" in run.err
    assert not db.exists()


def test_no_save_reads_a_conversation_and_leaves_it_unchanged(db: Path) -> None:
    driver = ScriptedDriver(["Hello, Ada.", "You are Ada."])
    invoke("chat", "--db", str(db), "--conversation", "c", "--once", "I am Ada", driver=driver)
    before = invoke("conversations", "export", "c", "--db", str(db)).out
    run = invoke(
        "chat",
        "--db",
        str(db),
        "--conversation",
        "c",
        "--no-save",
        "--once",
        "Who am I?",
        driver=driver,
    )
    assert run.code == 0, run.err
    assert [m.text for m in driver.calls[1].messages] == ["I am Ada", "Hello, Ada.", "Who am I?"]
    assert invoke("conversations", "export", "c", "--db", str(db)).out == before


def test_a_failed_turn_does_not_change_updated(db: Path) -> None:
    from threadline import ProviderUnavailableError

    driver = ScriptedDriver(["fine", ProviderUnavailableError("down")])
    invoke("chat", "--db", str(db), "--conversation", "c", "--once", "hi", driver=driver)
    before = invoke("conversations", "list", "--db", str(db)).out
    failed = invoke(
        "chat", "--db", str(db), "--conversation", "c", "--once", "again", driver=driver
    )
    assert failed.code == 1
    assert invoke("conversations", "list", "--db", str(db)).out == before


def test_repeat_penalty_and_temperature_reach_the_provider(db: Path) -> None:
    driver = ScriptedDriver(["x"])
    invoke(
        "chat",
        "--db",
        str(db),
        "--repeat-penalty",
        "1.25",
        "--temperature",
        "0.5",
        "--once",
        "hi",
        driver=driver,
    )
    call = driver.calls[0]
    assert call.extra_body == {"repeat_penalty": 1.25}
    assert call.sampling.temperature == 0.5


def test_the_local_model_gets_a_repeat_penalty_by_default(db: Path) -> None:
    class LocalStandIn(ScriptedDriver):
        name = "local"

    driver = LocalStandIn(["x"])
    invoke("chat", "--db", str(db), "--once", "hi", driver=driver)
    assert driver.calls[0].extra_body == {"repeat_penalty": 1.3}
    plain = ScriptedDriver(["x"])
    invoke("chat", "--db", str(db), "--once", "hi", driver=plain)
    assert plain.calls[0].extra_body == {}


# -- the command line a newcomer reads ---------------------------------------------------


def test_version_prints_the_package_version() -> None:
    run = invoke("--version")
    assert (run.code, run.out) == (0, f"threadline {threadline.__version__}\n")


def test_help_names_every_command_the_environment_and_the_database() -> None:
    top = invoke("--help")
    assert top.code == 0
    text = " ".join(top.out.split())
    for word in (
        "chat",
        "conversations",
        "import",
        "count",
        "THREADLINE_DB",
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "conversations.sqlite3",
    ):
        assert word in text


@pytest.mark.parametrize("command", [["chat"], ["conversations"], ["count"]])
def test_every_option_says_its_default(command: list[str]) -> None:
    run = invoke(*command, "--help")
    assert run.code == 0
    options = re.split(r"\n  (?=-)", run.out.split("options:")[1])[1:]
    without = [
        o.split()[0]
        for o in options
        if "default" not in o
        and not o.startswith(("-h", "--no-save", "--once", "--conversation", "--continue"))
    ]
    assert without == []


def test_db_is_accepted_in_the_same_place_for_every_command(db: Path, tmp_path: Path) -> None:
    invoke(
        "chat", "--conversation", "c", "--once", "hi", "--db", str(db), driver=ScriptedDriver(["x"])
    )
    assert db.exists()
    for argv in (
        ["conversations", "list", "--db", str(db)],
        ["conversations", "--db", str(db), "list"],
        ["--db", str(db), "conversations", "list"],
    ):
        assert invoke(*argv).out.startswith("c\t2 messages"), argv
    assert invoke("conversations", "show", "c", "--db", str(db)).code == 0
    assert invoke("conversations", "export", "c", "--db", str(db)).code == 0
    exported = tmp_path / "c.json"
    exported.write_text(invoke("conversations", "export", "c", "--db", str(db)).out)
    other = tmp_path / "other.sqlite3"
    assert invoke("conversations", "import", str(exported), "--db", str(other)).code == 0
    assert invoke("conversations", "delete", "c", "--db", str(other)).code == 0


def test_read_only_commands_never_create_a_database(tmp_path: Path) -> None:
    missing = tmp_path / "typo" / "conversations.sqlite3"
    listing = invoke("conversations", "list", "--db", str(missing))
    assert (listing.code, listing.err) == (
        0,
        f"no conversations (there is no database at {missing} yet)\n",
    )
    for action in (["show", "c"], ["export", "c"], ["delete", "c"]):
        run = invoke("conversations", *action, "--db", str(missing))
        assert run.code == 1
        assert str(missing) in run.err
        assert run.err.count("\n") == 1
    assert not (tmp_path / "typo").exists()


def _immutable(*paths: Path) -> bool:
    done = subprocess.run(["chattr", "+i", *map(str, paths)], capture_output=True)
    return done.returncode == 0


def _mutable(*paths: Path) -> None:
    subprocess.run(["chattr", "-i", *map(str, paths)], capture_output=True)


def test_a_read_only_database_can_be_listed_shown_and_exported(tmp_path: Path) -> None:
    folder = tmp_path / "shelf"
    folder.mkdir()
    db = folder / "conversations.sqlite3"
    invoke(
        "chat", "--db", str(db), "--conversation", "c", "--once", "hi", driver=ScriptedDriver(["x"])
    )
    # Even root cannot write an immutable file, nor make a -shm file in an immutable folder.
    if not _immutable(db, folder):
        pytest.skip("chattr +i is not available here")
    try:
        assert invoke("conversations", "list", "--db", str(db)).out.startswith("c\t2 messages")
        assert (
            invoke("conversations", "show", "c", "--db", str(db)).out == "user> hi\nassistant> x\n"
        )
        assert (
            loads_conversation(invoke("conversations", "export", "c", "--db", str(db)).out).id
            == "c"
        )
        deleted = invoke("conversations", "delete", "c", "--db", str(db))
        assert deleted.code == 1
        assert deleted.err.count("\n") == 1
        assert str(db) in deleted.err
    finally:
        _mutable(db, folder)
    assert sorted(p.name for p in folder.iterdir()) == ["conversations.sqlite3"]


def test_import_of_a_file_that_is_not_json_says_only_json_exports_import(
    db: Path, tmp_path: Path
) -> None:
    markdown = tmp_path / "talk.md"
    markdown.write_text("# Conversation talk\n")
    run = invoke("conversations", "import", str(markdown), "--db", str(db))
    assert run.code == 1
    assert errors(run) == [
        f"threadline: error: {markdown} is not JSON; only conversations exported as JSON "
        "import (conversations export ID, or /save FILE in the chat)"
    ]


def test_a_damaged_conversation_document_names_the_place_without_a_json_root(
    db: Path, tmp_path: Path
) -> None:
    path = tmp_path / "bad.json"
    damaged = json.loads(dumps_conversation(ConversationDocument(id="x", next_turn_id=1)))
    damaged["events"] = [{"message": 3}]
    path.write_text(json.dumps(damaged))
    run = invoke("conversations", "import", str(path), "--db", str(db))
    assert run.code == 1
    assert run.err.count("\n") == 1
    assert "$:" not in run.err
    assert "$.events[0]" in run.err


def test_count_with_a_known_model_uses_the_catalog_window(tmp_path: Path) -> None:
    path = tmp_path / "messages.json"
    path.write_text(dumps_messages([Message.user("hello world")]))
    run = invoke("count", str(path), "--model", "gpt-4o-mini")
    assert run.code == 0, run.err
    assert "fits a 128000-token context (gpt-4o-mini)" in run.out


def test_count_with_an_unknown_model_says_it_is_unknown(tmp_path: Path) -> None:
    path = tmp_path / "messages.json"
    path.write_text(dumps_messages([Message.user("hello world")]))
    run = invoke("count", str(path), "--model", "gpt-nonexistent-9")
    assert run.code == 1
    assert errors(run) == [
        "threadline: error: the model 'gpt-nonexistent-9' is unknown to the model catalog; "
        "give its window with --context-size N"
    ]


def test_without_the_local_extra_chat_says_the_three_ways_forward(tmp_path: Path) -> None:
    # A real process in which llama_cpp cannot be found, as after a plain pip install.
    code = (
        "import sys; sys.modules['llama_cpp'] = None; sys.argv = ['threadline'] + sys.argv[1:];"
        "from threadline.cli import run; run()"
    )
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "THREADLINE_DB": str(tmp_path / "d.db")}
    for argv in (["chat", "--once", "hi"], ["chat", "--provider", "local", "--once", "hi"]):
        done = subprocess.run(
            [sys.executable, "-c", code, *argv], env=env, capture_output=True, text=True
        )
        assert done.returncode == 1
        assert "Traceback" not in done.stderr
        assert done.stderr.count("\n") == 1, done.stderr
        for way in ("pip install 'threadline[local]'", "OPENAI_API_KEY", "--base-url"):
            assert way in done.stderr


def test_budget_says_what_the_last_turn_dropped(db: Path) -> None:
    long = " ".join(f"word{i}" for i in range(120))
    driver = ScriptedDriver([f"answer {i} " + long for i in range(3)])
    run = invoke(
        "chat",
        "--db",
        str(db),
        "--max-context-tokens",
        "900",
        driver=driver,
        stdin=f"{long}\n{long}\n{long}\n/budget\n/exit\n",
    )
    assert run.code == 0, run.err
    assert re.search(
        r"last turn's limiting: 1 round, prompt budget 644: round 1: \w+ \(pre\) dropped "
        r"\d+ units \(1 user, 1 assistant; 2 messages\); [\d,]+ → \d+ tokens, budget 644",
        run.err,
    ), run.err
