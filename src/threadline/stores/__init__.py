"""Conversation stores: where conversations persist between runs and processes.

``SQLiteStore`` is the embedded default (one file); ``MemoryStore`` keeps
everything in the process, for tests and short-lived programs.
"""

from threadline.stores.base import ConversationInfo, ConversationStore, StoredConversation
from threadline.stores.memory import MemoryStore
from threadline.stores.sqlite import SQLiteStore

__all__ = [
    "ConversationInfo",
    "ConversationStore",
    "MemoryStore",
    "SQLiteStore",
    "StoredConversation",
]
