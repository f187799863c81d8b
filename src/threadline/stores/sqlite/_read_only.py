"""Opening a SQLite store's file for reading only, for ``SQLiteStore(read_only=True)``.

Nothing is created: no file, no directory, no tables. A WAL database needs a
``-shm`` file beside it even to read; in a directory nobody may write, none
can be made, so the file is then opened as immutable (nobody can be writing
it there anyway).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path

from threadline._errors import ConversationFormatError

__all__ = ["connect_read_only"]


def connect_read_only(
    path: str,
    timeout: float,
    schema_version: Callable[[sqlite3.Connection, str], int | None],
) -> sqlite3.Connection:
    """A connection to ``path`` that never writes, checked to hold a store's tables.

    Raises:
        ConversationFormatError: the file is not a SQLite database, or holds no store.
        sqlite3.OperationalError: the file cannot be opened at all.
    """
    uri = Path(path).resolve().as_uri() + "?mode=ro"
    for suffix in ("", "&immutable=1"):
        connection = sqlite3.connect(
            uri + suffix, uri=True, timeout=timeout, isolation_level=None, check_same_thread=False
        )
        try:
            version = schema_version(connection, path)
        except sqlite3.DatabaseError as exc:
            connection.close()
            if exc.sqlite_errorname == "SQLITE_NOTADB":
                raise ConversationFormatError(f"{path} is not a SQLite database") from None
            if suffix or exc.sqlite_errorname != "SQLITE_CANTOPEN":
                raise
            continue
        except BaseException:
            connection.close()
            raise
        if version is None:
            connection.close()
            raise ConversationFormatError(f"{path} holds no threadline conversations")
        return connection
    raise AssertionError("unreachable")  # pragma: no cover
