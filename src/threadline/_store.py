"""The ``ConversationStore`` protocol every store implements.

A store keeps conversation documents (``threadline.serialization._documents``) under an
optimistic version: every write names the version it was based on, and a
store whose current version differs refuses the write with
``ConcurrentModificationError`` and changes nothing. Version 0 means "does
not exist yet"; the first write creates the conversation at version 1.

Every conversation also has a *generation*: an id given when it is created
and changed when it is deleted and created again, so a writer holding a
version from before the delete cannot match the new conversation by chance
(pass ``generation=`` to a write to have it checked).

How a conversation uses a store for one turn:

1. ``append_events([pending user event], ..., pending_marker=m)`` before any
   provider work, so a crash leaves the submitted message visible
   (``pending=True``); ``m`` is the writer's own marker for this turn;
2. on success, ``append_events(turn events, ..., drop_pending=m)``: its own
   pending copy is replaced by the committed turn in one transaction (other
   writers' pending prompts stay);
3. on failure, cancellation or a refused commit, ``remove_pending(id, m)``
   removes exactly its own pending copy, whatever other writers did since:
   it needs no version and does not change it. A failed first turn that
   created the conversation takes it back with ``delete(id,
   expected_version=1, generation=g)`` (``g`` the generation it created it
   with), which deletes nothing once another writer has written.

``drop_pending=True`` removes every pending event (the form for a writer
that knows no marker). A whole-conversation ``save`` passes each pending
event's marker (``pending_markers=``), so a rewrite (compaction, a settings
save) never takes another writer's prompt out of its hands.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol, runtime_checkable

import attrs

from threadline.serialization._documents import ConversationDocument, ConversationEvent

__all__ = ["ConversationInfo", "ConversationPage", "ConversationStore", "StoredConversation"]


@attrs.frozen(kw_only=True)
class StoredConversation:
    """A conversation as loaded: its document, the version it was at and its generation.

    ``pending_markers`` holds the marker of each pending event of
    ``document.events``, in order (``None`` for one written without a marker).
    """

    document: ConversationDocument
    version: int
    generation: str = ""
    pending_markers: tuple[str | None, ...] = ()


@attrs.frozen(kw_only=True)
class ConversationInfo:
    """A conversation in a listing, without its transcript."""

    id: str
    version: int
    events: int
    """How many events its transcript holds (pending ones included)."""
    updated_at: datetime | None
    metadata: dict[str, str] = attrs.field(factory=dict, hash=False)
    generation: str = ""


@attrs.frozen(kw_only=True)
class ConversationPage:
    """One page of a listing: ``conversations`` and the cursor of the next page.

    ``next_cursor`` is ``None`` on the last page; pass it to ``list_page`` to
    read on. A conversation written while pages are read moves to the front
    and may be missed by a listing already past it.
    """

    conversations: list[ConversationInfo]
    next_cursor: str | None


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

    async def save(
        self,
        document: ConversationDocument,
        *,
        expected_version: int,
        generation: str | None = None,
        pending_markers: Sequence[str | None] | None = None,
    ) -> int:
        """Replace the whole conversation (create it when ``expected_version`` is 0).

        ``generation``: when creating, the generation the new conversation
        gets (a fresh random one when ``None``); otherwise, when given, the
        write is refused unless the stored conversation has that generation.
        ``pending_markers``: one per pending event of ``document``, in order
        (``None`` for one without), stored with them so other writers' pending
        prompts stay theirs to commit or take back. Returns the new version.
        """
        ...

    async def append_events(
        self,
        conversation_id: str,
        events: Sequence[ConversationEvent],
        *,
        header: ConversationDocument,
        expected_version: int,
        drop_pending: bool | str = False,
        pending_marker: str | None = None,
        generation: str | None = None,
    ) -> int:
        """Atomically append ``events`` and update the conversation's state.

        ``header`` carries the state to store (every field but ``events``,
        which is ignored); ``drop_pending`` first removes the events marked
        pending (``True``: all of them; a marker: only those written with
        it). ``pending_marker`` is stored with the pending events among
        ``events``. ``expected_version`` 0 creates the conversation;
        ``generation`` is as for :meth:`save`. Returns the new version.
        """
        ...

    async def remove_pending(self, conversation_id: str, marker: str) -> bool:
        """Remove the pending events written with ``marker``, whatever the version.

        The version does not change: pending events are not part of the
        answered transcript. ``False`` when there were none (or no such
        conversation).
        """
        ...

    async def list(self) -> list[ConversationInfo]:
        """Every conversation, most recently updated first."""
        ...

    async def list_page(self, *, limit: int = 100, cursor: str | None = None) -> ConversationPage:
        """Up to ``limit`` conversations, most recently updated first, from ``cursor`` on."""
        ...

    async def delete(
        self,
        conversation_id: str,
        *,
        expected_version: int | None = None,
        generation: str | None = None,
    ) -> bool:
        """Delete the conversation; ``False`` when there was none.

        ``expected_version`` and ``generation``, when given, must be what is
        stored, or nothing is deleted and ``ConcurrentModificationError`` is
        raised: a writer takes back only what it made.
        """
        ...

    async def aclose(self) -> None:
        """Release the store's connections."""
        ...
