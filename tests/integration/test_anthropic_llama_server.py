"""AnthropicDriver and the run loop against the upstream llama.cpp server's Messages API.

The server (see conftest.py) serves SmolLM2-135M-Instruct. What these tests
prove is that the requests threadline builds are accepted by a server nobody
here wrote, and that what comes back (text, streams, usage, counts and
context-length refusals) is read correctly.

Tool calls run with the chat template in ``smollm2_tools.jinja``: with
SmolLM2's own template the server's forced-call grammar still lets the model
write text first, and a 135M model never gets to the call. The calls are
tested one driver call at a time: once a tool result is in, what the model
does next (answer or call again) is not worth asserting on.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal

import attrs
import pytest

from threadline import (
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
    AnthropicDriver,
    ProviderCall,
    ResponseDone,
    SamplingSettings,
    ToolCallChunk,
)

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

SYSTEM = "You are a helpful assistant. Answer in one short sentence."


@pytest.fixture
async def driver(llama_server_upstream: str) -> AsyncIterator[AnthropicDriver]:
    # A 4xx is never retried, so a refusal still fails at once with the server's
    # message; a retry covers a kept-alive connection the server closed meanwhile.
    async with AnthropicDriver(
        base_url=llama_server_upstream, api_key="not-needed-locally", max_retries=1
    ) as driver:
        yield driver


@pytest.fixture
def client(driver: AnthropicDriver, llama_model: Model) -> Client:
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


async def test_count_tokens_equals_the_reported_input_tokens(
    driver: AnthropicDriver, client: Client, llama_model: Model
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


async def test_five_turns_under_a_small_limit_drop_old_turns_and_stay_under_it(
    client: Client,
) -> None:
    limit = 360
    questions = [
        "Tell me about the ocean, the tides, the moon and why the water is salty.",
        "Now tell me about mountains, glaciers, snow and how valleys are carved.",
        "Describe a forest in autumn: the leaves, the animals, the smell of rain.",
        "Explain how a river starts in the hills and reaches the sea over the years.",
        "Finally, describe a desert at night with its stars, sand and cold wind.",
    ]
    history: list[Message] = []
    rounds = []
    for question in questions:
        result = await (
            client.request()
            .with_system(SYSTEM)
            .with_messages(history)
            .with_prompt(question)
            .with_max_context_tokens(limit)
            .with_max_output_tokens(48)
            .with_temperature(0)
            .run()
        )
        history.extend(result.new_messages())
        rounds.extend(result.rounds)

    assert len(rounds) == len(questions)
    for record in rounds:
        assert record.reported_input_tokens is not None
        assert record.reported_input_tokens < limit, record
        assert record.limiting is not None
    dropped = [unit for record in rounds if record.limiting for unit in record.limiting.dropped]
    assert dropped, "five turns over a 360-token limit must drop older turns"


def _long_history(notes: int) -> list[Message]:
    history: list[Message] = []
    for index in range(notes):
        history.append(Message.user(f"Note {index}: " + "the quick brown fox jumps. " * 12))
        history.append(Message.assistant(f"Noted {index}."))
    return history


async def test_an_over_long_prompt_is_limited_again_after_the_servers_refusal(
    client: Client, llama_model: Model
) -> None:
    # No context_size on the model: no budget, so everything is sent; the
    # server refuses it with its numbers, and the run limits and retries once.
    request = (
        client.request()
        .with_model(Model(llama_model.name))
        .with_system(SYSTEM)
        .with_messages(_long_history(30))
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
        # No system prompt: with one, greedy SmolLM2 starts with words, which the
        # server's grammar allows before the call, and never gets to it.
        messages=(Message.user("What is the weather in Paris?"),),
        tools=(get_weather,),
        tool_choice="get_weather",
        max_output_tokens=48,
        # Greedy: the grammar still lets words come before the call's "{", and a
        # sampled first token sometimes takes that path.
        sampling=SamplingSettings(temperature=0),
    )


async def test_a_forced_tool_choice_yields_tool_use_and_its_result_is_taken(
    driver: AnthropicDriver, llama_model: Model
) -> None:
    call = _weather_call(llama_model)
    response = await driver.complete(call)

    assert response.message.tool_calls, response
    for tool_call in response.message.tool_calls:
        assert tool_call.name == "get_weather"
        assert tool_call.parsed()["city"] in ("Paris", "Rome", "Oslo")
        assert tool_call.id
    # The tool_use turn and a user turn of tool_result blocks go back; the
    # server must accept them and answer. No tools this time: offered tools make
    # llama-server parse the answer as a possible call, and it refuses (500)
    # whatever SmolLM2 writes that is neither words nor a well-formed call.
    results = tuple(
        Message.tool(c.id, f"Sunny and 21 degrees Celsius in {c.parsed()['city']}.")
        for c in response.message.tool_calls
    )
    follow_up = ProviderCall(
        model=llama_model,
        messages=(*call.messages, response.message, *results),
        max_output_tokens=24,
        sampling=SamplingSettings(temperature=0),
    )
    answer = await driver.complete(follow_up)
    # The server read the exchange: it counts beyond the question alone.
    question_only = await driver.count_tokens(attrs.evolve(follow_up, messages=call.messages))
    assert answer.usage.input_tokens > question_only
    assert answer.usage.input_tokens == await driver.count_tokens(follow_up)


async def test_a_streamed_tool_call_assembles_from_input_json_deltas(
    driver: AnthropicDriver, llama_model: Model
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
    streamed = "".join(p.arguments for p in pieces if p.index == 0)
    assert streamed == first.arguments
