"""Conversation stores: where conversations persist between runs and processes.

``SQLiteStore`` is the embedded default (one file); ``PostgresStore`` and
``RedisStore`` serve many processes and machines (extras ``postgres`` and
``redis``); ``MemoryStore`` keeps everything in the process, for tests and
short-lived programs. ``open_store(url_or_path)`` picks one by URL. The store
contract (``ConversationStore`` and its records) lives in the core; each
store is imported only when first asked for, so ``import threadline`` loads
no ``sqlite3``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from threadline._errors import StoreClosedError
from threadline._public import lazy_members
from threadline._store import (
    ConversationInfo,
    ConversationPage,
    ConversationStore,
    StoredConversation,
)

if TYPE_CHECKING:
    from threadline.stores.memory import MemoryStore
    from threadline.stores.postgres import PostgresStore
    from threadline.stores.redis import RedisStore
    from threadline.stores.sqlite import SQLiteStore

__all__ = [
    "ConversationInfo",
    "ConversationPage",
    "ConversationStore",
    "MemoryStore",
    "PostgresStore",
    "RedisStore",
    "SQLiteStore",
    "StoreClosedError",
    "StoredConversation",
    "open_store",
]

# name -> the module that defines it, imported on first access.
_LAZY = {
    "MemoryStore": "threadline.stores.memory",
    "PostgresStore": "threadline.stores.postgres",
    "RedisStore": "threadline.stores.redis",
    "SQLiteStore": "threadline.stores.sqlite",
}

# URL scheme -> the store that serves it; anything else is a SQLite file path.
_SCHEMES = {
    "postgresql": "PostgresStore",
    "postgres": "PostgresStore",
    "redis": "RedisStore",
    "rediss": "RedisStore",
}


def open_store(target: str | os.PathLike[str]) -> SQLiteStore | PostgresStore | RedisStore:
    """The store a URL or path names: ``postgresql://…`` a :class:`PostgresStore`,
    ``redis://…`` (or ``rediss://``) a :class:`RedisStore`, anything else the
    :class:`SQLiteStore` file at that path.

    Raises:
        ImportError: the store's extra is not installed (the message names the
            ``pip install``).
        InvalidRequestError: a URL the store cannot use.

    Example::

        async with open_store(os.environ.get("DATABASE_URL", "state/conversations.db")) as store:
            ...
    """
    text = os.fspath(target)
    scheme, separator, _ = text.partition("://")
    name = _SCHEMES.get(scheme.lower()) if separator else None
    store: SQLiteStore | PostgresStore | RedisStore = __getattr__(name or "SQLiteStore")(text)
    return store


__getattr__, __dir__ = lazy_members(globals(), _LAZY, __all__)
