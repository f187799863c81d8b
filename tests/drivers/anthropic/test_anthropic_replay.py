"""AnthropicDriver checks the thinking it replays, whoever calls it."""

from __future__ import annotations

import json

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
)
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
    assert THINKING_REPLAY.blocks == {"thinking", "redacted_thinking"}
    assert THINKING_REPLAY.scope is ReplayScope.OPEN_TOOL_CYCLE
