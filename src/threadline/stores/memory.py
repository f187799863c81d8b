"""``MemoryStore``: conversations kept in this process, for tests and short-lived programs."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from types import TracebackType
from typing import TypeAlias

import anyio
import attrs

from threadline._errors import ConcurrentModificationError, ConversationNotFoundError
from threadline._store import ConversationInfo, StoredConversation
from threadline.serialization._converter import dumps_conversation, dumps_event
from threadline.serialization._documents import ConversationDocument, ConversationEvent
from threadline.stores._checks import (
    check_append,
    check_conversation_id,
    check_document,
    check_expected_version,
    check_turn_ids_below,
    utc_now,
)

__all__ = ["MemoryStore"]

# A name of its own: inside MemoryStore, ``list`` is the method.
_Events: TypeAlias = list[ConversationEvent]


@attrs.define(kw_only=True)
class _Entry:
    header: ConversationDocument
    """The conversation's state, with no events: those are in ``events``."""
    events: list[ConversationEvent]
    pending: int
    max_turn_id: int
    """At least the highest turn id in ``events`` (exact until pending events are dropped)."""
    version: int
    updated_at: datetime
    touched: int
    """Orders the listing: higher was written later."""


class MemoryStore:
    """A :class:`~threadline._store.ConversationStore` that keeps everything in memory.

    It has the semantics of the persistent stores, version checks included,
    and refuses what they would refuse (a message the saved format cannot
    hold), so code tested against it behaves the same on SQLite. Documents
    are copied in and out: editing a loaded document's ``settings`` or
    ``metadata`` never reaches the store. Everything is lost when the
    process ends.

    Example::

        store = MemoryStore()
        version = await store.save(ConversationDocument(id="c1"), expected_version=0)
        stored = await store.load("c1")
        assert stored.version == version == 1
    """

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._lock = anyio.Lock()
        self._writes = 0

    async def __aenter__(self) -> MemoryStore:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def load(self, conversation_id: str) -> StoredConversation:
        """The conversation's document and current version.

        Raises:
            ConversationNotFoundError: no conversation has that id.
        """
        check_conversation_id(conversation_id)
        async with self._lock:
            entry = self._entries.get(conversation_id)
            if entry is None:
                raise ConversationNotFoundError(conversation_id)
            # evolve runs the converters again, so settings and metadata are fresh copies.
            document = attrs.evolve(entry.header, events=tuple(entry.events))
            return StoredConversation(document=document, version=entry.version)

    async def save(self, document: ConversationDocument, *, expected_version: int) -> int:
        """Replace the whole conversation (create it when ``expected_version`` is 0).

        Returns the new version.

        Raises:
            ConcurrentModificationError: the conversation is not at ``expected_version``.
            ConversationFormatError: a message the saved format cannot hold.
        """
        check_document(document)
        check_expected_version(expected_version)
        dumps_conversation(document)
        async with self._lock:
            current = self._check_version(document.id, expected_version)
            events = list(document.events)
            self._put(
                document.id,
                header=document,
                events=events,
                pending=sum(1 for event in events if event.pending),
                max_turn_id=max((event.turn_id for event in events), default=-1),
                version=current + 1,
            )
            return current + 1

    async def append_events(
        self,
        conversation_id: str,
        events: Sequence[ConversationEvent],
        *,
        header: ConversationDocument,
        expected_version: int,
        drop_pending: bool = False,
    ) -> int:
        """Atomically append ``events`` and store ``header``'s state; see the protocol.

        Raises:
            ConcurrentModificationError: the conversation is not at ``expected_version``.
            ConversationFormatError: a message the saved format cannot hold.
            InvalidRequestError: a header for another conversation, or events
                whose turn ids are not below the header's ``next_turn_id``.
        """
        conversation_id, new_events, header = check_append(conversation_id, events, header)
        check_expected_version(expected_version)
        for event in new_events:
            dumps_event(event)
        async with self._lock:
            current = self._check_version(conversation_id, expected_version)
            entry = self._entries.get(conversation_id)
            if entry is None:
                kept: _Events = []
                pending, max_turn_id = 0, -1
            else:
                kept, pending, max_turn_id = entry.events, entry.pending, entry.max_turn_id
            dropping = drop_pending and pending > 0
            if header.next_turn_id <= max_turn_id:
                # The bound may be stale after earlier drops: check the exact one.
                max_turn_id = max(
                    (event.turn_id for event in kept if not (dropping and event.pending)),
                    default=-1,
                )
                check_turn_ids_below(max_turn_id, header)
            # Every check has passed: from here on the entry may change in place.
            if dropping:
                _drop_pending(kept, pending)
                pending = 0
            kept.extend(new_events)
            self._put(
                conversation_id,
                header=header,
                events=kept,
                pending=pending + sum(1 for event in new_events if event.pending),
                max_turn_id=max([max_turn_id, *(event.turn_id for event in new_events)]),
                version=current + 1,
            )
            return current + 1

    async def list(self) -> list[ConversationInfo]:
        """Every conversation, most recently updated first."""
        async with self._lock:
            entries = sorted(self._entries.values(), key=lambda entry: -entry.touched)
            return [
                ConversationInfo(
                    id=entry.header.id,
                    version=entry.version,
                    events=len(entry.events),
                    updated_at=entry.updated_at,
                    metadata=dict(entry.header.metadata),
                )
                for entry in entries
            ]

    async def delete(self, conversation_id: str) -> bool:
        """Delete the conversation; ``False`` when there was none."""
        check_conversation_id(conversation_id)
        async with self._lock:
            return self._entries.pop(conversation_id, None) is not None

    async def aclose(self) -> None:
        """Nothing to release; the conversations stay until the store is dropped."""

    def _check_version(self, conversation_id: str, expected_version: int) -> int:
        entry = self._entries.get(conversation_id)
        current = 0 if entry is None else entry.version
        if current != expected_version:
            raise ConcurrentModificationError(
                conversation_id,
                expected=expected_version,
                actual=None if entry is None else current,
            )
        return current

    def _put(
        self,
        conversation_id: str,
        *,
        header: ConversationDocument,
        events: _Events,
        pending: int,
        max_turn_id: int,
        version: int,
    ) -> None:
        self._writes += 1
        self._entries[conversation_id] = _Entry(
            # evolve copies settings and metadata: the caller's dicts stay the caller's.
            header=attrs.evolve(header, events=()),
            events=events,
            pending=pending,
            max_turn_id=max_turn_id,
            version=version,
            updated_at=utc_now(),
            touched=self._writes,
        )


def _drop_pending(events: list[ConversationEvent], pending: int) -> None:
    """Remove the ``pending`` events marked pending, in place."""
    tail = len(events) - pending
    # The usual case, a crash or a turn in flight: the pending message is the last event.
    if all(event.pending for event in events[tail:]):
        del events[tail:]
    else:
        events[:] = [event for event in events if not event.pending]
