"""What AnthropicDriver sends: system, merged turns, tools, tool choice, thinking replay."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import respx

from threadline import (
    Client,
    ImagePart,
    InvalidRequestError,
    Message,
    Model,
    Origin,
    Reasoning,
    TextPart,
    ToolCall,
    tool,
)
from threadline.drivers import AnthropicDriver, ProviderCall, SamplingSettings
from threadline.drivers.anthropic import Thinking

pytestmark = pytest.mark.anyio

BASE = "https://anthropic.example"
URL = f"{BASE}/v1/messages"
MODEL = Model("claude-test")
LABEL = "anthropic:claude-test"
OK = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "claude-test-2025",
    "content": [{"type": "text", "text": "ok"}],
    "stop_reason": "end_turn",
    "usage": {"input_tokens": 3, "output_tokens": 1},
}
THINKING = (
    b'[{"type":"thinking","thinking":"Paris is the capital.","signature":"EqQBCkYIBx=="},'
    b'{"type":"redacted_thinking","data":"EmwKAhgB"}]'
)


@tool
def get_weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: the city's name.
    """
    return "sunny"


async def sent_body(call: ProviderCall, **driver_args: Any) -> dict[str, Any]:
    # The translation itself; the cache breakpoints are tested in test_anthropic_cache.py.
    driver_args.setdefault("prompt_caching", False)
    with respx.mock(assert_all_called=True) as mock:
        route = mock.post(URL).mock(return_value=httpx.Response(200, json=OK))
        async with AnthropicDriver(base_url=BASE, api_key="sk-ant-test-key", **driver_args) as d:
            await d.complete(call)
    request = route.calls.last.request
    assert request.headers["x-api-key"] == "sk-ant-test-key"
    assert request.headers["anthropic-version"] == "2023-06-01"
    body: dict[str, Any] = json.loads(request.content)
    return body


def exchange(reasoning: Reasoning | None, call_id: str = "toolu_1") -> list[Message]:
    return [
        Message.assistant(
            "Let me look.",
            tool_calls=[ToolCall(id=call_id, name="get_weather", arguments='{"city": "Paris"}')],
            reasoning=reasoning,
        ),
        Message.tool(call_id, "sunny"),
    ]


async def test_system_is_top_level_and_same_role_messages_merge_into_one_turn() -> None:
    messages = (
        Message.system("Be terse."),
        Message.user("one"),
        Message.user([TextPart(text="two"), ImagePart(url="data:image/png;base64,iVBOR")]),
        Message.assistant("three"),
    )
    body = await sent_body(ProviderCall(model=MODEL, messages=(*messages, Message.user("four"))))

    assert body["system"] == [{"type": "text", "text": "Be terse."}]
    assert body["max_tokens"] == 4096
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "one"},
                {"type": "text", "text": "two"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "iVBOR"},
                },
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "three"}]},
        {"role": "user", "content": [{"type": "text", "text": "four"}]},
    ]


async def test_a_tool_exchange_is_tool_use_then_one_user_turn_of_results_with_is_error() -> None:
    messages = (
        Message.user("weather?"),
        Message.assistant(
            tool_calls=[
                ToolCall(id="toolu_a", name="get_weather", arguments='{"city": "Paris"}'),
                ToolCall(id="toolu_b", name="get_weather", arguments='{"city": "Oslo"}'),
            ]
        ),
        Message.tool("toolu_a", "sunny"),
        Message.tool("toolu_b", "error: the weather service is down"),
    )
    body = await sent_body(
        ProviderCall(model=MODEL, messages=messages, tools=(get_weather,), tool_choice="required")
    )

    assert body["messages"][1] == {
        "role": "assistant",
        "content": [
            {
                "type": "tool_use",
                "id": "toolu_a",
                "name": "get_weather",
                "input": {"city": "Paris"},
            },
            {"type": "tool_use", "id": "toolu_b", "name": "get_weather", "input": {"city": "Oslo"}},
        ],
    }
    assert body["messages"][2] == {
        "role": "user",
        "content": [
            {"type": "tool_result", "tool_use_id": "toolu_a", "content": "sunny"},
            {
                "type": "tool_result",
                "tool_use_id": "toolu_b",
                "content": "error: the weather service is down",
                "is_error": True,
            },
        ],
    }
    (declared,) = body["tools"]
    assert declared["name"] == "get_weather"
    assert declared["description"].startswith("The weather in a city")
    assert declared["input_schema"]["properties"]["city"]["type"] == "string"
    assert body["tool_choice"] == {"type": "any"}


@pytest.mark.parametrize(
    ("choice", "wire"),
    [
        ("auto", {"type": "auto"}),
        ("none", {"type": "none"}),
        ("required", {"type": "any"}),
        ("get_weather", {"type": "tool", "name": "get_weather"}),
    ],
)
async def test_tool_choice_maps_threadlines_values(choice: str, wire: dict[str, str]) -> None:
    call = ProviderCall(
        model=MODEL, messages=(Message.user("hi"),), tools=(get_weather,), tool_choice=choice
    )
    assert (await sent_body(call))["tool_choice"] == wire


async def test_a_forced_tool_that_was_not_sent_is_refused_before_sending() -> None:
    call = ProviderCall(
        model=MODEL, messages=(Message.user("hi"),), tools=(get_weather,), tool_choice="nope"
    )
    async with AnthropicDriver(base_url=BASE, api_key="k") as driver:
        with pytest.raises(InvalidRequestError, match="'nope'"):
            await driver.complete(call)


async def test_sampling_and_stop_sequences_map_and_openai_only_options_are_left_out() -> None:
    sampling = SamplingSettings(temperature=0.5, top_p=0.9, stop=("END",), seed=7)
    call = ProviderCall(
        model=MODEL, messages=(Message.user("hi"),), sampling=sampling, max_output_tokens=64
    )
    body = await sent_body(call)
    assert (body["temperature"], body["top_p"], body["stop_sequences"]) == (0.5, 0.9, ["END"])
    assert body["max_tokens"] == 64
    assert "seed" not in body


async def test_thinking_of_the_open_tool_use_cycle_is_sent_byte_for_byte_first() -> None:
    messages = (
        Message.user("weather?"),
        *exchange(Reasoning(text="t", provider_reasoning=THINKING, provider=LABEL)),
    )
    with respx.mock() as mock:
        route = mock.post(URL).mock(return_value=httpx.Response(200, json=OK))
        async with AnthropicDriver(base_url=BASE, api_key="k") as driver:
            await driver.complete(ProviderCall(model=MODEL, messages=messages))
    raw = route.calls.last.request.content
    assert THINKING[1:-1] + b',{"type":"text","text":"Let me look."}' in raw
    assistant = json.loads(raw)["messages"][1]["content"]
    assert [block["type"] for block in assistant] == [
        "thinking",
        "redacted_thinking",
        "text",
        "tool_use",
    ]


async def test_thinking_of_earlier_turns_is_left_out() -> None:
    signed = Reasoning(text="t", provider_reasoning=THINKING, provider=LABEL)
    messages = (
        Message.user("weather?"),
        *exchange(signed),
        Message.assistant("Sunny.", reasoning=signed),
        Message.user("and tomorrow?"),
    )
    body = await sent_body(ProviderCall(model=MODEL, messages=messages))
    blocks = [block for turn in body["messages"] for block in turn["content"]]
    assert all(block["type"] not in ("thinking", "redacted_thinking") for block in blocks)


@pytest.mark.parametrize("provider", ["openai-chat:gpt-4o", "anthropic:another-model", None])
async def test_reasoning_of_another_provider_or_model_is_never_sent_and_is_noted(
    provider: str | None, caplog: pytest.LogCaptureFixture
) -> None:
    messages = (
        Message.user("weather?"),
        *exchange(Reasoning(text="t", provider_reasoning=THINKING, provider=provider)),
    )
    caplog.set_level("INFO", logger="threadline.drivers.anthropic")
    body = await sent_body(ProviderCall(model=MODEL, messages=messages))
    assert [b["type"] for b in body["messages"][1]["content"]] == ["text", "tool_use"]
    assert any("message 1: reasoning from" in record.message for record in caplog.records)


async def test_refused_replay_state_fails_before_sending(respx_mock: respx.MockRouter) -> None:
    # The run loop checks replay state for every driver (threadline.engine._replay).
    route = respx_mock.post(URL).mock(return_value=httpx.Response(200, json=OK))
    bad = Reasoning(text="t", provider_reasoning=b'{"type": "text", "text": "x"}', provider=LABEL)
    async with AnthropicDriver(base_url=BASE, api_key="k") as driver:
        request = Client(driver, default_model=MODEL).request()
        request = request.with_messages([Message.user("q"), *exchange(bad)])
        with pytest.raises(InvalidRequestError, match='"type": "text"'):
            await request.run()
    assert not route.called


async def test_thinking_config_from_the_driver_or_the_request_and_its_budget_checked() -> None:
    call = ProviderCall(model=MODEL, messages=(Message.user("hi"),), max_output_tokens=4000)
    body = await sent_body(call, thinking=Thinking.enabled(2048))
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 2048}

    adaptive = ProviderCall(
        model=MODEL, messages=(Message.user("hi"),), extra_body={"thinking": Thinking.adaptive()}
    )
    assert (await sent_body(adaptive, thinking=Thinking.enabled(2048)))["thinking"] == {
        "type": "adaptive"
    }

    with pytest.raises(InvalidRequestError, match=">= 1024"):
        Thinking.enabled(512)
    too_big = ProviderCall(
        model=MODEL,
        messages=(Message.user("hi"),),
        max_output_tokens=2000,
        extra_body={"thinking": {"type": "enabled", "budget_tokens": 2048}},
    )
    async with AnthropicDriver(base_url=BASE, api_key="k") as driver:
        with pytest.raises(InvalidRequestError, match="below max_tokens"):
            await driver.complete(too_big)


async def test_environment_supplies_key_and_base_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-from-env")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "https://proxy.example/")
    with respx.mock() as mock:
        route = mock.post("https://proxy.example/v1/messages").mock(
            return_value=httpx.Response(200, json=OK)
        )
        async with AnthropicDriver() as driver:
            assert "sk-ant-from-env" not in repr(driver)
            await driver.complete(ProviderCall(model=MODEL, messages=(Message.user("hi"),)))
    assert route.calls.last.request.headers["x-api-key"] == "sk-ant-from-env"


async def test_a_reply_with_origin_is_sent_the_same_as_any_other() -> None:
    message = Message.assistant("hello", origin=Origin.TURN)
    body = await sent_body(
        ProviderCall(model=MODEL, messages=(Message.user("hi"), message, Message.user("bye")))
    )
    assert body["messages"][1] == {
        "role": "assistant",
        "content": [{"type": "text", "text": "hello"}],
    }


def test_the_message_cache_keeps_only_long_histories_and_changes_no_byte() -> None:
    # The driver's per-message JSON cache is private to its room: tested here, at the encoder.
    from threadline.drivers._http._wire import JSONCache
    from threadline.drivers.anthropic._request import encode_message_blocks, encode_request

    def call(count: int) -> ProviderCall:
        turns = [
            Message.user(f"q{i}") if i % 2 == 0 else Message.assistant(f"a{i}")
            for i in range(count)
        ]
        return ProviderCall(model=MODEL, messages=(Message.system("Be brief."), *turns))

    for count, kept in ((8, 0), (9, 9)):
        cache = JSONCache(encode_message_blocks, min_messages=10)
        args: dict[str, Any] = {"stream": False, "label": LABEL, "default_max_tokens": 64}
        cached = encode_request(call(count), cache=cache, **args)
        assert cached.body == encode_request(call(count), **args).body
        assert len(cache) == kept  # nine turns and the system message make ten


async def test_an_image_a_tool_returned_goes_in_its_tool_result() -> None:
    messages = (
        Message.user("Show me the chart."),
        Message.assistant(tool_calls=[ToolCall(id="toolu_a", name="chart")]),
        Message(
            role="tool",
            tool_call_id="toolu_a",
            content=(TextPart(text="the chart:"), ImagePart(url="data:image/png;base64,AAAA")),
        ),
    )
    body = await sent_body(ProviderCall(model=MODEL, messages=messages))
    assert body["messages"][2]["content"] == [
        {
            "type": "tool_result",
            "tool_use_id": "toolu_a",
            "content": [
                {"type": "text", "text": "the chart:"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
                },
            ],
        }
    ]
    assert AnthropicDriver(api_key="k").tool_result_images(MODEL)
