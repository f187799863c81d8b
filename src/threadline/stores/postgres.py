"""``PostgresStore``: conversations in PostgreSQL, shared by many processes and machines.

Needs the ``postgres`` extra (psycopg 3)::

    pip install 'threadline[postgres]'

The layout and the one-statement writes are in ``_postgres_schema``.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Awaitable, Callable, Sequence
from datetime import datetime
from typing import Any, Final, TypeVar

import anyio
import anyio.lowlevel
import anyio.to_thread

from threadline._errors import (
    ConversationFormatError,
    ConversationNotFoundError,
    InvalidRequestError,
    StoreError,
)
from threadline._store import ConversationInfo, StoredConversation
from threadline.serialization._converter import FORMAT_VERSION
from threadline.stores import _postgres_schema as schema
from threadline.stores._base import DeleteCheck, StoreBase, Write, check_turn_ids_below
from threadline.stores._deadlines import Watchdog, run_sync_until, seconds_left
from threadline.stores._parts import assemble, read_count, read_metadata, stored_conversation
from threadline.stores._remote import RemoteTarget, on_asyncio

try:
    import psycopg
    import psycopg.errors
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError("PostgresStore needs psycopg 3: pip install 'threadline[postgres]'") from exc

__all__ = ["SCHEMA_VERSION", "PostgresStore"]

SCHEMA_VERSION: Final = schema.SCHEMA_VERSION

_NO_CURSOR: Final = 2**63 - 1

# Errors that mean the threadline tables or functions are not what this code expects.
_SCHEMA_ERRORS: Final = (
    psycopg.errors.UndefinedTable,
    psycopg.errors.UndefinedFunction,
    psycopg.errors.UndefinedColumn,
    psycopg.errors.DatatypeMismatch,
)

_Rows = list[tuple[Any, ...]]
_T = TypeVar("_T")

# A connection of either kind: async under asyncio, blocking (used from worker
# threads) under trio.
_Connection = psycopg.AsyncConnection[Any] | psycopg.Connection[Any]


class PostgresStore(StoreBase):
    """A :class:`~threadline._store.ConversationStore` in a PostgreSQL database.

    ``url`` is a ``postgresql://user:password@host:port/database`` URL; the
    store creates its tables on first use (and migrates older ones), and
    refuses a database whose threadline schema is newer than this code. Each
    write is one statement that locks the conversation's row and compares
    its version, so across any number of processes and machines of two
    writers based on the same version exactly one succeeds; the others get
    ``ConcurrentModificationError`` and change nothing.

    Under asyncio the store uses psycopg's async connections; under trio,
    where they do not run, the same statements go through psycopg's blocking
    connections in worker threads. Idle connections are kept for the next
    call (at most ``max_connections`` in use at once); a call that finds none
    connects there and then, so after a server restart or an outage the next
    call works as soon as the server answers. A write whose connection is
    lost is retried once on a fresh connection, safely: a retried write that
    had in fact been applied is recognised, not refused as a conflict.

    ``timeout`` bounds every call, whatever the network does: waiting for a
    free connection, connecting, and the statement's answer (a server gone
    silent, without closing the connection, included). Past it the call
    raises ``StoreError``. A call cancelled while its statement runs waits
    for the answer, but no longer than that bound.

    Raises (from any call):
        StoreError: the server cannot be reached, refuses the login, lost the
            connection twice, gave no answer within ``timeout``, or its
            threadline tables are missing or of another layout; the message
            names the store (never the password) and what to do.
        ConversationFormatError: the database's threadline schema is newer
            than this code, or a stored row is damaged.
        StoreClosedError: the store was closed with :meth:`aclose`.

    Example::

        async with PostgresStore("postgresql://app:secret@db.internal/app") as store:
            stored = await store.load("support-42")
    """

    def __init__(self, url: str, *, max_connections: int = 10, timeout: float = 10.0) -> None:
        self._target = RemoteTarget(url, schemes=("postgresql", "postgres"), store="PostgresStore")
        if not isinstance(max_connections, int) or max_connections < 1:
            raise InvalidRequestError(f"max_connections is an int >= 1, not {max_connections!r}")
        if not isinstance(timeout, int | float) or timeout <= 0:
            raise InvalidRequestError(f"timeout is a number of seconds > 0, not {timeout!r}")
        self._max_connections = max_connections
        self._timeout = float(timeout)
        self._ready = False
        self._ready_lock = anyio.Lock()
        self._pools: dict[bool, _Pool] = {}  # by on_asyncio(): each kind of connection
        self._watchdog = Watchdog(self._timeout)

    def __repr__(self) -> str:
        return f"PostgresStore({self._target.shown!r})"

    # --- the backend ---------------------------------------------------------------

    async def _load(self, conversation_id: str) -> StoredConversation:
        rows = await self._call(schema.LOAD, (conversation_id,))
        if not rows:
            raise ConversationNotFoundError(conversation_id)
        version, generation, header, seqs, texts, markers = rows[0]
        document = assemble(conversation_id, header, list(zip(seqs, texts, strict=True)))
        return stored_conversation(
            conversation_id, document, version=version, generation=generation, markers=markers
        )

    async def _write(self, write: Write) -> int:
        records = write.records
        params = (
            write.conversation_id,
            write.expected_version,
            write.generation,
            write.write_id,
            write.replace,
            write.drop_all,
            write.drop_marker,
            write.pending_marker,
            write.header_text,
            json.dumps(write.header.metadata),
            FORMAT_VERSION,
            write.header.next_turn_id,
            [record.turn_id for record in records],
            [record.pending for record in records],
            [record.text for record in records],
            [record.marker for record in records],
        )
        status, version, detail = (await self._call(schema.WRITE, params))[0]
        if status == "ok":
            return int(version)
        if status == "conflict":
            raise write.conflict(version)
        if status == "generation":
            raise write.generation_refusal(detail, version)
        if status == "turn":
            check_turn_ids_below(int(detail), write.header)
        if status == "format":
            raise StoreError(
                f"{self!r}: conversation {write.conversation_id!r} was written in saved "
                f"format {detail} and this threadline writes format {FORMAT_VERSION}; load "
                f"it and save it whole (store.save) to bring it to the current format"
            )
        raise StoreError(f"{self!r}: the database answered a write with {status!r}")

    async def _list_page(self, limit: int, after: int | None) -> list[tuple[ConversationInfo, int]]:
        rows = await self._call(schema.LIST_PAGE, (_NO_CURSOR if after is None else after, limit))
        return [
            (
                ConversationInfo(
                    id=conversation_id,
                    version=read_count(conversation_id, "version", version, least=1),
                    events=read_count(conversation_id, "event_count", count),
                    updated_at=updated_at if isinstance(updated_at, datetime) else None,
                    metadata=read_metadata(conversation_id, metadata),
                    generation=generation,
                ),
                touched,
            )
            for conversation_id, version, count, updated_at, metadata, generation, touched in rows
        ]

    async def _remove_pending(self, conversation_id: str, marker: str) -> bool:
        rows = await self._call(schema.REMOVE_PENDING, (conversation_id, marker))
        return bool(rows[0][0])

    async def _delete(self, check: DeleteCheck) -> bool:
        expected, generation = check.expected_version, check.generation
        rows = await self._call(
            schema.DELETE, (check.conversation_id, expected, expected, generation, generation)
        )
        deleted, version, stored_generation = rows[0]
        if deleted or version is None:
            return bool(deleted)
        stored = read_count(check.conversation_id, "version", version, least=1)
        refusal = check.refusal(stored, stored_generation)
        assert refusal is not None  # the only reason a found row stays
        raise refusal

    async def _close(self) -> None:
        self._watchdog.close()
        for pool in self._pools.values():
            for connection in pool.close():
                await _close(connection)

    # --- the connection --------------------------------------------------------------

    async def _call(self, sql: str, params: Sequence[object]) -> _Rows:
        """Run one statement and return its rows, within the store's timeout.

        The statement is shielded from the caller's cancellation, so that a
        write is not cut off half-way for no reason, but never for longer
        than the deadline; a caller cancelled meanwhile then gets its
        cancellation rather than the ``StoreError``.
        """
        deadline = anyio.current_time() + self._timeout
        try:
            with anyio.CancelScope(shield=True):
                if not self._ready:
                    await self._prepare(deadline)
                rows = await self._run(sql, params, deadline)
        except (StoreError, ConversationFormatError):
            await anyio.lowlevel.checkpoint_if_cancelled()
            raise
        return rows

    async def _run(self, sql: str, params: Sequence[object], deadline: float) -> _Rows:
        pool = self._pools.get(on_asyncio())
        if pool is None:
            pool = self._pools[on_asyncio()] = _Pool(self._max_connections)
        with anyio.CancelScope(deadline=deadline) as waiting:
            await pool.slots.acquire()
        if waiting.cancelled_caught:
            raise self._late("no free connection", f"all {self._max_connections} are in use")
        try:
            outcome = await self._attempt(pool, sql, params, deadline, fresh=False)
            if isinstance(outcome, psycopg.OperationalError) and seconds_left(deadline) > 0:
                # A lost connection (a server restart, say): the idle ones went with it.
                for connection in pool.drain():
                    await _close(connection)
                outcome = await self._attempt(pool, sql, params, deadline, fresh=True)
        finally:
            pool.slots.release()
        if isinstance(outcome, psycopg.Error):
            raise self._error(outcome)
        return outcome

    async def _attempt(
        self, pool: _Pool, sql: str, params: Sequence[object], deadline: float, *, fresh: bool
    ) -> _Rows | psycopg.Error:
        """The statement on an idle connection (unless ``fresh``) or a new one."""
        connection = None if fresh else pool.take()
        if connection is None:
            connection = await self._connect(deadline)
        if isinstance(connection, psycopg.AsyncConnection):
            statement = functools.partial(_execute, connection, sql, params)
        else:
            blocking = functools.partial(_execute_blocking, connection, sql, params)
            statement = functools.partial(anyio.to_thread.run_sync, blocking)
        outcome, severed = await self._watched(connection, deadline, statement)
        healthy = not severed and not isinstance(outcome, psycopg.Error)
        if not (healthy and pool.keep(connection)):
            await _close(connection)
        if severed and isinstance(outcome, psycopg.Error):
            raise self._silent()
        return outcome

    async def _watched(
        self, connection: _Connection, deadline: float, work: Callable[[], Awaitable[_T]]
    ) -> tuple[_T | psycopg.Error, bool]:
        """What ``work()`` on ``connection`` returns or the ``psycopg.Error`` it raises,
        and whether the watchdog had to shut its socket down at ``deadline``."""
        token = self._watchdog.arm(connection.fileno(), deadline)
        try:
            outcome: _T | psycopg.Error = await work()
        except psycopg.Error as exc:
            outcome = exc
        finally:
            severed = self._watchdog.disarm(token)
        return outcome, severed

    async def _connect(self, deadline: float) -> _Connection:
        """A new connection of the running loop's kind, or ``StoreError`` by ``deadline``."""
        if not on_asyncio():
            return await self._connect_blocking(deadline)
        made: _Connection | None = None
        problem: psycopg.Error | None = None
        with anyio.CancelScope(deadline=deadline):
            try:
                made = await psycopg.AsyncConnection.connect(
                    self._target.url, **self._connect_options(deadline)
                )
            except psycopg.Error as exc:
                problem = exc
        if made is None:
            raise self._cannot_connect(problem)
        return made

    async def _connect_blocking(self, deadline: float) -> psycopg.Connection[Any]:
        """A new blocking connection, made in a worker thread, or ``StoreError`` by ``deadline``."""
        connect = functools.partial(
            psycopg.connect, self._target.url, **self._connect_options(deadline)
        )
        made: psycopg.Connection[Any] | None = None
        problem: psycopg.Error | None = None
        try:
            made = await run_sync_until(deadline, connect, _shut)
        except psycopg.Error as exc:
            problem = exc
        if made is None:
            raise self._cannot_connect(problem)
        return made

    def _connect_options(self, deadline: float) -> dict[str, Any]:
        return {
            "autocommit": True,
            # libpq counts whole seconds, at least 2: the deadline cuts it shorter.
            "connect_timeout": max(2, math.ceil(seconds_left(deadline))),
            # A server gone without a word (a partition): the kernel gives up on
            # an unanswered send or an idle connection instead of waiting for ever.
            "keepalives": 1,
            "keepalives_idle": max(1, round(self._timeout)),
            "keepalives_interval": 1,
            "keepalives_count": 3,
            "tcp_user_timeout": max(1, round(self._timeout * 1000)),
        }

    def _cannot_connect(self, problem: psycopg.Error | None) -> StoreError:
        # Raised outside the except block by the caller: nothing of the driver's
        # error (which may hold connection details) is chained to it.
        if problem is None:
            return self._late("cannot connect", "the server did not answer")
        return self._target.error(
            "PostgresStore",
            "cannot connect",
            problem,
            "check that the server runs at that address and that the URL's user and "
            "password are right",
        )

    def _late(self, what: str, why: str) -> StoreError:
        return self._target.error(
            "PostgresStore",
            f"{what} within {self._timeout:g} s",
            why,
            "check that the server runs and is reachable, or raise timeout",
        )

    def _silent(self) -> StoreError:
        return self._target.error(
            "PostgresStore",
            f"no answer from the server within {self._timeout:g} s",
            "the server or the network went silent",
            "check both, or raise timeout; a write in flight was applied once or not at "
            "all, load the conversation to see which",
        )

    def _error(self, problem: psycopg.Error) -> StoreError:
        if isinstance(problem, _SCHEMA_ERRORS):
            return self._target.error(
                "PostgresStore",
                "the database's threadline tables are missing or of another layout",
                problem,
                "restore them, or point the store at a database without them: it creates "
                "its tables when it opens",
            )
        if isinstance(problem, psycopg.OperationalError):
            return self._target.error(
                "PostgresStore",
                "the connection to the server was lost",
                problem,
                "check the server; a write in flight was applied once or not at all, "
                "load the conversation to see which",
            )
        return self._target.error(
            "PostgresStore", "the database refused the statement", problem, "see above"
        )

    # --- opening ---------------------------------------------------------------------

    async def _prepare(self, deadline: float) -> None:
        """Connect once and bring the schema to this code's version, by ``deadline``."""
        with anyio.CancelScope(deadline=deadline) as waiting:
            await self._ready_lock.acquire()
        if waiting.cancelled_caught:  # another call was preparing, and still is
            raise self._silent()
        try:
            if self._ready:
                return
            self._check_open()
            connection = await self._connect_blocking(deadline)
            problem, severed = await self._watched(
                connection,
                deadline,
                functools.partial(anyio.to_thread.run_sync, self._migrate, connection),
            )
            await _close(connection)
            if severed:
                raise self._silent()
            if problem is not None:
                raise problem
            self._ready = True
        finally:
            self._ready_lock.release()

    def _migrate(
        self, connection: psycopg.Connection[Any]
    ) -> StoreError | ConversationFormatError | None:
        try:
            with connection.transaction():
                connection.execute("SELECT pg_advisory_xact_lock(%s)", (schema.MIGRATION_LOCK,))
                connection.execute(
                    "CREATE TABLE IF NOT EXISTS threadline_schema (version integer NOT NULL)"
                )
                found = connection.execute("SELECT max(version) FROM threadline_schema").fetchone()
                version = int(found[0]) if found and found[0] is not None else 0
                if version > SCHEMA_VERSION:
                    return ConversationFormatError(
                        f"{self!r}: the database has threadline schema version {version}, "
                        f"written by a newer threadline; this one reads schema version "
                        f"{SCHEMA_VERSION}; upgrade threadline to use it"
                    )
                for step in range(version, SCHEMA_VERSION):
                    connection.execute(schema.MIGRATIONS[step].encode())
                if version < SCHEMA_VERSION:
                    connection.execute("DELETE FROM threadline_schema")
                    connection.execute(
                        "INSERT INTO threadline_schema (version) VALUES (%s)", (SCHEMA_VERSION,)
                    )
        except psycopg.Error as exc:
            return self._target.error(
                "PostgresStore",
                "cannot prepare the threadline tables",
                exc,
                "check that the user may create tables and functions in this database",
            )
        return None


# --- the connections ------------------------------------------------------------------


class _Pool:
    """The store's connections of one kind: idle ones are reused, new ones made on demand.

    Nothing runs in the background and nothing backs off: a call that finds
    no idle connection connects there and then, so a server back from a
    restart serves the very next call. ``slots`` bounds how many are in use.
    """

    def __init__(self, max_connections: int) -> None:
        self.slots = anyio.Semaphore(max_connections)
        self._idle: list[_Connection] = []
        self._closed = False

    def take(self) -> _Connection | None:
        return self._idle.pop() if self._idle else None

    def keep(self, connection: _Connection) -> bool:
        """Keep ``connection`` for the next call; ``False`` when the store is closed."""
        if self._closed or connection.closed:
            return False
        self._idle.append(connection)
        return True

    def drain(self) -> list[_Connection]:
        """The idle connections, taken out (to be closed)."""
        idle, self._idle = self._idle, []
        return idle

    def close(self) -> list[_Connection]:
        self._closed = True
        return self.drain()


async def _execute(connection: psycopg.AsyncConnection[Any], sql: str, params: Any) -> _Rows:
    cursor = await connection.execute(sql, params)
    return await cursor.fetchall()


def _execute_blocking(connection: psycopg.Connection[Any], sql: str, params: Any) -> _Rows:
    return connection.execute(sql, params).fetchall()


async def _close(connection: _Connection) -> None:
    if isinstance(connection, psycopg.AsyncConnection):
        await connection.close()
    else:
        await anyio.to_thread.run_sync(_shut, connection)


def _shut(connection: psycopg.Connection[Any]) -> None:
    connection.close()
