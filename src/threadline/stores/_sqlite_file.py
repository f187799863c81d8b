"""Telling whether a SQLite store's file is still the one it opened.

A file deleted (or replaced) while a connection has it open stays open as an
unlinked inode: SQLite goes on writing to it and every write is lost when the
connection closes. The store compares the file at its path with the one it
opened before each call, and refuses to go on when they differ.
"""

from __future__ import annotations

import os

from threadline._errors import StoreError

__all__ = ["file_identity", "vanished"]


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
