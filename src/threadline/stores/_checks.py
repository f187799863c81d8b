"""Argument checks every store makes the same way, before it touches its data."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime

from threadline._errors import InvalidRequestError
from threadline.serialization._documents import ConversationDocument, ConversationEvent

__all__ = [
    "check_append",
    "check_conversation_id",
    "check_document",
    "check_expected_version",
    "check_turn_ids_below",
    "utc_now",
]


def utc_now() -> datetime:
    """The time a store stamps on a write."""
    return datetime.now(UTC)


def check_conversation_id(conversation_id: object) -> str:
    if not isinstance(conversation_id, str) or not conversation_id:
        raise InvalidRequestError(
            f"a conversation id is a non-empty string, not {conversation_id!r}"
        )
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
