"""The ``ConversationStore`` protocol every store implements.

A store keeps conversation documents (``threadline.serialization._documents``) under an
optimistic version: every write names the version it was based on, and a
store whose current version differs refuses the write with
``ConcurrentModificationError`` and changes nothing. Version 0 means "does
not exist yet"; the first write creates the conversation at version 1.

How a conversation uses a store for one turn:

1. ``append_events([pending user event], ...)`` before any provider work, so
   a crash leaves the submitted message visible (``pending=True``);
2. on success, ``append_events(turn events, ..., drop_pending=True)``: the
   pending copy is replaced by the committed turn in one transaction;
3. on failure or cancellation, ``append_events([], ..., drop_pending=True)``
   with the state as it was before the turn.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol, runtime_checkable

import attrs

from threadline.serialization._documents import ConversationDocument, ConversationEvent

__all__ = ["ConversationInfo", "ConversationStore", "StoredConversation"]


@attrs.frozen(kw_only=True)
class StoredConversation:
    """A conversation as loaded: its document and the version it was at."""

    document: ConversationDocument
    version: int


@attrs.frozen(kw_only=True)
class ConversationInfo:
    """A conversation in a listing, without its transcript."""

    id: str
    version: int
    events: int
    """How many events its transcript holds (pending ones included)."""
    updated_at: datetime | None
    metadata: dict[str, str] = attrs.field(factory=dict, hash=False)


@runtime_checkable
class ConversationStore(Protocol):
    """Persistent conversations with optimistic concurrency.

    Every method may raise ``ConcurrentModificationError`` (a stale
    ``expected_version``) and ``ConversationNotFoundError`` where noted. A
    store is safe to share between tasks; across processes (and machines, for
    the server-backed stores) the version check keeps writes from being lost.
    """

    async def load(self, conversation_id: str) -> StoredConversation:
        """The conversation's document and current version.

        Raises:
            ConversationNotFoundError: no conversation has that id.
        """
        ...

    async def save(self, document: ConversationDocument, *, expected_version: int) -> int:
        """Replace the whole conversation (create it when ``expected_version`` is 0).

        Returns the new version.
        """
        ...

    async def append_events(
        self,
        conversation_id: str,
        events: Sequence[ConversationEvent],
        *,
        header: ConversationDocument,
        expected_version: int,
        drop_pending: bool = False,
    ) -> int:
        """Atomically append ``events`` and update the conversation's state.

        ``header`` carries the state to store (every field but ``events``,
        which is ignored); ``drop_pending`` first removes the events marked
        pending. ``expected_version`` 0 creates the conversation. Returns the
        new version.
        """
        ...

    async def list(self) -> list[ConversationInfo]:
        """Every conversation, most recently updated first."""
        ...

    async def delete(self, conversation_id: str) -> bool:
        """Delete the conversation; ``False`` when there was none."""
        ...

    async def aclose(self) -> None:
        """Release the store's connections."""
        ...
