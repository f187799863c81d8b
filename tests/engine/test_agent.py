"""Agent.run and Agent.stream: one-shot requests with the agent's setup and no memory."""

from __future__ import annotations

import pytest

from threadline import (
    Agent,
    Client,
    Conversation,
    FinalResult,
    InvalidRequestError,
    Message,
    Model,
    Origin,
    Role,
    RoundDone,
    StreamEvent,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    ToolResultEvent,
    tool,
)
from threadline.counting import ApproximateCounter
from threadline.limiting import TokenLimitEvent
from threadline.testing import ScriptedDriver

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

MODEL = Model("scripted-model", context_size=8192)


@tool
def lookup(city: str) -> str:
    """The weather in a city.

    Args:
        city: The city's name.
    """
    return f"sunny in {city}"


def calling(call_id: str) -> Message:
    return Message.assistant(
        tool_calls=[ToolCall(id=call_id, name="lookup", arguments='{"city": "Porto"}')]
    )


async def test_run_sends_the_instructions_and_the_prompt_and_remembers_nothing() -> None:
    driver = ScriptedDriver(["Hello Ada.", "I do not know."])
    agent = Agent(Client(driver), model=MODEL, instructions="Be terse.", temperature=0.1)

    first = await agent.run("My name is Ada.")
    second = await agent.run(Message.user("What is my name?"))

    assert first.text == "Hello Ada."
    assert second.text == "I do not know."
    assert [[m.text for m in call.messages] for call in driver.calls] == [
        ["Be terse.", "My name is Ada."],
        ["Be terse.", "What is my name?"],
    ]
    assert [m.origin for m in second.new_messages()] == [Origin.TURN, Origin.TURN]
    assert all(call.sampling.temperature == 0.1 for call in driver.calls)


async def test_run_returns_what_a_conversations_first_turn_returns() -> None:
    driver = ScriptedDriver([calling("c1"), "Sunny.", calling("c2"), "Sunny."])
    agent = Agent(Client(driver), model=MODEL, instructions="Be terse.", tools=[lookup])

    one_shot = await agent.run("Weather in Porto?")
    turn = await Conversation(agent).run("Weather in Porto?")

    assert one_shot.text == turn.text == "Sunny."
    assert [m.role for m in one_shot.new_messages()] == [
        Role.USER,
        Role.ASSISTANT,
        Role.TOOL,
        Role.ASSISTANT,
    ]
    assert [m.text for m in one_shot.new_messages()] == [m.text for m in turn.new_messages()]
    assert [r.tool_calls for r in one_shot.rounds] == [r.tool_calls for r in turn.rounds]
    assert driver.calls[0].messages == driver.calls[2].messages


async def test_run_goes_through_the_agents_budget_handlers_and_counter() -> None:
    seen: list[int] = []
    counter = ApproximateCounter()

    def pre(event: TokenLimitEvent) -> None:
        seen.append(event.estimated_tokens)

    agent = Agent(
        Client(ScriptedDriver(["ok"])),
        model=MODEL,
        token_counter=counter,
        max_context_tokens=20,
        output_reserve_tokens=0,
        pre_max_tokens_reached=pre,
    )
    prompt = Message.user("word " * 40, origin=Origin.TURN)
    result = await agent.run(prompt)

    assert result.budget is not None
    assert (result.budget.limit, result.budget.reserve) == (20, 0)
    assert seen == [counter.count([prompt])]
    assert result.rounds[0].estimated_input_tokens == counter.count([prompt])


async def test_stream_yields_the_events_a_conversation_stream_yields() -> None:
    driver = ScriptedDriver([calling("c1"), "It is sunny in Porto.", calling("c2"), "Sunny."])
    agent = Agent(Client(driver), model=MODEL, tools=[lookup])

    async def kinds(events_of: object) -> list[type[StreamEvent]]:
        found: list[type[StreamEvent]] = []
        async with events_of as events:  # type: ignore[attr-defined]
            async for event in events:
                found.append(type(event))
                if isinstance(event, FinalResult):
                    assert event.result.text
        return found

    one_shot = await kinds(agent.stream("Weather?"))
    turn = await kinds(Conversation(agent).stream("Weather?"))
    assert one_shot[:3] == [ToolCallEvent, ToolResultEvent, RoundDone]
    assert TextDelta in one_shot
    assert one_shot[-1] is FinalResult
    assert {*one_shot} == {*turn}


async def test_leaving_a_stream_early_stops_the_run() -> None:
    driver = ScriptedDriver(["a long story " * 5, "next"])
    agent = Agent(Client(driver), model=MODEL)
    async with agent.stream("Tell me a story.") as events:
        async for event in events:
            assert isinstance(event, TextDelta)
            break
    assert (await agent.run("again")).text == "next"


async def test_a_prompt_that_is_no_user_message_is_refused_before_sending() -> None:
    driver = ScriptedDriver(["unused"])
    agent = Agent(Client(driver), model=MODEL)
    with pytest.raises(InvalidRequestError, match="prompt must be a str or a user Message"):
        await agent.run(Message.assistant("hi"))
    with pytest.raises(InvalidRequestError, match="no model"):
        await Agent(Client(driver)).run("hi")
    with pytest.raises(InvalidRequestError, match="prompt must be"):
        async with agent.stream(5):  # type: ignore[arg-type]
            pass
    assert driver.calls == []
