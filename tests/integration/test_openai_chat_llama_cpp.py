"""OpenAIChatDriver and the run loop against llama-cpp-python's real server.

The server (see conftest.py) serves SmolLM2-135M-Instruct. Its answers are
not worth reading; what these tests prove is that the requests threadline
builds are accepted by a server nobody here wrote, and that what comes back
(text, streams, usage, tool calls) is read correctly.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal

import pytest

from threadline import (
    Client,
    FinalResult,
    Message,
    Model,
    ProviderResponseError,
    Request,
    Role,
    RoundDone,
    RunResult,
    TextDelta,
    ToolCallEvent,
    ToolResultEvent,
    tool,
)
from threadline.drivers import OpenAIChatDriver

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

SYSTEM = "You are a helpful assistant. Answer in one short sentence."


@pytest.fixture
async def client(llama_server: str, llama_model: Model) -> AsyncIterator[Client]:
    # No retries: a refusal from the server should fail the test at once,
    # with the server's own message, not after backoff.
    driver = OpenAIChatDriver(llama_server, api_key="not-needed", max_retries=0)
    async with Client(driver, default_model=llama_model) as client:
        yield client


async def test_plain_run_returns_the_servers_answer_and_usage(
    client: Client, llama_model: Model
) -> None:
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
    assert result.response.model == llama_model.name
    (round_one,) = result.rounds
    assert round_one.reported_input_tokens is not None
    assert round_one.reported_input_tokens > 0
    assert 0 < result.usage.output_tokens <= 24
    assert [m.role for m in result.new_messages()] == [Role.USER, Role.ASSISTANT]
    assert result.new_messages()[-1] == result.response.message


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
    assert final.text.strip()
    assert kinds[-2:] == [RoundDone, FinalResult]
    assert final.response.finish_reason in ("stop", "length")


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
    results: list[RunResult] = []
    for question in questions:
        result = await (
            client.request()
            .with_system(SYSTEM)
            .with_messages(history)
            .with_prompt(question)
            .with_max_context_tokens(limit)
            .with_max_output_tokens(48)
            .with_temperature(0)
            .with_seed(7)
            .run()
        )
        history.extend(result.new_messages())
        results.append(result)

    rounds = [r for result in results for r in result.rounds]
    assert len(rounds) == len(questions)
    for record in rounds:
        assert record.reported_input_tokens is not None
        assert record.reported_input_tokens < limit, record
        assert record.limiting is not None
        assert record.limiting.budget_tokens == limit - 48
    dropped = [unit for record in rounds if record.limiting for unit in record.limiting.dropped]
    assert dropped, "five turns over a 360-token limit must drop older turns"
    assert {unit.handler for unit in dropped} == {"drop_oldest_units"}
    # The history kept growing on the caller's side; only what was sent shrank.
    assert len(history) == 2 * len(questions)
    last = results[-1]
    assert last.messages[0].role is Role.SYSTEM
    assert last.messages[1].role is Role.USER
    assert len(last.messages) < len(history) + 1


async def test_forced_tool_choice_calls_the_tool_then_answers(client: Client) -> None:
    cities: list[str] = []

    # A closed set of cities keeps the grammar-constrained arguments short:
    # a free string lets a 135M model ramble until max_tokens cuts the JSON.
    @tool
    def get_weather(city: Literal["Paris", "Rome", "Oslo"]) -> str:
        """The current weather in a city.

        Args:
            city: the city.
        """
        cities.append(city)
        return f"Sunny and 21 degrees Celsius in {city}."

    result = await (
        client.request()
        .with_system(SYSTEM)
        .with_prompt("What is the weather like in Paris right now?")
        .with_tools([get_weather])
        .with_tool_choice("get_weather")
        .with_max_output_tokens(48)
        .with_temperature(0)
        .run()
    )

    assert len(cities) == 1
    assert cities[0] in ("Paris", "Rome", "Oslo")
    first, second = result.rounds
    assert first.tool_calls == 1
    assert first.finish_reason == "tool_calls"
    assert second.tool_calls == 0
    assert result.text.strip()
    roles = [m.role for m in result.new_messages()]
    assert roles == [Role.USER, Role.ASSISTANT, Role.TOOL, Role.ASSISTANT]
    call = result.new_messages()[1].tool_calls[0]
    assert call.name == "get_weather"
    assert call.parsed() == {"city": cities[0]}
    assert result.new_messages()[2].tool_call_id == call.id


async def test_streamed_tool_round_reports_the_call_and_its_result(client: Client) -> None:
    @tool
    def add(a: int, b: int) -> int:
        """Add two whole numbers."""
        return a + b

    request = (
        client.request()
        .with_system(SYSTEM)
        .with_prompt("What is 2 plus 3? Use the add tool.")
        .with_tools([add])
        .with_tool_choice("add")
        .with_max_output_tokens(32)
        .with_temperature(0)
    )
    calls: list[ToolCallEvent] = []
    results: list[ToolResultEvent] = []
    final: RunResult | None = None
    async with request.stream() as events:
        async for event in events:
            if isinstance(event, ToolCallEvent):
                calls.append(event)
            elif isinstance(event, ToolResultEvent):
                results.append(event)
            elif isinstance(event, FinalResult):
                final = event.result

    assert final is not None
    assert [c.call.name for c in calls] == ["add"]
    arguments = calls[0].call.parsed()
    assert isinstance(arguments, dict)
    assert set(arguments) == {"a", "b"}
    (tool_result,) = results
    assert not tool_result.is_error
    assert tool_result.message.text == str(arguments["a"] + arguments["b"])
    assert len(final.rounds) == 2
    assert final.rounds[1].tool_calls == 0


def _long_history(notes: int) -> list[Message]:
    history: list[Message] = []
    for index in range(notes):
        history.append(Message.user(f"Note {index}: " + "the quick brown fox jumps. " * 12))
        history.append(Message.assistant(f"Noted {index}."))
    return history


async def test_an_over_long_prompt_is_limited_again_after_the_servers_refusal(
    client: Client, llama_model: Model
) -> None:
    # The model's context_size is left unset, so threadline has no budget and
    # sends everything; the server refuses it as too long, and the run limits
    # the transcript to what the refusal said fits and retries once.
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
    # No budget before the refusal: the first step only counted; the retry's limited.
    assert record.limiting is not None
    assert record.limiting.budget_tokens is None
    assert record.budget_reason.startswith("no budget")
    assert record.retry_limiting is not None
    assert record.retry_limiting.dropped
    assert record.reported_input_tokens is not None
    assert llama_model.context_size is not None
    assert record.reported_input_tokens + 16 <= llama_model.context_size
    assert result.text.strip()


async def test_a_stream_the_server_ends_empty_fails_clearly(
    client: Client, llama_model: Model
) -> None:
    # llama-cpp-python answers an over-long *streamed* request with 200 and an
    # empty event stream (its error is raised inside the stream's generator).
    # The driver must say so, not hang or return an empty answer.
    request = (
        client.request()
        .with_model(Model(llama_model.name))
        .with_messages(_long_history(30))
        .with_prompt("Which note came last?")
        .with_max_output_tokens(16)
    )
    with pytest.raises(ProviderResponseError, match="stream ended before the response"):
        await _drain(request)


async def _drain(request: Request) -> None:
    async with request.stream() as events:
        async for _event in events:
            pass
