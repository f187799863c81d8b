"""Conversation.model_input: what the model sees next turn, and the token helpers that count it."""

from __future__ import annotations

import pytest

from threadline import (
    Agent,
    Client,
    Conversation,
    Message,
    Model,
    Origin,
    Role,
    ToolCall,
    tool,
)
from threadline.counting import ApproximateCounter
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


def agent_with(driver: ScriptedDriver, **options: object) -> Agent:
    options.setdefault("token_counter", ApproximateCounter())
    return Agent(
        Client(driver),
        model=MODEL,
        instructions="Be terse.",
        tools=[lookup],
        **options,  # type: ignore[arg-type]
    )


async def test_model_input_puts_the_instructions_first_then_the_window() -> None:
    driver = ScriptedDriver([f"answer {i}" for i in range(4)])
    conv = Conversation(agent_with(driver), history_limit=2)
    assert conv.model_input == (Message.system("Be terse."),)
    assert conv.messages == ()

    for i in range(3):
        await conv.run(f"question {i}")

    assert [m.text for m in conv.messages] == ["question 2", "answer 2"]
    assert [m.text for m in conv.model_input] == ["Be terse.", "question 2", "answer 2"]
    assert [m.role for m in conv.model_input] == [Role.SYSTEM, Role.USER, Role.ASSISTANT]
    assert all(m.origin is Origin.SEED for m in conv.model_input)


async def test_model_input_is_exactly_what_the_next_turn_sends_before_its_prompt() -> None:
    call = ToolCall(id="c1", name="lookup", arguments='{"city": "Porto"}')
    driver = ScriptedDriver([Message.assistant(tool_calls=[call]), "Sunny.", "Take a hat.", "Bye."])
    conv = Conversation(agent_with(driver), history_limit=3)
    await conv.run("Weather in Porto?")
    await conv.run("What should I wear?")

    expected = conv.model_input
    await conv.run("Thanks!")
    sent = driver.calls[-1].messages
    assert sent[:-1] == expected
    assert sent[-1].text == "Thanks!"


async def test_without_instructions_model_input_is_the_window() -> None:
    driver = ScriptedDriver(["a"])
    conv = Conversation(Agent(Client(driver), model=MODEL))
    await conv.run("q")
    assert conv.model_input == tuple(m.with_origin(Origin.SEED) for m in conv.messages)
    assert [m.text for m in conv.model_input] == ["q", "a"]


async def test_token_estimate_counts_model_input_and_the_tools() -> None:
    driver = ScriptedDriver(["answer " * 30, "ok"])
    counter = ApproximateCounter()
    agent = agent_with(driver, token_counter=counter)
    conv = Conversation(agent, history_limit=2)
    assert conv.token_estimate() == counter.count([Message.system("Be terse.")], agent.tools)

    await conv.run("question " * 30)
    assert conv.token_estimate() == counter.count(conv.model_input, agent.tools)
    assert conv.token_estimate() > counter.count(conv.messages, agent.tools)


async def test_available_context_tokens_is_the_turns_budget_less_model_input() -> None:
    driver = ScriptedDriver(["answer " * 30, "ok"])
    counter = ApproximateCounter()
    agent = agent_with(driver, token_counter=counter, max_context_tokens=3000)
    conv = Conversation(agent, output_reserve_tokens=500)
    await conv.run("question " * 30)

    before = conv.model_input
    available = conv.available_context_tokens()
    assert available == 2500 - conv.token_estimate()
    assert conv.token_estimate() == counter.count(before, agent.tools)

    prompt = Message.user("next " * 10, origin=Origin.TURN)
    result = await conv.run(prompt)
    assert result.budget is not None
    assert result.budget.prompt_tokens == 2500
    assert driver.calls[-1].messages == (*before, prompt)
    assert result.rounds[0].estimated_input_tokens == counter.count([*before, prompt], agent.tools)
