"""``MemoryStore``: conversations kept in this process, for tests and short-lived programs."""

from __future__ import annotations

import itertools
from datetime import datetime
from typing import TypeAlias

import anyio
import attrs

from threadline._errors import ConversationNotFoundError
from threadline._store import ConversationInfo, StoredConversation
from threadline.serialization._documents import ConversationDocument, ConversationEvent
from threadline.stores._base import (
    DeleteCheck,
    StoreBase,
    Write,
    check_turn_ids_below,
    new_generation,
    utc_now,
)

__all__ = ["MemoryStore"]

# A name of its own: inside MemoryStore, ``list`` is the method.
_Events: TypeAlias = list[ConversationEvent]


@attrs.define(kw_only=True)
class _Entry:
    header: ConversationDocument
    """The conversation's state, with no events: those are in ``events``."""
    events: _Events
    markers: list[str | None]
    """The marker of each event (``None`` for one that is not pending or has none)."""
    pending: int
    max_turn_id: int
    """At least the highest turn id in ``events`` (exact until pending events are dropped)."""
    version: int
    generation: str
    last_write: str
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
            return StoredConversation(
                document=document,
                version=entry.version,
                generation=entry.generation,
                pending_markers=tuple(
                    marker
                    for event, marker in zip(entry.events, entry.markers, strict=True)
                    if event.pending
                ),
            )

    async def _write(self, write: Write) -> int:
        async with self._lock:
            entry = self._entries.get(write.conversation_id)
            if entry is None:
                if write.expected_version != 0:
                    raise write.conflict(None)
                entry = _Entry(
                    header=write.header,
                    events=[],
                    markers=[],
                    pending=0,
                    max_turn_id=-1,
                    version=0,
                    generation=write.generation or new_generation(),
                    last_write="",
                    updated_at=utc_now(),
                    touched=0,
                )
            elif entry.version != write.expected_version:
                raise write.conflict(entry.version)
            elif write.generation is not None and write.generation != entry.generation:
                raise write.generation_refusal(entry.generation, entry.version)
            cut, events, markers = _kept(entry, write)
            # An upper bound of the kept events' turn ids (dropping events only lowers
            # it); only when it would refuse the header is the exact one needed.
            max_turn_id = entry.max_turn_id if cut or events else -1
            if write.header.next_turn_id <= max_turn_id:
                kept = itertools.chain(itertools.islice(entry.events, cut), events)
                max_turn_id = max((event.turn_id for event in kept), default=-1)
            check_turn_ids_below(max(max_turn_id, write.max_turn_id), write.header)
            # Every check has passed: from here on the entry may change in place.
            pending = entry.pending if cut == len(entry.events) else 0
            pending += sum(event.pending for event in events)
            del entry.events[cut:], entry.markers[cut:]
            entry.events.extend(events)
            entry.markers.extend(markers)
            for record in write.records:
                entry.events.append(record.event)
                entry.markers.append(record.marker)
            entry.max_turn_id = max(max_turn_id, write.max_turn_id)
            self._writes += 1
            entry.header = attrs.evolve(write.header, events=())
            entry.pending = pending + sum(record.pending for record in write.records)
            entry.version += 1
            entry.last_write = write.write_id
            entry.updated_at = utc_now()
            entry.touched = self._writes
            self._entries[write.conversation_id] = entry
            return entry.version

    async def _remove_pending(self, conversation_id: str, marker: str) -> bool:
        async with self._lock:
            entry = self._entries.get(conversation_id)
            if entry is None or not entry.pending:
                return False
            kept = [
                index
                for index, (event, own) in enumerate(zip(entry.events, entry.markers, strict=True))
                if not (event.pending and own == marker)
            ]
            if len(kept) == len(entry.events):
                return False
            entry.pending -= len(entry.events) - len(kept)
            entry.events = [entry.events[index] for index in kept]
            entry.markers = [entry.markers[index] for index in kept]
            return True

    async def _list_page(self, limit: int, after: int | None) -> list[tuple[ConversationInfo, int]]:
        async with self._lock:
            entries = sorted(
                (
                    entry
                    for entry in self._entries.values()
                    if after is None or entry.touched < after
                ),
                key=lambda entry: -entry.touched,
            )[:limit]
            return [
                (
                    ConversationInfo(
                        id=entry.header.id,
                        version=entry.version,
                        events=len(entry.events),
                        updated_at=entry.updated_at,
                        metadata=dict(entry.header.metadata),
                        generation=entry.generation,
                    ),
                    entry.touched,
                )
                for entry in entries
            ]

    async def _delete(self, check: DeleteCheck) -> bool:
        async with self._lock:
            entry = self._entries.get(check.conversation_id)
            if entry is None:
                return False
            refusal = check.refusal(entry.version, entry.generation)
            if refusal is not None:
                raise refusal
            del self._entries[check.conversation_id]
            return True

    async def _close(self) -> None:
        """Nothing to release; the conversations go with the store."""


def _kept(entry: _Entry, write: Write) -> tuple[int, _Events, list[str | None]]:
    """What the write keeps of the stored events: the entry's first ``cut`` events, then
    the events (with their markers) it returns. Without a pending event to drop, the
    cut is the end; a commit after a long transcript does not copy it."""
    if write.replace:
        return 0, [], []
    events, markers = entry.events, entry.markers
    if not entry.pending or not (write.drop_all or write.drop_marker):
        return len(events), [], []
    # Only the pending events can go, and they are few: find the earliest from the
    # end, so a commit after a long transcript does not walk all of it.
    first, seen = len(events), 0
    while seen < entry.pending and first > 0:
        first -= 1
        seen += events[first].pending
    kept = [
        index
        for index in range(first, len(events))
        if not write.drops(events[index].pending, markers[index])
    ]
    return first, [events[index] for index in kept], [markers[index] for index in kept]
