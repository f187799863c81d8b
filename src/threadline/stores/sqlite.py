"""``SQLiteStore``: conversations in one SQLite file, the embedded default.

The layout, schema version 1::

    threadline_schema         (version)
    threadline_conversations  (id, version, format_version, header, metadata,
                               event_count, created_at, updated_at, touched)
    threadline_events         (conversation_id, seq, turn_id, pending, event)

``header`` is the saved conversation without its events and ``event`` one
event, both JSON of ``_serialization``'s format; every event of a
conversation is in the ``format_version`` of the conversation's row (an older
conversation is rewritten whole when it is next written). Appending a turn writes
the turn's rows and the header, never the whole transcript. Writes run in
``BEGIN IMMEDIATE`` transactions, so the version check and the write are one
step even when several processes share the file.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from datetime import datetime
from pathlib import Path
from types import TracebackType
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
    dumps_conversation_header,
    dumps_event,
    loads_conversation_parts,
)
from threadline.serialization._documents import ConversationDocument, ConversationEvent
from threadline.stores._checks import (
    check_append,
    check_conversation_id,
    check_document,
    check_expected_version,
    check_turn_ids_below,
    utc_now,
)
from threadline.stores._sqlite_read_only import connect_read_only

__all__ = ["SCHEMA_VERSION", "SQLiteStore"]

SCHEMA_VERSION: Final = 1
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
        touched INTEGER NOT NULL
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
        PRIMARY KEY (conversation_id, seq)
    ) WITHOUT ROWID
    """,
    # For the turn id check after an append: the highest id without a scan.
    "CREATE INDEX threadline_events_turn ON threadline_events (conversation_id, turn_id)",
    # For drop_pending: find the few pending rows without reading the transcript.
    "CREATE INDEX threadline_events_pending ON threadline_events (conversation_id) WHERE pending",
)

_EVENT_PATH: Final = re.compile(r"\$\.events\[(\d+)\]")

_T = TypeVar("_T")
_EventRow: TypeAlias = tuple[int, bool, str]
"""An event as written: its turn id, whether it is pending, its JSON."""


class SQLiteStore:
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
        RuntimeError: the store was closed with :meth:`aclose`.

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
        self._closed = False
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

    async def __aenter__(self) -> SQLiteStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    # --- the protocol ------------------------------------------------------------

    async def load(self, conversation_id: str) -> StoredConversation:
        """The conversation's document and current version.

        Raises:
            ConversationNotFoundError: no conversation has that id.
            ConversationFormatError: a stored row is damaged; the error names
                the conversation and the event.
        """
        check_conversation_id(conversation_id)
        return await self._run(lambda connection: _load(connection, conversation_id))

    async def save(self, document: ConversationDocument, *, expected_version: int) -> int:
        """Replace the whole conversation (create it when ``expected_version`` is 0).

        Returns the new version.

        Raises:
            ConcurrentModificationError: the conversation is not at ``expected_version``.
            ConversationFormatError: a message the saved format cannot hold.
        """
        check_document(document)
        check_expected_version(expected_version)

        def work(connection: sqlite3.Connection) -> int:
            rows = _event_rows(document.events)
            return _write(
                connection,
                document,
                rows,
                expected_version=expected_version,
                replace=True,
                drop_pending=False,
            )

        return await self._run(work)

    async def append_events(
        self,
        conversation_id: str,
        events: Sequence[ConversationEvent],
        *,
        header: ConversationDocument,
        expected_version: int,
        drop_pending: bool = False,
    ) -> int:
        """Atomically append ``events`` and store ``header``'s state; see the protocol.

        Writes the new events and the header, not the transcript before them.

        Raises:
            ConcurrentModificationError: the conversation is not at ``expected_version``.
            ConversationFormatError: a message the saved format cannot hold.
            InvalidRequestError: a header for another conversation, or events
                whose turn ids are not below the header's ``next_turn_id``.
        """
        conversation_id, new_events, header = check_append(conversation_id, events, header)
        check_expected_version(expected_version)

        def work(connection: sqlite3.Connection) -> int:
            rows = _event_rows(new_events)
            return _write(
                connection,
                header,
                rows,
                expected_version=expected_version,
                replace=False,
                drop_pending=drop_pending,
            )

        return await self._run(work)

    async def list(self) -> list[ConversationInfo]:
        """Every conversation, most recently updated first.

        ``updated_at`` is when the store last wrote the conversation.
        """
        return await self._run(_list)

    async def delete(self, conversation_id: str) -> bool:
        """Delete the conversation; ``False`` when there was none."""
        check_conversation_id(conversation_id)
        return await self._run(lambda connection: _delete(connection, conversation_id))

    async def aclose(self) -> None:
        """Close the connection. Closing twice is fine; any other call afterwards raises."""
        async with self._lock:
            await anyio.to_thread.run_sync(self._close)

    # --- the connection --------------------------------------------------------------

    async def _run(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        async with self._lock:
            return await anyio.to_thread.run_sync(self._call, work)

    def _call(self, work: Callable[[sqlite3.Connection], _T]) -> _T:
        with self._thread_lock:
            if self._closed:
                raise RuntimeError(f"{self!r} is closed")
            try:
                if self._connection is None:
                    if self._read_only:
                        self._connection = connect_read_only(
                            self._path, self._timeout, _schema_version
                        )
                    else:
                        self._connection = _connect(self._path, self._timeout)
                return work(self._connection)
            except sqlite3.OperationalError as exc:
                # Locked past the time-out, a read-only or vanished file: the
                # transaction was rolled back, so nothing changed.
                raise StoreError(f"SQLite store {self._path}: {exc}") from exc

    def _close(self) -> None:
        with self._thread_lock:
            self._closed = True
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
        connection.execute("PRAGMA journal_mode = WAL")
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
        if _schema_version(connection, path) is None:
            for statement in _CREATE_TABLES:
                connection.execute(statement)
            connection.execute(
                "INSERT INTO threadline_schema (version) VALUES (?)", (SCHEMA_VERSION,)
            )


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


def _event_rows(events: Sequence[ConversationEvent]) -> list[_EventRow]:
    return [(event.turn_id, event.pending, dumps_event(event)) for event in events]


def _load(connection: sqlite3.Connection, conversation_id: str) -> StoredConversation:
    # One read transaction: the header and the events of the same version.
    with _transaction(connection):
        row = connection.execute(
            "SELECT version, header FROM threadline_conversations WHERE id = ?",
            (conversation_id,),
        ).fetchone()
        if row is None:
            raise ConversationNotFoundError(conversation_id)
        events = _read_events(connection, conversation_id)
    version, header = row
    return StoredConversation(document=_assemble(conversation_id, header, events), version=version)


def _read_events(connection: sqlite3.Connection, conversation_id: str) -> list[tuple[Any, Any]]:
    cursor = connection.execute(
        "SELECT seq, event FROM threadline_events WHERE conversation_id = ? ORDER BY seq",
        (conversation_id,),
    )
    return cursor.fetchall()


def _assemble(
    conversation_id: str, header: object, events: Sequence[tuple[Any, Any]]
) -> ConversationDocument:
    """The stored parts as one document; a damaged row is refused, naming where it is."""
    where = f"stored conversation {conversation_id!r}"
    if not isinstance(header, str | bytes):
        raise ConversationFormatError(f"{where}: the header is not JSON text but {header!r}")
    for index, (seq, text) in enumerate(events):
        if not isinstance(text, str | bytes):
            raise ConversationFormatError(
                f"{where}, event seq {seq}: expected JSON text, not {text!r}",
                path=f"$.events[{index}]",
            )
    try:
        return loads_conversation_parts(header, [text for _, text in events])
    except ConversationFormatError as exc:
        match = _EVENT_PATH.match(exc.path)
        if match:
            where += f", event seq {events[int(match[1])][0]}"
        raise ConversationFormatError(f"{where}: {exc.reason}", path=exc.path) from None


def _write(
    connection: sqlite3.Connection,
    header: ConversationDocument,
    rows: list[_EventRow],
    *,
    expected_version: int,
    replace: bool,
    drop_pending: bool,
) -> int:
    conversation_id = header.id
    header_text = dumps_conversation_header(header)
    metadata = json.dumps(header.metadata)
    with _transaction(connection, "IMMEDIATE"):
        found = connection.execute(
            "SELECT version, format_version, event_count FROM threadline_conversations "
            "WHERE id = ?",
            (conversation_id,),
        ).fetchone()
        current = 0 if found is None else found[0]
        if current != expected_version:
            raise ConcurrentModificationError(
                conversation_id,
                expected=expected_version,
                actual=None if found is None else current,
            )
        count = 0 if found is None else found[2]
        if replace:
            connection.execute(
                "DELETE FROM threadline_events WHERE conversation_id = ?", (conversation_id,)
            )
            count = 0
        elif found is not None:
            if found[1] != FORMAT_VERSION:
                count = _rewrite_in_current_format(connection, conversation_id)
            if drop_pending:
                count -= connection.execute(
                    "DELETE FROM threadline_events WHERE conversation_id = ? AND pending",
                    (conversation_id,),
                ).rowcount
        first_seq = connection.execute(
            "SELECT coalesce(max(seq) + 1, 0) FROM threadline_events WHERE conversation_id = ?",
            (conversation_id,),
        ).fetchone()[0]
        connection.executemany(
            "INSERT INTO threadline_events (conversation_id, seq, turn_id, pending, event) "
            "VALUES (?, ?, ?, ?, ?)",
            [
                (conversation_id, first_seq + offset, turn_id, pending, text)
                for offset, (turn_id, pending, text) in enumerate(rows)
            ],
        )
        count += len(rows)
        highest = connection.execute(
            "SELECT max(turn_id) FROM threadline_events WHERE conversation_id = ?",
            (conversation_id,),
        ).fetchone()[0]
        if highest is not None:
            check_turn_ids_below(highest, header)
        now = utc_now().isoformat()
        touched = "(SELECT coalesce(max(touched), 0) + 1 FROM threadline_conversations)"
        if found is None:
            connection.execute(
                "INSERT INTO threadline_conversations (id, version, format_version, header, "
                "metadata, event_count, created_at, updated_at, touched) "
                f"VALUES (?, ?, ?, ?, ?, ?, ?, ?, {touched})",
                (conversation_id, 1, FORMAT_VERSION, header_text, metadata, count, now, now),
            )
        else:
            # Compare-and-set: BEGIN IMMEDIATE already excludes other writers,
            # and the version in the WHERE keeps that true if this code changes.
            updated = connection.execute(
                "UPDATE threadline_conversations SET version = ?, format_version = ?, "
                f"header = ?, metadata = ?, event_count = ?, updated_at = ?, touched = {touched} "
                "WHERE id = ? AND version = ?",
                (
                    current + 1,
                    FORMAT_VERSION,
                    header_text,
                    metadata,
                    count,
                    now,
                    conversation_id,
                    current,
                ),
            )
            if updated.rowcount != 1:
                raise ConcurrentModificationError(
                    conversation_id, expected=expected_version, actual=None
                )
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
    document = _assemble(conversation_id, header, _read_events(connection, conversation_id))
    connection.execute(
        "DELETE FROM threadline_events WHERE conversation_id = ?", (conversation_id,)
    )
    rows = _event_rows(document.events)
    connection.executemany(
        "INSERT INTO threadline_events (conversation_id, seq, turn_id, pending, event) "
        "VALUES (?, ?, ?, ?, ?)",
        [
            (conversation_id, seq, turn_id, pending, text)
            for seq, (turn_id, pending, text) in enumerate(rows)
        ],
    )
    return len(rows)


def _list(connection: sqlite3.Connection) -> list[ConversationInfo]:
    rows = connection.execute(
        "SELECT id, version, event_count, updated_at, metadata FROM threadline_conversations "
        "ORDER BY touched DESC"
    ).fetchall()
    return [
        ConversationInfo(
            id=conversation_id,
            version=version,
            events=count,
            updated_at=_read_time(conversation_id, updated_at),
            metadata=_read_metadata(conversation_id, metadata),
        )
        for conversation_id, version, count, updated_at, metadata in rows
    ]


def _read_time(conversation_id: str, value: object) -> datetime:
    moment = None
    if isinstance(value, str):
        with suppress(ValueError):
            moment = datetime.fromisoformat(value)
    if moment is None:
        raise ConversationFormatError(
            f"stored conversation {conversation_id!r}: updated_at {value!r} is not an ISO 8601 time"
        )
    return moment


def _read_metadata(conversation_id: str, value: object) -> dict[str, str]:
    try:
        metadata = json.loads(value) if isinstance(value, str | bytes) else None
    except ValueError:
        metadata = None
    if not isinstance(metadata, dict) or not all(
        isinstance(item, str) for item in metadata.values()
    ):
        raise ConversationFormatError(
            f"stored conversation {conversation_id!r}: the metadata column is not a JSON "
            f"object of strings: {value!r}",
            path="$.metadata",
        )
    return metadata


def _delete(connection: sqlite3.Connection, conversation_id: str) -> bool:
    with _transaction(connection, "IMMEDIATE"):
        connection.execute(
            "DELETE FROM threadline_events WHERE conversation_id = ?", (conversation_id,)
        )
        deleted = connection.execute(
            "DELETE FROM threadline_conversations WHERE id = ?", (conversation_id,)
        ).rowcount
    return deleted > 0
