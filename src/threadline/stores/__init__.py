"""Conversation stores: where conversations persist between runs and processes.

``SQLiteStore`` is the embedded default (one file); ``MemoryStore`` keeps
everything in the process, for tests and short-lived programs. The store
contract (``ConversationStore`` and its records) lives in the core; each
store is imported only when first asked for, so ``import threadline`` loads
no ``sqlite3``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from threadline._errors import StoreClosedError
from threadline._public import publish
from threadline._store import (
    ConversationInfo,
    ConversationPage,
    ConversationStore,
    StoredConversation,
)

if TYPE_CHECKING:
    from threadline.stores.memory import MemoryStore
    from threadline.stores.sqlite import SQLiteStore

__all__ = [
    "ConversationInfo",
    "ConversationPage",
    "ConversationStore",
    "MemoryStore",
    "SQLiteStore",
    "StoreClosedError",
    "StoredConversation",
]

# name -> the module that defines it, imported on first access.
_LAZY = {
    "MemoryStore": "threadline.stores.memory",
    "SQLiteStore": "threadline.stores.sqlite",
}

publish(globals(), [name for name in __all__ if name not in _LAZY], __name__)


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'threadline.stores' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    publish({name: value}, [name], __name__)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
