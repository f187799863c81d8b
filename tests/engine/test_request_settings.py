"""RequestSettings: one checked value behind Agent, Conversation and the Request builder."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from threadline import (
    NOT_GIVEN,
    Agent,
    Client,
    Conversation,
    InvalidRequestError,
    Model,
    RequestSettings,
)
from threadline.counting import ApproximateCounter
from threadline.drivers import ProviderCall
from threadline.limiting import TokenLimitEvent, drop_oldest_units
from threadline.stores import ConversationStore
from threadline.stores.memory import MemoryStore
from threadline.stores.sqlite import SQLiteStore
from threadline.testing import ScriptedDriver

MODEL = Model("scripted-model", context_size=8192)

pytestmark = pytest.mark.both_backends


def every_option() -> RequestSettings:
    async def pre(event: TokenLimitEvent) -> None:
        return None

    return RequestSettings(
        max_context_tokens=6000,
        output_reserve_tokens=0,
        max_output_tokens=300,
        temperature=0.25,
        top_p=0.9,
        seed=7,
        stop=["END", "STOP"],
        presence_penalty=0.5,
        frequency_penalty=-0.5,
        tool_choice="none",
        max_rounds=3,
        token_counter=ApproximateCounter(),
        pre_max_tokens_reached=pre,
        post_max_tokens_reached=drop_oldest_units(None),
        extra_body={"user": "ada"},
    )


def as_changes(settings: RequestSettings) -> dict[str, Any]:
    return {f.name: getattr(settings, f.name) for f in attrs.fields(RequestSettings)}


def without_messages(call: ProviderCall) -> ProviderCall:
    # A conversation's calls also carry its prompt-cache key; the settings are the same.
    return attrs.evolve(call, messages=(), cache_key=None)


# -- the value --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("option", "value", "message"),
    [
        ("max_context_tokens", 0, "max_context_tokens must be a positive int, not 0"),
        ("max_context_tokens", True, "max_context_tokens must be a positive int, not True"),
        ("output_reserve_tokens", -1, "output_reserve_tokens must be an int of 0 or more, not -1"),
        ("output_reserve_tokens", None, "output_reserve_tokens must be an int of 0 or more"),
        ("max_output_tokens", 2.5, "max_output_tokens must be a positive int, not 2.5"),
        ("temperature", "hot", "temperature must be a finite number or None, not 'hot'"),
        ("top_p", float("inf"), "top_p must be a finite number or None, not inf"),
        ("seed", 1.5, "seed must be an int or None, not 1.5"),
        ("stop", [""], "stop must be a string, a list of non-empty strings or None"),
        ("presence_penalty", float("nan"), "presence_penalty must be a finite number"),
        ("frequency_penalty", False, "frequency_penalty must be a finite number"),
        ("tool_choice", 5, "tool_choice must be 'auto', 'none', 'required', a tool's name"),
        ("max_rounds", 0, "max_rounds must be an int of 1 or more, not 0"),
        ("token_counter", "o200k_base", "token_counter must be a TokenCounter"),
        ("pre_max_tokens_reached", 5, "pre_max_tokens_reached must be a callable or None, not 5"),
        ("post_max_tokens_reached", "x", "post_max_tokens_reached must be a callable or None"),
        ("extra_body", 5, "extra_body must be a mapping, not 5"),
        ("repair_interrupted_tool_calls", 1, "repair_interrupted_tool_calls must be a bool, not 1"),
    ],
)
def test_a_wrong_value_is_refused_naming_the_argument_and_the_value(
    option: str, value: object, message: str
) -> None:
    with pytest.raises(InvalidRequestError) as made:
        RequestSettings(**{option: value})
    assert str(made.value).startswith(message)
    with pytest.raises(InvalidRequestError) as evolved:
        RequestSettings().evolve(**{option: value})  # type: ignore[misc]
    assert str(evolved.value) == str(made.value)


def test_every_place_that_takes_an_option_says_the_same_thing() -> None:
    client = Client(ScriptedDriver(), default_model=MODEL)
    agent = Agent(client)
    expected = "max_rounds must be an int of 1 or more, not 0"
    attempts = [
        lambda: RequestSettings(max_rounds=0),
        lambda: Agent(client, max_rounds=0),
        lambda: Conversation(agent, max_rounds=0),
        lambda: Conversation(agent).settings.evolve(max_rounds=0),
    ]
    for attempt in attempts:
        with pytest.raises(InvalidRequestError) as refused:
            attempt()
        assert str(refused.value) == expected


@pytest.mark.anyio
async def test_the_builder_names_the_same_problem_at_run() -> None:
    request = Client(ScriptedDriver(), default_model=MODEL).request().with_prompt("hi")
    with pytest.raises(InvalidRequestError) as refused:
        await request.with_max_rounds(0).run()
    assert "with_max_rounds: max_rounds must be an int of 1 or more, not 0" in str(refused.value)


@pytest.mark.anyio
async def test_a_later_valid_builder_value_clears_an_earlier_mistake() -> None:
    driver = ScriptedDriver(["ok"])
    request = Client(driver, default_model=MODEL).request().with_prompt("hi")
    request.with_max_rounds(0).with_temperature("hot")  # type: ignore[arg-type]
    result = await request.with_max_rounds(2).with_temperature(0.5).run()
    assert result.text == "ok"
    assert driver.calls[0].sampling.temperature == 0.5


def test_evolve_makes_a_new_value_and_leaves_the_old_one() -> None:
    base = RequestSettings(temperature=0.5)
    colder = base.evolve(temperature=0.0, max_rounds=2)
    assert (base.temperature, base.max_rounds) == (0.5, 10)
    assert (colder.temperature, colder.max_rounds) == (0.0, 2)
    assert colder == RequestSettings(temperature=0.0, max_rounds=2)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        colder.temperature = 1.0  # type: ignore[misc]


def test_evolve_refuses_an_unknown_option_by_name() -> None:
    with pytest.raises(InvalidRequestError, match="'tempreature'"):
        RequestSettings().evolve(tempreature=0.1)  # type: ignore[call-arg]


def test_defaults_stop_and_extra_body_are_values_not_shared_state() -> None:
    settings = RequestSettings()
    assert settings.output_reserve_tokens is NOT_GIVEN
    assert settings.max_rounds == 10
    assert RequestSettings(stop="END").stop == ("END",)
    body = {"user": "ada"}
    frozen = RequestSettings(extra_body=body)
    body["user"] = "eve"
    assert frozen.extra_body == {"user": "ada"}
    with pytest.raises(TypeError):
        frozen.extra_body["user"] = "eve"  # type: ignore[index]


def test_the_repr_shows_what_differs_from_the_defaults() -> None:
    assert repr(RequestSettings()) == "RequestSettings()"
    assert repr(RequestSettings(max_rounds=3, temperature=0.2)) == (
        "RequestSettings(temperature=0.2, max_rounds=3)"
    )


def test_the_keyword_arguments_type_every_option() -> None:
    # The TypedDict behind the keyword arguments is private; it must list every field.
    from threadline._settings import SettingsChanges

    assert set(SettingsChanges.__annotations__) == set(attrs.fields_dict(RequestSettings))


# -- one value, three ways in -----------------------------------------------------------


@pytest.mark.anyio
async def test_settings_keywords_and_builder_methods_make_the_same_value_and_call() -> None:
    settings = every_option()
    driver = ScriptedDriver(["a", "b", "c", "d"])
    client = Client(driver, default_model=MODEL)

    by_value = Agent(client, settings=settings)
    by_keywords = Agent(client, **as_changes(settings))
    request = (
        client.request()
        .with_max_context_tokens(6000)
        .with_output_reserve_tokens(0)
        .with_max_output_tokens(300)
        .with_temperature(0.25)
        .with_top_p(0.9)
        .with_seed(7)
        .with_stop(["END", "STOP"])
        .with_presence_penalty(0.5)
        .with_frequency_penalty(-0.5)
        .with_tool_choice("none")
        .with_max_rounds(3)
        .with_token_counter(settings.token_counter)
        .pre_max_tokens_reached(settings.pre_max_tokens_reached)
        .post_max_tokens_reached(settings.post_max_tokens_reached)
        .with_extra_body({"user": "ada"})
    )
    assert by_value.settings == by_keywords.settings == request.settings == settings
    assert Conversation(by_value).settings == settings
    assert Conversation(Agent(client), settings=settings).settings == settings
    assert Conversation(Agent(client), **as_changes(settings)).settings == settings

    await by_value.run("q")
    await by_keywords.run("q")
    await request.with_prompt("q").run()
    await Conversation(Agent(client), settings=settings).run("q")
    first, *others = [without_messages(call) for call in driver.calls]
    assert all(call == first for call in others)
    assert first.max_output_tokens == 300
    assert first.sampling.stop == ("END", "STOP")
    assert first.extra_body == {"user": "ada"}


def test_keywords_change_the_settings_value_they_come_with() -> None:
    client = Client(ScriptedDriver(), default_model=MODEL)
    base = RequestSettings(temperature=0.5, max_output_tokens=100)
    agent = Agent(client, settings=base, temperature=0.0)
    assert agent.settings == base.evolve(temperature=0.0)

    conv = Conversation(agent, max_context_tokens=4000)
    assert conv.settings == agent.settings.evolve(max_context_tokens=4000)
    replaced = Conversation(agent, settings=RequestSettings(seed=1))
    assert replaced.settings == RequestSettings(seed=1)

    conv.settings = conv.settings.evolve(top_p=0.5)
    conv.output_reserve_tokens = 0
    assert (conv.settings.top_p, conv.output_reserve_tokens, conv.max_context_tokens) == (
        0.5,
        0,
        4000,
    )
    with pytest.raises(InvalidRequestError, match="settings must be a RequestSettings"):
        Agent(client, settings={"temperature": 0.1})  # type: ignore[arg-type]


# -- handlers set on the agent reach every conversation ------------------------------


@pytest.fixture(params=["memory", "sqlite"])
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, anyio_backend: str
) -> AsyncIterator[ConversationStore]:
    opened: ConversationStore = (
        MemoryStore() if request.param == "memory" else SQLiteStore(tmp_path / "threads.db")
    )
    try:
        yield opened
    finally:
        await opened.aclose()


class Watched:
    """A Pre handler that drops like the built-in and remembers each round it ran in."""

    def __init__(self) -> None:
        self.rounds: list[int] = []
        self._drop = drop_oldest_units(None)

    async def __call__(self, event: TokenLimitEvent) -> None:
        self.rounds.append(event.round)
        await self._drop(event)  # type: ignore[misc]


@pytest.mark.anyio
async def test_handlers_set_on_the_agent_reach_a_conversation_loaded_from_a_store(
    store: ConversationStore,
) -> None:
    pre = Watched()
    driver = ScriptedDriver([f"answer {i} " + "word " * 20 for i in range(6)])
    agent = Agent(
        Client(driver),
        model=MODEL,
        token_counter=ApproximateCounter(),
        max_context_tokens=120,
        output_reserve_tokens=0,
        pre_max_tokens_reached=pre,
    )
    first = Conversation(agent, id="t", store=store)
    for i in range(3):
        await first.run(f"question {i} " + "word " * 20)
    ran_before_saving = len(pre.rounds)
    assert ran_before_saving > 0

    loaded = await Conversation.load(agent, store, "t")
    assert loaded.settings == agent.settings
    result = await loaded.run("question 3 " + "word " * 20)
    assert len(pre.rounds) == ran_before_saving + 1
    assert [h.handler for h in result.limiting[0].handlers] == ["Watched"]

    restored = Conversation.from_json(agent, loaded.to_json())
    result = await restored.run("question 4 " + "word " * 20)
    assert len(pre.rounds) == ran_before_saving + 2
    assert result.limiting[0].dropped


@pytest.mark.anyio
async def test_a_loaded_conversation_keeps_its_saved_budget_over_the_agents(
    store: ConversationStore,
) -> None:
    client = Client(ScriptedDriver(["a", "b", "c"]), default_model=MODEL)
    await Conversation(Agent(client), id="own", store=store, max_context_tokens=5000).run("q")
    await Conversation(Agent(client), id="unset", store=store).run("q")

    agent = Agent(client, max_context_tokens=7000, temperature=0.3)
    own = await Conversation.load(agent, store, "own")
    unset = await Conversation.load(agent, store, "unset")
    assert (own.max_context_tokens, own.settings.temperature) == (5000, 0.3)
    assert unset.max_context_tokens == 7000  # nothing saved: the agent's holds
    again = await Conversation.load(agent, store, "own", max_context_tokens=6000)
    assert again.max_context_tokens == 6000
    result = await again.run("q")
    assert result.budget is not None
    assert result.budget.limit == 6000
