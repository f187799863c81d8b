"""Stored parts back into documents, the same way in every store that keeps
a conversation as a header and one JSON text per event."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from contextlib import suppress
from datetime import datetime
from typing import Any, Final

from threadline._errors import ConversationFormatError
from threadline._store import StoredConversation
from threadline.serialization._converter import loads_conversation_parts
from threadline.serialization._documents import ConversationDocument

__all__ = ["assemble", "read_count", "read_metadata", "read_time", "stored_conversation"]

_EVENT_PATH: Final = re.compile(r"\$\.events\[(\d+)\]")


def assemble(
    conversation_id: str, header: object, events: Sequence[tuple[Any, ...]]
) -> ConversationDocument:
    """The stored parts as one document; a damaged row is refused, naming where it is."""
    where = f"stored conversation {conversation_id!r}"
    if not isinstance(header, str | bytes):
        raise ConversationFormatError(f"{where}: the header is not JSON text but {header!r}")
    for index, (seq, text, *_) in enumerate(events):
        if not isinstance(text, str | bytes):
            raise ConversationFormatError(
                f"{where}, event seq {seq}: expected JSON text, not {text!r}",
                path=f"$.events[{index}]",
            )
    try:
        return loads_conversation_parts(header, [row[1] for row in events])
    except ConversationFormatError as exc:
        match = _EVENT_PATH.match(exc.path)
        if match:
            where += f", event seq {events[int(match[1])][0]}"
        raise ConversationFormatError(f"{where}: {exc.reason}", path=exc.path) from None


def stored_conversation(
    conversation_id: str,
    document: ConversationDocument,
    *,
    version: object,
    generation: object,
    markers: Sequence[object],
) -> StoredConversation:
    """The loaded conversation, once what came with its document is checked.

    ``markers`` are those of the events stored as pending, in order: one for
    each event whose own JSON says it is pending, or the two disagree.
    """
    where = f"stored conversation {conversation_id!r}"
    if not isinstance(generation, str):
        raise ConversationFormatError(
            f"{where}: the generation {generation!r} is not text", path="$.generation"
        )
    pending = sum(event.pending for event in document.events)
    if len(markers) != pending:
        raise ConversationFormatError(
            f"{where}: {len(markers)} events are stored as pending, but {pending} of the "
            f"events say they are pending"
        )
    for marker in markers:
        if marker is not None and not isinstance(marker, str):
            raise ConversationFormatError(f"{where}: a pending marker is {marker!r}, not text")
    return StoredConversation(
        document=document,
        version=read_count(conversation_id, "version", version, least=1),
        generation=generation,
        pending_markers=tuple(str(marker) if marker else None for marker in markers),
    )


def read_count(conversation_id: str, name: str, value: object, *, least: int = 0) -> int:
    """A stored count (``version``, ``count``, ...): an ``int``, or its digits as text
    (Redis keeps numbers as text); anything else, or below ``least``, is damage.

    A version is a count of writes, so 1 or more: a stored 0 or -3 handed on
    would make the next write refuse the caller's ``expected_version``.
    """
    number: int | None = None
    if type(value) is int:
        number = value
    elif isinstance(value, str) and value.isascii() and value.isdigit() and len(value) < 19:
        number = int(value)
    if number is None or number < least:
        raise ConversationFormatError(
            f"stored conversation {conversation_id!r}: {name} {value!r} is not a whole "
            f"number of {least} or more; the stored data is damaged",
            path=f"$.{name}",
        )
    return number


def read_time(conversation_id: str, value: object) -> datetime:
    moment = None
    if isinstance(value, str):
        with suppress(ValueError):
            moment = datetime.fromisoformat(value)
    if moment is None:
        raise ConversationFormatError(
            f"stored conversation {conversation_id!r}: updated_at {value!r} is not an ISO 8601 time"
        )
    return moment


def read_metadata(conversation_id: str, value: object) -> dict[str, str]:
    try:
        metadata = json.loads(value) if isinstance(value, str | bytes) else None
    except ValueError:
        metadata = None
    if not isinstance(metadata, dict) or not all(
        isinstance(item, str) for item in metadata.values()
    ):
        raise ConversationFormatError(
            f"stored conversation {conversation_id!r}: the metadata column is not a JSON "
            f"object of strings: {value!r}",
            path="$.metadata",
        )
    return metadata
