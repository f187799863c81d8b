"""A saved conversation in parts, as stores keep it: one header and one JSON text per event."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from threadline import ConversationFormatError, Message, Origin, Reasoning, ToolCall, Usage
from threadline.serialization import (
    FORMAT_VERSION,
    ConversationDocument,
    ConversationEvent,
    dumps_conversation,
)
from threadline.serialization._converter import (
    dumps_conversation_header,
    dumps_event,
    loads_conversation_parts,
)


def document() -> ConversationDocument:
    return ConversationDocument(
        id="c1",
        history_limit=4,
        next_turn_id=2,
        total_usage=Usage(input_tokens=9, output_tokens=3),
        settings={"max_context_tokens": 4096},
        metadata={"user": "ada"},
        created_at=datetime(2025, 5, 6, 7, 8, 9, tzinfo=UTC),
        events=(
            ConversationEvent(message=Message.user("Weather?", origin=Origin.TURN), turn_id=0),
            ConversationEvent(
                message=Message.assistant(
                    tool_calls=[ToolCall(id="call_1", name="weather")],
                    reasoning=Reasoning(provider_reasoning=b'{"a":  1}'),
                    origin=Origin.TURN,
                ),
                turn_id=0,
                usage=Usage(input_tokens=9, output_tokens=3),
            ),
            ConversationEvent(
                message=Message.tool("call_1", "sunny", origin=Origin.TURN), turn_id=0
            ),
            ConversationEvent(
                message=Message.user("And now?", origin=Origin.TURN), turn_id=1, pending=True
            ),
        ),
    )


def parts(of: ConversationDocument) -> tuple[str, list[str]]:
    return dumps_conversation_header(of), [dumps_event(event) for event in of.events]


def test_the_parts_load_back_as_the_same_document() -> None:
    header, events = parts(document())

    assert loads_conversation_parts(header, events) == document()


def test_the_parts_are_the_saved_conversation_cut_at_its_events() -> None:
    header, events = parts(document())

    whole = json.loads(dumps_conversation(document()))

    assert json.loads(header) == {key: value for key, value in whole.items() if key != "events"}
    assert [json.loads(event) for event in events] == whole["events"]
    assert json.loads(header)["format_version"] == FORMAT_VERSION


def test_the_header_ignores_the_documents_events() -> None:
    assert dumps_conversation_header(document()) == dumps_conversation_header(
        ConversationDocument(
            id="c1",
            history_limit=4,
            next_turn_id=2,
            total_usage=Usage(input_tokens=9, output_tokens=3),
            settings={"max_context_tokens": 4096},
            metadata={"user": "ada"},
            created_at=datetime(2025, 5, 6, 7, 8, 9, tzinfo=UTC),
        )
    )


def test_an_event_the_format_cannot_hold_is_refused_with_its_path() -> None:
    event = ConversationEvent(
        message=Message.assistant("x", reasoning=Reasoning(provider_reasoning=b"{oops")), turn_id=0
    )

    with pytest.raises(ConversationFormatError) as caught:
        dumps_event(event)

    assert caught.value.path == "$.message.reasoning.provider_reasoning"


@pytest.mark.parametrize(
    ("dump", "value"),
    [(dumps_event, Message.user("not an event")), (dumps_conversation_header, {"id": "c1"})],
)
def test_dumping_something_else_is_a_type_error(dump: Any, value: object) -> None:
    with pytest.raises(TypeError, match="expected a Conversation"):
        dump(value)


@pytest.mark.parametrize(
    ("damage", "path", "reason"),
    [
        ('{"message": ', "$.events[2]", "not valid JSON"),
        ('{"message": {"role": "user"}, "turn_id": NaN}', "$.events[2].turn_id", "NaN"),
        ('"text"', "$.events[2]", "expected an object"),
        (
            '{"message": {"role": "user", "content": "x"}, "turn_id": 0, "mood": 1}',
            "$.events[2].mood",
            "unknown field 'mood'",
        ),
        (
            '{"message": {"role": "tool", "content": "x", "origin": "turn"}, "turn_id": 0}',
            "$.events[2].message",
            "tool_call_id",
        ),
    ],
)
def test_a_damaged_event_is_refused_with_a_path_into_the_events(
    damage: str, path: str, reason: str
) -> None:
    header, events = parts(document())
    events[2] = damage

    with pytest.raises(ConversationFormatError) as caught:
        loads_conversation_parts(header, events)

    assert caught.value.path == path
    assert reason in caught.value.reason


@pytest.mark.parametrize(
    ("damage", "path", "reason"),
    [
        ('{"format_version": 1, "id"', "$", "the header is not valid JSON"),
        (
            '{"format_version": 1, "settings": {"token_calibration": {"m": Infinity}}}',
            "$.settings.token_calibration.m",
            "Infinity is not a JSON number",
        ),
        ("[]", "$", "expected a saved conversation header"),
        ('{"format_version": 1, "id": "c1", "events": []}', "$.events", "holds no events"),
        ('{"id": "c1"}', "$.format_version", "no format_version"),
        (f'{{"format_version": {FORMAT_VERSION + 1}}}', "$.format_version", "newer threadline"),
    ],
)
def test_a_damaged_header_is_refused(damage: str, path: str, reason: str) -> None:
    _, events = parts(document())

    with pytest.raises(ConversationFormatError) as caught:
        loads_conversation_parts(damage, events)

    assert caught.value.path == path
    assert reason in caught.value.reason


def test_events_that_break_the_header_are_refused_as_a_document() -> None:
    header = dumps_conversation_header(ConversationDocument(id="c1", next_turn_id=1))
    late = dumps_event(ConversationEvent(message=Message.user("late"), turn_id=5))

    with pytest.raises(ConversationFormatError, match="turn_id 5"):
        loads_conversation_parts(header, [late])


@pytest.mark.parametrize(
    "field",
    [
        name
        for name in json.loads(dumps_conversation_header(document()))
        if name not in ("format_version", "id")
    ],
)
def test_a_header_missing_a_field_is_refused_naming_it(field: str) -> None:
    header, events = parts(document())
    damaged = json.loads(header)
    del damaged[field]

    with pytest.raises(ConversationFormatError) as caught:
        loads_conversation_parts(json.dumps(damaged), events)

    assert caught.value.path == f"$.{field}"
    assert "required field" in caught.value.reason
