"""``MemoryStore``: conversations kept in this process, for tests and short-lived programs."""

from __future__ import annotations

from datetime import datetime
from typing import TypeAlias

import anyio
import attrs

from threadline._errors import ConcurrentModificationError, ConversationNotFoundError
from threadline._store import ConversationInfo, StoredConversation
from threadline.serialization._documents import ConversationDocument, ConversationEvent
from threadline.stores._base import StoreBase, Write, check_turn_ids_below, utc_now

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


class MemoryStore(StoreBase):
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

    def __repr__(self) -> str:
        return f"MemoryStore(<{len(self._entries)} conversations>)"

    async def _load(self, conversation_id: str) -> StoredConversation:
        async with self._lock:
            entry = self._entries.get(conversation_id)
            if entry is None:
                raise ConversationNotFoundError(conversation_id)
            # evolve runs the converters again, so settings and metadata are fresh copies.
            document = attrs.evolve(entry.header, events=tuple(entry.events))
            return StoredConversation(document=document, version=entry.version)

    async def _write(self, write: Write) -> int:
        new_events = [record.event for record in write.records]
        async with self._lock:
            current = self._check_version(write.conversation_id, write.expected_version)
            entry = self._entries.get(write.conversation_id)
            if write.replace or entry is None:
                kept: _Events = []
                pending, max_turn_id = 0, -1
            else:
                kept, pending, max_turn_id = entry.events, entry.pending, entry.max_turn_id
            dropping = write.drop_pending and pending > 0
            if write.header.next_turn_id <= max_turn_id:
                # The bound may be stale after earlier drops: check the exact one.
                max_turn_id = max(
                    (event.turn_id for event in kept if not (dropping and event.pending)),
                    default=-1,
                )
                check_turn_ids_below(max_turn_id, write.header)
            # Every check has passed: from here on the entry may change in place.
            if dropping:
                _drop_pending(kept, pending)
                pending = 0
            kept.extend(new_events)
            self._put(
                write.conversation_id,
                header=write.header,
                events=kept,
                pending=pending + sum(1 for event in new_events if event.pending),
                max_turn_id=max(max_turn_id, write.max_turn_id),
                version=current + 1,
            )
            return current + 1

    async def _list(self) -> list[ConversationInfo]:
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

    async def _delete(self, conversation_id: str) -> bool:
        async with self._lock:
            return self._entries.pop(conversation_id, None) is not None

    async def _close(self) -> None:
        """Nothing to release; the conversations go with the store."""

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
