"""The upstream llama.cpp server's own count (``/apply-template``, ``/tokenize``) is the
``prompt_tokens`` it then reports, for plain turns, other scripts, tools and tool exchanges;
and limiting asks it near the budget, so a budget at the window's edge is never refused."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence

import pytest

from threadline import Client, Message, Model, Tool, ToolCall
from threadline.counting import AsyncTokenCounter, TokenCalibration
from threadline.drivers import OpenAIChatDriver, ProviderCall, SamplingSettings

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

LOOKUP = Tool(
    name="lookup_word",
    description="Look a word up in a bilingual dictionary.",
    parameters={
        "type": "object",
        "properties": {"word": {"type": "string"}, "language": {"type": "string"}},
        "required": ["word"],
    },
)
EXCHANGE = [
    Message.user("What does вокзал mean?"),
    Message.assistant(
        tool_calls=[ToolCall(id="call-1", name="lookup_word", arguments='{"word": "вокзал"}')]
    ),
    Message.tool("call-1", "вокзал — железнодорожная станция; 駅 in Japanese."),
]


@pytest.fixture
async def driver(llama_server_upstream: str) -> AsyncIterator[OpenAIChatDriver]:
    async with OpenAIChatDriver(
        f"{llama_server_upstream}/v1",
        api_key="not-needed",
        max_retries=1,
        exact_counting="llama.cpp",
    ) as driver:
        yield driver


async def reported(
    driver: OpenAIChatDriver,
    model: Model,
    messages: Sequence[Message],
    tools: Sequence[Tool] = (),
    choice: str | None = None,
) -> int:
    call = ProviderCall(
        model=model,
        messages=tuple(messages),
        tools=tuple(tools),
        tool_choice=choice,
        max_output_tokens=4,
        sampling=SamplingSettings(temperature=0),
    )
    response = await driver.complete(call)
    return response.usage.input_tokens


@pytest.mark.parametrize(
    ("messages", "tools", "choice"),
    [
        pytest.param([Message.user("Name a colour.")], (), None, id="plain"),
        pytest.param(
            [
                Message.system("Answer briefly."),
                Message.user("東京でおすすめの朝ごはんは？"),  # noqa: RUF001 - Japanese punctuation
                Message.assistant("Попробуйте онигири и мисо-суп."),
                Message.user("def f(x):\n    return {k: v for k, v in x.items()}"),
            ],
            (),
            None,
            id="scripts-and-code",
        ),
        pytest.param([Message.user("Look up 駅.")], (LOOKUP,), "required", id="tools-offered"),
        pytest.param(EXCHANGE, (), None, id="tool-exchange"),
    ],
)
async def test_the_count_is_what_the_server_reports(
    driver: OpenAIChatDriver,
    llama_model: Model,
    messages: list[Message],
    tools: tuple[Tool, ...],
    choice: str | None,
) -> None:
    counter = driver.exact_token_counter(llama_model)
    assert isinstance(counter, AsyncTokenCounter)
    exact = await counter.count(messages, tools)
    assert exact == await reported(driver, llama_model, messages, tools, choice)


class Counting:
    def __init__(self, counter: AsyncTokenCounter) -> None:
        self.counter = counter
        self.calls = 0

    async def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        self.calls += 1
        return await self.counter.count(messages, tools)


async def test_a_budget_at_the_windows_edge_is_kept_by_the_servers_own_count(
    driver: OpenAIChatDriver, llama_model: Model
) -> None:
    # Russian costs SmolLM2 about three times what it costs o200k: limiting on the
    # estimate alone sends far more than the window holds.
    history: list[Message] = []
    for n in range(30):
        history.append(Message.user(f"Вопрос {n}: сколько стоит билет на поезд до Казани?"))
        history.append(Message.assistant(f"Ответ {n}: около двух тысяч рублей в плацкарте."))
    counter = driver.exact_token_counter(llama_model)
    assert counter is not None
    counting = Counting(counter)
    client = Client(
        driver,
        default_model=llama_model,
        exact_token_counter=counting,
        calibration=TokenCalibration(),
    )
    result = await (
        client.request()
        .with_messages(history)
        .with_prompt("И последний вопрос: где купить билет?")
        .with_output_reserve_tokens(40)
        .with_max_output_tokens(8)
        .with_temperature(0)
        .run()
    )
    (record,) = result.rounds
    assert not record.context_retry
    assert counting.calls == 1
    assert record.limiting is not None
    assert record.limiting.counted_by == "exact"
    assert record.reported_input_tokens is not None
    assert record.reported_input_tokens <= llama_model.context_size - 40  # type: ignore[operator]
    assert record.limiting.dropped
