"""``SQLiteStore`` itself: the tables, the transactions, every read and write.

The layout is described in :mod:`threadline.stores.sqlite`.
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final, TypeAlias, TypeVar

import anyio
import anyio.to_thread

from threadline._errors import (
    ConcurrentModificationError,
    ConversationFormatError,
    ConversationNotFoundError,
    InvalidRequestError,
    StoreError,
)
from threadline._store import ConversationInfo, StoredConversation
from threadline.serialization._converter import (
    FORMAT_VERSION,
    dumps_event,
)
from threadline.stores._base import (
    DeleteCheck,
    EventRecord,
    StoreBase,
    Write,
    check_turn_ids_below,
    utc_now,
)
from threadline.stores._parts import (
    assemble,
    read_count,
    read_metadata,
    read_time,
    stored_conversation,
)
from threadline.stores.sqlite._file import file_identity, use_wal, vanished
from threadline.stores.sqlite._read_only import connect_read_only

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]

SCHEMA_VERSION: Final = 2
"""The layout of the tables this threadline writes, and the newest it reads."""

_CREATE_TABLES: Final = (
    """
    CREATE TABLE threadline_conversations (
        id TEXT PRIMARY KEY NOT NULL,
        version INTEGER NOT NULL,
        format_version INTEGER NOT NULL,
        header TEXT NOT NULL,
        metadata TEXT NOT NULL,
        event_count INTEGER NOT NULL,
        created_at TEXT NOT NULL,
        updated_at TEXT NOT NULL,
        touched INTEGER NOT NULL,
        generation TEXT NOT NULL DEFAULT ''
    )
    """,
    "CREATE INDEX threadline_conversations_touched ON threadline_conversations (touched)",
    """
    CREATE TABLE threadline_events (
        conversation_id TEXT NOT NULL,
        seq INTEGER NOT NULL,
        turn_id INTEGER NOT NULL,
        pending INTEGER NOT NULL,
        event TEXT NOT NULL,
        marker TEXT,
        PRIMARY KEY (conversation_id, seq)
    ) WITHOUT ROWID
    """,
    # For the turn id check after an append: the highest id without a scan.
    "CREATE INDEX threadline_events_turn ON threadline_events (conversation_id, turn_id)",
    # For drop_pending: find the few pending rows without reading the transcript. The
    # deletes name it (INDEXED BY): SQLite's planner takes the primary key otherwise,
    # which reads every row of the conversation (0.5 ms a commit at 8,000 events).
    "CREATE INDEX threadline_events_pending ON threadline_events (conversation_id) WHERE pending",
)

# What brings a file of each older schema version to the next one.
_MIGRATIONS: Final = {
    1: (
        "ALTER TABLE threadline_conversations ADD COLUMN generation TEXT NOT NULL DEFAULT ''",
        "UPDATE threadline_conversations SET generation = lower(hex(randomblob(16)))",
        "ALTER TABLE threadline_events ADD COLUMN marker TEXT",
    ),
}


_T = TypeVar("_T")


class SQLiteStore(StoreBase):
    """A :class:`~threadline._store.ConversationStore` in one SQLite file.

    The file (and its parent directories) is created on first use, in WAL
    mode so readers never wait for a writer. Every call runs its blocking
    work in a worker thread (``anyio.to_thread``), one call at a time on one
    connection; the store is safe to share between tasks. Several processes
    may use the same file: each write is a ``BEGIN IMMEDIATE`` transaction
    that checks the version and writes in one step, so of two writers based
    on the same version exactly one succeeds. ``timeout`` is how many
    seconds a write waits for another process's transaction before SQLite
    gives up with ``StoreError`` ("database is locked"); nothing is written.

    ``read_only=True`` opens an existing file for reading only: it creates
    nothing (no file, no directory, no tables), works on a file or directory
    the process may not write, and every write raises ``StoreError``.

    ``path=":memory:"`` gives a private database that lives as long as the
    store, handy in tests; :class:`~threadline.stores.memory.MemoryStore` is
    the lighter choice there.

    A call cancelled while its transaction runs waits for the transaction
    to finish (committed or rolled back) before the cancellation is raised.

    Raises (from any call):
        ConversationFormatError: the file is not a SQLite database, or was
            written by a newer threadline (a newer schema version), or a
            stored row is damaged (the error names the conversation and the
            event).
        StoreClosedError: the store was closed with :meth:`aclose`.

    Example::

        async with SQLiteStore("state/conversations.db") as store:
            stored = await store.load("support-42")
    """

    def __init__(
        self, path: str | os.PathLike[str], *, timeout: float = 30.0, read_only: bool = False
    ) -> None:
        self._path = os.fspath(path)
        if not self._path:
            raise InvalidRequestError("SQLiteStore needs a file path (or ':memory:'), not ''")
        self._timeout = timeout
        self._read_only = read_only
        self._connection: sqlite3.Connection | None = None
        self._opened_file: tuple[int, int] | None = None
        """The (device, inode) of the file the connection opened."""
        # The anyio lock queues tasks without holding worker threads; the thread
        # lock keeps the one connection to one thread even if the store is
        # shared between event loops.
        self._lock = anyio.Lock()
        self._thread_lock = threading.Lock()

    @property
    def path(self) -> str:
        """The database file, as given."""
        return self._path

    def __repr__(self) -> str:
        return f"SQLiteStore({self._path!r})"

    # --- the backend ---------------------------------------------------------------

    async def _load(self, conversation_id: str) -> StoredConversation:
        return await self._run(lambda connection: _load(connection, conversation_id))

    async def _write(self, write: Write) -> int:
        return await self._run(lambda connection: _write(connection, write))

    async def _list_page(self, limit: int, after: int | None) -> list[tuple[ConversationInfo, int]]:
        return await self._run(lambda connection: _list_page(connection, limit, after))

    async def _remove_pending(self, conversation_id: str, marker: str) -> bool:
        return await self._run(
            lambda connection: _remove_pending(connection, conversation_id, marker)
        )

    async def _delete(self, check: DeleteCheck) -> bool:
        return await self._run(lambda connection: _delete(connection, check))

    async def _close(self) -> None:
        async with self._lock:
            await anyio.to_thread.run_sync(self._close_connection)

    # --- the connection --------------------------------------------------------------

    async def _run(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        async with self._lock:
            return await anyio.to_thread.run_sync(self._call, work)

    def _call(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        with self._thread_lock:
            if self._closed:
                raise self._closed_error()
            try:
                if self._connection is None:
                    if self._read_only:
                        self._connection = connect_read_only(
                            self._path, self._timeout, _current_schema_version
                        )
                    else:
                        self._connection = _connect(self._path, self._timeout)
                    self._opened_file = file_identity(self._path)
                else:
                    self._check_same_file()
                return work(self._connection)
            except sqlite3.OperationalError as exc:
                # Locked past the time-out, a read-only or vanished file: the
                # transaction was rolled back, so nothing changed.
                raise StoreError(f"SQLite store {self._path}: {exc}") from exc
            except sqlite3.DatabaseError as exc:
                # A damaged file ("database disk image is malformed"): not ours to repair.
                raise StoreError(
                    f"SQLite store {self._path}: {exc}; the file is damaged: restore it "
                    f"from a backup or move it away to start a new one"
                ) from exc

    def _check_same_file(self) -> None:
        """Refuse to go on with a file deleted or replaced since it was opened (see
        ``_file``); the next call opens what is at the path then."""
        if self._opened_file is not None and self._opened_file != file_identity(self._path):
            assert self._connection is not None
            self._connection.close()
            self._connection = None
            raise vanished(self._path)

    def _close_connection(self) -> None:
        with self._thread_lock:
            if self._connection is not None:
                self._connection.close()
                self._connection = None


def _connect(path: str, timeout: float) -> sqlite3.Connection:
    if path != ":memory:":
        Path(path).parent.mkdir(parents=True, exist_ok=True)
    # isolation_level=None: no implicit transactions; every one here is explicit.
    connection = sqlite3.connect(
        path, timeout=timeout, isolation_level=None, check_same_thread=False
    )
    try:
        use_wal(connection, timeout)
        # FULL: a committed pending message survives a power cut, not only a crash.
        connection.execute("PRAGMA synchronous = FULL")
        _prepare_schema(connection, path)
    except sqlite3.DatabaseError as exc:
        connection.close()
        if exc.sqlite_errorname == "SQLITE_NOTADB":
            raise ConversationFormatError(f"{path} is not a SQLite database") from None
        raise
    except BaseException:
        connection.close()
        raise
    return connection


def _prepare_schema(connection: sqlite3.Connection, path: str) -> None:
    if _schema_version(connection, path) == SCHEMA_VERSION:
        return
    with _transaction(connection, "IMMEDIATE"):
        # Checked again inside the write lock: another process may have won the race.
        connection.execute(
            "CREATE TABLE IF NOT EXISTS threadline_schema (version INTEGER NOT NULL)"
        )
        version = _schema_version(connection, path)
        if version is None:
            for statement in _CREATE_TABLES:
                connection.execute(statement)
            connection.execute(
                "INSERT INTO threadline_schema (version) VALUES (?)", (SCHEMA_VERSION,)
            )
            return
        while version < SCHEMA_VERSION:
            for statement in _MIGRATIONS[version]:
                connection.execute(statement)
            version += 1
        connection.execute("UPDATE threadline_schema SET version = ?", (SCHEMA_VERSION,))


def _schema_version(connection: sqlite3.Connection, path: str) -> int | None:
    """The file's schema version, ``None`` when it has no threadline tables yet."""
    exists = connection.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'threadline_schema'"
    ).fetchone()
    if exists is None:
        return None
    version = connection.execute("SELECT max(version) FROM threadline_schema").fetchone()[0]
    if version is None:
        return None
    if type(version) is not int or version < 1:
        raise ConversationFormatError(f"{path}: {version!r} is not a store schema version")
    if version > SCHEMA_VERSION:
        raise ConversationFormatError(
            f"{path} has store schema version {version}, written by a newer threadline; "
            f"this one reads schema version {SCHEMA_VERSION}; upgrade threadline to open it"
        )
    return version


def _current_schema_version(connection: sqlite3.Connection, path: str) -> int | None:
    """The schema version of a file opened read-only, which cannot be migrated."""
    version = _schema_version(connection, path)
    if version is not None and version < SCHEMA_VERSION:
        raise ConversationFormatError(
            f"{path} has store schema version {version}, written by an older threadline; "
            f"open it once without read_only to migrate it to version {SCHEMA_VERSION}"
        )
    return version


@contextmanager
def _transaction(connection: sqlite3.Connection, mode: str = "") -> Iterator[None]:
    connection.execute(f"BEGIN {mode}")
    try:
        yield
        connection.execute("COMMIT")
    except BaseException:
        if connection.in_transaction:
            connection.execute("ROLLBACK")
        raise


# --- the work, run in a worker thread ---------------------------------------------------


def _load(connection: sqlite3.Connection, conversation_id: str) -> StoredConversation:
    # One read transaction: the header and the events of the same version.
    with _transaction(connection):
        row = connection.execute(
            "SELECT version, header, generation FROM threadline_conversations WHERE id = ?",
            (conversation_id,),
        ).fetchone()
        if row is None:
            raise ConversationNotFoundError(conversation_id)
        events = connection.execute(
            "SELECT seq, event, pending, marker FROM threadline_events "
            "WHERE conversation_id = ? ORDER BY seq",
            (conversation_id,),
        ).fetchall()
    version, header, generation = row
    return stored_conversation(
        conversation_id,
        assemble(conversation_id, header, events),
        version=version,
        generation=generation,
        markers=[marker for _, _, pending, marker in events if pending],
    )


def _read_events(connection: sqlite3.Connection, conversation_id: str) -> list[tuple[Any, Any]]:
    cursor = connection.execute(
        "SELECT seq, event FROM threadline_events WHERE conversation_id = ? ORDER BY seq",
        (conversation_id,),
    )
    return cursor.fetchall()


def _write(connection: sqlite3.Connection, write: Write) -> int:
    """Check the version, write the events, then the header: one transaction."""
    with _transaction(connection, "IMMEDIATE"):
        found = _check_version(connection, write)
        count = _append_rows(connection, write, found)
        return _upsert_header(connection, write, found, count)


_Found: TypeAlias = tuple[int, int, int, str]
"""A stored conversation's row as a write sees it: version, format version, event count,
generation."""


def _check_version(connection: sqlite3.Connection, write: Write) -> _Found | None:
    """The conversation's row, when ``write.expected_version`` is its version.

    Raises:
        ConcurrentModificationError: it is at another version (or absent).
    """
    found: _Found | None = connection.execute(
        "SELECT version, format_version, event_count, generation FROM threadline_conversations "
        "WHERE id = ?",
        (write.conversation_id,),
    ).fetchone()
    current = 0 if found is None else found[0]
    if current != write.expected_version:
        raise ConcurrentModificationError(
            write.conversation_id,
            expected=write.expected_version,
            actual=None if found is None else current,
        )
    if found is not None and write.generation is not None and write.generation != found[3]:
        raise write.generation_refusal(found[3], current)
    return found


def _append_rows(connection: sqlite3.Connection, write: Write, found: _Found | None) -> int:
    """Write the event rows (replacing or after the kept ones); the new event count."""
    conversation_id = write.conversation_id
    count = 0 if found is None else found[2]
    if write.replace:
        connection.execute(
            "DELETE FROM threadline_events WHERE conversation_id = ?", (conversation_id,)
        )
        count = 0
    elif found is not None:
        if found[1] != FORMAT_VERSION:
            count = _rewrite_in_current_format(connection, conversation_id)
        if write.drop_all:
            count -= connection.execute(
                "DELETE FROM threadline_events INDEXED BY threadline_events_pending "
                "WHERE conversation_id = ? AND pending",
                (conversation_id,),
            ).rowcount
        elif write.drop_marker is not None:
            count -= connection.execute(
                "DELETE FROM threadline_events INDEXED BY threadline_events_pending "
                "WHERE conversation_id = ? AND pending AND marker = ?",
                (conversation_id, write.drop_marker),
            ).rowcount
    first_seq = connection.execute(
        "SELECT coalesce(max(seq) + 1, 0) FROM threadline_events WHERE conversation_id = ?",
        (conversation_id,),
    ).fetchone()[0]
    _insert_rows(connection, conversation_id, first_seq, write.records)
    highest = connection.execute(
        "SELECT max(turn_id) FROM threadline_events WHERE conversation_id = ?",
        (conversation_id,),
    ).fetchone()[0]
    if highest is not None:
        check_turn_ids_below(highest, write.header)
    return count + len(write.records)


def _insert_rows(
    connection: sqlite3.Connection,
    conversation_id: str,
    first_seq: int,
    records: Sequence[EventRecord],
) -> None:
    connection.executemany(
        "INSERT INTO threadline_events (conversation_id, seq, turn_id, pending, event, marker) "
        "VALUES (?, ?, ?, ?, ?, ?)",
        [
            (
                conversation_id,
                first_seq + offset,
                record.turn_id,
                record.pending,
                record.text,
                record.marker,
            )
            for offset, record in enumerate(records)
        ],
    )


def _upsert_header(
    connection: sqlite3.Connection, write: Write, found: _Found | None, count: int
) -> int:
    """Create or update the conversation's row; the new version."""
    header = write.header
    metadata = json.dumps(header.metadata)
    now = utc_now().isoformat()
    touched = "(SELECT coalesce(max(touched), 0) + 1 FROM threadline_conversations)"
    if found is None:
        connection.execute(
            "INSERT INTO threadline_conversations (id, version, format_version, header, "
            "metadata, event_count, created_at, updated_at, touched, generation) "
            f"VALUES (?, ?, ?, ?, ?, ?, ?, ?, {touched}, ?)",
            (
                header.id,
                1,
                FORMAT_VERSION,
                write.header_text,
                metadata,
                count,
                now,
                now,
                write.generation,
            ),
        )
        return 1
    current = found[0]
    # Compare-and-set: BEGIN IMMEDIATE already excludes other writers,
    # and the version in the WHERE keeps that true if this code changes.
    updated = connection.execute(
        "UPDATE threadline_conversations SET version = ?, format_version = ?, "
        f"header = ?, metadata = ?, event_count = ?, updated_at = ?, touched = {touched} "
        "WHERE id = ? AND version = ?",
        (
            current + 1,
            FORMAT_VERSION,
            write.header_text,
            metadata,
            count,
            now,
            header.id,
            current,
        ),
    )
    if updated.rowcount != 1:
        raise ConcurrentModificationError(header.id, expected=write.expected_version, actual=None)
    return current + 1


def _rewrite_in_current_format(connection: sqlite3.Connection, conversation_id: str) -> int:
    """Bring a conversation written by an older threadline to the current format.

    Its events were written in the header's older format; a new event in the
    current format beside them would be read under the wrong version, so the
    whole conversation is migrated once, in this transaction.
    """
    header = connection.execute(
        "SELECT header FROM threadline_conversations WHERE id = ?", (conversation_id,)
    ).fetchone()[0]
    rows = connection.execute(
        "SELECT seq, event, marker FROM threadline_events WHERE conversation_id = ? ORDER BY seq",
        (conversation_id,),
    ).fetchall()
    document = assemble(conversation_id, header, rows)
    connection.execute(
        "DELETE FROM threadline_events WHERE conversation_id = ?", (conversation_id,)
    )
    for seq, (event, (_, _, marker)) in enumerate(zip(document.events, rows, strict=True)):
        record = EventRecord(event, dumps_event(event), marker if event.pending else None)
        _insert_rows(connection, conversation_id, seq, [record])
    return len(rows)


def _list_page(
    connection: sqlite3.Connection, limit: int, after: int | None
) -> list[tuple[ConversationInfo, int]]:
    rows = connection.execute(
        "SELECT id, version, event_count, updated_at, metadata, generation, touched "
        "FROM threadline_conversations WHERE touched < ? ORDER BY touched DESC LIMIT ?",
        (_NO_CURSOR if after is None else after, limit),
    ).fetchall()
    return [
        (
            ConversationInfo(
                id=conversation_id,
                version=read_count(conversation_id, "version", version, least=1),
                events=read_count(conversation_id, "event_count", count),
                updated_at=read_time(conversation_id, updated_at),
                metadata=read_metadata(conversation_id, metadata),
                generation=generation,
            ),
            touched,
        )
        for conversation_id, version, count, updated_at, metadata, generation, touched in rows
    ]


_NO_CURSOR: Final = 2**63 - 1


def _remove_pending(connection: sqlite3.Connection, conversation_id: str, marker: str) -> bool:
    with _transaction(connection, "IMMEDIATE"):
        removed = connection.execute(
            "DELETE FROM threadline_events INDEXED BY threadline_events_pending "
            "WHERE conversation_id = ? AND pending AND marker = ?",
            (conversation_id, marker),
        ).rowcount
        if removed:
            connection.execute(
                "UPDATE threadline_conversations SET event_count = event_count - ? WHERE id = ?",
                (removed, conversation_id),
            )
    return removed > 0


def _delete(connection: sqlite3.Connection, check: DeleteCheck) -> bool:
    conversation_id = check.conversation_id
    with _transaction(connection, "IMMEDIATE"):
        row = connection.execute(
            "SELECT version, generation FROM threadline_conversations WHERE id = ?",
            (conversation_id,),
        ).fetchone()
        if row is None:
            return False
        version = row[0]
        if check.expected_version is not None:  # a damaged version cannot be compared
            version = read_count(conversation_id, "version", version, least=1)
        refusal = check.refusal(version, row[1])
        if refusal is not None:
            raise refusal
        connection.execute(
            "DELETE FROM threadline_events WHERE conversation_id = ?", (conversation_id,)
        )
        connection.execute("DELETE FROM threadline_conversations WHERE id = ?", (conversation_id,))
    return True
