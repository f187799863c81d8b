"""Conversation: turns, usage, the one-caller lock, compaction, reset and the token helpers."""

from __future__ import annotations

import anyio
import pytest

from threadline import (
    NOT_GIVEN,
    Agent,
    Client,
    Conversation,
    InvalidRequestError,
    Message,
    Model,
    Origin,
    ProviderUnavailableError,
    Role,
    Tool,
    ToolCall,
    Usage,
    tool,
)
from threadline.counting import ApproximateCounter
from threadline.drivers import ProviderCall, ProviderResponse
from threadline.serialization import ConversationEvent
from threadline.testing import ScriptedDriver, ScriptedReply

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

MODEL = Model("scripted-model", context_size=8192)


@tool
def lookup(city: str) -> str:
    """The weather in a city.

    Args:
        city: The city's name.
    """
    return f"sunny in {city}"


def make_agent(replies: list[ScriptedReply], **options: object) -> tuple[Agent, ScriptedDriver]:
    driver = ScriptedDriver(replies)
    agent = Agent(Client(driver), model=MODEL, instructions="Be terse.", **options)  # type: ignore[arg-type]
    return agent, driver


def texts(call: ProviderCall) -> list[str]:
    return [m.text for m in call.messages]


def calling(call_id: str, city: str = "Porto") -> Message:
    return Message.assistant(
        tool_calls=[ToolCall(id=call_id, name="lookup", arguments=f'{{"city": "{city}"}}')]
    )


class GatedDriver(ScriptedDriver):
    """A ScriptedDriver whose first call waits until the test opens the gate."""

    def __init__(self, replies: list[ScriptedReply]) -> None:
        super().__init__(replies)
        self.first_call_arrived = anyio.Event()
        self.gate = anyio.Event()

    async def complete(self, call: ProviderCall) -> ProviderResponse:
        if not self.first_call_arrived.is_set():
            self.first_call_arrived.set()
            await self.gate.wait()
        return await super().complete(call)


# -- turns ------------------------------------------------------------------------------


async def test_second_turn_sends_the_first_turn_as_history() -> None:
    agent, driver = make_agent(["Hello, Ada.", "Your name is Ada."])
    conv = Conversation(agent)

    await conv.run("My name is Ada.")
    result = await conv.run("What is my name?")

    assert result.text == "Your name is Ada."
    assert texts(driver.calls[1]) == [
        "Be terse.",
        "My name is Ada.",
        "Hello, Ada.",
        "What is my name?",
    ]
    assert [m.origin for m in driver.calls[1].messages[1:3]] == [Origin.SEED, Origin.SEED]


async def test_a_turn_records_events_usage_model_and_last_response() -> None:
    agent, _ = make_agent(["Hi."])
    conv = Conversation(agent)

    result = await conv.run("Hello")

    assert [e.message.role for e in conv.events] == [Role.USER, Role.ASSISTANT]
    assert [e.turn_id for e in conv.events] == [0, 0]
    reply = conv.events[1]
    assert reply.usage == result.usage
    assert reply.model == MODEL.name
    assert reply.finish_reason == "stop"
    assert conv.events[0].usage is None
    assert not any(e.pending for e in conv.events)
    assert conv.total_usage == result.usage
    assert conv.last_response == result.response
    assert conv.turn_count() == 1
    (turn,) = conv.turns
    assert (turn.id, turn.text, turn.usage) == (0, "Hi.", result.usage)
    assert turn.prompt == Message.user("Hello", origin=Origin.TURN)


async def test_total_usage_adds_every_turn() -> None:
    agent, _ = make_agent(["One.", "Two."])
    conv = Conversation(agent)

    first = await conv.run("a")
    second = await conv.run("b")

    assert conv.total_usage == first.usage + second.usage
    assert [t.id for t in conv.turns] == [0, 1]


async def test_a_tool_turn_keeps_the_call_and_its_result_and_sends_them_next_time() -> None:
    agent, driver = make_agent([calling("c1"), "Sunny.", "Yes, it was sunny."], tools=[lookup])
    conv = Conversation(agent)

    first = await conv.run("Weather in Porto?")
    await conv.run("Was it sunny?")

    roles = [e.message.role for e in conv.events]
    tool_turn = [Role.USER, Role.ASSISTANT, Role.TOOL, Role.ASSISTANT]
    assert roles == [*tool_turn, Role.USER, Role.ASSISTANT]
    assert conv.events[2].message.text == "sunny in Porto"
    # Each provider call's usage is kept on the reply it produced.
    assert [e.usage for e in conv.events[:4] if e.message.role is Role.ASSISTANT] == [
        r.usage for r in first.rounds
    ]
    assert [e.finish_reason for e in conv.events[:4] if e.usage] == ["tool_calls", "stop"]
    assert texts(driver.calls[2])[1:5] == ["Weather in Porto?", "", "sunny in Porto", "Sunny."]


async def test_a_prompt_may_be_a_user_message_but_nothing_else() -> None:
    agent, driver = make_agent(["Seen."])
    conv = Conversation(agent)

    await conv.run(Message.user("as a message"))
    with pytest.raises(InvalidRequestError, match="str or a user Message"):
        await conv.run(Message.assistant("not a prompt"))
    with pytest.raises(InvalidRequestError, match="str or a user Message"):
        await conv.run(42)  # type: ignore[arg-type]

    assert conv.events[0].message.origin is Origin.TURN
    assert len(driver.calls) == 1


async def test_a_failed_run_leaves_the_conversation_as_it_was() -> None:
    agent, driver = make_agent(["First.", ProviderUnavailableError("down"), "Third."])
    conv = Conversation(agent)
    await conv.run("one")
    before = (conv.events, conv.total_usage, conv.turns, conv.last_response, conv.messages)

    with pytest.raises(ProviderUnavailableError):
        await conv.run("two")

    assert (conv.events, conv.total_usage, conv.turns, conv.last_response, conv.messages) == before
    await conv.run("three")
    assert "two" not in texts(driver.calls[2])
    assert [t.id for t in conv.turns] == [0, 1]


async def test_agent_defaults_reach_every_request() -> None:
    agent, driver = make_agent(["ok"], max_output_tokens=77, temperature=0.25, seed=7)
    await Conversation(agent).run("hi")

    (call,) = driver.calls
    assert call.max_output_tokens == 77
    assert call.sampling.temperature == 0.25
    assert call.sampling.seed == 7
    assert call.model == MODEL


def test_agent_refuses_a_tool_it_cannot_run_and_duplicate_names() -> None:
    client = Client(ScriptedDriver([]), default_model=MODEL)
    with pytest.raises(InvalidRequestError, match="has no function"):
        Agent(client, tools=[Tool(name="remote")])
    with pytest.raises(InvalidRequestError, match="appears twice"):
        Agent(client, tools=[lookup, lookup])
    with pytest.raises(InvalidRequestError, match="max_rounds"):
        Agent(client, max_rounds=0)
    assert Agent(client).model == MODEL


def test_conversation_refuses_bad_options() -> None:
    agent, _ = make_agent([])
    with pytest.raises(InvalidRequestError, match="history_limit"):
        Conversation(agent, history_limit=-1)
    with pytest.raises(InvalidRequestError, match="max_context_tokens"):
        Conversation(agent, max_context_tokens=0)
    with pytest.raises(InvalidRequestError, match="output_reserve_tokens"):
        Conversation(agent, output_reserve_tokens=-5)
    with pytest.raises(InvalidRequestError, match="id"):
        Conversation(agent, id="")
    with pytest.raises(InvalidRequestError, match="metadata"):
        Conversation(agent, metadata={"a": 1})  # type: ignore[dict-item]
    conv = Conversation(agent)
    with pytest.raises(InvalidRequestError, match="history_limit"):
        conv.history_limit = True
    assert len(conv.id) == 32
    assert conv.output_reserve_tokens is NOT_GIVEN


# -- one caller at a time ---------------------------------------------------------------


async def test_a_second_run_waits_for_the_first_and_sees_its_whole_turn() -> None:
    driver = GatedDriver(["first answer", "second answer"])
    conv = Conversation(Agent(Client(driver), model=MODEL))
    results: dict[str, str] = {}

    async def run(prompt: str) -> None:
        results[prompt] = (await conv.run(prompt)).text

    async with anyio.create_task_group() as tg:
        tg.start_soon(run, "first")
        await driver.first_call_arrived.wait()
        tg.start_soon(run, "second")
        # The second run is queued on the lock: nothing of it reached the model.
        await anyio.wait_all_tasks_blocked()
        assert len(driver.calls) == 0
        driver.gate.set()

    assert results == {"first": "first answer", "second": "second answer"}
    assert [(e.turn_id, e.message.text) for e in conv.events] == [
        (0, "first"),
        (0, "first answer"),
        (1, "second"),
        (1, "second answer"),
    ]
    assert texts(driver.calls[1]) == ["first", "first answer", "second"]


async def test_a_run_cancelled_while_it_waits_leaves_the_next_ones_in_order() -> None:
    driver = GatedDriver(["first answer", "third answer", "fourth answer"])
    conv = Conversation(Agent(Client(driver), model=MODEL))

    async with anyio.create_task_group() as tg:
        tg.start_soon(conv.run, "first")
        await driver.first_call_arrived.wait()
        with anyio.CancelScope() as waiting:
            waiting.cancel()  # queued behind the first, then given up
            await conv.run("second")
        tg.start_soon(conv.run, "third")
        await anyio.wait_all_tasks_blocked()
        assert len(driver.calls) == 0  # the third waits for the first, which holds the turn
        driver.gate.set()
    await conv.run("fourth")  # after the others let go, a turn starts at once

    assert [t.prompt.text for t in conv.turns if t.prompt] == ["first", "third", "fourth"]


async def test_many_concurrent_runs_each_produce_one_whole_turn() -> None:
    driver = ScriptedDriver()
    for i in range(5):
        driver.add_replies([calling(f"c{i}"), f"done {i}"])
    conv = Conversation(Agent(Client(driver), model=MODEL, tools=[lookup]))

    async with anyio.create_task_group() as tg:
        for i in range(5):
            tg.start_soon(conv.run, f"prompt {i}")

    assert [t.id for t in conv.turns] == [0, 1, 2, 3, 4]
    for turn in conv.turns:
        assert [m.role for m in turn.messages] == [
            Role.USER,
            Role.ASSISTANT,
            Role.TOOL,
            Role.ASSISTANT,
        ]
        assert turn.text.startswith("done")


# -- compaction ---------------------------------------------------------------------------


async def _three_turns() -> tuple[Conversation, ScriptedDriver]:
    agent, driver = make_agent(["A1", calling("c1"), "A2", "A3"], tools=[lookup])
    conv = Conversation(agent)
    for prompt in ("Q1", "Q2", "Q3"):
        await conv.run(prompt)
    return conv, driver


async def test_user_event_indices_are_the_safe_cuts() -> None:
    conv, _ = await _three_turns()
    assert conv.user_event_indices() == [0, 2, 6]
    assert all(conv.events[i].message.role is Role.USER for i in conv.user_event_indices())


async def test_replace_events_installs_a_summary_and_rebuilds_everything() -> None:
    conv, driver = await _three_turns()
    cut = conv.user_event_indices()[-1]
    summary = ConversationEvent(message=Message.user("Summary: Q1, Q2 asked."), turn_id=0)
    kept = list(conv.events[cut:])

    await conv.replace_events([summary, *kept])
    kept.clear()  # the conversation copied what it was given

    assert [e.message.text for e in conv.events] == ["Summary: Q1, Q2 asked.", "Q3", "A3"]
    assert [t.id for t in conv.turns] == [0, 2]
    assert conv.total_usage == conv.events[2].usage
    assert conv.last_response is not None
    assert conv.last_response.text == "A3"
    assert conv.last_response.model == MODEL.name

    driver.add_replies(["A4"])
    await conv.run("Q4")
    assert texts(driver.calls[-1])[1:] == ["Summary: Q1, Q2 asked.", "Q3", "A3", "Q4"]
    assert conv.turns[-1].id == 3  # turn ids keep counting forward


async def test_replace_events_refuses_a_broken_transcript() -> None:
    conv, _ = await _three_turns()
    events = conv.events
    before = conv.events

    with pytest.raises(InvalidRequestError, match="start with a user event"):
        await conv.replace_events(events[1:])
    with pytest.raises(InvalidRequestError, match="break a tool unit"):
        await conv.replace_events([*events[:4], *events[5:]])  # the tool result is gone
    with pytest.raises(InvalidRequestError, match="pending"):
        await conv.replace_events(
            [ConversationEvent(message=Message.user("x"), turn_id=0, pending=True)]
        )
    with pytest.raises(InvalidRequestError, match="not a ConversationEvent"):
        await conv.replace_events([Message.user("x")])  # type: ignore[list-item]

    assert conv.events == before


async def test_replace_events_with_nothing_empties_the_transcript_but_not_the_ids() -> None:
    conv, driver = await _three_turns()
    await conv.replace_events([])
    assert (conv.events, conv.turns, conv.total_usage, conv.last_response) == (
        (),
        (),
        Usage(),
        None,
    )
    driver.add_replies(["fresh"])
    await conv.run("again")
    assert conv.turns[0].id == 3


async def test_reset_clears_history_and_usage_but_keeps_identity_and_settings() -> None:
    agent, driver = make_agent(["one", "two"])
    conv = Conversation(
        agent, id="c-1", history_limit=4, max_context_tokens=5000, metadata={"a": "b"}
    )
    await conv.run("hello")

    await conv.reset()

    assert (conv.events, conv.turns, conv.total_usage, conv.last_response) == (
        (),
        (),
        Usage(),
        None,
    )
    assert (conv.id, conv.history_limit, conv.max_context_tokens, conv.metadata) == (
        "c-1",
        4,
        5000,
        {"a": "b"},
    )
    assert conv.agent is agent
    await conv.run("again")
    assert texts(driver.calls[-1]) == ["Be terse.", "again"]
    assert conv.turns[0].id == 1


# -- token helpers ------------------------------------------------------------------------


async def test_token_estimate_counts_instructions_tools_and_window_with_the_agents_counter() -> (
    None
):
    counter = ApproximateCounter()
    agent, _ = make_agent(["A1", "A2"], tools=[lookup], token_counter=counter)
    conv = Conversation(agent, history_limit=2)
    await conv.run("Q1")
    await conv.run("Q2")

    expected = counter.count([Message.system("Be terse."), *conv.messages], agent.tools)
    assert conv.token_estimate() == expected
    assert conv.messages == tuple(e.message for e in conv.events[2:])


async def test_available_context_tokens_is_the_prompt_budget_left() -> None:
    counter = ApproximateCounter()
    agent, _ = make_agent(["A1"], token_counter=counter)
    conv = Conversation(agent, max_context_tokens=1000, output_reserve_tokens=100)
    await conv.run("Q1")

    assert conv.available_context_tokens() == 900 - conv.token_estimate()
    conv.output_reserve_tokens = 0
    assert conv.available_context_tokens() == 1000 - conv.token_estimate()
    conv.max_context_tokens = 10
    assert conv.available_context_tokens() == 0


def test_available_context_tokens_is_none_without_a_budget() -> None:
    agent = Agent(Client(ScriptedDriver([])), model=Model("no-size"))
    conv = Conversation(agent)
    assert conv.available_context_tokens() is None
    with pytest.raises(InvalidRequestError, match="no model"):
        Conversation(Agent(Client(ScriptedDriver([])))).token_estimate()


async def test_conversation_settings_reach_the_request_budget() -> None:
    agent, driver = make_agent([str(i) for i in range(4)], token_counter=ApproximateCounter())
    conv = Conversation(agent, max_context_tokens=60, output_reserve_tokens=0)
    results = [await conv.run(f"question number {i} " + "word " * 10) for i in range(4)]

    result = results[-1]
    assert result.budget is not None
    assert (result.budget.limit, result.budget.reserve) == (60, 0)
    ran = {h.handler for r in results for record in r.limiting for h in record.handlers}
    assert ran == {"cache_stable_units"}  # a conversation's default Pre dropped old turns
    assert len(driver.calls[-1].messages) < 2 + 2 * 3
    assert len(conv.events) == 8  # the transcript keeps everything


async def test_conversation_handlers_replace_the_default() -> None:
    seen: list[int] = []

    def pre(event: object) -> None:
        seen.append(1)

    agent, _ = make_agent(["a", "b"], token_counter=ApproximateCounter())
    conv = Conversation(
        agent, max_context_tokens=20, output_reserve_tokens=0, pre_max_tokens_reached=pre
    )
    await conv.run("x " * 40)
    assert seen == [1]


def test_repr_names_the_conversation() -> None:
    agent, _ = make_agent([])
    assert repr(Conversation(agent, id="abc")) == (
        "Conversation(id='abc', turns=0, events=0, history_limit=0)"
    )
    assert "scripted-model" in repr(agent)


def test_an_idle_conversation_moves_between_event_loops_and_backends() -> None:
    agent, driver = make_agent(["on trio", "on asyncio", "on trio again"])
    conv = Conversation(agent)

    for backend in ("trio", "asyncio", "trio"):
        anyio.run(conv.run, f"hello from {backend}", backend=backend)

    assert [t.text for t in conv.turns] == ["on trio", "on asyncio", "on trio again"]
    assert len(driver.calls[-1].messages) == 6
