"""OpenAIResponsesDriver and the run loop against the upstream llama.cpp server's Responses API.

The server (see conftest.py) serves SmolLM2-135M-Instruct at ``/v1/responses``
(converted to its chat pipeline, stateless) and counts at
``/v1/responses/input_tokens``. What these tests prove is that the stateless
requests threadline builds (``store: false``, the whole kept transcript as
input items) are accepted by a server nobody here wrote, and that what comes
back (text, streams, tool calls, usage, counts and context-length refusals)
is read correctly. Tool calls use the template in ``smollm2_tools.jinja`` and
are checked one driver call at a time, as for the other drivers.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal

import attrs
import pytest

from threadline import (
    BadRequestError,
    Client,
    FinalResult,
    Message,
    Model,
    Role,
    RoundDone,
    RunResult,
    TextDelta,
    tool,
)
from threadline.drivers import (
    OpenAIResponsesDriver,
    ProviderCall,
    ResponseDone,
    SamplingSettings,
    ToolCallChunk,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

SYSTEM = "You are a helpful assistant. Answer in one short sentence."


@pytest.fixture
async def driver(llama_server_upstream: str) -> AsyncIterator[OpenAIResponsesDriver]:
    # A 4xx is never retried; one retry covers a kept-alive connection the server closed.
    async with OpenAIResponsesDriver(
        f"{llama_server_upstream}/v1", api_key="not-needed-locally", max_retries=1
    ) as driver:
        yield driver


@pytest.fixture
def client(driver: OpenAIResponsesDriver, llama_model: Model) -> Client:
    return Client(driver, default_model=llama_model)


async def test_plain_run_returns_the_servers_answer_and_usage(client: Client) -> None:
    result = await (
        client.request()
        .with_system(SYSTEM)
        .with_prompt("Name one colour of the rainbow.")
        .with_max_output_tokens(24)
        .with_temperature(0)
        .run()
    )

    assert result.text.strip()
    assert result.response.finish_reason in ("stop", "length")
    (round_one,) = result.rounds
    assert round_one.reported_input_tokens is not None
    assert round_one.reported_input_tokens > 0
    assert 0 < result.usage.output_tokens <= 24
    assert [m.role for m in result.new_messages()] == [Role.USER, Role.ASSISTANT]


async def test_stream_yields_text_deltas_that_join_to_the_final_text(client: Client) -> None:
    request = (
        client.request()
        .with_system(SYSTEM)
        .with_prompt("Count from one to five in words.")
        .with_max_output_tokens(32)
        .with_temperature(0)
    )
    deltas: list[str] = []
    kinds: list[type[object]] = []
    final: RunResult | None = None
    async with request.stream() as events:
        async for event in events:
            kinds.append(type(event))
            if isinstance(event, TextDelta):
                deltas.append(event.text)
            elif isinstance(event, FinalResult):
                final = event.result

    assert final is not None
    assert len(deltas) > 1, "a streamed reply should arrive in more than one piece"
    assert "".join(deltas) == final.text
    assert kinds[-2:] == [RoundDone, FinalResult]
    assert final.usage.input_tokens > 0
    assert final.usage.output_tokens > 0


async def test_input_tokens_equal_the_reported_input_tokens(
    driver: OpenAIResponsesDriver, llama_model: Model
) -> None:
    history = [
        Message.user("What is the capital of France?"),
        Message.assistant("Paris."),
        Message.user("And of Italy?"),
    ]
    call = ProviderCall(
        model=llama_model, messages=(Message.system(SYSTEM), *history), max_output_tokens=8
    )
    counted = await driver.count_tokens(call)
    answered = await driver.complete(call)

    assert counted > 0
    assert counted == answered.usage.input_tokens
    exact = driver.exact_token_counter(llama_model)
    assert await exact.count(call.messages) == counted


async def test_ten_turns_under_a_small_limit_drop_old_turns_and_stay_under_it(
    client: Client,
) -> None:
    limit = 360
    topics = [
        "the ocean and its tides",
        "mountains and glaciers",
        "a forest in autumn",
        "a river from hills to sea",
        "a desert at night",
        "a city in the rain",
        "a harbour at dawn",
        "a field of wheat in summer",
        "a frozen lake in winter",
        "a volcano after it sleeps",
    ]
    history: list[Message] = []
    rounds = []
    for topic in topics:
        result = await (
            client.request()
            .with_system(SYSTEM)
            .with_messages(history)
            .with_prompt(f"Describe {topic}: what you see, hear and smell there, in detail.")
            .with_max_context_tokens(limit)
            .with_max_output_tokens(48)
            .with_temperature(0)
            .run()
        )
        history.extend(result.new_messages())
        rounds.extend(result.rounds)

    assert len(rounds) == len(topics)
    for record in rounds:
        assert record.reported_input_tokens is not None
        assert record.reported_input_tokens < limit, record
    dropped = [unit for record in rounds if record.limiting for unit in record.limiting.dropped]
    assert dropped, "ten turns over a 360-token limit must drop older turns"


async def test_an_over_long_prompt_is_limited_again_after_the_servers_refusal(
    client: Client, llama_model: Model
) -> None:
    # No context_size on the model: no budget, so everything is sent; the
    # server refuses it, and the run limits and retries once.
    history: list[Message] = []
    for index in range(30):
        history.append(Message.user(f"Note {index}: " + "the quick brown fox jumps. " * 12))
        history.append(Message.assistant(f"Noted {index}."))
    request = (
        client.request()
        .with_model(Model(llama_model.name))
        .with_system(SYSTEM)
        .with_messages(history)
        .with_prompt("Which note came last?")
        .with_max_output_tokens(16)
        .with_temperature(0)
    )
    assert await request.budget() is None

    result = await request.run()

    (record,) = result.rounds
    assert record.context_retry
    assert record.retry_limiting is not None
    assert record.retry_limiting.dropped
    assert record.reported_input_tokens is not None
    assert llama_model.context_size is not None
    assert record.reported_input_tokens + 16 <= llama_model.context_size
    assert result.text.strip()


@tool
def get_weather(city: Literal["Paris", "Rome", "Oslo"]) -> str:
    """The current weather in a city.

    Args:
        city: the city.
    """
    return f"Sunny and 21 degrees Celsius in {city}."


def _weather_call(llama_model: Model) -> ProviderCall:
    return ProviderCall(
        model=llama_model,
        # No system prompt and greedy sampling: SmolLM2 then gets to the call.
        messages=(Message.user("What is the weather in Paris?"),),
        tools=(get_weather,),
        # "required", not the tool's name: this server's Responses conversion
        # does not carry a named tool choice ({"type": "function", "name": ...})
        # to its grammar, and the model's free output then fails to parse (500).
        tool_choice="required",
        max_output_tokens=48,
        sampling=SamplingSettings(temperature=0),
    )


async def test_a_tool_round_sends_the_call_and_its_output_back(
    driver: OpenAIResponsesDriver, llama_model: Model
) -> None:
    call = _weather_call(llama_model)
    response = await driver.complete(call)

    assert response.message.tool_calls, response
    assert response.finish_reason == "tool_calls"
    for tool_call in response.message.tool_calls:
        assert tool_call.name == "get_weather"
        assert tool_call.parsed()["city"] in ("Paris", "Rome", "Oslo")
        assert tool_call.id
    results = tuple(
        Message.tool(c.id, f"Sunny and 21 degrees Celsius in {c.parsed()['city']}.")
        for c in response.message.tool_calls
    )
    # No tools on the follow-up: offered tools make llama-server parse the answer
    # as a possible call and refuse what a 135M model writes that is neither.
    follow_up = ProviderCall(
        model=llama_model,
        messages=(*call.messages, response.message, *results),
        max_output_tokens=24,
        sampling=SamplingSettings(temperature=0),
    )
    answer = await driver.complete(follow_up)
    question_only = await driver.count_tokens(attrs.evolve(follow_up, messages=call.messages))
    assert answer.usage.input_tokens > question_only
    assert answer.usage.input_tokens == await driver.count_tokens(follow_up)


async def test_a_streamed_tool_call_assembles_from_argument_deltas(
    driver: OpenAIResponsesDriver, llama_model: Model
) -> None:
    pieces: list[ToolCallChunk] = []
    done: ResponseDone | None = None
    async with driver.stream(_weather_call(llama_model)) as chunks:
        async for chunk in chunks:
            if isinstance(chunk, ToolCallChunk):
                pieces.append(chunk)
            elif isinstance(chunk, ResponseDone):
                done = chunk

    assert done is not None
    calls = done.response.message.tool_calls
    assert calls
    first = calls[0]
    assert first.parsed()["city"] in ("Paris", "Rome", "Oslo")
    assert pieces[0].id == first.id
    streamed = "".join(p.arguments for p in pieces if p.index == 0)
    assert streamed == first.arguments


async def test_server_state_mode_meets_a_server_that_keeps_no_state(
    llama_server_upstream: str, llama_model: Model
) -> None:
    # llama.cpp's server accepts store: true but keeps nothing, and refuses
    # previous_response_id: the error says so and names the way out.
    async with OpenAIResponsesDriver(
        f"{llama_server_upstream}/v1", api_key="not-needed-locally", server_state=True
    ) as driver:
        client = Client(driver, default_model=llama_model)
        first = await client.request().with_prompt("Say hi.").with_max_output_tokens(8).run()
        assert first.text.strip()
        follow = client.request().with_messages(first.messages).with_prompt("Again.")
        with pytest.raises(BadRequestError) as refused:
            await follow.with_max_output_tokens(8).run()
    assert "previous_response_id" in refused.value.message
    assert "server_state=False" in refused.value.message
