"""Structured output in a conversation: raw text saved, the value rebuilt only when asked,
and a turn whose answer fails its type leaves nothing behind."""

from __future__ import annotations

import json

import attrs
import pytest

from threadline import Agent, Client, Conversation, FinalResult, InvalidRequestError, Model
from threadline.stores.memory import MemoryStore
from threadline.testing import ScriptedDriver
from threadline.tools import OutputValidationError

pytestmark = pytest.mark.anyio

MODEL = Model("fake", context_size=8192)


@attrs.frozen
class Weather:
    city: str
    celsius: int


PORTO = '{"city": "Porto", "celsius": 18}'


def agent_of(driver: ScriptedDriver, **options: object) -> Agent:
    return Agent(Client(driver, default_model=MODEL), **options)  # type: ignore[arg-type]


async def test_a_turn_saves_the_raw_text_and_load_rebuilds_the_value_only_when_asked() -> None:
    driver = ScriptedDriver([PORTO])
    conversation = Conversation(agent_of(driver, output_type=Weather))
    result = await conversation.run("weather?")
    assert result.output == Weather(city="Porto", celsius=18)
    document = json.loads(conversation.to_json())
    saved = [event["message"] for event in document["events"]]
    assert saved[-1]["content"] == PORTO
    assert "Weather" not in conversation.to_json()  # the type is not saved, only the text
    restored = Conversation.from_json(agent_of(ScriptedDriver([])), conversation.to_json())
    assert restored.turns[0].text == PORTO
    assert restored.turns[0].output(Weather) == Weather(city="Porto", celsius=18)


async def test_rebuilding_a_saved_answer_as_a_type_it_does_not_fit_raises() -> None:
    conversation = Conversation(agent_of(ScriptedDriver(["plain words"])))
    await conversation.run("hi")
    with pytest.raises(OutputValidationError) as caught:
        conversation.turns[0].output(Weather)
    assert caught.value.text == "plain words"
    with pytest.raises(InvalidRequestError, match="output_type"):
        conversation.turns[0].output(complex)


async def test_an_output_type_per_turn_overrides_the_agents() -> None:
    driver = ScriptedDriver(["just text", PORTO, "more text"])
    conversation = Conversation(agent_of(driver))
    assert (await conversation.run("one")).output == "just text"
    assert (await conversation.run("two", output_type=Weather)).output.celsius == 18
    assert (await conversation.run("three")).output == "more text"
    assert [call.output is not None for call in driver.calls] == [False, True, False]

    typed = Conversation(agent_of(ScriptedDriver(["free"]), output_type=Weather))
    assert (await typed.run("text please", output_type=None)).output == "free"


async def test_a_turn_whose_answer_fails_adds_nothing_in_memory_or_in_the_store() -> None:
    store = MemoryStore()
    driver = ScriptedDriver([PORTO, "not json", "still not json"])
    conversation = Conversation(agent_of(driver, output_type=Weather), id="c1", store=store)
    await conversation.run("first")
    before = (conversation.to_json(), (await store.load("c1")).document)
    with pytest.raises(OutputValidationError):
        await conversation.run("second")
    assert conversation.turn_count() == 1
    assert conversation.to_json() == before[0]
    assert (await store.load("c1")).document == before[1]


async def test_a_repaired_turn_keeps_the_exchange_it_took() -> None:
    driver = ScriptedDriver(['{"city": "Porto"}', PORTO])
    conversation = Conversation(agent_of(driver, output_type=Weather))
    result = await conversation.run("weather?")
    assert result.output_repairs == 1
    texts = [message.text for message in conversation.turns[0].messages]
    assert texts[0] == "weather?"
    assert texts[1] == '{"city": "Porto"}'
    assert texts[2].startswith("Your answer does not match")
    assert texts[3] == PORTO
    assert conversation.turns[0].output(Weather).city == "Porto"


async def test_a_streamed_turn_hands_the_value_out_in_final_result() -> None:
    conversation = Conversation(agent_of(ScriptedDriver([PORTO]), output_type=Weather))
    async with conversation.stream("weather?") as events:
        finals = [event async for event in events if isinstance(event, FinalResult)]
    assert finals[0].output == Weather(city="Porto", celsius=18)
    assert conversation.turn_count() == 1


async def test_the_token_estimate_prices_the_agents_output_schema() -> None:
    plain = Conversation(agent_of(ScriptedDriver([])))
    typed = Conversation(agent_of(ScriptedDriver([]), output_type=Weather))
    assert typed.token_estimate() > plain.token_estimate()
