"""Telling whether a SQLite store's file is still the one it opened; switching it to WAL.

A file deleted (or replaced) while a connection has it open stays open as an
unlinked inode: SQLite goes on writing to it and every write is lost when the
connection closes. The store compares the file at its path with the one it
opened before each call, and refuses to go on when they differ.
"""

from __future__ import annotations

import os
import sqlite3
import time

from threadline._errors import StoreError

__all__ = ["file_identity", "use_wal", "vanished"]


def use_wal(connection: sqlite3.Connection, timeout: float) -> None:
    """Put the database in WAL mode, waiting up to ``timeout`` seconds for other processes.

    Changing the journal mode needs the database to itself, and SQLite answers
    "database is locked" at once, without its busy handler, while another
    process opens it or writes: two processes opening a new file together
    would otherwise fail. A database already in WAL mode is left as it is.
    """
    deadline = time.monotonic() + timeout
    pause = 0.005
    while True:
        try:
            (mode,) = connection.execute("PRAGMA journal_mode = WAL").fetchone()
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorname not in ("SQLITE_BUSY", "SQLITE_LOCKED"):
                raise
            if time.monotonic() + pause > deadline:
                raise
        else:
            # The mode the file is in now: another writer's open transaction can
            # leave it unchanged without an error.
            if str(mode).lower() in ("wal", "memory"):
                return
            if time.monotonic() + pause > deadline:
                raise sqlite3.OperationalError(f"could not switch to WAL mode (still {mode})")
        time.sleep(pause)  # a worker thread's wait: the store runs its calls off the loop
        pause = min(pause * 2, 0.1)


def file_identity(path: str) -> tuple[int, int] | None:
    """The file at ``path`` as (device, inode); ``None`` for ``:memory:``, and
    ``(-1, -1)`` for a missing file, which is never the one opened."""
    if path == ":memory:":
        return None
    try:
        found = os.stat(path)
    except FileNotFoundError:
        return (-1, -1)
    return (found.st_dev, found.st_ino)


def vanished(path: str) -> StoreError:
    """The error for a store whose file was deleted or replaced while it had it open."""
    return StoreError(
        f"SQLite store {path}: the file was deleted or replaced while the store had it "
        "open; nothing was written (the next call opens the file now at that path)"
    )
