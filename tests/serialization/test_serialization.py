"""Saving and loading messages and conversations: the shape, and every refusal."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest

from threadline import (
    ConversationFormatError,
    ImagePart,
    InvalidRequestError,
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


def _exchange() -> list[Message]:
    return [
        Message.system("be terse"),
        Message.user("add 1 and 2", origin=Origin.TURN),
        Message.assistant(
            tool_calls=[ToolCall(id="c1", name="add", arguments='{"a": 1, "b": 2}')],
            reasoning=Reasoning(
                text="use the tool",
                provider_reasoning=b'{"signature": "s1"}',
                provider="anthropic:claude-sonnet-4-5",
            ),
            origin=Origin.TURN,
        ),
        Message.tool("c1", "3", origin=Origin.TURN),
        Message.assistant("3", origin=Origin.TURN),
    ]


def _document(**changes: Any) -> ConversationDocument:
    fields: dict[str, Any] = {
        "id": "conv-1",
        "next_turn_id": 1,
        "events": [ConversationEvent(message=m, turn_id=0) for m in _exchange()[1:]],
    }
    fields.update(changes)
    return ConversationDocument(**fields)


def _messages_doc(*messages: dict[str, Any]) -> str:
    return json.dumps({"format_version": 1, "messages": list(messages)})


def _conversation_doc(**fields: Any) -> str:
    # Every field a saved conversation always holds, so each case is refused for its own.
    document: dict[str, Any] = json.loads(dumps_conversation(ConversationDocument(id="c")))
    document.update({"next_turn_id": 1, **fields})
    return json.dumps(document)


def _event(message: dict[str, Any], **fields: Any) -> dict[str, Any]:
    return {"message": message, "turn_id": 0, **fields}


# --- the shape written -----------------------------------------------------------------


def test_a_message_list_is_a_versioned_document() -> None:
    written = json.loads(dumps_messages([Message.user("hi")]))

    assert written == {
        "format_version": FORMAT_VERSION,
        "messages": [{"role": "user", "content": "hi", "origin": "seed"}],
    }


def test_defaults_are_left_out_but_role_content_origin_and_arguments_are_written() -> None:
    written = json.loads(dumps_messages(_exchange()))["messages"]

    assert written[2] == {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"id": "c1", "name": "add", "arguments": '{"a": 1, "b": 2}'}],
        "reasoning": {
            "text": "use the tool",
            "provider_reasoning": '{"signature": "s1"}',
            "provider": "anthropic:claude-sonnet-4-5",
        },
        "origin": "turn",
    }
    assert written[3] == {"role": "tool", "content": "3", "tool_call_id": "c1", "origin": "turn"}


def test_content_parts_are_tagged_with_their_type() -> None:
    message = Message.user([TextPart(text="see"), ImagePart(url="https://x/p.png")])

    written = json.loads(dumps_messages([message]))["messages"][0]["content"]

    assert written == [{"type": "text", "text": "see"}, {"type": "image", "url": "https://x/p.png"}]


def test_provider_reasoning_is_written_as_a_string_holding_the_exact_bytes() -> None:
    raw = b'[ {"type":"thinking" ,\n "signature": "\\u00e9"}\t]\r\n'
    message = Message.assistant("x", reasoning=Reasoning(provider_reasoning=raw))

    written = json.loads(dumps_messages([message]))["messages"][0]["reasoning"]

    assert written == {"provider_reasoning": raw.decode()}
    assert loads_messages(dumps_messages([message]))[0] == message


def test_the_output_is_ascii_and_keeps_every_character() -> None:
    messages = [Message.user("température 18 °C ☁️ 日本 \U0001f600 lone \ud800 surrogate")]

    text = dumps_messages(messages)

    assert text.isascii()
    assert loads_messages(text) == messages


def test_indent_makes_the_document_readable_without_changing_it() -> None:
    messages = _exchange()

    indented = dumps_messages(messages, indent=2)

    assert "\n  " in indented
    assert loads_messages(indented) == messages


def test_a_conversation_document_writes_every_top_level_field_with_events_last() -> None:
    created = datetime(2025, 3, 14, 9, 26, 53, tzinfo=UTC)
    document = _document(
        settings={"max_context_tokens": 8000},
        metadata={"user": "ada"},
        created_at=created,
    )

    written = json.loads(dumps_conversation(document))

    assert list(written) == [
        "format_version",
        "id",
        "history_limit",
        "next_turn_id",
        "total_usage",
        "settings",
        "metadata",
        "created_at",
        "updated_at",
        "events",
    ]
    assert written["created_at"] == "2025-03-14T09:26:53+00:00"
    assert written["updated_at"] is None
    assert written["total_usage"] == {
        "input_tokens": 0,
        "output_tokens": 0,
        "cached_input_tokens": 0,
        "reasoning_tokens": 0,
    }
    assert written["events"][0] == {
        "message": {"role": "user", "content": "add 1 and 2", "origin": "turn"},
        "turn_id": 0,
    }


def test_a_conversation_round_trips_with_usage_pending_and_times() -> None:
    events = [
        ConversationEvent(message=Message.user("q", origin=Origin.TURN), turn_id=0),
        ConversationEvent(
            message=Message.assistant("a", origin=Origin.TURN),
            turn_id=0,
            usage=Usage(input_tokens=9, output_tokens=1),
            model="m",
            finish_reason="stop",
        ),
        ConversationEvent(
            message=Message.user("next", origin=Origin.TURN), turn_id=4, pending=True
        ),
    ]
    document = ConversationDocument(
        id="c",
        events=events,
        history_limit=6,
        next_turn_id=5,
        total_usage=Usage(input_tokens=9, output_tokens=1),
        settings={"output_reserve_tokens": 0, "nested": {"a": [1, 2.5, None, True, "x"]}},
        metadata={"title": "t"},
        created_at=datetime(2025, 1, 1, tzinfo=timezone(timedelta(hours=5, minutes=30))),
        updated_at=datetime(2025, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
    )

    assert loads_conversation(dumps_conversation(document)) == document


# --- what loading accepts -----------------------------------------------------------


def test_a_bare_array_of_messages_is_read_as_version_1() -> None:
    text = json.dumps([{"role": "user", "content": "hi"}, {"role": "assistant"}])

    assert loads_messages(text) == [Message.user("hi"), Message.assistant("")]


def test_loads_messages_returns_the_transcript_of_a_saved_conversation() -> None:
    document = _document()

    assert loads_messages(dumps_conversation(document)) == [e.message for e in document.events]


def test_loads_accepts_utf8_bytes() -> None:
    messages = [Message.user("é")]

    assert loads_messages(dumps_messages(messages).encode()) == messages
    assert loads_messages('[{"role": "user", "content": "é"}]'.encode()) == messages


def test_a_message_left_with_only_its_role_reads_as_the_defaults() -> None:
    assert loads_messages(_messages_doc({"role": "assistant"})) == [Message.assistant("")]


@pytest.mark.parametrize("raw", ["", "   ", "null", " null\n"])
def test_provider_reasoning_that_means_none_loads_as_it_was(raw: str) -> None:
    text = _messages_doc({"role": "assistant", "reasoning": {"provider_reasoning": raw}})

    reasoning = loads_messages(text)[0].reasoning

    assert reasoning is not None
    assert reasoning.provider_reasoning == raw.encode()
    assert not reasoning.has_provider_reasoning()


def test_loading_a_message_list_as_a_conversation_says_which_loader_to_use() -> None:
    with pytest.raises(ConversationFormatError, match="loads_messages"):
        loads_conversation(dumps_messages(_exchange()))


# --- what loading refuses --------------------------------------------------------------

_MESSAGE_REFUSALS = [
    # (document, path, words of the reason)
    ("{", "$", "not valid JSON"),
    ("", "$", "not valid JSON"),
    ('{"format_version": 1, "messages": [NaN]}', "$.messages[0]", "NaN"),
    ('{"format_version": 1, "format_version": 1, "messages": []}', "$", "appears twice"),
    ('"messages"', "$", "not the string"),
    ('{"messages": []}', "$.format_version", "no format_version"),
    ('{"format_version": "1", "messages": []}', "$.format_version", "must be an integer"),
    ('{"format_version": 1.0, "messages": []}', "$.format_version", "must be an integer"),
    ('{"format_version": true, "messages": []}', "$.format_version", "must be an integer"),
    ('{"format_version": null, "messages": []}', "$.format_version", "must be an integer"),
    ('{"format_version": 2, "messages": []}', "$.format_version", "newer threadline"),
    ('{"format_version": 0, "messages": []}', "$.format_version", "older than this threadline"),
    ('{"format_version": -3, "messages": []}', "$.format_version", "never negative"),
    ('{"format_version": ' + "9" * 5000 + "}", "$", "a number too long to read"),
    ('{"format_version": 0, "messages": []}', "$.format_version", "older than this threadline"),
    ('{"format_version": 1}', "$.messages", "required field is missing"),
    ('{"format_version": 1, "messages": {}}', "$.messages", "expected an array"),
    ('{"format_version": 1, "messages": [], "extra": 1}', "$.extra", "unknown field"),
    (_messages_doc("hi"), "$.messages[0]", "expected an object"),
    (_messages_doc({"content": "x"}), "$.messages[0].role", "required field is missing"),
    (_messages_doc({"role": "narrator"}), "$.messages[0].role", "expected a role"),
    (_messages_doc({"role": "USER"}), "$.messages[0].role", "expected a role"),
    (_messages_doc({"role": 1}), "$.messages[0].role", "expected a role"),
    (_messages_doc({"role": "user", "origin": "replay"}), "$.messages[0].origin", "origin"),
    (
        _messages_doc({"role": "user", "origin": "injection"}),
        "$.messages[0].origin",
        "never persisted",
    ),
    (_messages_doc({"role": "user", "content": 5}), "$.messages[0].content", "expected a string"),
    (
        _messages_doc({"role": "user", "content": None}),
        "$.messages[0].content",
        "expected a string",
    ),
    (
        _messages_doc({"role": "user", "content": [{"type": "video", "url": "x"}]}),
        "$.messages[0].content[0].type",
        "part type",
    ),
    (
        _messages_doc({"role": "user", "content": [{"text": "x"}]}),
        "$.messages[0].content[0].type",
        "needs a type",
    ),
    (
        _messages_doc({"role": "user", "content": [{"type": "text"}]}),
        "$.messages[0].content[0].text",
        "required field is missing",
    ),
    (
        _messages_doc({"role": "user", "content": [{"type": "image", "url": "u", "alt": ""}]}),
        "$.messages[0].content[0].alt",
        "unknown field",
    ),
    (
        _messages_doc({"role": "user", "content": ["x"]}),
        "$.messages[0].content[0]",
        "expected a content part object",
    ),
    (
        _messages_doc({"role": "user", "name": 3}),
        "$.messages[0].name",
        "expected a string or null",
    ),
    (_messages_doc({"role": "user", "conten": "x"}), "$.messages[0].conten", "unknown field"),
    (
        _messages_doc({"role": "tool", "content": "42"}),
        "$.messages[0]",
        "needs the tool_call_id",
    ),
    (
        _messages_doc({"role": "user", "tool_call_id": "c"}),
        "$.messages[0]",
        "only tool messages",
    ),
    (
        _messages_doc(
            {"role": "user", "tool_calls": [{"id": "c", "name": "f", "arguments": "{}"}]}
        ),
        "$.messages[0]",
        "only assistant messages carry tool calls",
    ),
    (
        _messages_doc({"role": "assistant", "tool_calls": "c1"}),
        "$.messages[0].tool_calls",
        "expected an array",
    ),
    (
        _messages_doc({"role": "assistant", "tool_calls": [{"id": "c1", "arguments": "{}"}]}),
        "$.messages[0].tool_calls[0].name",
        "required field is missing",
    ),
    (
        _messages_doc(
            {"role": "assistant", "tool_calls": [{"id": "c", "name": "f", "arguments": {}}]}
        ),
        "$.messages[0].tool_calls[0].arguments",
        "expected a string",
    ),
    (
        _messages_doc({"role": "assistant", "reasoning": "thinking..."}),
        "$.messages[0].reasoning",
        "expected an object",
    ),
    (
        _messages_doc({"role": "assistant", "reasoning": {"provider_reasoning": "{oops"}}),
        "$.messages[0].reasoning.provider_reasoning",
        "not valid JSON",
    ),
    (
        _messages_doc({"role": "assistant", "reasoning": {"provider_reasoning": "[1] [2]"}}),
        "$.messages[0].reasoning.provider_reasoning",
        "not valid JSON",
    ),
    (
        _messages_doc({"role": "assistant", "reasoning": {"provider_reasoning": "[NaN]"}}),
        "$.messages[0].reasoning.provider_reasoning",
        "NaN",
    ),
    (
        _messages_doc({"role": "assistant", "reasoning": {"provider_reasoning": '"\ud800"'}}),
        "$.messages[0].reasoning.provider_reasoning",
        "lone surrogate",
    ),
    (
        _messages_doc({"role": "assistant", "reasoning": {"provider_reasoning": {"a": 1}}}),
        "$.messages[0].reasoning.provider_reasoning",
        "as a string",
    ),
    (
        _messages_doc({"role": "user", "reasoning": {"text": "hm"}}),
        "$.messages[0]",
        "only assistant messages carry reasoning",
    ),
    (
        json.dumps([{"role": "user"}, {"role": "tool", "content": "x"}]),
        "$[1]",
        "needs the tool_call_id",
    ),
    ("[1]", "$[0]", "expected an object"),
]


@pytest.mark.parametrize(("text", "path", "reason"), _MESSAGE_REFUSALS)
def test_loads_messages_refuses_with_the_path_and_the_reason(
    text: str, path: str, reason: str
) -> None:
    with pytest.raises(ConversationFormatError) as caught:
        loads_messages(text)

    assert caught.value.path == path
    assert reason in caught.value.reason
    assert str(caught.value).startswith(f"{path}: ")
    # No cattrs exception group or KeyError trails behind the error.
    assert caught.value.__cause__ is None
    assert caught.value.__context__ is None or caught.value.__suppress_context__


_CONVERSATION_REFUSALS = [
    ("[]", "$", "expected a saved conversation"),
    ('{"format_version": 1, "next_turn_id": 0, "events": []}', "$.id", "required"),
    (_conversation_doc(id=""), "$", "non-empty"),
    (_conversation_doc(id=7), "$.id", "expected a string"),
    (_conversation_doc(history_limit=-1), "$", "history_limit must be an int >= 0"),
    (_conversation_doc(history_limit="10"), "$.history_limit", "expected an integer"),
    (_conversation_doc(next_turn_id=1.5), "$.next_turn_id", "expected an integer"),
    (_conversation_doc(total_usage={"input_tokens": "3"}), "$.total_usage.input_tokens", "integer"),
    (_conversation_doc(total_usage={"input": 3}), "$.total_usage.input", "unknown field"),
    (_conversation_doc(settings=[]), "$.settings", "expected an object"),
    (_conversation_doc(metadata={"a b": 1}), '$.metadata["a b"]', "expected a string"),
    (_conversation_doc(metadata="x"), "$.metadata", "expected an object"),
    (_conversation_doc(created_at="yesterday"), "$.created_at", "ISO 8601"),
    (_conversation_doc(created_at=1736000000), "$.created_at", "ISO 8601"),
    (_conversation_doc(updated_at="2025-01-01T10:00:00"), "$.updated_at", "no UTC offset"),
    (_conversation_doc(window=3), "$.window", "unknown field"),
    (_conversation_doc(events={}), "$.events", "expected an array"),
    (
        _conversation_doc(events=[{"turn_id": 0}]),
        "$.events[0].message",
        "required field is missing",
    ),
    (
        _conversation_doc(events=[_event({"role": "user"}, turn_id=True)]),
        "$.events[0].turn_id",
        "expected an integer",
    ),
    (
        _conversation_doc(events=[_event({"role": "user"}, pending="yes")]),
        "$.events[0].pending",
        "true or false",
    ),
    (
        _conversation_doc(events=[_event({"role": "user"}, usage={"output_tokens": -1.0})]),
        "$.events[0].usage.output_tokens",
        "expected an integer",
    ),
    (
        _conversation_doc(events=[_event({"role": "user"}), _event({"role": "wizard"})]),
        "$.events[1].message.role",
        "expected a role",
    ),
    (
        _conversation_doc(events=[_event({"role": "user", "origin": "injection"})]),
        "$.events[0].message.origin",
        "never persisted",
    ),
    (
        _conversation_doc(events=[_event({"role": "tool", "content": "x"})]),
        "$.events[0].message",
        "needs the tool_call_id",
    ),
    (
        _conversation_doc(next_turn_id=1, events=[_event({"role": "user"}, turn_id=1)]),
        "$.events[0].turn_id",
        "not below next_turn_id",
    ),
]


@pytest.mark.parametrize(("text", "path", "reason"), _CONVERSATION_REFUSALS)
def test_loads_conversation_refuses_with_the_path_and_the_reason(
    text: str, path: str, reason: str
) -> None:
    with pytest.raises(ConversationFormatError) as caught:
        loads_conversation(text)

    assert caught.value.path == path
    assert reason in caught.value.reason
    assert caught.value.__cause__ is None


def test_every_problem_is_counted_and_the_first_is_named() -> None:
    text = _messages_doc({"role": "x"}, {"role": "user", "content": 1}, {"role": "y"})

    with pytest.raises(ConversationFormatError) as caught:
        loads_messages(text)

    assert caught.value.path == "$.messages[0].role"
    assert "(and 2 more problem(s))" in caught.value.reason


def test_loads_refuses_what_is_not_text_with_a_type_error() -> None:
    with pytest.raises(TypeError, match="str or bytes"):
        loads_messages([{"role": "user"}])  # type: ignore[arg-type]


def test_loads_refuses_bytes_that_are_not_utf8() -> None:
    with pytest.raises(ConversationFormatError, match="not UTF-8 text"):
        loads_messages(b'[{"role": "user", "content": "\xff"}]')


# --- what saving refuses ------------------------------------------------------------------


def test_saving_an_injected_message_is_refused_with_its_path() -> None:
    messages = [*_exchange(), Message.user("context", origin=Origin.INJECTION)]

    with pytest.raises(ConversationFormatError, match="never persisted") as caught:
        dumps_messages(messages)

    assert caught.value.path == "$.messages[5].origin"


def test_a_conversation_document_cannot_hold_an_injected_message() -> None:
    injected = Message.system("today is Friday", origin=Origin.INJECTION)

    with pytest.raises(ValueError, match="never persisted"):
        ConversationEvent(message=injected, turn_id=0)


@pytest.mark.parametrize(
    ("raw", "reason"),
    [
        (b"{not json", "not valid JSON"),
        (b"[NaN]", "NaN"),
        (b'"\xff"', "not UTF-8"),
        (b'\xef\xbb\xbf{"a": 1}', "not valid JSON"),
    ],
)
def test_saving_provider_reasoning_that_would_not_load_is_refused(raw: bytes, reason: str) -> None:
    message = Message.assistant("x", reasoning=Reasoning(provider_reasoning=raw))
    document = _document(
        events=[
            ConversationEvent(message=Message.user("q"), turn_id=0),
            ConversationEvent(message=message, turn_id=0),
        ]
    )

    with pytest.raises(ConversationFormatError, match=reason) as from_list:
        dumps_messages([Message.user("q"), message])
    with pytest.raises(ConversationFormatError, match=reason) as from_conversation:
        dumps_conversation(document)

    assert from_list.value.path == "$.messages[1].reasoning.provider_reasoning"
    assert from_conversation.value.path == "$.events[1].message.reasoning.provider_reasoning"


def test_saving_something_else_than_messages_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"messages\[1\] is a dict"):
        dumps_messages([Message.user("x"), {"role": "user"}])  # type: ignore[list-item]
    with pytest.raises(TypeError, match="ConversationDocument"):
        dumps_conversation({"id": "c"})  # type: ignore[arg-type]


def test_a_document_nested_beyond_reading_is_refused_not_crashed() -> None:
    with pytest.raises(ConversationFormatError, match="nested too deeply"):
        loads_messages("[" * 100_000)


def _turns(*events: tuple[str, int, bool]) -> str:
    return _conversation_doc(
        next_turn_id=9,
        events=[
            _event({"role": role}, turn_id=turn, pending=pending) for role, turn, pending in events
        ],
    )


_IMPOSSIBLE = [
    (
        _turns(("user", 0, False), ("assistant", 0, True)),
        "$.events[1].pending",
        "only a user message (a submitted prompt) can be pending; this one's role is assistant",
    ),
    (
        _turns(("user", 1, False), ("assistant", 1, False), ("user", 0, False)),
        "$.events[2].turn_id",
        "turn_id 0 goes back: event 1 before it is of turn 1",
    ),
    (
        _turns(("user", 0, False), ("user", 1, False), ("assistant", 0, False)),
        "$.events[2].turn_id",
        "turn_id 0 goes back",
    ),
    (
        _conversation_doc(next_turn_id=1, events=[_event({"role": "user"}, turn_id=1)]),
        "$.events[0].turn_id",
        "turn_id 1 is not below next_turn_id 1",
    ),
    (
        _conversation_doc(format_version=-1),
        "$.format_version",
        "format version -1 is not a version: versions are never negative",
    ),
]


@pytest.mark.parametrize(("text", "path", "reason"), _IMPOSSIBLE)
def test_a_document_no_conversation_could_write_is_refused_with_its_path(
    text: str, path: str, reason: str
) -> None:
    with pytest.raises(ConversationFormatError) as caught:
        loads_conversation(text)

    assert caught.value.path == path
    assert caught.value.reason.startswith(reason)


def test_pending_prompts_stay_out_of_the_order_of_answered_turns() -> None:
    # A crashed process's prompt stays pending while others answer later turns.
    document = loads_conversation(
        _turns(("user", 1, False), ("user", 3, True), ("user", 2, True), ("user", 2, False))
    )
    assert [(e.turn_id, e.pending) for e in document.events] == [
        (1, False),
        (3, True),
        (2, True),
        (2, False),
    ]


def test_a_saved_id_no_encoder_takes_is_refused_at_its_path() -> None:
    # JSON's "\ud800" escape reads as a lone surrogate: no conversation could run with it.
    with pytest.raises(ConversationFormatError) as caught:
        loads_conversation(_conversation_doc(id="\ud800x"))

    assert caught.value.path == "$.id"
    assert "lone surrogate" in caught.value.reason
    with pytest.raises(InvalidRequestError, match="lone surrogate"):
        ConversationDocument(id="\ud800x")
