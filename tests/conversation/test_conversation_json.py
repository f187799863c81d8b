"""Saving and restoring a conversation as versioned JSON."""

from __future__ import annotations

import json
from typing import Any

import pytest

from threadline import (
    NOT_GIVEN,
    Agent,
    Client,
    Conversation,
    ConversationFormatError,
    InvalidRequestError,
    Message,
    Model,
    ToolCall,
    Usage,
    tool,
)
from threadline.drivers import OpenAIChatDriver
from threadline.serialization import (
    ConversationDocument,
    ConversationEvent,
    dumps_conversation,
    loads_conversation,
)
from threadline.testing import ScriptedDriver

pytestmark = pytest.mark.anyio

MODEL = Model("scripted-model", context_size=8192)
SECRET = "sk-test-0123456789abcdef"


@tool
def lookup(city: str) -> str:
    """The weather in a city.

    Args:
        city: The city's name.
    """
    return f"sunny in {city}"


def agent_with(replies: list[str | Message]) -> tuple[Agent, ScriptedDriver]:
    driver = ScriptedDriver(replies)
    return Agent(
        Client(driver), model=MODEL, instructions="Secret instructions.", tools=[lookup]
    ), driver


async def test_a_restored_conversation_continues_where_it_left_off() -> None:
    call = Message.assistant(
        tool_calls=[ToolCall(id="c1", name="lookup", arguments='{"city": "Oslo"}')]
    )
    agent, _ = agent_with(["Hi Ada.", call, "Sunny in Oslo."])
    conv = Conversation(
        agent,
        id="thread-1",
        history_limit=6,
        max_context_tokens=4000,
        output_reserve_tokens=0,
        metadata={"user": "ada"},
    )
    await conv.run("I am Ada.")
    await conv.run("Weather in Oslo?")

    text = conv.to_json()
    new_agent, new_driver = agent_with(["You are Ada."])
    restored = Conversation.from_json(new_agent, text)

    assert restored.id == "thread-1"
    assert restored.events == conv.events
    assert restored.messages == conv.messages
    assert (
        restored.history_limit,
        restored.max_context_tokens,
        restored.output_reserve_tokens,
    ) == (
        6,
        4000,
        0,
    )
    assert restored.metadata == {"user": "ada"}
    assert restored.total_usage == conv.total_usage
    assert restored.turns == conv.turns
    assert restored.last_response is not None
    assert restored.last_response.text == "Sunny in Oslo."

    await restored.run("Who am I?")
    sent = [m.text for m in new_driver.calls[0].messages]
    assert sent[0] == "Secret instructions."
    assert sent[1:] == [m.text for m in conv.messages] + ["Who am I?"]
    assert restored.turns[-1].id == 2


async def test_an_unset_reserve_stays_unset_and_unknown_settings_survive() -> None:
    agent, _ = agent_with([])
    document = ConversationDocument(
        id="c", settings={"max_context_tokens": None, "from_the_future": [1, 2]}
    )
    conv = Conversation.from_json(agent, dumps_conversation(document))
    assert conv.output_reserve_tokens is NOT_GIVEN
    assert conv.max_context_tokens is None
    again = loads_conversation(conv.to_json())
    assert again.settings == {"max_context_tokens": None, "from_the_future": [1, 2]}


async def test_the_document_holds_no_agent_key_or_tool_handler() -> None:
    driver = OpenAIChatDriver("http://127.0.0.1:9/v1", api_key=SECRET)
    agent = Agent(Client(driver), model=MODEL, instructions="Secret instructions.", tools=[lookup])
    conv = Conversation(agent)
    await conv.replace_events([ConversationEvent(message=Message.user("hi"), turn_id=0)])

    text = conv.to_json()

    assert SECRET not in text
    assert "Secret instructions." not in text
    assert "lookup" not in text
    assert "scripted-model" not in text
    assert set(json.loads(text)) == {
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
    }


@pytest.mark.parametrize(
    ("edit", "path"),
    [
        (lambda d: d.update(format_version=99), "$.format_version"),
        (lambda d: d.pop("id"), "$"),
        (lambda d: d["settings"].update(max_context_tokens="big"), "$.settings.max_context_tokens"),
        (
            lambda d: d["settings"].update(output_reserve_tokens=-1),
            "$.settings.output_reserve_tokens",
        ),
        (lambda d: d["events"][0]["message"].update(role="wizard"), "$.events[0].message.role"),
        (lambda d: d["events"].pop(2), "$.events[1]"),  # a call whose result is gone
    ],
)
async def test_a_bad_document_is_refused_with_its_path(edit: object, path: str) -> None:
    call = Message.assistant(
        tool_calls=[ToolCall(id="c1", name="lookup", arguments='{"city": "Oslo"}')]
    )
    agent, _ = agent_with([call, "Sunny."])
    conv = Conversation(agent)
    await conv.run("Weather?")
    data = json.loads(conv.to_json())
    edit(data)  # type: ignore[operator]

    with pytest.raises(ConversationFormatError) as raised:
        Conversation.from_json(agent, json.dumps(data))
    assert raised.value.path.startswith(path)


def test_text_that_is_not_a_conversation_is_refused() -> None:
    agent, _ = agent_with([])
    for text in ("", "[]", "{not json", '{"format_version": 1, "messages": []}'):
        with pytest.raises(ConversationFormatError):
            Conversation.from_json(agent, text)


async def test_a_pending_prompt_travels_and_is_never_sent_as_answered() -> None:
    agent, driver = agent_with(["Fine."])
    document = ConversationDocument(
        id="crashed",
        next_turn_id=2,
        total_usage=Usage(input_tokens=3),
        events=(
            ConversationEvent(message=Message.user("first"), turn_id=0),
            ConversationEvent(message=Message.assistant("answer"), turn_id=0),
            ConversationEvent(message=Message.user("lost in a crash"), turn_id=1, pending=True),
        ),
    )
    conv = Conversation.from_json(agent, dumps_conversation(document))

    assert [m.text for m in conv.pending_messages()] == ["lost in a crash"]
    assert [e.message.text for e in conv.events] == ["first", "answer"]
    assert conv.turn_count() == 1
    assert loads_conversation(conv.to_json()).events == document.events

    await conv.run("next")
    assert "lost in a crash" not in [m.text for m in driver.calls[0].messages]
    assert [m.text for m in conv.pending_messages()] == ["lost in a crash"]


def test_a_saved_transcript_that_opens_with_an_answer_is_refused() -> None:
    conversation_agent = Agent(Client(ScriptedDriver([])), model=Model("m", context_size=8192))
    saved = Conversation(conversation_agent, id="c")
    document = json.loads(saved.to_json())
    document["events"] = [
        {
            "message": {"role": "assistant", "content": "an answer to nothing", "origin": "turn"},
            "turn_id": 0,
        }
    ]
    document["next_turn_id"] = 1
    with pytest.raises(ConversationFormatError) as info:
        Conversation.from_json(conversation_agent, json.dumps(document))
    assert info.value.path == "$.events[0].message.role"


def test_from_json_and_from_document_take_history_limit_as_open_does() -> None:
    agent, _ = agent_with([])
    text = Conversation(agent, id="c", history_limit=6).to_json()

    assert Conversation.from_json(agent, text).history_limit == 6
    assert Conversation.from_json(agent, text, history_limit=2).history_limit == 2
    document = loads_conversation(text)
    assert Conversation.from_document(agent, document, history_limit=0).history_limit == 0
    with pytest.raises(InvalidRequestError, match="history_limit"):
        Conversation.from_json(agent, text, history_limit=-1)


@pytest.mark.parametrize(("option", "value"), [("id", "another"), ("metadata", {"owner": "bob"})])
def test_what_a_document_holds_is_not_a_keyword_argument_of_from_json(
    option: str, value: object
) -> None:
    agent, _ = agent_with([])
    text = Conversation(agent, id="c", metadata={"owner": "ada"}).to_json()
    given: dict[str, Any] = {option: value}
    # The id and labels are the saved conversation's: refused, naming the argument.
    with pytest.raises(InvalidRequestError, match=f"^{option}="):
        Conversation.from_json(agent, text, **given)
    with pytest.raises(InvalidRequestError, match=f"^{option}="):
        Conversation.from_document(agent, loads_conversation(text), **given)
