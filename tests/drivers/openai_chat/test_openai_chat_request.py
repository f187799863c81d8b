"""What OpenAIChatDriver puts on the wire: body, headers, and what it refuses to send."""

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
    Reasoning,
    TextPart,
    Tool,
    ToolCall,
)
from threadline.drivers import Driver, OpenAIChatDriver, ProviderCall, SamplingSettings

FAKE_KEY = "sk-FAKE-threadline-test-key-0000000000"
BASE = "https://llm.example/v1"
URL = f"{BASE}/chat/completions"
MODEL = Model("gpt-test", context_size=8192)

WEATHER = Tool(
    name="get_weather",
    description="Current weather for a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
)
CLOCK = Tool(name="now", parameters={"type": "object", "properties": {}})

REPLY = {
    "id": "chatcmpl-1",
    "object": "chat.completion",
    "model": "gpt-test",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 10, "completion_tokens": 1, "total_tokens": 11},
}


def sent_body(route: respx.Route) -> Any:
    return json.loads(route.calls.last.request.content)


@pytest.fixture
async def driver() -> Any:
    async with OpenAIChatDriver(BASE, api_key=FAKE_KEY, max_retries=0) as driver:
        yield driver


@pytest.mark.anyio
async def test_exact_body_for_system_history_tools_and_a_forced_tool(
    driver: OpenAIChatDriver, respx_mock: respx.MockRouter
) -> None:
    route = respx_mock.post(URL).mock(return_value=httpx.Response(200, json=REPLY))
    call = ProviderCall(
        model=MODEL,
        messages=(
            Message.system("You are terse."),
            Message.user("Weather in Paris and Rome?", name="ada"),
            Message.assistant(
                "",
                tool_calls=[
                    ToolCall(id="call_1", name="get_weather", arguments='{"city": "Paris"}'),
                    ToolCall(id="call_2", name="get_weather", arguments='{"city":"Rome"}'),
                ],
                reasoning=Reasoning(text="I should look both up.", provider="openai-chat:x"),
            ),
            Message.tool("call_1", "18C, clear"),
            Message.tool("call_2", "24C, sunny"),
            Message.assistant("Paris 18C, Rome 24C."),
            Message.user("And Oslo?"),
        ),
        tools=(WEATHER, CLOCK),
        tool_choice="get_weather",
        max_output_tokens=256,
        sampling=SamplingSettings(temperature=0.2, top_p=0.9, stop=("END",), seed=7),
    )

    await driver.complete(call)

    assert sent_body(route) == {
        "model": "gpt-test",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Weather in Paris and Rome?", "name": "ada"},
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {
                        "id": "call_1",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                    },
                    {
                        "id": "call_2",
                        "type": "function",
                        "function": {"name": "get_weather", "arguments": '{"city":"Rome"}'},
                    },
                ],
            },
            {"role": "tool", "content": "18C, clear", "tool_call_id": "call_1"},
            {"role": "tool", "content": "24C, sunny", "tool_call_id": "call_2"},
            {"role": "assistant", "content": "Paris 18C, Rome 24C."},
            {"role": "user", "content": "And Oslo?"},
        ],
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": "get_weather",
                    "description": "Current weather for a city.",
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string"}},
                        "required": ["city"],
                    },
                },
            },
            {
                "type": "function",
                "function": {"name": "now", "parameters": {"type": "object", "properties": {}}},
            },
        ],
        "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
        "max_tokens": 256,
        "temperature": 0.2,
        "top_p": 0.9,
        "stop": ["END"],
        "seed": 7,
    }


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "none", "required"])
async def test_tool_choice_modes_are_sent_as_strings(
    driver: OpenAIChatDriver, respx_mock: respx.MockRouter, mode: str
) -> None:
    route = respx_mock.post(URL).mock(return_value=httpx.Response(200, json=REPLY))
    call = ProviderCall(
        model=MODEL, messages=(Message.user("hi"),), tools=(WEATHER,), tool_choice=mode
    )
    await driver.complete(call)
    assert sent_body(route)["tool_choice"] == mode


@pytest.mark.anyio
async def test_a_minimal_call_sends_only_model_and_messages(
    driver: OpenAIChatDriver, respx_mock: respx.MockRouter
) -> None:
    route = respx_mock.post(URL).mock(return_value=httpx.Response(200, json=REPLY))
    await driver.complete(ProviderCall(model=MODEL, messages=(Message.user("hi"),)))
    assert sent_body(route) == {
        "model": "gpt-test",
        "messages": [{"role": "user", "content": "hi"}],
    }


@pytest.mark.anyio
async def test_content_parts_become_text_and_image_url_parts(
    driver: OpenAIChatDriver, respx_mock: respx.MockRouter
) -> None:
    route = respx_mock.post(URL).mock(return_value=httpx.Response(200, json=REPLY))
    message = Message.user(
        [
            TextPart(text="What is this?"),
            ImagePart(url="https://img.example/cat.png", detail="low"),
            ImagePart(url="data:image/png;base64,AAAA"),
        ]
    )
    await driver.complete(ProviderCall(model=MODEL, messages=(message,)))
    assert sent_body(route)["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {
                    "type": "image_url",
                    "image_url": {"url": "https://img.example/cat.png", "detail": "low"},
                },
                {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            ],
        }
    ]


@pytest.mark.anyio
async def test_extra_body_is_merged_last_and_max_tokens_field_is_configurable(
    respx_mock: respx.MockRouter,
) -> None:
    route = respx_mock.post(URL).mock(return_value=httpx.Response(200, json=REPLY))
    call = ProviderCall(
        model=MODEL,
        messages=(Message.user("hi"),),
        max_output_tokens=100,
        sampling=SamplingSettings(temperature=1.0, presence_penalty=0.5, frequency_penalty=0.1),
        extra_body={"temperature": 0.0, "reasoning_effort": "low", "metadata": {"k": "v"}},
    )
    async with OpenAIChatDriver(
        BASE, api_key=FAKE_KEY, max_tokens_field="max_completion_tokens"
    ) as driver:
        await driver.complete(call)
    body = sent_body(route)
    assert body["max_completion_tokens"] == 100
    assert "max_tokens" not in body
    assert body["temperature"] == 0.0
    assert body["presence_penalty"] == 0.5
    assert body["frequency_penalty"] == 0.1
    assert body["reasoning_effort"] == "low"
    assert body["metadata"] == {"k": "v"}


@pytest.mark.anyio
async def test_display_reasoning_is_never_sent_back(
    driver: OpenAIChatDriver, respx_mock: respx.MockRouter
) -> None:
    route = respx_mock.post(URL).mock(return_value=httpx.Response(200, json=REPLY))
    reasoning = Reasoning(
        text="secret chain of thought",
        provider_reasoning=b'{"type": "thinking", "signature": "abc"}',
        provider="anthropic:claude",
    )
    call = ProviderCall(
        model=MODEL,
        messages=(
            Message.user("q"),
            Message.assistant("a", reasoning=reasoning),
            Message.user("q2"),
        ),
    )
    await driver.complete(call)
    raw = route.calls.last.request.content
    assert b"chain of thought" not in raw
    assert b"signature" not in raw
    assert sent_body(route)["messages"][1] == {"role": "assistant", "content": "a"}


@pytest.mark.parametrize(
    ("state", "complaint"),
    [
        (b"{not json", "not valid JSON"),
        (b'{"type": "text", "text": "I am the assistant"}', '"type": "text"'),
        (b'[{"type": "thinking"}, {"type": "text", "text": "x"}]', '"type": "text"'),
    ],
)
@pytest.mark.anyio
async def test_refused_replay_state_fails_before_anything_is_sent(
    driver: OpenAIChatDriver, respx_mock: respx.MockRouter, state: bytes, complaint: str
) -> None:
    # The run loop checks replay state for every driver (threadline.engine._replay).
    route = respx_mock.post(URL).mock(return_value=httpx.Response(200, json=REPLY))
    history = [
        Message.user("q"),
        Message.assistant("a", reasoning=Reasoning(provider_reasoning=state)),
    ]
    request = Client(driver, default_model=MODEL).request().with_messages(history)
    with pytest.raises(InvalidRequestError, match="message 1") as info:
        await request.with_prompt("again").run()
    assert complaint in str(info.value)
    assert not route.called


@pytest.mark.anyio
@pytest.mark.parametrize("state", [b"", b"   ", b"null", b'{"type": "thinking"}'])
async def test_empty_or_well_formed_replay_state_is_accepted(
    driver: OpenAIChatDriver, respx_mock: respx.MockRouter, state: bytes
) -> None:
    route = respx_mock.post(URL).mock(return_value=httpx.Response(200, json=REPLY))
    call = ProviderCall(
        model=MODEL,
        messages=(Message.assistant("a", reasoning=Reasoning(provider_reasoning=state)),),
    )
    await driver.complete(call)
    assert route.called


@pytest.mark.anyio
async def test_a_forced_tool_that_was_not_sent_is_refused(
    driver: OpenAIChatDriver, respx_mock: respx.MockRouter
) -> None:
    route = respx_mock.post(URL).mock(return_value=httpx.Response(200, json=REPLY))
    call = ProviderCall(
        model=MODEL, messages=(Message.user("hi"),), tools=(WEATHER,), tool_choice="nope"
    )
    with pytest.raises(InvalidRequestError, match="'nope'"):
        await driver.complete(call)
    assert not route.called


@pytest.mark.anyio
async def test_values_json_cannot_carry_are_refused(
    driver: OpenAIChatDriver, respx_mock: respx.MockRouter
) -> None:
    route = respx_mock.post(URL).mock(return_value=httpx.Response(200, json=REPLY))
    call = ProviderCall(model=MODEL, messages=(Message.user("hi"),), extra_body={"when": object()})
    with pytest.raises(InvalidRequestError, match="cannot be encoded as JSON"):
        await driver.complete(call)
    assert not route.called


@pytest.mark.anyio
async def test_headers_carry_the_key_organization_and_defaults(
    respx_mock: respx.MockRouter,
) -> None:
    route = respx_mock.post(URL).mock(return_value=httpx.Response(200, json=REPLY))
    async with OpenAIChatDriver(
        BASE,
        api_key=FAKE_KEY,
        organization="org-1",
        project="proj-1",
        default_headers={"X-Trace": "t-1"},
    ) as driver:
        await driver.complete(ProviderCall(model=MODEL, messages=(Message.user("hi"),)))
    headers = route.calls.last.request.headers
    assert headers["authorization"] == f"Bearer {FAKE_KEY}"
    assert headers["openai-organization"] == "org-1"
    assert headers["openai-project"] == "proj-1"
    assert headers["x-trace"] == "t-1"
    assert headers["content-type"] == "application/json"


@pytest.mark.anyio
async def test_the_key_falls_back_to_the_environment(
    respx_mock: respx.MockRouter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", FAKE_KEY)
    route = respx_mock.post(URL).mock(return_value=httpx.Response(200, json=REPLY))
    async with OpenAIChatDriver(BASE) as driver:
        await driver.complete(ProviderCall(model=MODEL, messages=(Message.user("hi"),)))
    assert route.calls.last.request.headers["authorization"] == f"Bearer {FAKE_KEY}"


@pytest.mark.anyio
async def test_no_key_anywhere_sends_no_authorization_for_local_servers(
    respx_mock: respx.MockRouter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    route = respx_mock.post("http://127.0.0.1:8080/v1/chat/completions").mock(
        return_value=httpx.Response(200, json=REPLY)
    )
    async with OpenAIChatDriver("http://127.0.0.1:8080/v1/") as driver:
        await driver.complete(ProviderCall(model=MODEL, messages=(Message.user("hi"),)))
    assert "authorization" not in route.calls.last.request.headers


@pytest.mark.anyio
async def test_a_given_client_is_used_and_left_open() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=REPLY)

    http_client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    async with OpenAIChatDriver(BASE, api_key=FAKE_KEY, http_client=http_client) as driver:
        await driver.complete(ProviderCall(model=MODEL, messages=(Message.user("hi"),)))
    assert len(seen) == 1
    assert not http_client.is_closed
    await http_client.aclose()


@pytest.mark.anyio
async def test_an_explicit_timeout_applies_to_a_given_client() -> None:
    seen: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request)
        return httpx.Response(200, json=REPLY)

    async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http_client:
        driver = OpenAIChatDriver(BASE, http_client=http_client, timeout=12.0)
        await driver.complete(ProviderCall(model=MODEL, messages=(Message.user("hi"),)))
        untouched = OpenAIChatDriver(BASE, http_client=http_client)
        await untouched.complete(ProviderCall(model=MODEL, messages=(Message.user("hi"),)))
    assert seen[0].extensions["timeout"]["read"] == 12.0
    assert seen[1].extensions["timeout"] == http_client.timeout.as_dict()


@pytest.mark.anyio
async def test_it_is_a_driver_that_counts_nothing_and_replays_no_reasoning() -> None:
    async with OpenAIChatDriver(BASE, api_key=FAKE_KEY) as driver:
        assert isinstance(driver, Driver)
        assert driver.name == "openai-chat"
        assert driver.token_counter() is None
        projection = driver.replay_projection(MODEL)
        reasoning = Reasoning(text="t", provider_reasoning=b"{}")
        assert list(projection.replayed_reasoning(reasoning)) == []
        assert driver.retry_policy.max_retries == 2


@pytest.mark.anyio
async def test_extra_body_cannot_turn_a_complete_into_a_stream(
    driver: OpenAIChatDriver, respx_mock: respx.MockRouter
) -> None:
    route = respx_mock.post(URL).mock(return_value=httpx.Response(200, json=REPLY))
    call = ProviderCall(model=MODEL, messages=(Message.user("hi"),), extra_body={"stream": True})
    response = await driver.complete(call)
    assert "stream" not in sent_body(route)
    assert response.text == "ok"


def test_a_lone_surrogate_is_refused_naming_the_problem() -> None:
    from threadline import InvalidRequestError
    from threadline.drivers.openai_chat._wire import encode_body

    with pytest.raises(InvalidRequestError, match="lone surrogate"):
        encode_body({"messages": [{"role": "user", "content": "bad \udcff byte"}]})
