"""AnthropicDriver checks the thinking it replays, whoever calls it, and counts what it sends."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import httpx
import pytest
import respx

from threadline import (
    Client,
    InvalidRequestError,
    Message,
    Model,
    Reasoning,
    ToolCall,
    tool,
)
from threadline.counting import BuiltinTokenCounter
from threadline.drivers import AnthropicDriver, ProviderCall, ReplayScope
from threadline.drivers.anthropic import THINKING_REPLAY

pytestmark = pytest.mark.anyio

BASE = "https://anthropic.example"
URL = f"{BASE}/v1/messages"
MODEL = Model("claude-test", context_size=200_000)
LABEL = "anthropic:claude-test"
OK = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-test",
    "content": [{"type": "text", "text": "ok"}],
    "stop_reason": "end_turn",
    "usage": {"input_tokens": 3, "output_tokens": 1},
}

# Stored state the driver must never put in a body: blocks it does not replay, and
# bytes that would leave the body no longer JSON once spliced into it.
REFUSED = [
    (b'{"type": "text", "text": "I am the assistant"}', '{"type": "text"} block'),
    (
        b'[{"type": "thinking", "thinking": "t", "signature": "s"},'
        b' {"type": "tool_use", "id": "toolu_9", "name": "rm", "input": {}}]',
        '{"type": "tool_use"} block at position 1',
    ),
    (b'["just a string"]', "a string"),
    (b'[{"thinking": "no type"}]', "a block without a type"),
    (b'{"type": "thinking", "thinking": "t"} trailing bytes', "not valid JSON"),
    (b'[{"type": "thinking", "thinking": "t"}, oops]', "not valid JSON"),
    (b'[{"type": "thinking", "thinking": NaN}]', "not valid JSON"),
    (b'[{"type": "thinking", "thinking": "\xff"}]', "not valid JSON"),
]


def exchange(reasoning: Reasoning) -> list[Message]:
    return [
        Message.user("weather?"),
        Message.assistant(
            "Let me look.",
            tool_calls=[ToolCall(id="toolu_1", name="get_weather", arguments='{"city": "Paris"}')],
            reasoning=reasoning,
        ),
        Message.tool("toolu_1", "sunny"),
    ]


@pytest.mark.parametrize(("state", "complaint"), REFUSED)
async def test_a_driver_called_directly_refuses_replay_state_it_would_send(
    state: bytes, complaint: str, respx_mock: respx.MockRouter
) -> None:
    route = respx_mock.post(URL).mock(return_value=httpx.Response(200, json=OK))
    call = ProviderCall(
        model=MODEL, messages=tuple(exchange(Reasoning(provider_reasoning=state, provider=LABEL)))
    )
    async with AnthropicDriver(base_url=BASE, api_key="k") as driver:
        with pytest.raises(InvalidRequestError, match="message 1") as info:
            await driver.complete(call)
        assert complaint in str(info.value)
        with pytest.raises(InvalidRequestError, match="message 1"):
            async with driver.stream(call):
                pass
        with pytest.raises(InvalidRequestError, match="message 1"):
            await driver.exact_token_counter(MODEL).count(call.messages)
    assert not route.called


async def test_the_run_loop_refuses_a_stored_tool_use_block_before_sending(
    respx_mock: respx.MockRouter,
) -> None:
    route = respx_mock.post(URL).mock(return_value=httpx.Response(200, json=OK))
    state = b'[{"type": "tool_use", "id": "toolu_9", "name": "rm", "input": {}}]'
    history = exchange(Reasoning(provider_reasoning=state, provider=LABEL))
    async with AnthropicDriver(base_url=BASE, api_key="k") as driver:
        request = Client(driver, default_model=MODEL).request().with_messages(history)
        with pytest.raises(InvalidRequestError, match=r'message 1: .*\{"type": "tool_use"\}'):
            await request.run()
    assert not route.called


async def test_state_the_driver_never_sends_is_not_refused_by_its_allow_list(
    respx_mock: respx.MockRouter,
) -> None:
    # An earlier turn's blocks, or another provider's items, are left out, not checked.
    route = respx_mock.post(URL).mock(return_value=httpx.Response(200, json=OK))
    odd = b'[{"type": "reasoning", "id": "rs_1", "encrypted_content": "gAAA"}]'
    history = [
        *exchange(Reasoning(provider_reasoning=odd, provider=LABEL)),
        Message.assistant("Sunny."),
        Message.user("and Lisbon?"),
        Message.assistant("Also sunny.", reasoning=Reasoning(provider_reasoning=odd)),
    ]
    async with AnthropicDriver(base_url=BASE, api_key="k") as driver:
        request = Client(driver, default_model=MODEL).request().with_messages(history)
        await request.with_prompt("thanks").run()
    body = json.loads(route.calls.last.request.content)
    assert b"encrypted_content" not in route.calls.last.request.content
    assert [block["text"] for block in body["messages"][-1]["content"]] == ["thanks"]


def test_the_driver_declares_its_rules_as_data() -> None:
    driver = AnthropicDriver(base_url=BASE, api_key="k")
    assert driver.replay_rules(MODEL) is THINKING_REPLAY
    assert driver.replay_projection(MODEL) is THINKING_REPLAY
    assert THINKING_REPLAY.blocks == {"thinking", "redacted_thinking", "compaction"}
    assert THINKING_REPLAY.scope is ReplayScope.OPEN_TOOL_CYCLE
    assert THINKING_REPLAY.kept == {"compaction"}  # sent every turn, whatever the scope


@tool
def get_weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: the city's name.
    """
    return "sunny"


THOUGHT = " ".join(f"step{n} of reasoning about the weather" for n in range(40))
SIGNED = [
    {"type": "thinking", "thinking": THOUGHT, "signature": "EqQBCkYIBxgCKkA" * 8},
    {"type": "redacted_thinking", "data": "EmwKAhgBEgy3va" * 8},
]


def without_reasoning(messages: Sequence[Message]) -> list[Message]:
    return [attrs.evolve(m, reasoning=None) for m in messages]


def answering(sent: list[dict[str, Any]]) -> Callable[[httpx.Request], httpx.Response]:
    def answer(request: httpx.Request) -> httpx.Response:
        body = json.loads(request.content)
        sent.append(body)
        if body["messages"][-1]["content"][-1].get("text") != "Weather in Paris?":
            return httpx.Response(200, json=OK)
        call = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "P"}}
        reply = {**OK, "content": [*SIGNED, call], "stop_reason": "tool_use"}
        return httpx.Response(200, json=reply)

    return answer


async def test_the_signed_thinking_sent_in_the_open_cycle_is_counted(
    respx_mock: respx.MockRouter,
) -> None:
    sent: list[dict[str, Any]] = []
    respx_mock.post(URL).mock(side_effect=answering(sent))
    counter = BuiltinTokenCounter()
    async with AnthropicDriver(base_url=BASE, api_key="k") as driver:
        client = Client(driver, default_model=MODEL, token_counter=counter)
        request = client.request().with_prompt("Weather in Paris?").with_tools([get_weather])
        result = await request.run()
    # The second call replayed the signed thinking first in the assistant's turn...
    assert sent[1]["messages"][1]["content"][:2] == SIGNED
    first, second = result.rounds
    handed = result.messages[:3]  # the prompt, the reply that called, the result
    thinking = counter.count([Message.user(THOUGHT)]) - counter.count([Message.user("")])
    # ...and the estimate, the ledger and the record count it.
    without = without_reasoning(handed)
    assert second.estimated_input_tokens >= counter.count(without, [get_weather]) + thinking
    assert second.limiting is not None
    assert second.limiting.tokens_after == second.estimated_input_tokens
    assert first.estimated_input_tokens == counter.count(handed[:1], [get_weather])


async def test_thinking_of_earlier_turns_costs_nothing_as_it_is_not_sent(
    respx_mock: respx.MockRouter,
) -> None:
    sent: list[dict[str, Any]] = []
    respx_mock.post(URL).mock(side_effect=answering(sent))
    counter = BuiltinTokenCounter()
    async with AnthropicDriver(base_url=BASE, api_key="k") as driver:
        client = Client(driver, default_model=MODEL, token_counter=counter)
        request = client.request().with_prompt("Weather in Paris?").with_tools([get_weather])
        done = await request.run()
        again = await client.request().with_messages(done.messages).with_prompt("thanks").run()
    history = without_reasoning([*done.messages, Message.user("thanks")])
    assert again.rounds[0].estimated_input_tokens == counter.count(history)
    assert all(
        block["type"] != "thinking" for turn in sent[2]["messages"] for block in turn["content"]
    )
    assert again.messages[1].reasoning == done.messages[1].reasoning  # the transcript keeps it
