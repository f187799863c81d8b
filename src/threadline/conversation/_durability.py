"""Durability: everything a conversation writes to its store, and when.

A turn joins the transcript only when its run completes. Until then nothing
in memory changes; with a store, the submitted prompt is written first,
marked pending under a marker of the turn's own, and the turn replaces it in
one write on success. A failed or cancelled run removes that copy again, under
a shielded cancel scope, so the conversation and its store are left as they
were; a refused one removes exactly its own copy, whatever other writers did.
The pending write and its removal send back the header the store held (only
the turn id handed out moves): the conversation's settings, which may be
this object's own (``load(..., max_context_tokens=...)``), reach the store
with a committed turn or ``save()``, never with a turn that did not happen.
A pending prompt sent again answers the copy a crash left (by its marker)
instead of writing a second one.

:class:`TurnWriter` does all of that, and is the only code that talks to a
:class:`~threadline._store.ConversationStore`. It keeps what the conversation
knows of its store: the version last written or read, the marker of each
pending prompt, the header the store holds, and when the conversation was
last written. The conversation hands it each document to write as a function
(a *header*), called only when there is a store to write to.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime

import anyio
import attrs

from threadline._errors import ConcurrentModificationError
from threadline._messages import Message, Origin
from threadline._store import ConversationStore, StoredConversation
from threadline.serialization._documents import ConversationDocument, ConversationEvent

__all__ = ["Header", "TurnWrite", "TurnWriter", "copies_of", "now", "read_stored"]

logger = logging.getLogger("threadline.conversation")

Header = Callable[[], ConversationDocument]
"""Makes the document (a header, or a whole one) a write sends, when it is sent."""


def now() -> datetime:
    """The time a conversation stamps on what it writes."""
    return datetime.now(UTC)


@attrs.define(kw_only=True)
class TurnWrite:
    """What one turn has written to the store so far."""

    turn_id: int
    prompt: Message
    marker: str
    """This turn's pending copy in the store: committed or removed exactly, whatever
    other writers did."""
    before: ConversationDocument | None = None
    """The header the store held before the turn wrote (``None``: nothing stored),
    written back when the turn does not commit."""
    adopted: bool = False
    """The prompt is a pending prompt a crashed turn left in the store, under
    ``marker``: this turn answers that copy and writes none of its own, so a
    crash now still leaves exactly one."""
    pending_written: bool = False
    created_store_entry: bool = False
    committed: bool = False


def copies_of(prompt: Message, pending: Sequence[ConversationEvent]) -> list[int]:
    """Indices into ``pending`` of the prompts that ``prompt`` sends again."""
    return [
        i for i, event in enumerate(pending) if event.message.with_origin(Origin.TURN) == prompt
    ]


async def read_stored(store: ConversationStore, id: str) -> StoredConversation:
    """What ``store`` holds of conversation ``id``.

    Raises:
        ConversationNotFoundError: it holds no such conversation.
    """
    return await store.load(id)


class TurnWriter:
    """A conversation's writes to its store (none without one), and what it knows of it.

    ``markers`` holds the store's marker of each pending event, beside the
    transcript's pending events (``None``: unknown, as for a pending prompt
    written by ``save()`` or an older version). ``stored`` is the header the
    store holds at ``version`` as far as this conversation knows (``None``
    while nothing is stored).
    """

    __slots__ = ("_id", "markers", "store", "stored", "updated_at", "version")

    def __init__(
        self,
        store: ConversationStore | None,
        id: str,
        *,
        version: int = 0,
        pending: int = 0,
        updated_at: datetime | None = None,
        stored: ConversationDocument | None = None,
    ) -> None:
        self.store = store
        self._id = id
        self.version = version
        self.stored = None if stored is None else attrs.evolve(stored, events=())
        self.markers: tuple[str | None, ...] = (None,) * pending
        self.updated_at = updated_at

    def begin(
        self, turn_id: int, prompt: Message, pending: Sequence[ConversationEvent]
    ) -> TurnWrite:
        """The writes of turn ``turn_id``, which sends ``prompt`` with ``pending`` events
        waiting: it adopts a pending copy of the prompt a crash left, if any."""
        markers = self.markers
        adopted = next(
            (m for i in copies_of(prompt, pending) if (m := markers[i]) is not None), None
        )
        return TurnWrite(
            turn_id=turn_id,
            prompt=prompt,
            marker=adopted or uuid.uuid4().hex,
            adopted=adopted is not None,
        )

    async def write_pending(self, turn: TurnWrite, header: Header) -> None:
        """Write the turn's prompt as pending, under its marker (or claim the version
        only, for an adopted prompt, so a stale conversation is still refused before
        the model is called). ``header`` is the conversation's, written only to create
        the stored conversation; a stored one keeps its header, its turn ids moved on.

        Raises:
            ConcurrentModificationError: another writer wrote the store first.
        """
        store = self.store
        if store is None:
            return
        pending = ConversationEvent(message=turn.prompt, turn_id=turn.turn_id, pending=True)
        before = self.stored
        written = header() if before is None else _with_turn(before, turn.turn_id)
        # Shielded, so the version we hold always matches what the store did.
        with anyio.CancelScope(shield=True):
            turn.created_store_entry = self.version == 0
            try:
                self.version = await store.append_events(
                    self._id,
                    [] if turn.adopted else [pending],
                    header=written,
                    expected_version=self.version,
                    pending_marker=None if turn.adopted else turn.marker,
                    generation=turn.marker if turn.created_store_entry else None,
                )
            except ConcurrentModificationError as exc:
                raise self.refusal(exc) from None
            turn.before, self.stored = before, written
            turn.pending_written = not turn.adopted

    async def commit(
        self,
        turn: TurnWrite,
        events: Sequence[ConversationEvent],
        pending: Sequence[ConversationEvent],
        header: Header,
    ) -> tuple[ConversationEvent, ...]:
        """Write the turn's ``events`` in place of its pending copy (and of further
        copies earlier crashes left); return the ``pending`` events still unanswered.

        Raises:
            ConcurrentModificationError: another writer got in since the pending
                write; nothing is written then.
        """
        markers = self.markers
        copies = copies_of(turn.prompt, pending)
        kept = [i for i in range(len(pending)) if i not in copies]
        # A copy without a marker (written by save() or an older version) goes only
        # with every pending event; the others are written back, without markers.
        rewrite = any(markers[i] is None for i in copies)
        with anyio.CancelScope(shield=True):
            if self.store is not None:
                written = header()
                self.version = await self.store.append_events(
                    self._id,
                    [*events, *(pending[i] for i in kept)] if rewrite else events,
                    header=written,
                    expected_version=self.version,
                    drop_pending=True if rewrite else turn.marker,
                )
                self.stored, self.updated_at = written, written.updated_at
                if not rewrite:
                    await self._remove_copies({markers[i] for i in copies} - {turn.marker})
        self.markers = tuple(None if rewrite else markers[i] for i in kept)
        turn.committed = True
        return tuple(pending[i] for i in kept)

    async def _remove_copies(self, markers: Iterable[str | None]) -> None:
        """Take back further pending copies of a prompt just answered (left by
        earlier crashes while it was sent again)."""
        assert self.store is not None
        for marker in markers:
            if marker is None:
                continue
            try:
                await self.store.remove_pending(self._id, marker)
            except Exception:
                logger.warning(
                    "could not remove a pending copy of a prompt conversation %r answered",
                    self._id,
                    exc_info=True,
                )

    async def abandon(self, turn: TurnWrite) -> None:
        """Take back this turn's own pending copy (an adopted one stays pending), and the
        header with it: the store's as it was before the turn."""
        store = self.store
        if store is None or not turn.pending_written:
            return
        # A conversation the turn created has no header before it: the pending one stays.
        header = self.stored if turn.before is None else turn.before
        assert header is not None  # the pending write stored one
        with anyio.CancelScope(shield=True):
            try:
                if turn.created_store_entry and await self._delete_own_entry(store, turn):
                    return
                try:
                    # Versioned, so the header goes back to what it was too.
                    self.version = await store.append_events(
                        self._id,
                        [],
                        header=header,
                        expected_version=self.version,
                        drop_pending=turn.marker,
                        generation=turn.marker if turn.created_store_entry else None,
                    )
                    self.stored = header
                except ConcurrentModificationError:
                    # Another writer got in: take back exactly this turn's prompt.
                    await store.remove_pending(self._id, turn.marker)
            except Exception:
                # The pending prompt stays visible on load; that is what it is for.
                logger.warning(
                    "could not remove the pending prompt of conversation %r after its turn failed",
                    self._id,
                    exc_info=True,
                )

    async def _delete_own_entry(self, store: ConversationStore, turn: TurnWrite) -> bool:
        """Remove the stored conversation a failed first turn created (with its marker
        as generation), when no one else has written it since; ``True`` when it is gone."""
        try:
            await store.delete(self._id, expected_version=self.version, generation=turn.marker)
        except ConcurrentModificationError:
            return False
        self.version, self.stored = 0, None
        return True

    async def save(self, document: Header, *, pending: int, same_pending: bool) -> None:
        """Write the whole conversation, ``document``, which holds ``pending`` pending
        events (``same_pending``: the very ones it held, whose markers then stay).

        Raises:
            ConcurrentModificationError: the store changed under this conversation.
        """
        markers = self.markers if same_pending else (None,) * pending
        # Shielded, so a cancel cannot leave the store rewritten and the memory not.
        with anyio.CancelScope(shield=True):
            if self.store is not None:
                written = document()
                try:
                    self.version = await self.store.save(
                        written, expected_version=self.version, pending_markers=markers
                    )
                except ConcurrentModificationError as exc:
                    raise self.refusal(exc) from None
                self.stored = attrs.evolve(written, events=())
                self.updated_at = written.updated_at
        self.markers = markers

    def refusal(self, error: ConcurrentModificationError) -> ConcurrentModificationError:
        """``error``, or for a conversation made new whose id the store already holds,
        the error that says so and how to continue the stored one."""
        if self.version != 0 or error.actual is None:
            return error
        return ConcurrentModificationError(
            self._id,
            expected=0,
            actual=error.actual,
            message=(
                f"conversation {self._id!r} already exists in the store (version "
                f"{error.actual}) and this Conversation was made as a new one; continue the "
                f"stored one with `await Conversation.load(agent, store, {self._id!r})`, or "
                f"`await Conversation.open(agent, store, {self._id!r})` to load it or "
                "create it in one call"
            ),
        )


def _with_turn(header: ConversationDocument, turn_id: int) -> ConversationDocument:
    """``header`` with turn ``turn_id`` handed out, as a pending write stores it."""
    return attrs.evolve(
        header, next_turn_id=max(header.next_turn_id, turn_id + 1), updated_at=now()
    )
