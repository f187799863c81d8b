"""summarize_oldest: one summary for the oldest turns, the rest kept verbatim."""

from __future__ import annotations

import logging

import pytest

from threadline import (
    Agent,
    Client,
    Conversation,
    InvalidRequestError,
    Message,
    Model,
    Role,
    ToolCall,
)
from threadline.counting import ApproximateCounter
from threadline.limiting import (
    SUMMARY_ACKNOWLEDGEMENT,
    SUMMARY_HEADING,
    TokenLimitEvent,
    drop_oldest_units,
    summarize_oldest,
)
from threadline.testing import ScriptedDriver

pytestmark = pytest.mark.anyio

MODEL = Model("main-model", context_size=100_000)
CHEAP = Model("cheap-model", context_size=100_000)
COUNTER = ApproximateCounter()


def summarizer(*replies: str) -> tuple[Client, ScriptedDriver]:
    driver = ScriptedDriver(replies)
    return Client(driver, default_model=CHEAP), driver


def history() -> list[Message]:
    """System, three turns (the second with a tool exchange), and the current prompt."""
    call = ToolCall(id="c1", name="lookup", arguments='{"city": "Oslo"}')
    return [
        Message.system("Be terse."),
        Message.user("I am Ada."),
        Message.assistant("Hi Ada."),
        Message.user("Weather in Oslo?"),
        Message.assistant(tool_calls=[call]),
        Message.tool("c1", "rain", name="lookup"),
        Message.assistant("It rains."),
        Message.user("Thanks."),
        Message.assistant("You're welcome."),
        Message.user("What is my name?"),
    ]


def event_for(messages: list[Message], budget: int = 10) -> TokenLimitEvent:
    return TokenLimitEvent(messages, budget_tokens=budget, counter=COUNTER)


def summary(text: str) -> Message:
    return Message.user(f"{SUMMARY_HEADING}\n{text}")


ACK = Message.assistant(SUMMARY_ACKNOWLEDGEMENT)


async def test_the_oldest_turns_become_one_summary_and_the_last_turns_stay() -> None:
    client, driver = summarizer("Ada asked about Oslo; it rains.")
    handler = summarize_oldest(client, keep_last_turns=1)
    messages = history()
    event = event_for(messages)

    await handler(event)

    assert event.messages == [
        messages[0],
        summary("Ada asked about Oslo; it rains."),
        ACK,
        *messages[7:],
    ]
    (call,) = driver.calls
    assert call.model == CHEAP
    assert call.messages[0].role is Role.SYSTEM
    prompt = call.messages[1].text
    assert prompt.splitlines() == [
        "user: I am Ada.",
        "assistant: Hi Ada.",
        "user: Weather in Oslo?",
        'assistant called tool lookup with {"city": "Oslo"}',
        "tool result (lookup): rain",
        "assistant: It rains.",
    ]


async def test_keep_last_turns_zero_summarizes_everything_before_the_prompt() -> None:
    client, _ = summarizer("All of it.")
    event = event_for(history())

    await summarize_oldest(client, keep_last_turns=0)(event)

    assert [m.text for m in event.messages] == [
        "Be terse.",
        f"{SUMMARY_HEADING}\nAll of it.",
        SUMMARY_ACKNOWLEDGEMENT,
        "What is my name?",
    ]


async def test_the_prompt_and_the_live_tool_exchange_are_never_summarized() -> None:
    client, driver = summarizer("Earlier: greetings.")
    call = ToolCall(id="live", name="lookup", arguments="{}")
    # Turns longer than their summary: a summary no shorter than what it covers is not used.
    messages = [
        Message.user("Hello, I would like to tell you about my long day at the office."),
        Message.assistant("Hi. I am listening; tell me about the long day at the office."),
        Message.user("Look it up."),
        Message.assistant(tool_calls=[call]),
        Message.tool("live", "found"),
    ]
    event = TokenLimitEvent(messages, budget_tokens=1, counter=COUNTER, prompt_index=2)

    await summarize_oldest(client, keep_last_turns=0)(event)

    assert event.messages == [summary("Earlier: greetings."), ACK, *messages[2:]]
    assert "Look it up." not in driver.calls[0].messages[1].text


async def test_nothing_droppable_before_the_kept_turns_means_no_call() -> None:
    client, driver = summarizer()
    messages = history()
    event = event_for(messages)

    await summarize_oldest(client, keep_last_turns=3)(event)
    short = event_for([Message.system("s"), Message.user("only the prompt")])
    await summarize_oldest(client)(short)

    assert event.messages == messages
    assert [m.text for m in short.messages] == ["s", "only the prompt"]
    assert driver.calls == []


async def test_a_summary_is_reused_while_it_fits_and_extended_when_it_does_not() -> None:
    client, driver = summarizer("S1", "S2")
    handler = summarize_oldest(client, keep_last_turns=1)
    first = history()
    await handler(event_for(first))

    # Next turn: the window grew by one turn. A roomy budget: the old summary still does.
    grown = [
        *first[:-1],
        Message.user("What is my name?"),
        Message.assistant("Ada."),
        Message.user("Bye."),
    ]
    roomy = event_for(grown, budget=10_000)
    await handler(roomy)
    assert len(driver.calls) == 1
    assert roomy.messages == [grown[0], summary("S1"), ACK, *grown[7:]]

    # A tight budget: the summary is extended with the turn after it, not redone.
    tight = event_for(grown, budget=10)
    await handler(tight)
    assert len(driver.calls) == 2
    assert driver.calls[1].messages[1].text.splitlines() == [
        f"user: {SUMMARY_HEADING}",
        "S1",
        "user: Thanks.",
        "assistant: You're welcome.",
    ]
    assert tight.messages == [grown[0], summary("S2"), ACK, *grown[9:]]


async def test_a_summary_at_the_front_is_recognised_in_a_later_round() -> None:
    client, driver = summarizer("S1", "S2")
    handler = summarize_oldest(client, keep_last_turns=1)
    messages = history()
    event = event_for(messages)
    await handler(event)

    again = event_for(
        [*event.messages[:-1], Message.user("x"), Message.assistant("y"), messages[-1]]
    )
    await handler(again)

    assert (
        driver.calls[1].messages[1].text.startswith(f"user: {SUMMARY_HEADING}\nS1\nuser: Thanks.")
    )
    assert again.messages[1] == summary("S2")


async def test_a_blank_summary_leaves_the_transcript(caplog: pytest.LogCaptureFixture) -> None:
    client, _ = summarizer("   ")
    messages = history()
    event = event_for(messages)

    with caplog.at_level(logging.WARNING, logger="threadline.limiting"):
        await summarize_oldest(client)(event)

    assert event.messages == messages
    assert "returned nothing" in caplog.text


async def test_an_agent_can_write_the_summaries_with_its_own_model() -> None:
    driver = ScriptedDriver(["From the agent."])
    agent = Agent(Client(driver), model=CHEAP, instructions="ignored for summaries")
    event = event_for(history())

    await summarize_oldest(agent, keep_last_turns=0, instructions="Summarize.")(event)

    assert driver.calls[0].model == CHEAP
    assert driver.calls[0].messages[0].text == "Summarize."
    assert event.messages[1] == summary("From the agent.")


async def test_an_agent_writes_the_summaries_with_its_sampling() -> None:
    driver = ScriptedDriver(["From the agent."])
    agent = Agent(Client(driver), model=CHEAP, temperature=0, top_p=0.5, seed=7)

    await summarize_oldest(agent, keep_last_turns=0)(event_for(history()))

    sampling = driver.calls[0].sampling
    assert (sampling.temperature, sampling.top_p, sampling.seed) == (0, 0.5, 7)


async def test_a_client_writes_the_summaries_with_the_provider_sampling() -> None:
    driver = ScriptedDriver(["From the client."])

    await summarize_oldest(Client(driver, default_model=CHEAP))(event_for(history()))

    sampling = driver.calls[0].sampling
    assert (sampling.temperature, sampling.top_p, sampling.seed) == (None, None, None)


def test_summarize_oldest_refuses_what_it_cannot_use() -> None:
    with pytest.raises(InvalidRequestError, match="no model"):
        summarize_oldest(Client(ScriptedDriver()))
    with pytest.raises(InvalidRequestError, match="Client or an Agent"):
        summarize_oldest(CHEAP)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="keep_last_turns"):
        summarize_oldest(Client(ScriptedDriver(), default_model=CHEAP), keep_last_turns=-1)
    handler = summarize_oldest(Client(ScriptedDriver()), model="named-model")
    assert handler.__name__ == "summarize_oldest"  # type: ignore[attr-defined]


async def test_in_a_conversation_with_drop_oldest_units_as_post() -> None:
    cheap_client, cheap_driver = summarizer(*(f"Summary {i}: Ada asked things." for i in range(6)))
    main_driver = ScriptedDriver([f"answer {i} " + "filler " * 20 for i in range(6)])
    agent = Agent(Client(main_driver), model=MODEL, token_counter=COUNTER)
    conv = Conversation(
        agent,
        max_context_tokens=200,
        output_reserve_tokens=0,
        pre_max_tokens_reached=summarize_oldest(cheap_client, keep_last_turns=1),
        post_max_tokens_reached=drop_oldest_units(None),
    )

    results = [await conv.run(f"question {i} " + "word " * 20) for i in range(6)]

    summarized = [r for r in results if r.limiting and r.limiting[0].handlers]
    assert summarized
    last_sent = main_driver.calls[-1].messages
    assert last_sent[0].text.startswith(SUMMARY_HEADING)
    assert last_sent[-1].text.startswith("question 5")
    assert any(h.handler == "summarize_oldest" for r in summarized for h in r.limiting[0].handlers)
    # The conversation's own transcript is untouched; only what is sent is compacted.
    assert len(conv.events) == 12
    # Later turns reuse or extend the summary: at most one summarizer call per turn.
    assert 1 <= len(cheap_driver.calls) <= len(summarized)
