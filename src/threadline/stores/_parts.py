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
from threadline.serialization._converter import loads_conversation_parts
from threadline.serialization._documents import ConversationDocument

__all__ = ["assemble", "read_metadata", "read_time"]

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
