"""Histories with interrupted tool calls: refused by default, repaired on request (issue 28 §5)."""

from __future__ import annotations

import pytest

from threadline import (
    Agent,
    Client,
    Conversation,
    InvalidRequestError,
    Message,
    Model,
    Request,
    RequestSettings,
    Role,
    ToolCall,
)
from threadline.limiting import ToolCallRepair
from threadline.testing import ScriptedDriver

pytestmark = pytest.mark.anyio

MODEL = Model("fake", context_size=8192)
INTERRUPTED = "error: the tool call was interrupted before it returned a result"


def calling(*ids: str) -> Message:
    return Message.assistant(
        "Let me look.", tool_calls=[ToolCall(id=i, name="weather", arguments="{}") for i in ids]
    )


# A process died mid-tool: the last call has no result.
DIED = [Message.user("weather in Paris?"), calling("c1")]
# A history from elsewhere: a result for a call it never made.
ORPHAN = [Message.user("hi"), Message.tool("c9", "sunny"), Message.assistant("Hello.")]


def request(
    driver: ScriptedDriver, history: list[Message], *, repair: bool | None = None
) -> Request:
    built = Client(driver, default_model=MODEL).request().with_system("Be brief.")
    built = built.with_messages(history).with_prompt("and now?")
    return built if repair is None else built.with_repair_interrupted_tool_calls(repair)


@pytest.mark.parametrize(
    ("history", "complaint"),
    [
        (DIED, r"message 2: tool call 'c1' \(weather\) has no result"),
        (ORPHAN, r"message 2: tool result for call 'c9' answers no call"),
    ],
)
async def test_such_a_history_is_refused_by_default_naming_the_message_and_the_repair(
    history: list[Message], complaint: str
) -> None:
    driver = ScriptedDriver(["never"])
    for repair in (None, False):
        with pytest.raises(InvalidRequestError, match=complaint) as info:
            await request(driver, history, repair=repair).run()
        assert "with_repair_interrupted_tool_calls(True)" in str(info.value)
    assert driver.calls == []


async def test_an_interrupted_call_gets_a_result_saying_so() -> None:
    driver = ScriptedDriver(["It was interrupted; shall I try again?"])
    result = await request(driver, DIED, repair=True).run()
    sent = driver.calls[0].messages
    assert [m.role for m in sent] == [Role.SYSTEM, Role.USER, Role.ASSISTANT, Role.TOOL, Role.USER]
    assert (sent[3].tool_call_id, sent[3].text) == ("c1", INTERRUPTED)
    assert sent[1] is DIED[0]
    assert sent[2] == DIED[1]  # the repaired unit keeps its call as it was
    repaired = ToolCallRepair(kind="interrupted", index=2, call_id="c1", tool="weather")
    assert result.rounds[0].tool_calls_repaired == (repaired,)
    assert result.tool_calls_repaired == (repaired,)
    assert "message 2: tool call 'c1' (weather) was interrupted" in str(repaired)
    assert "1 interrupted tool call(s) repaired" in result.limiting_summary()
    assert result.new_messages() == [sent[4], result.response.message]


async def test_an_orphan_result_is_dropped_and_nothing_before_it_is_touched() -> None:
    driver = ScriptedDriver(["ok"])
    result = await request(driver, ORPHAN, repair=True).run()
    sent = driver.calls[0].messages
    assert [m.text for m in sent] == ["Be brief.", "hi", "Hello.", "and now?"]
    assert sent[1] is ORPHAN[0]
    assert sent[2] is ORPHAN[2]
    assert result.tool_calls_repaired == (
        ToolCallRepair(kind="orphan", index=2, call_id="c9", tool=None),
    )


async def test_a_partly_answered_exchange_keeps_its_results_and_gets_the_missing_one() -> None:
    answered = Message.tool("c1", "sunny")
    history = [Message.user("weather?"), calling("c1", "c2"), answered, Message.user("well?")]
    driver = ScriptedDriver(["ok"])
    result = await request(driver, history, repair=True).run()
    sent = driver.calls[0].messages
    assert sent[3] is answered
    assert (sent[4].tool_call_id, sent[4].text) == ("c2", INTERRUPTED)
    assert sent[5] is history[3]
    assert [r.call_id for r in result.tool_calls_repaired] == ["c2"]


async def test_a_result_separated_from_its_call_is_dropped_and_the_call_interrupted() -> None:
    history = [calling("c1"), Message.user("hurry"), Message.tool("c1", "late")]
    driver = ScriptedDriver(["ok"])
    result = await request(driver, history, repair=True).run()
    sent = driver.calls[0].messages
    assert [(m.role, m.text) for m in sent[1:4]] == [
        (Role.ASSISTANT, "Let me look."),
        (Role.TOOL, INTERRUPTED),
        (Role.USER, "hurry"),
    ]
    assert [(r.kind, r.index) for r in result.tool_calls_repaired] == [
        ("interrupted", 1),
        ("orphan", 3),
    ]


async def test_the_repair_is_deterministic_and_idempotent() -> None:
    driver = ScriptedDriver(["one", "two", "three"])
    first = await request(driver, DIED, repair=True).run()
    again = await request(driver, DIED, repair=True).run()
    assert driver.calls[0].messages == driver.calls[1].messages
    assert first.tool_calls_repaired == again.tool_calls_repaired
    repaired_history = list(driver.calls[0].messages[1:-1])
    third = await request(driver, repaired_history, repair=True).run()
    assert third.tool_calls_repaired == ()
    assert driver.calls[2].messages == driver.calls[0].messages


async def test_a_whole_history_is_sent_as_it_is_with_the_repair_on() -> None:
    history = [
        Message.user("q"),
        calling("c1"),
        Message.tool("c1", "sunny"),
        Message.assistant("a"),
    ]
    driver = ScriptedDriver(["ok"])
    result = await request(driver, history, repair=True).run()
    assert driver.calls[0].messages[1:-1] == tuple(history)
    assert all(a is b for a, b in zip(driver.calls[0].messages[1:-1], history, strict=True))
    assert result.tool_calls_repaired == ()


def test_the_setting_is_a_bool_in_the_one_settings_value() -> None:
    assert RequestSettings().repair_interrupted_tool_calls is False
    on = RequestSettings(repair_interrupted_tool_calls=True)
    assert on.evolve(repair_interrupted_tool_calls=False) == RequestSettings()
    assert "repair_interrupted_tool_calls=True" in repr(on)
    with pytest.raises(InvalidRequestError, match="repair_interrupted_tool_calls must be a bool"):
        RequestSettings(repair_interrupted_tool_calls="yes")  # type: ignore[arg-type]


async def test_an_agent_s_setting_reaches_its_requests_and_conversations() -> None:
    driver = ScriptedDriver(["ok", "fine"])
    agent = Agent(Client(driver), model=MODEL, repair_interrupted_tool_calls=True)
    result = await agent.request().with_messages(DIED).with_prompt("and now?").run()
    assert result.tool_calls_repaired[0].call_id == "c1"
    conv = Conversation(agent)
    assert conv.settings.repair_interrupted_tool_calls is True
    await conv.run("hello")
