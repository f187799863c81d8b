"""``PostgresStore``: conversations in PostgreSQL, shared by many processes and machines.

Needs the ``postgres`` extra (psycopg 3 and psycopg-pool)::

    pip install 'threadline[postgres]'

The layout and the one-statement writes are in ``_postgres_schema``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any, Final

import anyio
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
from threadline.stores._parts import assemble, read_metadata
from threadline.stores._remote import RemoteTarget, on_asyncio

try:
    import psycopg
    import psycopg.errors
    import psycopg_pool
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(
        "PostgresStore needs psycopg 3 and psycopg-pool: pip install 'threadline[postgres]'"
    ) from exc

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


class PostgresStore(StoreBase):
    """A :class:`~threadline._store.ConversationStore` in a PostgreSQL database.

    ``url`` is a ``postgresql://user:password@host:port/database`` URL; the
    store creates its tables on first use (and migrates older ones), and
    refuses a database whose threadline schema is newer than this code. Each
    write is one statement that locks the conversation's row and compares
    its version, so across any number of processes and machines of two
    writers based on the same version exactly one succeeds; the others get
    ``ConcurrentModificationError`` and change nothing.

    Under asyncio the store uses psycopg's async connection pool; under
    trio, where it does not run, the same statements go through psycopg's
    blocking pool in worker threads. A call cancelled while its statement
    runs waits for it to finish. A write whose connection is lost is retried
    once on a fresh connection, safely: a retried write that had in fact
    been applied is recognised, not refused as a conflict.

    ``max_connections`` bounds the pool; ``timeout`` is how many seconds a
    call waits for a connection (or to connect) before ``StoreError``.

    Raises (from any call):
        StoreError: the server cannot be reached, refuses the login, lost the
            connection twice, or its threadline tables are missing or of
            another layout; the message names the store (never the password)
            and what to do.
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
        self._async_pool: psycopg_pool.AsyncConnectionPool | None = None
        self._sync_pool: psycopg_pool.ConnectionPool | None = None

    def __repr__(self) -> str:
        return f"PostgresStore({self._target.shown!r})"

    # --- the backend ---------------------------------------------------------------

    async def _load(self, conversation_id: str) -> StoredConversation:
        rows = await self._call(schema.LOAD, (conversation_id,))
        if not rows:
            raise ConversationNotFoundError(conversation_id)
        version, generation, header, seqs, texts, markers = rows[0]
        document = assemble(conversation_id, header, list(zip(seqs, texts, strict=True)))
        return StoredConversation(
            document=document,
            version=version,
            generation=generation,
            pending_markers=tuple(markers),
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
                    version=version,
                    events=count,
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
        refusal = check.refusal(version, stored_generation)
        assert refusal is not None  # the only reason a found row stays
        raise refusal

    async def _close(self) -> None:
        async with self._ready_lock:
            async_pool, self._async_pool = self._async_pool, None
            sync_pool, self._sync_pool = self._sync_pool, None
            if async_pool is not None:
                await async_pool.close()
            if sync_pool is not None:
                await anyio.to_thread.run_sync(sync_pool.close)

    # --- the connection --------------------------------------------------------------

    async def _call(self, sql: str, params: Sequence[object]) -> _Rows:
        """Run one statement and return its rows; errors become ``StoreError``."""
        if not self._ready:
            await self._prepare()
        problem: BaseException | None = None
        for attempt in range(2):
            problem = None
            try:
                with anyio.CancelScope(shield=True):
                    if on_asyncio():
                        return await self._async_call(sql, params)
                    return await anyio.to_thread.run_sync(self._sync_call, sql, params)
            except psycopg_pool.PoolTimeout as exc:
                problem = exc
                break
            except psycopg.OperationalError as exc:
                # A lost connection: drop the pool's dead ones, try once more.
                problem = exc
                if attempt == 0:
                    await self._check_pools()
            except _SCHEMA_ERRORS as exc:
                problem = exc
                break
            except psycopg.Error as exc:
                problem = exc
                break
        raise self._error(problem)

    async def _async_call(self, sql: str, params: Sequence[object]) -> _Rows:
        pool = self._async_pool
        if pool is None:
            pool = self._async_pool = psycopg_pool.AsyncConnectionPool(**self._pool_options())
            await pool.open(wait=False)
        async with pool.connection() as connection:
            cursor = await connection.execute(sql, params)
            return await cursor.fetchall()

    def _sync_call(self, sql: str, params: Sequence[object]) -> _Rows:
        pool = self._sync_pool
        if pool is None:
            pool = self._sync_pool = psycopg_pool.ConnectionPool(**self._pool_options())
            pool.open(wait=False)
        with pool.connection() as connection:
            return connection.execute(sql, params).fetchall()

    def _pool_options(self) -> dict[str, Any]:
        return {
            "conninfo": self._target.url,
            "min_size": 1,
            "max_size": self._max_connections,
            "timeout": self._timeout,
            "kwargs": self._connect_options(),
            "open": False,
        }

    def _connect_options(self) -> dict[str, Any]:
        return {"autocommit": True, "connect_timeout": max(1, round(self._timeout))}

    async def _check_pools(self) -> None:
        if self._async_pool is not None and on_asyncio():
            await self._async_pool.check()
        if self._sync_pool is not None:
            await anyio.to_thread.run_sync(self._sync_pool.check)

    def _error(self, problem: BaseException | None) -> StoreError:
        if isinstance(problem, _SCHEMA_ERRORS):
            return self._target.error(
                "PostgresStore",
                "the database's threadline tables are missing or of another layout",
                problem,
                "restore them, or point the store at a database without them: it creates "
                "its tables when it opens",
            )
        if isinstance(problem, psycopg_pool.PoolTimeout):
            return self._target.error(
                "PostgresStore",
                f"no connection to the server within {self._timeout:g} s",
                problem,
                "check that the server runs and accepts connections, or raise timeout",
            )
        if isinstance(problem, psycopg.OperationalError):
            return self._target.error(
                "PostgresStore",
                "the connection to the server was lost twice",
                problem,
                "check the server; a write in flight was applied once or not at all, "
                "load the conversation to see which",
            )
        return self._target.error(
            "PostgresStore", "the database refused the statement", problem or "unknown", "see above"
        )

    # --- opening ---------------------------------------------------------------------

    async def _prepare(self) -> None:
        """Connect once and bring the schema to this code's version."""
        async with self._ready_lock:
            if self._ready:
                return
            self._check_open()
            with anyio.CancelScope(shield=True):
                problem = await anyio.to_thread.run_sync(self._migrate)
            if problem is not None:
                raise problem
            self._ready = True

    def _migrate(self) -> StoreError | ConversationFormatError | None:
        try:
            connection = psycopg.connect(self._target.url, **self._connect_options())
        except psycopg.Error as exc:
            # Built here, raised by the caller: nothing of the driver's error is chained.
            return self._target.error(
                "PostgresStore",
                "cannot connect",
                exc,
                "check that the server runs at that address and that the URL's user and "
                "password are right",
            )
        try:
            with connection, connection.transaction():
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
