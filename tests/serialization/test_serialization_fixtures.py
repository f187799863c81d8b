"""Documents saved in format version 1 keep loading, into exactly these values.

The fixtures were written by hand in the version 1 shape. Every later version
of threadline must load them (through its migrations) into the objects below;
never edit a fixture to make a test pass.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from threadline import (
    ConversationFormatError,
    ImagePart,
    Message,
    Origin,
    Reasoning,
    TextPart,
    ToolCall,
    Usage,
)
from threadline.serialization import (
    FORMAT_VERSION,
    ConversationDocument,
    ConversationEvent,
    dumps_conversation,
    dumps_messages,
    loads_conversation,
    loads_messages,
)

FIXTURES = Path(__file__).parents[1] / "fixtures"
TURN = Origin.TURN

_THINKING = (
    b'[{"type": "thinking",\n'
    b'  "thinking": "The user wants current conditions; call the weather tool.",\n'
    b'  "signature":"EqQBCkYIARgCIkB0c2lnbmVk"}]\n'
)

EXPECTED_CONVERSATION = ConversationDocument(
    id="conv-2025-03-14-lyon",
    history_limit=12,
    next_turn_id=3,
    total_usage=Usage(
        input_tokens=2391, output_tokens=318, cached_input_tokens=1024, reasoning_tokens=142
    ),
    settings={
        "max_context_tokens": 32000,
        "output_reserve_tokens": 2048,
        "temperature": 0.2,
        "stop": ["\n\nUser:"],
        "tool_choice": None,
    },
    metadata={"title": "Weather in Lyon", "user": "ada"},
    created_at=datetime(2025, 3, 14, 9, 26, 53, 589793, tzinfo=UTC),
    updated_at=datetime(2025, 3, 14, 9, 31, 7, tzinfo=timezone(timedelta(hours=1))),
    events=[
        ConversationEvent(
            message=Message.user("What's the weather in Lyon right now?", name="ada", origin=TURN),
            turn_id=0,
        ),
        ConversationEvent(
            message=Message.assistant(
                tool_calls=[
                    ToolCall(
                        id="toolu_01A",
                        name="get_weather",
                        arguments='{"city": "Lyon", "units": "metric"}',
                    )
                ],
                reasoning=Reasoning(
                    text="The user wants current conditions; call the weather tool.",
                    provider_reasoning=_THINKING,
                    provider="anthropic:claude-sonnet-4-5",
                ),
                origin=TURN,
            ),
            turn_id=0,
            usage=Usage(input_tokens=612, output_tokens=88, reasoning_tokens=54),
            model="claude-sonnet-4-5",
            finish_reason="tool_calls",
        ),
        ConversationEvent(
            message=Message.tool(
                "toolu_01A",
                '{"temperature_c": 18, "sky": "cloudy"}',
                name="get_weather",
                origin=TURN,
            ),
            turn_id=0,
        ),
        ConversationEvent(
            message=Message.assistant("It is 18 °C and cloudy in Lyon.", origin=TURN),
            turn_id=0,
            usage=Usage(input_tokens=731, output_tokens=14, cached_input_tokens=512),
            model="claude-sonnet-4-5",
            finish_reason="stop",
        ),
        ConversationEvent(
            message=Message.user(
                [
                    TextPart(text="Does this sky look like rain to you? ☁️"),
                    ImagePart(url="https://example.com/sky.jpg", detail="low"),
                ],
                origin=TURN,
            ),
            turn_id=1,
        ),
        ConversationEvent(
            message=Message.assistant(
                "Those clouds are thin; rain is unlikely before tonight.",
                reasoning=Reasoning(text="Thin altostratus, no rain shafts."),
                origin=TURN,
            ),
            turn_id=1,
            usage=Usage(
                input_tokens=1048, output_tokens=216, cached_input_tokens=512, reasoning_tokens=88
            ),
            model="claude-sonnet-4-5",
            finish_reason="stop",
        ),
        ConversationEvent(
            message=Message.user("And tomorrow?", origin=TURN), turn_id=2, pending=True
        ),
    ],
)

EXPECTED_MESSAGES = [
    Message.system("You are a terse travel assistant."),
    Message.user("Find me a train from Paris to Lyon."),
    Message.assistant(
        tool_calls=[
            ToolCall(
                id="call_9", name="search_trains", arguments='{"from": "Paris", "to": "Lyon"}'
            ),
            ToolCall(id="call_10", name="get_prices", arguments="{}"),
        ],
        reasoning=Reasoning(
            provider_reasoning=(
                b'{"id":"rs_1","type":"reasoning","encrypted_content":"gAAAAABo","summary":[]}'
            ),
            provider="openai:o4-mini",
        ),
        origin=TURN,
    ),
    Message.tool("call_9", '[{"dep": "07:04", "arr": "09:01"}]', origin=TURN),
    Message.tool("call_10", '{"from_eur": 29}', origin=TURN),
    Message.assistant("07:04 → 09:01, from 29 €.", origin=TURN),
]


def _fixture(name: str) -> str:
    return (FIXTURES / name).read_text(encoding="utf-8")


def test_the_v1_conversation_fixture_loads_into_the_expected_document() -> None:
    assert loads_conversation(_fixture("conversation_v1.json")) == EXPECTED_CONVERSATION


def test_the_v1_messages_fixture_loads_into_the_expected_messages() -> None:
    assert loads_messages(_fixture("messages_v1.json")) == EXPECTED_MESSAGES


def test_the_v1_conversation_fixture_gives_its_transcript_to_loads_messages() -> None:
    transcript = loads_messages(_fixture("conversation_v1.json"))

    assert transcript == [event.message for event in EXPECTED_CONVERSATION.events]


def test_the_reasoning_bytes_of_the_fixture_are_kept_exactly() -> None:
    document = loads_conversation(_fixture("conversation_v1.json"))

    reasoning = document.events[1].message.reasoning
    assert reasoning is not None
    assert reasoning.provider_reasoning == _THINKING


def test_while_version_1_is_current_the_writer_writes_the_fixtures_shape() -> None:
    # When the format version changes, this test moves to the new fixtures;
    # the two loading tests above stay as they are.
    assert FORMAT_VERSION == 1
    conversation = json.loads(dumps_conversation(EXPECTED_CONVERSATION))
    messages = json.loads(dumps_messages(EXPECTED_MESSAGES))

    assert conversation == json.loads(_fixture("conversation_v1.json"))
    assert messages == json.loads(_fixture("messages_v1.json"))


_DOCUMENT_FIELDS = [
    name
    for name in json.loads(_fixture("conversation_v1.json"))
    if name not in ("format_version", "id")
]


@pytest.mark.parametrize("field", _DOCUMENT_FIELDS)
def test_a_saved_conversation_missing_a_field_is_refused_naming_it(field: str) -> None:
    # Every field is always written; read as its default, a missing one would
    # load another conversation (no events but their usage, usage 0 beside
    # events that carry some, turn ids that start over).
    document = json.loads(_fixture("conversation_v1.json"))
    del document[field]

    with pytest.raises(ConversationFormatError) as caught:
        loads_conversation(json.dumps(document))

    assert caught.value.path == f"$.{field}"
    assert "required field" in caught.value.reason
