"""Round trips are exact: whatever can be saved loads back equal (property-based)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from threadline import ImagePart, Message, Origin, Reasoning, Role, TextPart, ToolCall, Usage
from threadline._messages import ContentPart
from threadline.serialization import (
    ConversationDocument,
    ConversationEvent,
    dumps_conversation,
    dumps_messages,
    loads_conversation,
    loads_messages,
)
from threadline.serialization._documents import JsonValue

# Any code point, lone surrogates included: a Python str may hold them.
any_text = st.text(st.characters(exclude_categories=()), max_size=30)
# A conversation's id is text: a lone surrogate there is refused (see id_problem).
id_text = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=30)
optional_text = st.none() | any_text
saved_origins = st.sampled_from([Origin.SEED, Origin.TURN])
counts = st.integers(min_value=0, max_value=2**40)

json_values: st.SearchStrategy[JsonValue] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=10),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)

_WHITESPACE = st.text(st.sampled_from(" \t\r\n"), max_size=3)


@st.composite
def json_bytes(draw: st.DrawFn, value: Any | None = None) -> bytes:
    """Valid JSON text for a random value, spaced and escaped oddly, as UTF-8."""

    def render(item: Any) -> str:
        space = draw(_WHITESPACE)
        if isinstance(item, list):
            inner = ",".join(render(element) for element in item)
            return f"{space}[{inner}{draw(_WHITESPACE)}]{draw(_WHITESPACE)}"
        if isinstance(item, dict):
            members = ",".join(f"{render(key)}:{render(element)}" for key, element in item.items())
            return f"{space}{{{members}{draw(_WHITESPACE)}}}{draw(_WHITESPACE)}"
        ascii_only = draw(st.booleans())
        return f"{space}{json.dumps(item, ensure_ascii=ascii_only)}{draw(_WHITESPACE)}"

    return render(draw(json_values) if value is None else value).encode("utf-8")


provider_reasoning = st.one_of(
    st.just(b""),
    _WHITESPACE.map(str.encode),
    _WHITESPACE.map(lambda space: f"{space}null{space}".encode()),
    json_bytes(),
)

reasonings = st.builds(
    Reasoning, text=any_text, provider_reasoning=provider_reasoning, provider=optional_text
)
parts: st.SearchStrategy[ContentPart] = st.builds(TextPart, text=any_text) | st.builds(
    ImagePart, url=any_text, detail=optional_text
)
contents = any_text | st.lists(parts, max_size=3).map(tuple)
tool_calls = st.builds(
    ToolCall, id=any_text, name=any_text, arguments=any_text | json_bytes().map(bytes.decode)
)


@st.composite
def messages(draw: st.DrawFn) -> Message:
    role = draw(st.sampled_from(Role))
    fields: dict[str, Any] = {
        "role": role,
        "content": draw(contents),
        "name": draw(optional_text),
        "origin": draw(saved_origins),
    }
    if role is Role.ASSISTANT:
        fields["tool_calls"] = draw(st.lists(tool_calls, max_size=3))
        fields["reasoning"] = draw(st.none() | reasonings)
    if role is Role.TOOL:
        fields["tool_call_id"] = draw(any_text.filter(bool))
    return Message(**fields)


usages = st.builds(
    Usage,
    input_tokens=counts,
    output_tokens=counts,
    cached_input_tokens=counts,
    reasoning_tokens=counts,
)
offsets = st.integers(min_value=-23 * 60 - 59, max_value=23 * 60 + 59).map(
    lambda minutes: timezone(timedelta(minutes=minutes))
)
times = st.none() | st.datetimes(
    min_value=datetime(1970, 1, 2),
    max_value=datetime(9999, 12, 30),
    timezones=st.just(UTC) | offsets,
)


@st.composite
def documents(draw: st.DrawFn) -> ConversationDocument:
    transcript = draw(st.lists(messages(), max_size=6))
    next_turn_id = draw(st.integers(min_value=len(transcript) + 1, max_value=2**31))
    turn_ids = st.integers(min_value=0, max_value=next_turn_id - 1)
    # Answered turns never go back; a pending prompt (a user message) may carry any id.
    answered_ids = iter(
        sorted(draw(st.lists(turn_ids, min_size=len(transcript), max_size=len(transcript))))
    )
    events = []
    for message in transcript:
        pending = message.role is Role.USER and draw(st.booleans())
        events.append(
            ConversationEvent(
                message=message,
                turn_id=draw(turn_ids) if pending else next(answered_ids),
                usage=draw(st.none() | usages),
                pending=pending,
                model=draw(optional_text),
                finish_reason=draw(optional_text),
            )
        )
    return ConversationDocument(
        id=draw(id_text),
        events=events,
        history_limit=draw(counts),
        next_turn_id=next_turn_id,
        total_usage=draw(usages),
        settings=draw(st.dictionaries(st.text(max_size=12), json_values, max_size=5)),
        metadata=draw(st.dictionaries(any_text, any_text, max_size=3)),
        created_at=draw(times),
        updated_at=draw(times),
    )


@given(st.lists(messages(), max_size=8))
def test_any_message_list_survives_dumps_then_loads(transcript: list[Message]) -> None:
    text = dumps_messages(transcript)

    assert loads_messages(text) == transcript
    assert text.isascii()


@given(st.lists(messages(), max_size=8))
def test_a_saved_message_list_is_saved_again_identically(transcript: list[Message]) -> None:
    text = dumps_messages(transcript)

    assert dumps_messages(loads_messages(text)) == text


@given(reasonings)
def test_provider_reasoning_comes_back_byte_for_byte(reasoning: Reasoning) -> None:
    message = Message.assistant("x", reasoning=reasoning)

    (loaded,) = loads_messages(dumps_messages([message]))

    assert loaded.reasoning is not None
    assert loaded.reasoning.provider_reasoning == reasoning.provider_reasoning
    assert loaded.reasoning.has_provider_reasoning() == reasoning.has_provider_reasoning()


@given(documents())
def test_any_conversation_document_survives_dumps_then_loads(
    document: ConversationDocument,
) -> None:
    text = dumps_conversation(document)

    loaded = loads_conversation(text)

    assert loaded == document
    assert dumps_conversation(loaded) == text
