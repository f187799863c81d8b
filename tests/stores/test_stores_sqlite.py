"""What only the SQLite store promises: the file, several processes, crashes, damaged rows."""

from __future__ import annotations

import json
import signal
import sqlite3
import sys
import textwrap
from collections.abc import AsyncIterator, Iterator
from contextlib import closing
from pathlib import Path
from subprocess import CompletedProcess
from typing import Any

import anyio
import anyio.abc
import attrs
import pytest
from anyio.streams.buffered import BufferedByteReceiveStream

from threadline import (
    ConversationFormatError,
    InvalidRequestError,
    Message,
    Origin,
    StoreError,
)
from threadline.serialization import FORMAT_VERSION, ConversationDocument, ConversationEvent

# Private: one test registers an old format in its migration table, one writes schema-1 rows.
from threadline.serialization import _converter as _serialization
from threadline.stores import StoreClosedError
from threadline.stores.sqlite import SCHEMA_VERSION, SQLiteStore

pytestmark = pytest.mark.anyio


def prompt(text: str, turn_id: int, *, pending: bool = False) -> ConversationEvent:
    return ConversationEvent(
        message=Message.user(text, origin=Origin.TURN), turn_id=turn_id, pending=pending
    )


def answer(text: str, turn_id: int) -> ConversationEvent:
    return ConversationEvent(message=Message.assistant(text, origin=Origin.TURN), turn_id=turn_id)


def three_turns() -> ConversationDocument:
    events = [
        event for turn in range(3) for event in (prompt(f"q{turn}", turn), answer(f"a{turn}", turn))
    ]
    return ConversationDocument(id="c1", next_turn_id=3, events=events)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "conversations.db"


@pytest.fixture
async def store(path: Path) -> AsyncIterator[SQLiteStore]:
    async with SQLiteStore(path) as opened:
        yield opened


@pytest.fixture
def raw(path: Path) -> Iterator[sqlite3.Connection]:
    """A connection of the test's own, to look at and damage the file behind the store's back."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with closing(sqlite3.connect(path, isolation_level=None)) as connection:
        yield connection


async def run_python(script: str, *args: str, check: bool = True) -> CompletedProcess[bytes]:
    """Run ``script`` in a new interpreter; ``check``: a failure raises, with its stderr."""
    return await anyio.run_process(
        [sys.executable, "-c", textwrap.dedent(script), *args], check=check
    )


# --- the file ------------------------------------------------------------------------------


async def test_the_file_and_its_directories_are_created_on_first_use(path: Path) -> None:
    store = SQLiteStore(path)
    assert not path.parent.exists()

    async with store:
        await store.save(three_turns(), expected_version=0)

    assert await anyio.Path(path).is_file()
    async with SQLiteStore(path) as reopened:
        stored = await reopened.load("c1")
    assert (stored.version, stored.document) == (1, three_turns())


async def test_the_file_is_in_wal_mode_with_a_schema_version(
    store: SQLiteStore, raw: sqlite3.Connection
) -> None:
    await store.list()

    assert raw.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert raw.execute("SELECT version FROM threadline_schema").fetchall() == [(SCHEMA_VERSION,)]


async def test_a_store_opening_while_another_process_holds_the_new_file_waits_for_it(
    path: Path, raw: sqlite3.Connection
) -> None:
    # Switching to WAL needs the file to itself, and while another connection holds a
    # write lock SQLite refuses at once, without its busy wait (that wait could
    # deadlock): two processes opening a new database together met "database is locked".
    raw.execute("CREATE TABLE other (x)")
    raw.execute("BEGIN IMMEDIATE")
    raw.execute("INSERT INTO other VALUES (1)")

    async def release() -> None:
        await anyio.sleep(0.3)  # the other process's write takes its time
        raw.execute("COMMIT")

    async with anyio.create_task_group() as group, SQLiteStore(path, timeout=5) as store:
        group.start_soon(release)
        assert await store.list() == []
    with closing(sqlite3.connect(path)) as fresh:
        assert fresh.execute("PRAGMA journal_mode").fetchone() == ("wal",)


async def test_a_newer_schema_version_is_refused(path: Path, raw: sqlite3.Connection) -> None:
    async with SQLiteStore(path) as store:
        await store.save(three_turns(), expected_version=0)
    raw.execute("UPDATE threadline_schema SET version = ?", (SCHEMA_VERSION + 1,))

    async with SQLiteStore(path) as store:
        with pytest.raises(ConversationFormatError, match="newer threadline") as caught:
            await store.load("c1")

    assert f"schema version {SCHEMA_VERSION + 1}" in str(caught.value)
    assert raw.execute("SELECT count(*) FROM threadline_events").fetchone() == (6,)


# The layout of schema version 1, as threadline 0.1.0.dev0 wrote it before generations.
SCHEMA_1 = """
CREATE TABLE threadline_schema (version INTEGER NOT NULL);
INSERT INTO threadline_schema (version) VALUES (1);
CREATE TABLE threadline_conversations (
    id TEXT PRIMARY KEY NOT NULL, version INTEGER NOT NULL, format_version INTEGER NOT NULL,
    header TEXT NOT NULL, metadata TEXT NOT NULL, event_count INTEGER NOT NULL,
    created_at TEXT NOT NULL, updated_at TEXT NOT NULL, touched INTEGER NOT NULL
);
CREATE INDEX threadline_conversations_touched ON threadline_conversations (touched);
CREATE TABLE threadline_events (
    conversation_id TEXT NOT NULL, seq INTEGER NOT NULL, turn_id INTEGER NOT NULL,
    pending INTEGER NOT NULL, event TEXT NOT NULL, PRIMARY KEY (conversation_id, seq)
) WITHOUT ROWID;
CREATE INDEX threadline_events_turn ON threadline_events (conversation_id, turn_id);
CREATE INDEX threadline_events_pending ON threadline_events (conversation_id) WHERE pending;
"""


async def test_a_file_of_schema_version_1_is_migrated_and_keeps_its_conversations(
    path: Path, raw: sqlite3.Connection
) -> None:
    document = three_turns()
    raw.executescript(SCHEMA_1)
    raw.execute(
        "INSERT INTO threadline_conversations VALUES ('c1', 4, ?, ?, '{}', ?, "
        "'2025-01-01T00:00:00+00:00', '2025-01-01T00:00:00+00:00', 1)",
        (FORMAT_VERSION, _serialization.dumps_conversation_header(document), len(document.events)),
    )
    raw.executemany(
        "INSERT INTO threadline_events VALUES ('c1', ?, ?, ?, ?)",
        [
            (seq, e.turn_id, e.pending, _serialization.dumps_event(e))
            for seq, e in enumerate(document.events)
        ],
    )

    async with SQLiteStore(path) as store:
        stored = await store.load("c1")
        assert (stored.version, stored.document) == (4, document)
        assert stored.generation
        assert await store.save(document, expected_version=4, generation=stored.generation) == 5
    assert raw.execute("SELECT version FROM threadline_schema").fetchall() == [(SCHEMA_VERSION,)]


async def test_a_file_that_is_not_a_database_is_refused(path: Path) -> None:
    await anyio.Path(path.parent).mkdir(parents=True)
    await anyio.Path(path).write_bytes(b"these are my notes, not a database" * 100)

    async with SQLiteStore(path) as store:
        with pytest.raises(ConversationFormatError, match="not a SQLite database"):
            await store.list()

    assert (await anyio.Path(path).read_bytes()).startswith(b"these are my notes")


async def test_memory_gives_a_private_database_for_the_stores_lifetime() -> None:
    async with SQLiteStore(":memory:") as store:
        await store.save(three_turns(), expected_version=0)
        assert (await store.load("c1")).document == three_turns()

    async with SQLiteStore(":memory:") as other:
        assert await other.list() == []


def test_an_empty_path_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="file path"):
        SQLiteStore("")


async def test_a_closed_store_refuses_calls_and_closing_twice_is_fine(path: Path) -> None:
    store = SQLiteStore(path)
    await store.save(three_turns(), expected_version=0)
    await store.aclose()
    await store.aclose()

    with pytest.raises(StoreClosedError, match="closed"):
        await store.load("c1")


# --- what a write costs --------------------------------------------------------------------------


async def test_appending_a_turn_writes_the_turn_and_not_the_transcript(
    store: SQLiteStore, raw: sqlite3.Connection
) -> None:
    history = [
        event for turn in range(100) for event in (prompt(f"q{turn}", turn), answer("a", turn))
    ]
    await store.save(
        ConversationDocument(id="c1", next_turn_id=100, events=history), expected_version=0
    )
    raw.executescript(
        """
        CREATE TABLE row_writes (kind TEXT);
        CREATE TRIGGER count_inserts AFTER INSERT ON threadline_events
            BEGIN INSERT INTO row_writes VALUES ('insert'); END;
        CREATE TRIGGER count_updates AFTER UPDATE ON threadline_events
            BEGIN INSERT INTO row_writes VALUES ('update'); END;
        CREATE TRIGGER count_deletes AFTER DELETE ON threadline_events
            BEGIN INSERT INTO row_writes VALUES ('delete'); END;
        """
    )
    state = ConversationDocument(id="c1", next_turn_id=101)

    version = await store.append_events(
        "c1", [prompt("q100", 100, pending=True)], header=state, expected_version=1
    )
    await store.append_events(
        "c1",
        [prompt("q100", 100), answer("a", 100)],
        header=state,
        expected_version=version,
        drop_pending=True,
    )

    writes = [kind for (kind,) in raw.execute("SELECT kind FROM row_writes")]
    assert sorted(writes) == ["delete", "insert", "insert", "insert"]
    assert len((await store.load("c1")).document.events) == 202


async def test_a_write_waiting_for_another_process_does_not_block_the_event_loop(
    store: SQLiteStore, raw: sqlite3.Connection
) -> None:
    await store.save(three_turns(), expected_version=0)
    written = anyio.Event()

    async def write() -> None:
        await store.append_events(
            "c1",
            [prompt("q3", 3)],
            header=attrs.evolve(three_turns(), next_turn_id=4, events=()),
            expected_version=1,
        )
        written.set()

    raw.execute("BEGIN IMMEDIATE")  # another writer holds the file
    async with anyio.create_task_group() as group:
        group.start_soon(write)
        await anyio.wait_all_tasks_blocked()
        # This task runs while the store's write waits for the lock in its thread.
        assert not written.is_set()
        raw.execute("COMMIT")

    assert written.is_set()
    assert (await store.load("c1")).version == 2


# --- damaged rows --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("damage", "path_prefix", "reason"),
    [
        ('{"message": {"role": "user", "content": "q1", "orig', "$.events[1]", "not valid JSON"),
        ("[1, 2, 3]", "$.events[1]", "expected an object"),
        (
            '{"message": {"role": "wizard", "content": "q1", "origin": "turn"}, "turn_id": 1}',
            "$.events[1].message.role",
            "expected a role",
        ),
    ],
)
async def test_a_damaged_event_row_is_refused_naming_the_conversation_and_the_event(
    store: SQLiteStore, raw: sqlite3.Connection, damage: str, path_prefix: str, reason: str
) -> None:
    await store.save(three_turns(), expected_version=0)
    raw.execute("DELETE FROM threadline_events WHERE seq = 0")  # so index 1 is seq 2
    raw.execute("UPDATE threadline_events SET event = ? WHERE seq = 2", (damage,))

    with pytest.raises(ConversationFormatError) as caught:
        await store.load("c1")

    assert caught.value.path.startswith(path_prefix)
    assert "stored conversation 'c1', event seq 2" in caught.value.reason
    assert reason in caught.value.reason


async def test_an_event_row_that_breaks_the_document_is_refused_naming_the_conversation(
    store: SQLiteStore, raw: sqlite3.Connection
) -> None:
    await store.save(three_turns(), expected_version=0)
    damage = '{"message": {"role": "user", "content": "q1", "origin": "turn"}, "turn_id": 7}'
    raw.execute("UPDATE threadline_events SET event = ? WHERE seq = 1", (damage,))

    with pytest.raises(ConversationFormatError) as caught:
        await store.load("c1")

    assert caught.value.path == "$.events[1].turn_id"
    assert caught.value.reason.startswith(
        "stored conversation 'c1', event seq 1: turn_id 7 is not below next_turn_id"
    )


async def test_an_event_row_of_bytes_that_are_not_utf8_is_refused(
    store: SQLiteStore, raw: sqlite3.Connection
) -> None:
    await store.save(three_turns(), expected_version=0)
    raw.execute("UPDATE threadline_events SET event = X'7bff00' WHERE seq = 3")

    with pytest.raises(ConversationFormatError, match="event seq 3: not UTF-8 text") as caught:
        await store.load("c1")
    assert caught.value.path == "$.events[3]"


async def test_a_damaged_header_is_refused_naming_the_conversation(
    store: SQLiteStore, raw: sqlite3.Connection
) -> None:
    await store.save(three_turns(), expected_version=0)
    raw.execute('UPDATE threadline_conversations SET header = \'{"format_version": 1, "id": \'')

    with pytest.raises(
        ConversationFormatError, match="stored conversation 'c1': the header is not valid JSON"
    ):
        await store.load("c1")


async def test_a_damaged_listing_row_is_refused_naming_the_conversation(
    store: SQLiteStore, raw: sqlite3.Connection
) -> None:
    await store.save(three_turns(), expected_version=0)
    raw.execute("UPDATE threadline_conversations SET metadata = '{\"user\": 5}'")

    with pytest.raises(ConversationFormatError, match="stored conversation 'c1': the metadata"):
        await store.list()


async def test_a_conversation_written_in_an_older_format_is_migrated_when_next_written(
    path: Path, raw: sqlite3.Connection, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with SQLiteStore(path) as store:
        await store.save(three_turns(), expected_version=0)
    # Make the rows look like a fictional format 0, which spelled turn_id "turn".
    for seq, text in raw.execute("SELECT seq, event FROM threadline_events").fetchall():
        event = json.loads(text)
        event["turn"] = event.pop("turn_id")
        raw.execute(
            "UPDATE threadline_events SET event = ? WHERE seq = ?", (json.dumps(event), seq)
        )
    (header_text,) = raw.execute("SELECT header FROM threadline_conversations").fetchone()
    raw.execute(
        "UPDATE threadline_conversations SET format_version = 0, header = ?",
        (json.dumps({**json.loads(header_text), "format_version": 0}),),
    )

    def from_format_0(document: dict[str, Any]) -> dict[str, Any]:
        for event in document["events"]:
            event["turn_id"] = event.pop("turn")
        return document

    monkeypatch.setitem(_serialization._MIGRATIONS, 0, from_format_0)
    async with SQLiteStore(path) as store:
        assert (await store.load("c1")).document == three_turns()
        state = attrs.evolve(three_turns(), next_turn_id=4, events=())
        await store.append_events("c1", [prompt("q3", 3)], header=state, expected_version=1)
    monkeypatch.delitem(_serialization._MIGRATIONS, 0)

    async with SQLiteStore(path) as store:
        document = (await store.load("c1")).document
    assert document.events == (*three_turns().events, prompt("q3", 3))
    assert raw.execute(
        "SELECT DISTINCT format_version FROM threadline_conversations"
    ).fetchall() == [(1,)]


# --- several processes ---------------------------------------------------------------------------

_RACER = """
    import sys

    import anyio

    from threadline.serialization import ConversationDocument, ConversationEvent
    from threadline import ConcurrentModificationError
    from threadline import Message, Origin
    from threadline.stores.sqlite import SQLiteStore


    async def main(path: str, name: str) -> None:
        async with SQLiteStore(path) as store:
            stored = await store.load("c1")
            print("ready", flush=True)
            sys.stdin.readline()  # the parent's starting gun
            event = ConversationEvent(message=Message.user(name, origin=Origin.TURN), turn_id=3)
            header = ConversationDocument(id="c1", next_turn_id=4)
            try:
                version = await store.append_events(
                    "c1", [event], header=header, expected_version=stored.version
                )
            except ConcurrentModificationError as exc:
                print("refused", exc.actual, flush=True)
            else:
                print("wrote", version, flush=True)


    anyio.run(main, *sys.argv[1:])
"""


async def test_two_processes_writing_on_one_version_one_is_refused(path: Path) -> None:
    async with SQLiteStore(path) as store:
        await store.save(three_turns(), expected_version=0)
    outcomes: dict[str, str] = {}

    async def race(name: str, *, task_status: anyio.abc.TaskStatus[anyio.abc.Process]) -> None:
        async with await anyio.open_process(
            [sys.executable, "-c", textwrap.dedent(_RACER), str(path), name], stderr=None
        ) as racer:
            assert racer.stdout is not None
            lines = BufferedByteReceiveStream(racer.stdout)
            assert await lines.receive_until(b"\n", 1000) == b"ready"
            task_status.started(racer)
            outcomes[name] = (await lines.receive_until(b"\n", 1000)).decode()
        assert racer.returncode == 0

    async with anyio.create_task_group() as group:
        racers = [await group.start(race, name) for name in ("left", "right")]
        # Both have loaded version 1; now let them write at once.
        for racer in racers:
            assert racer.stdin is not None
            await racer.stdin.send(b"go\n")

    assert sorted(outcomes.values()) == ["refused 2", "wrote 2"]
    winner = "left" if outcomes["left"].startswith("wrote") else "right"
    async with SQLiteStore(path) as store:
        stored = await store.load("c1")
    assert stored.version == 2
    assert [event.message.text for event in stored.document.events][-2:] == ["a2", winner]


_RETRIER = """
    import sys

    import anyio
    import attrs

    from threadline.serialization import ConversationEvent
    from threadline import ConcurrentModificationError
    from threadline import Message, Origin
    from threadline.stores.sqlite import SQLiteStore


    async def main(path: str, name: str) -> None:
        async with SQLiteStore(path) as store:
            for turn in range(15):
                while True:
                    stored = await store.load("c1")
                    turn_id = stored.document.next_turn_id
                    event = ConversationEvent(
                        message=Message.user(f"{name} {turn}", origin=Origin.TURN), turn_id=turn_id
                    )
                    header = attrs.evolve(stored.document, next_turn_id=turn_id + 1, events=())
                    try:
                        await store.append_events(
                            "c1", [event], header=header, expected_version=stored.version
                        )
                    except ConcurrentModificationError:
                        continue
                    break


    anyio.run(main, *sys.argv[1:])
"""


async def test_two_processes_that_reload_and_retry_lose_no_write(path: Path) -> None:
    async with SQLiteStore(path) as store:
        await store.save(ConversationDocument(id="c1"), expected_version=0)
    async with anyio.create_task_group() as group:
        for name in ("left", "right"):
            group.start_soon(run_python, _RETRIER, str(path), name)

    async with SQLiteStore(path) as store:
        stored = await store.load("c1")
    assert stored.version == 31
    texts = [event.message.text for event in stored.document.events]
    assert sorted(texts) == sorted(
        f"{name} {turn}" for name in ("left", "right") for turn in range(15)
    )
    assert [event.turn_id for event in stored.document.events] == list(range(30))
    # Each process's own writes stay in the order it made them.
    for name in ("left", "right"):
        assert [text for text in texts if text.startswith(name)] == [
            f"{name} {turn}" for turn in range(15)
        ]


_CRASHER = """
    import os
    import signal
    import sys

    import anyio
    import attrs

    from threadline.serialization import ConversationEvent
    from threadline import Message, Origin
    from threadline.stores.sqlite import _store as sqlite
    from threadline.stores.sqlite import SQLiteStore


    def die(*args: object) -> None:
        os.kill(os.getpid(), signal.SIGKILL)


    async def main(path: str) -> None:
        store = SQLiteStore(path)
        stored = await store.load("c1")
        turn_id = stored.document.next_turn_id
        header = attrs.evolve(stored.document, next_turn_id=turn_id + 1, events=())
        submitted = ConversationEvent(
            message=Message.user("q3", origin=Origin.TURN), turn_id=turn_id, pending=True
        )
        version = await store.append_events(
            "c1", [submitted], header=header, expected_version=stored.version
        )
        # The commit dies inside its transaction, after its rows are written: the
        # turn id check runs between the inserts and the version update.
        sqlite.check_turn_ids_below = die
        answer = ConversationEvent(
            message=Message.assistant("a3", origin=Origin.TURN), turn_id=turn_id
        )
        await store.append_events(
            "c1",
            [attrs.evolve(submitted, pending=False), answer],
            header=header,
            expected_version=version,
            drop_pending=True,
        )
        print("the process was not killed", flush=True)


    anyio.run(main, sys.argv[1])
"""


@pytest.mark.skipif(sys.platform == "win32", reason="SIGKILL is POSIX")
async def test_a_process_killed_between_pending_and_commit_leaves_a_store_that_loads_and_continues(
    path: Path,
) -> None:
    async with SQLiteStore(path) as store:
        await store.save(three_turns(), expected_version=0)

    crashed = await run_python(_CRASHER, str(path), check=False)

    assert crashed.returncode == -signal.SIGKILL, (crashed.stdout, crashed.stderr)
    async with SQLiteStore(path) as store:
        stored = await store.load("c1")
        assert stored.version == 2
        assert stored.document.events[:-1] == three_turns().events
        assert stored.document.events[-1] == prompt("q3", 3, pending=True)

        header = attrs.evolve(stored.document, events=())
        version = await store.append_events(
            "c1",
            [prompt("q3", 3), answer("a3", 3)],
            header=header,
            expected_version=2,
            drop_pending=True,
        )
        stored = await store.load("c1")
    assert version == stored.version == 3
    assert stored.document.events == (*three_turns().events, prompt("q3", 3), answer("a3", 3))


async def test_a_write_locked_out_past_the_timeout_is_a_store_error_and_changes_nothing(
    tmp_path: Path,
) -> None:
    path = tmp_path / "locked.sqlite3"
    async with SQLiteStore(path, timeout=0.05) as store:
        await store.save(three_turns(), expected_version=0)
        other = sqlite3.connect(path, isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process holds the write lock
        try:
            with pytest.raises(StoreError, match="database is locked"):
                await store.append_events(
                    "c1",
                    [prompt("q3", 3)],
                    header=attrs.evolve(three_turns(), next_turn_id=4, events=()),
                    expected_version=1,
                )
        finally:
            other.execute("ROLLBACK")
            other.close()
        stored = await store.load("c1")
    assert stored.version == 1
    assert stored.document == three_turns()


def _scribble_over_pages(path: Path) -> None:
    """Overwrite the start of every page but the first (the header): the b-trees are garbage."""
    wal = path.with_name(path.name + "-wal")
    assert not wal.exists() or wal.stat().st_size == 0  # checkpointed on close
    data = bytearray(path.read_bytes())
    for offset in range(4096, len(data), 4096):
        data[offset : offset + 64] = b"\xff" * 64
    path.write_bytes(bytes(data))


def three_turns_as(conversation_id: str) -> ConversationDocument:
    return attrs.evolve(three_turns(), id=conversation_id)


async def test_a_damaged_file_is_a_store_error_naming_the_file(path: Path) -> None:
    async with SQLiteStore(path) as store:
        for index in range(200):
            await store.save(three_turns_as(f"c{index}"), expected_version=0)
    await anyio.to_thread.run_sync(_scribble_over_pages, path)

    async with SQLiteStore(path) as store:
        with pytest.raises(StoreError, match="damaged") as caught:
            await store.list()
    assert str(path) in str(caught.value)
