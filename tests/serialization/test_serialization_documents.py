"""The saved-conversation document classes: what they accept and what they refuse."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import attrs
import pytest

from threadline import (
    Agent,
    Client,
    Conversation,
    InvalidRequestError,
    Message,
    Model,
    Origin,
    Usage,
)
from threadline.serialization import ConversationDocument, ConversationEvent
from threadline.serialization._documents import json_value_problem
from threadline.testing import ScriptedDriver


def _event(turn_id: int = 0, **fields: Any) -> ConversationEvent:
    return ConversationEvent(
        message=Message.user("q", origin=Origin.TURN), turn_id=turn_id, **fields
    )


def test_a_new_document_starts_empty() -> None:
    document = ConversationDocument(id="c")

    assert document.events == ()
    assert document.history_limit == 0
    assert document.next_turn_id == 0
    assert document.total_usage == Usage()
    assert document.settings == {}
    assert document.metadata == {}
    assert document.created_at is None
    assert document.updated_at is None


def test_events_are_kept_as_a_tuple() -> None:
    events = [_event(0), _event(1)]

    document = ConversationDocument(id="c", events=events, next_turn_id=2)

    assert document.events == tuple(events)


def test_settings_are_copied_so_the_callers_later_edits_do_not_reach_the_document() -> None:
    settings: dict[str, Any] = {"stop": ["END"]}
    metadata = {"user": "ada"}

    document = ConversationDocument(id="c", settings=settings, metadata=metadata)
    settings["stop"].append("STOP")
    metadata["user"] = "bob"

    assert document.settings == {"stop": ["END"]}
    assert document.metadata == {"user": "ada"}


def test_documents_are_frozen_and_hashable() -> None:
    document = ConversationDocument(id="c", events=[_event()], next_turn_id=1, settings={"a": [1]})

    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        document.id = "d"  # type: ignore[misc]
    assert hash(document) == hash(attrs.evolve(document))
    assert hash(_event()) == hash(_event())


@pytest.mark.parametrize(
    ("fields", "fragment"),
    [
        ({"id": ""}, "non-empty string"),
        ({"id": None}, "non-empty string"),
        ({"history_limit": -1}, "history_limit must be an int >= 0"),
        ({"history_limit": True}, "history_limit must be an int >= 0"),
        ({"next_turn_id": "3"}, "next_turn_id must be an int >= 0"),
        ({"events": [_event(2)], "next_turn_id": 2}, "not below next_turn_id 2"),
        ({"events": [Message.user("q")], "next_turn_id": 1}, "event 0 is a Message"),
        ({"settings": {"limit": float("inf")}}, "settings.limit: inf is not a JSON number"),
        ({"settings": {"stop": ("a", "b")}}, "settings.stop: a tuple is not a JSON value"),
        ({"settings": {"m": {1: "x"}}}, "settings.m: the key 1 is not a string"),
        ({"settings": [("a", 1)]}, "settings must be a mapping"),
        ({"metadata": {"n": 1}}, "metadata maps strings to strings"),
        ({"metadata": "x"}, "metadata must be a mapping"),
        ({"created_at": datetime(2025, 1, 1)}, "created_at must be timezone-aware"),
        ({"updated_at": "2025-01-01T00:00:00+00:00"}, "updated_at must be a datetime"),
    ],
)
def test_a_document_refuses_fields_that_do_not_fit(fields: dict[str, Any], fragment: str) -> None:
    with pytest.raises(InvalidRequestError) as caught:
        ConversationDocument(**{"id": "c", **fields})

    assert fragment in str(caught.value)


@pytest.mark.parametrize(
    ("fields", "error"),
    [
        ({"turn_id": -1}, InvalidRequestError),
        ({"turn_id": 1.0}, InvalidRequestError),
        ({"pending": 1}, TypeError),
        ({"usage": {"input_tokens": 1}}, TypeError),
        ({"model": 4}, TypeError),
        ({"finish_reason": b"stop"}, TypeError),
    ],
)
def test_an_event_refuses_fields_that_do_not_fit(
    fields: dict[str, Any], error: type[Exception]
) -> None:
    with pytest.raises(error):
        ConversationEvent(**{"message": Message.user("q"), "turn_id": 0, **fields})


def test_an_event_holds_a_message_not_its_dict() -> None:
    with pytest.raises(TypeError):
        ConversationEvent(message={"role": "user"}, turn_id=0)  # type: ignore[arg-type]


def test_aware_times_of_any_offset_are_accepted() -> None:
    moment = datetime(2025, 1, 1, tzinfo=UTC)

    assert ConversationDocument(id="c", created_at=moment).created_at == moment


@pytest.mark.parametrize(
    ("value", "problem"),
    [
        ({"a": [1, 2.5, None, True, "x", {"b": {}}]}, None),
        ({"a": [1, float("nan")]}, (".a[1]", "nan is not a JSON number")),
        ({"odd key": {1: 2}}, ('["odd key"]', "the key 1 is not a string")),
        ([b"x"], ("[0]", "a bytes is not a JSON value")),
    ],
)
def test_json_value_problem_says_where_a_value_stops_being_json(
    value: object, problem: tuple[str, str] | None
) -> None:
    assert json_value_problem(value) == problem


def _answer(turn_id: int, **fields: Any) -> ConversationEvent:
    return ConversationEvent(
        message=Message.assistant("a", origin=Origin.TURN), turn_id=turn_id, **fields
    )


@pytest.mark.parametrize("role", ["assistant", "system", "tool"])
def test_only_a_user_message_can_be_pending(role: str) -> None:
    message = {
        "assistant": Message.assistant("a"),
        "system": Message.system("s"),
        "tool": Message.tool("call_1", "r"),
    }[role]
    with pytest.raises(InvalidRequestError, match=f"can be pending; this one's role is {role}"):
        ConversationEvent(message=message, turn_id=0, pending=True)


@pytest.mark.parametrize(
    ("events", "fragment"),
    [
        ([_event(1), _answer(1), _event(0)], "event 2: turn_id 0 goes back: event 1"),
        ([_event(0), _event(1), _answer(0)], "event 2: turn_id 0 goes back"),
        ([_event(2), _event(3), _answer(3), _event(2)], "event 3: turn_id 2 goes back"),
    ],
)
def test_a_document_refuses_turn_ids_that_go_back_or_repeat(
    events: list[ConversationEvent], fragment: str
) -> None:
    with pytest.raises(InvalidRequestError, match=fragment):
        ConversationDocument(id="c", next_turn_id=5, events=events)


def test_pending_events_keep_their_place_out_of_the_turn_order() -> None:
    events = [_event(0), _event(3, pending=True), _event(1), _answer(1), _event(2, pending=True)]
    document = ConversationDocument(id="c", next_turn_id=4, events=events)
    assert document.events == tuple(events)


@pytest.mark.anyio
async def test_replace_events_refuses_turn_ids_a_saved_document_could_not_hold() -> None:
    # Accepted, they would make a conversation that saves but never loads again.
    client = Client(ScriptedDriver([]), default_model=Model("m", context_size=8192))
    conversation = Conversation(Agent(client))
    with pytest.raises(InvalidRequestError, match="goes back"):
        await conversation.replace_events([_event(2), _answer(2), _event(1), _answer(1)])
    assert conversation.events == ()
