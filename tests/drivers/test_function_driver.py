"""FunctionDriver: replies computed from what was sent, whole or streamed, on both backends."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import anyio
import anyio.lowlevel
import pytest
from hypothesis import given
from hypothesis import strategies as st

import threadline.testing
from threadline import (
    Agent,
    Client,
    Conversation,
    FinalResult,
    Message,
    Model,
    Origin,
    RateLimitError,
    ReasoningDelta,
    Role,
    TextDelta,
    ToolCall,
    ToolCallEvent,
    ToolResultEvent,
    Usage,
    tool,
)
from threadline.counting import estimate_message_tokens
from threadline.drivers import (
    Driver,
    ProviderResponse,
    ReasoningChunk,
    ResponseDone,
    StreamChunk,
    TextChunk,
    ToolCallChunk,
)
from threadline.testing import FunctionDriver, ProviderCall

pytestmark = pytest.mark.anyio

MODEL = Model("function-model", context_size=8192)
BOTH_BACKENDS = pytest.mark.both_backends


@tool
def lookup(city: str) -> str:
    """The weather in a city.

    Args:
        city: The city's name.
    """
    return f"sunny in {city}"


def echo(call: ProviderCall) -> str:
    return f"you said {call.messages[-1].text}"


def weather(call: ProviderCall) -> Message | str:
    """Calls ``lookup`` first, then answers with what the tool said."""
    last = call.messages[-1]
    if last.role is Role.TOOL:
        return f"It is {last.text}."
    return Message.assistant(
        tool_calls=[
            ToolCall(id=f"c{len(call.messages)}", name="lookup", arguments='{"city": "Porto"}')
        ]
    )


async def events_of(client: Client, prompt: str) -> list[object]:
    async with client.request().with_prompt(prompt).with_tools([lookup]).stream() as events:
        return [event async for event in events]


def streamed_text(events: list[object]) -> list[str]:
    return [e.text for e in events if isinstance(e, TextDelta)]


# -- whole replies -------------------------------------------------------------------


async def test_a_sync_function_answers_from_what_was_sent() -> None:
    driver = FunctionDriver(echo)
    result = await Client(driver, default_model=MODEL).request().with_prompt("hi").run()

    assert result.text == "you said hi"
    assert result.response.model == "function-model"
    assert result.response.finish_reason == "stop"
    assert result.response.message.origin is Origin.TURN
    assert [m.text for m in driver.calls[0].messages] == ["hi"]
    assert result.response.usage == Usage(
        input_tokens=estimate_message_tokens(Message.user("hi")),
        output_tokens=estimate_message_tokens(Message.assistant("you said hi")),
    )


@BOTH_BACKENDS
async def test_an_async_function_is_awaited() -> None:
    async def slow_echo(call: ProviderCall) -> str:
        await anyio.lowlevel.checkpoint()
        return echo(call)

    client = Client(FunctionDriver(slow_echo), default_model=MODEL)
    result = await client.request().with_prompt("hi").run()
    assert result.text == "you said hi"


async def test_a_returned_provider_response_is_used_as_given() -> None:
    given_response = ProviderResponse(
        message=Message.assistant("cut sh", origin=Origin.TURN),
        finish_reason="length",
        usage=Usage(input_tokens=1234, output_tokens=2),
        model="the-real-model",
    )
    driver = FunctionDriver(lambda call: given_response)
    result = await Client(driver, default_model=MODEL).request().with_prompt("hi").run()

    assert result.response == given_response
    assert result.rounds[0].reported_input_tokens == 1234


async def test_tool_rounds_run_through_a_real_request() -> None:
    driver = FunctionDriver(weather)
    request = Client(driver, default_model=MODEL).request().with_prompt("Weather?")
    result = await request.with_tools([lookup]).run()

    assert result.text == "It is sunny in Porto."
    assert [r.finish_reason for r in result.rounds] == ["tool_calls", "stop"]
    assert [m.role for m in driver.calls[1].messages] == [Role.USER, Role.ASSISTANT, Role.TOOL]
    assert driver.calls[1].tools[0].name == "lookup"


async def test_a_conversation_sends_its_history_to_the_function() -> None:
    def recall(call: ProviderCall) -> str:
        said = [m.text for m in call.messages if m.role is Role.USER]
        return " | ".join(said)

    driver = FunctionDriver(recall)
    agent = Agent(Client(driver), model=MODEL, instructions="Be terse.")
    conversation = Conversation(agent)

    await conversation.run("My name is Ada.")
    second = await conversation.run("What is my name?")

    assert second.text == "My name is Ada. | What is my name?"
    assert [m.role for m in driver.calls[1].messages] == [
        Role.SYSTEM,
        Role.USER,
        Role.ASSISTANT,
        Role.USER,
    ]


# -- streams -------------------------------------------------------------------------


@BOTH_BACKENDS
async def test_a_stream_of_a_plain_function_cuts_its_reply_into_pieces() -> None:
    driver = FunctionDriver(echo, stream_pieces=4)
    client = Client(driver, default_model=MODEL)
    events = await events_of(client, "a longer prompt")

    assert streamed_text(events) == ["you sa", "id a l", "onger ", "prompt"]
    final = events[-1]
    assert isinstance(final, FinalResult)
    assert final.result.response == await driver.complete(driver.calls[0])


def sync_deltas(call: ProviderCall) -> Iterator[str | StreamChunk]:
    yield ReasoningChunk(text="They want a greeting. ")
    yield "Hel"
    yield TextChunk(text="lo")
    yield "!"


async def async_deltas(call: ProviderCall) -> AsyncIterator[str | StreamChunk]:
    for delta in sync_deltas(call):
        await anyio.lowlevel.checkpoint()
        yield delta


@BOTH_BACKENDS
@pytest.mark.parametrize("stream_function", [sync_deltas, async_deltas])
async def test_a_stream_function_streams_its_deltas_as_they_come(stream_function: object) -> None:
    driver = FunctionDriver(stream_function=stream_function)  # type: ignore[arg-type]
    events = await events_of(Client(driver, default_model=MODEL), "greet me")

    assert streamed_text(events) == ["Hel", "lo", "!"]
    assert [e.text for e in events if isinstance(e, ReasoningDelta)] == ["They want a greeting. "]
    final = events[-1]
    assert isinstance(final, FinalResult)
    reply = final.result.response.message
    assert reply.text == "Hello!"
    assert reply.reasoning is not None
    assert reply.reasoning.text == "They want a greeting. "
    assert reply.reasoning.provider == "function:function-model"
    assert final.result.response.usage.output_tokens == estimate_message_tokens(reply)


@BOTH_BACKENDS
async def test_a_streamed_tool_call_is_put_together_from_its_pieces() -> None:
    def deltas(call: ProviderCall) -> Iterator[str | StreamChunk]:
        if call.messages[-1].role is Role.TOOL:
            yield f"It is {call.messages[-1].text}."
            return
        yield ToolCallChunk(index=0, name="lookup", arguments='{"city": ')
        yield ToolCallChunk(index=0, arguments='"Porto"}')

    driver = FunctionDriver(stream_function=deltas)
    events = await events_of(Client(driver, default_model=MODEL), "Weather?")

    [called] = [e.call for e in events if isinstance(e, ToolCallEvent)]
    assert (called.name, called.arguments) == ("lookup", '{"city": "Porto"}')
    assert called.id == "call_1_0"  # given none, it gets one unique to the driver's call
    [answered] = [e for e in events if isinstance(e, ToolResultEvent)]
    assert answered.message.text == "sunny in Porto"
    assert "".join(streamed_text(events)) == "It is sunny in Porto."


async def test_a_stream_function_alone_also_answers_a_whole_request() -> None:
    driver = FunctionDriver(stream_function=sync_deltas)
    result = await Client(driver, default_model=MODEL).request().with_prompt("hi").run()
    assert result.text == "Hello!"
    assert len(driver.calls) == 1


async def test_a_response_done_from_the_stream_function_ends_the_stream_as_given() -> None:
    given_response = ProviderResponse(
        message=Message.assistant("Hel", origin=Origin.TURN),
        finish_reason="length",
        usage=Usage(input_tokens=7, output_tokens=1),
        model="function-model",
    )

    def cut_short(call: ProviderCall) -> Iterator[str | StreamChunk]:
        yield "Hel"
        yield ResponseDone(response=given_response)
        yield "never streamed"

    driver = FunctionDriver(stream_function=cut_short)
    events = await events_of(Client(driver, default_model=MODEL), "hi")
    assert streamed_text(events) == ["Hel"]
    final = events[-1]
    assert isinstance(final, FinalResult)
    assert final.result.response == given_response


@BOTH_BACKENDS
@pytest.mark.parametrize("asynchronous", [True, False], ids=["async", "sync"])
async def test_leaving_a_stream_early_closes_the_stream_function(asynchronous: bool) -> None:
    closed: list[str] = []

    async def endless(call: ProviderCall) -> AsyncIterator[str]:
        try:
            while True:
                yield "more "
        finally:
            closed.append(call.messages[-1].text)

    def endless_sync(call: ProviderCall) -> Iterator[str]:
        try:
            while True:
                yield "more "
        finally:
            closed.append(call.messages[-1].text)

    driver = FunctionDriver(stream_function=endless if asynchronous else endless_sync)
    client = Client(driver, default_model=MODEL)
    async with client.request().with_prompt("go on").stream() as events:
        async for event in events:
            assert isinstance(event, TextDelta)
            break
    assert closed == ["go on"]


# -- errors --------------------------------------------------------------------------


async def test_what_the_function_raises_propagates_unchanged() -> None:
    refusal = RateLimitError("slow down", status=429, provider="function")

    def refuse(call: ProviderCall) -> str:
        raise refusal

    with pytest.raises(RateLimitError) as raised:
        await Client(FunctionDriver(refuse), default_model=MODEL).request().with_prompt("q").run()
    assert raised.value is refusal


@BOTH_BACKENDS
async def test_what_a_stream_function_raises_midway_propagates_unchanged() -> None:
    failure = ConnectionResetError("the pretend server hung up")

    def half(call: ProviderCall) -> Iterator[str]:
        yield "Hel"
        raise failure

    client = Client(FunctionDriver(stream_function=half), default_model=MODEL)
    with pytest.raises(ConnectionResetError) as raised:
        await events_of(client, "hi")
    assert raised.value is failure


@pytest.mark.parametrize(
    ("reply", "error", "names"),
    [
        (42, TypeError, "not int"),
        (None, TypeError, "not NoneType"),
        (Message.user("hi"), ValueError, "returned a user message"),
    ],
)
async def test_a_function_returning_no_reply_gets_an_error_naming_what_it_returned(
    reply: object, error: type[Exception], names: str
) -> None:
    driver = FunctionDriver(lambda call: reply)  # type: ignore[arg-type, return-value]
    with pytest.raises(error, match=names):
        await Client(driver, default_model=MODEL).request().with_prompt("q").run()


@pytest.mark.parametrize(
    ("stream_function", "names"),
    [
        (lambda call: "Hello", "stream_function must return an iterable .*not str"),
        (lambda call: 42, "stream_function must return an iterable .*not int"),
        (lambda call: ["Hel", 42], "yields str, .*not int"),
        (lambda call: [ToolCallChunk(index=0, arguments="{}")], "tool call 0 without a name"),
    ],
)
async def test_a_stream_function_giving_no_deltas_gets_an_error_naming_the_problem(
    stream_function: object, names: str
) -> None:
    driver = FunctionDriver(stream_function=stream_function)  # type: ignore[arg-type]
    with pytest.raises((TypeError, ValueError), match=names):
        await events_of(Client(driver, default_model=MODEL), "q")


def test_a_driver_needs_a_function() -> None:
    with pytest.raises(TypeError, match="needs a function, a stream_function or both"):
        FunctionDriver()


async def test_it_is_a_driver_with_the_protocols_defaults() -> None:
    driver = FunctionDriver(echo)
    assert isinstance(driver, Driver)
    assert driver.token_counter() is None
    await driver.aclose()


# -- usage ---------------------------------------------------------------------------


async def test_a_long_conversation_prices_only_the_messages_new_to_each_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    priced: list[Message] = []

    def spy(message: Message) -> int:
        priced.append(message)
        return estimate_message_tokens(message)

    monkeypatch.setattr(threadline.testing, "estimate_message_tokens", spy)
    driver = FunctionDriver(weather)
    conversation = Conversation(Agent(Client(driver), model=MODEL, tools=[lookup]))
    per_turn = []
    for turn in range(30):
        before = len(priced)
        result = await conversation.run(f"Weather, take {turn}?")
        per_turn.append(len(priced) - before)
        sent = driver.calls[-1].messages
        assert result.response.usage.input_tokens == sum(map(estimate_message_tokens, sent))
    # A turn prices its prompt, call and result, the last turn's four messages
    # again (they come back as seed copies) and its two replies: never the history.
    assert per_turn[1:] == [9] * 29


MESSAGES = [Message.user(f"question {i} " * i) for i in range(6)] + [
    Message.assistant(f"answer {i}") for i in range(6)
]


@given(st.lists(st.lists(st.sampled_from(MESSAGES), max_size=8), min_size=1, max_size=6))
def test_input_usage_is_the_sum_over_what_was_sent_whatever_the_calls(
    calls: list[list[Message]],
) -> None:
    driver = FunctionDriver(lambda call: "ok")

    async def send_all() -> list[int]:
        usages = []
        for sent in calls:
            response = await driver.complete(ProviderCall(model=MODEL, messages=tuple(sent)))
            usages.append(response.usage.input_tokens)
        return usages

    priced = anyio.run(send_all)
    assert priced == [sum(map(estimate_message_tokens, sent)) for sent in calls]
