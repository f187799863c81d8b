"""The store base every backend builds on.

:class:`StoreBase` implements the :class:`~threadline._store.ConversationStore`
protocol once: the argument checks, the serialization of what is written, the
closed state and ``async with``. A backend implements only how to load, write,
list and delete (``_load``, ``_write``, ``_list``, ``_delete``) and how to
release what it holds (``_close``); each of those runs only on an open store,
with arguments already checked.
"""

from __future__ import annotations

import builtins
import re
import secrets
import uuid
from abc import ABC, abstractmethod
from collections.abc import Sequence
from datetime import UTC, datetime

import attrs

from threadline._closing import AsyncClosing
from threadline._errors import ConcurrentModificationError, InvalidRequestError, StoreClosedError
from threadline._store import ConversationInfo, ConversationPage, StoredConversation
from threadline.serialization._converter import dumps_conversation_header, dumps_event
from threadline.serialization._documents import (
    ConversationDocument,
    ConversationEvent,
    id_problem,
)

__all__ = [
    "DeleteCheck",
    "EventRecord",
    "StoreBase",
    "Write",
    "check_turn_ids_below",
    "new_generation",
    "utc_now",
]


def utc_now() -> datetime:
    """The time a store stamps on a write."""
    return datetime.now(UTC)


@attrs.frozen
class EventRecord:
    """One event to write: the event and its JSON in the current saved format."""

    event: ConversationEvent
    text: str
    marker: str | None = None
    """The writer's marker of a pending event (``None`` for others, or none given)."""

    @property
    def turn_id(self) -> int:
        return self.event.turn_id

    @property
    def pending(self) -> bool:
        return self.event.pending


@attrs.frozen(kw_only=True)
class Write:
    """One checked write, for a backend's ``_write``.

    ``replace``: the records are the whole transcript (``save``); otherwise
    they are appended after the stored events, first removing the pending
    ones when ``drop_all`` is set, or those written with ``drop_marker``.
    Either way the header's state replaces the stored one, in one step with
    the version check. ``pending_marker`` goes with the pending records.
    ``generation``: when creating (``expected_version`` 0), the generation the
    new conversation gets; otherwise the one to check, or ``None``.
    ``write_id`` is unique to this write: a backend that retries a write
    after a lost connection stores it to tell "already applied" from a
    conflict.
    """

    conversation_id: str
    header: ConversationDocument
    header_text: str
    """The header as JSON, without events (``dumps_conversation_header``)."""
    records: tuple[EventRecord, ...]
    expected_version: int
    replace: bool
    drop_all: bool = False
    drop_marker: str | None = None
    pending_marker: str | None = None
    generation: str | None = None
    # 32 random hex digits, as a uuid4's hex but without building a UUID (every write makes one).
    write_id: str = attrs.field(factory=lambda: secrets.token_hex(16))

    @property
    def max_turn_id(self) -> int:
        """The highest turn id among the records, -1 when there are none."""
        return max((record.turn_id for record in self.records), default=-1)

    def drops(self, pending: bool, marker: str | None) -> bool:
        """Whether a stored event (pending or not, with its marker) is removed by this write."""
        if self.replace:
            return True
        return pending and (self.drop_all or (marker is not None and marker == self.drop_marker))

    def generation_refusal(
        self, stored_generation: str, version: int
    ) -> ConcurrentModificationError:
        return ConcurrentModificationError(
            self.conversation_id,
            expected=self.expected_version,
            actual=version,
            reason=(
                f"it was deleted and created again since it was loaded (generation "
                f"{stored_generation!r}, not {self.generation!r}); load it again"
            ),
        )

    def conflict(self, actual: int | None) -> ConcurrentModificationError:
        return ConcurrentModificationError(
            self.conversation_id, expected=self.expected_version, actual=actual
        )


@attrs.frozen
class DeleteCheck:
    """One checked delete: the conversation and what it must still be at."""

    conversation_id: str
    expected_version: int | None = None
    generation: str | None = None

    def refusal(self, version: int, generation: str) -> ConcurrentModificationError | None:
        """The error when the stored ``version``/``generation`` do not match, else ``None``."""
        if self.generation is not None and generation != self.generation:
            return ConcurrentModificationError(
                self.conversation_id,
                expected=self.expected_version or version,
                actual=version,
                reason=(
                    f"it was deleted and created again since it was loaded (generation "
                    f"{generation!r}, not {self.generation!r}); nothing was deleted"
                ),
            )
        if self.expected_version is not None and version != self.expected_version:
            return ConcurrentModificationError(
                self.conversation_id, expected=self.expected_version, actual=version
            )
        return None


def new_generation() -> str:
    """A fresh generation id for a conversation being created."""
    return uuid.uuid4().hex


class StoreBase(AsyncClosing, ABC):
    """What every store shares; subclass it and implement the five backend methods.

    Every public method refuses a closed store with
    :class:`~threadline._errors.StoreClosedError` and checks its arguments
    (raising ``InvalidRequestError``) before the backend sees them.
    """

    _closed: bool = False

    # --- the protocol ------------------------------------------------------------------

    async def load(self, conversation_id: str) -> StoredConversation:
        """The conversation's document and current version.

        Raises:
            ConversationNotFoundError: no conversation has that id.
        """
        self._check_open()
        return await self._load(check_conversation_id(conversation_id))

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
        ``pending_markers``: the marker of each pending event of the document,
        in order (``None`` for one without), so the writers that own them can
        still commit or take back exactly their own. Returns the new version.

        Raises:
            ConcurrentModificationError: the conversation is not at
                ``expected_version`` (or not of ``generation``).
            ConversationFormatError: a message the saved format cannot hold.
            InvalidRequestError: ``pending_markers`` not one per pending event,
                or a marker that is not a short printable string.
        """
        self._check_open()
        document = check_document(document)
        check_expected_version(expected_version)
        markers = _pending_markers(document.events, pending_markers)
        write = Write(
            conversation_id=document.id,
            header=document,
            header_text=dumps_conversation_header(document),
            records=_records(document.events, markers),
            expected_version=expected_version,
            replace=True,
            generation=_generation_for(expected_version, generation),
        )
        return await self._write(write)

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
        """Atomically append ``events`` and store ``header``'s state; see the protocol.

        Writes the new events and the header, not the transcript before them.
        ``drop_pending``: ``True`` first removes every pending event, a
        marker only those written with it. ``pending_marker`` is stored with
        the pending events among ``events``.

        Raises:
            ConcurrentModificationError: the conversation is not at
                ``expected_version`` (or not of ``generation``).
            ConversationFormatError: a message the saved format cannot hold.
            InvalidRequestError: a header for another conversation, events
                whose turn ids are not below the header's ``next_turn_id``, or
                a marker that is not a short printable string.
        """
        self._check_open()
        conversation_id, new_events, header = check_append(conversation_id, events, header)
        check_expected_version(expected_version)
        if not isinstance(drop_pending, bool):
            check_marker(drop_pending, "drop_pending")
        if pending_marker is not None:
            check_marker(pending_marker, "pending_marker")
        write = Write(
            conversation_id=conversation_id,
            header=header,
            header_text=dumps_conversation_header(header),
            records=_records(new_events, [pending_marker] * sum(e.pending for e in new_events)),
            expected_version=expected_version,
            replace=False,
            drop_all=drop_pending is True,
            drop_marker=None if isinstance(drop_pending, bool) else drop_pending,
            pending_marker=pending_marker,
            generation=_generation_for(expected_version, generation),
        )
        return await self._write(write)

    async def remove_pending(self, conversation_id: str, marker: str) -> bool:
        """Remove the pending events written with ``marker``, whatever the version.

        The version does not change: pending events are not part of the
        answered transcript, and a writer whose commit was refused must still
        be able to take its own prompt back. ``False`` when there were none
        (or no such conversation).
        """
        self._check_open()
        return await self._remove_pending(
            check_conversation_id(conversation_id), check_marker(marker, "marker")
        )

    async def list(self) -> list[ConversationInfo]:
        """Every conversation, most recently updated first (read page by page)."""
        conversations: builtins.list[ConversationInfo] = []
        cursor: str | None = None
        while True:
            page = await self.list_page(limit=LIST_PAGE_SIZE, cursor=cursor)
            conversations.extend(page.conversations)
            if page.next_cursor is None:
                return conversations
            cursor = page.next_cursor

    async def list_page(self, *, limit: int = 100, cursor: str | None = None) -> ConversationPage:
        """Up to ``limit`` conversations, most recently updated first, from ``cursor`` on.

        Raises:
            InvalidRequestError: a ``limit`` below 1 or a cursor this store did not give.
        """
        self._check_open()
        if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
            raise InvalidRequestError(f"limit is an int >= 1, not {limit!r}")
        after = None if cursor is None else _read_cursor(cursor)
        rows = await self._list_page(limit, after)
        if len(rows) < limit:
            return ConversationPage(conversations=[info for info, _ in rows], next_cursor=None)
        return ConversationPage(
            conversations=[info for info, _ in rows], next_cursor=str(rows[-1][1])
        )

    async def delete(
        self,
        conversation_id: str,
        *,
        expected_version: int | None = None,
        generation: str | None = None,
    ) -> bool:
        """Delete the conversation; ``False`` when there was none.

        ``expected_version`` (1 or more) and ``generation``, when given, must
        be what is stored, or nothing is deleted: a writer that created a
        conversation can take it back without removing what another writer
        made of it since.

        Raises:
            ConcurrentModificationError: the stored version or generation differs.
            InvalidRequestError: an ``expected_version`` below 1, or a malformed
                ``generation``.
        """
        self._check_open()
        conversation_id = check_conversation_id(conversation_id)
        if expected_version is not None and check_expected_version(expected_version) < 1:
            raise InvalidRequestError(
                "expected_version of a delete is the version held (1 or more), or None"
            )
        if generation is not None:
            check_marker(generation, "generation")
        check = DeleteCheck(conversation_id, expected_version, generation)
        return await self._delete(check)

    async def aclose(self) -> None:
        """Release the store's connections. Closing twice is fine; any other call
        afterwards raises :class:`~threadline._errors.StoreClosedError`."""
        if self._closed:
            return
        self._closed = True
        await self._close()

    # --- for backends ------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise self._closed_error()

    def _closed_error(self) -> StoreClosedError:
        return StoreClosedError(f"{self!r} is closed; open a new store to go on")

    @abstractmethod
    async def _load(self, conversation_id: str) -> StoredConversation: ...

    @abstractmethod
    async def _write(self, write: Write) -> int:
        """Check the version and write in one step; return the new version."""

    @abstractmethod
    async def _list_page(
        self, limit: int, after: int | None
    ) -> builtins.list[tuple[ConversationInfo, int]]:
        """Up to ``limit`` conversations with their write order (unique, higher is
        later), highest first, only those below ``after`` when it is given."""

    @abstractmethod
    async def _remove_pending(self, conversation_id: str, marker: str) -> bool: ...

    @abstractmethod
    async def _delete(self, check: DeleteCheck) -> bool:
        """Delete ``check.conversation_id`` when ``check.refusal`` finds nothing
        against what is stored (raise it otherwise), in one step; ``False``
        when there is no such conversation."""

    @abstractmethod
    async def _close(self) -> None:
        """Release what the store holds; called once, by the first ``aclose``."""


LIST_PAGE_SIZE = 500
"""How many conversations ``list()`` reads at a time."""

_MARKER = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}\Z")


def _read_cursor(cursor: object) -> int:
    if isinstance(cursor, str) and cursor.isdigit() and len(cursor) < 20:
        return int(cursor)
    raise InvalidRequestError(f"{cursor!r} is not a cursor a listing of this store gave")


def _generation_for(expected_version: int, generation: object) -> str | None:
    if generation is not None and (
        not isinstance(generation, str) or not _MARKER.match(generation)
    ):
        raise InvalidRequestError(
            f"a generation is a string of 1 to 128 letters, digits or ._:@/+=-, not {generation!r}"
        )
    if expected_version == 0:
        return generation or new_generation()
    return generation


def _records(
    events: Sequence[ConversationEvent], markers: Sequence[str | None]
) -> tuple[EventRecord, ...]:
    """The events to write, each pending one with its marker (``markers`` in order)."""
    # Serializing here refuses a message the saved format cannot hold before
    # any backend is touched.
    left = iter(markers)
    return tuple(
        EventRecord(event, dumps_event(event), next(left) if event.pending else None)
        for event in events
    )


def _pending_markers(
    events: Sequence[ConversationEvent], markers: Sequence[str | None] | None
) -> list[str | None]:
    pending = sum(event.pending for event in events)
    if markers is None:
        return [None] * pending
    checked = list(markers)
    if len(checked) != pending:
        raise InvalidRequestError(
            f"pending_markers holds {len(checked)} markers for {pending} pending events; "
            "give one per pending event, in order (None for one without)"
        )
    for marker in checked:
        if marker is not None:
            check_marker(marker, "a pending marker")
    return checked


# --- argument checks ----------------------------------------------------------------------


def check_conversation_id(conversation_id: object) -> str:
    if not isinstance(conversation_id, str) or not conversation_id:
        raise InvalidRequestError(
            f"a conversation id is a non-empty string, not {conversation_id!r}"
        )
    problem = id_problem(conversation_id)  # else the driver's encoder fails raw, past the store
    if problem is not None:
        raise InvalidRequestError(problem)
    return conversation_id


def check_expected_version(expected_version: object) -> int:
    if (
        not isinstance(expected_version, int)
        or isinstance(expected_version, bool)
        or expected_version < 0
    ):
        raise InvalidRequestError(
            f"expected_version is an int >= 0 (0: the conversation does not exist yet), "
            f"not {expected_version!r}"
        )
    return expected_version


def check_marker(marker: object, name: str) -> str:
    if not isinstance(marker, str) or not _MARKER.match(marker):
        raise InvalidRequestError(
            f"{name} is a marker: 1 to 128 letters, digits or ._:@/+=-, not {marker!r}"
        )
    return marker


def check_document(document: object) -> ConversationDocument:
    if not isinstance(document, ConversationDocument):
        raise InvalidRequestError(f"expected a ConversationDocument, not {type(document).__name__}")
    return document


def check_append(
    conversation_id: object, events: Sequence[ConversationEvent], header: object
) -> tuple[str, tuple[ConversationEvent, ...], ConversationDocument]:
    """The arguments of ``append_events``, checked: the id, the new events and the header."""
    checked_id = check_conversation_id(conversation_id)
    checked_header = check_document(header)
    if checked_header.id != checked_id:
        raise InvalidRequestError(
            f"the header is conversation {checked_header.id!r}, not {checked_id!r}"
        )
    checked_events = tuple(events)
    for index, event in enumerate(checked_events):
        if not isinstance(event, ConversationEvent):
            raise InvalidRequestError(
                f"event {index} is a {type(event).__name__}, not a ConversationEvent"
            )
    check_turn_ids_below(
        max((event.turn_id for event in checked_events), default=-1), checked_header
    )
    return checked_id, checked_events, checked_header


def check_turn_ids_below(max_turn_id: int, header: ConversationDocument) -> None:
    """Refuse a transcript whose highest turn id is not below the header's ``next_turn_id``."""
    if max_turn_id >= header.next_turn_id:
        raise InvalidRequestError(
            f"the transcript would hold turn_id {max_turn_id}, which is not below the "
            f"header's next_turn_id {header.next_turn_id}"
        )
