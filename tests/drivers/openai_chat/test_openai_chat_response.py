"""Reading whole Chat Completions answers, and refusing ones that break the protocol."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import respx

from threadline import (
    Message,
    Model,
    Origin,
    ProviderResponseError,
    ProviderUnavailableError,
    Reasoning,
    Role,
    ToolCall,
    Usage,
)
from threadline.drivers import OpenAIChatDriver, ProviderCall

BASE = "https://llm.example/v1"
URL = f"{BASE}/chat/completions"
CALL = ProviderCall(model=Model("deepseek-r1"), messages=(Message.user("hi"),))


def completion(message: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "deepseek-r1-2025",
        "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
        **extra,
    }


@pytest.fixture
async def driver() -> Any:
    async with OpenAIChatDriver(BASE, api_key=None, max_retries=0) as driver:
        yield driver


@pytest.mark.anyio
async def test_text_reasoning_usage_and_request_id_are_read(
    driver: OpenAIChatDriver, respx_mock: respx.MockRouter
) -> None:
    body = completion(
        {"role": "assistant", "content": "42", "reasoning_content": "6 times 7."},
        usage={
            "prompt_tokens": 120,
            "completion_tokens": 30,
            "total_tokens": 150,
            "prompt_tokens_details": {"cached_tokens": 64},
            "completion_tokens_details": {"reasoning_tokens": 25},
        },
    )
    respx_mock.post(URL).mock(
        return_value=httpx.Response(200, json=body, headers={"x-request-id": "req_abc"})
    )
    response = await driver.complete(CALL)
    assert response.message.role is Role.ASSISTANT
    assert response.message.origin is Origin.TURN
    assert response.text == "42"
    assert response.message.reasoning == Reasoning(
        text="6 times 7.", provider="openai-chat:deepseek-r1"
    )
    assert not response.message.reasoning.has_provider_reasoning()
    assert response.usage == Usage(
        input_tokens=120, output_tokens=30, cached_input_tokens=64, reasoning_tokens=25
    )
    assert response.finish_reason == "stop"
    assert response.model == "deepseek-r1-2025"
    assert response.request_id == "req_abc"
    assert response.response_id == "chatcmpl-1"
    assert response.request_id == "req_abc"


@pytest.mark.anyio
async def test_tool_calls_are_read_with_arguments_kept_verbatim(
    driver: OpenAIChatDriver, respx_mock: respx.MockRouter
) -> None:
    body = completion(
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{ "city" : "Paris" }'},
                },
                {  # a server that sends decoded arguments and no id
                    "type": "function",
                    "function": {"name": "now", "arguments": {"tz": "UTC"}},
                },
            ],
        }
    )
    body["choices"][0]["finish_reason"] = "tool_calls"
    respx_mock.post(URL).mock(return_value=httpx.Response(200, json=body))
    response = await driver.complete(CALL)
    assert response.text == ""
    assert response.finish_reason == "tool_calls"
    first, second = response.message.tool_calls
    assert first == ToolCall(id="call_a", name="get_weather", arguments='{ "city" : "Paris" }')
    assert (second.name, second.arguments) == ("now", '{"tz": "UTC"}')
    # An id the server left out is invented, and never repeats across responses:
    # a run sends every round's calls back, so a positional id would collide.
    assert second.id.startswith("call_")
    respx_mock.post(URL).mock(return_value=httpx.Response(200, json=body))
    again = await driver.complete(CALL)
    assert again.message.tool_calls[1].id != second.id


@pytest.mark.anyio
async def test_missing_optional_parts_get_sensible_defaults(
    driver: OpenAIChatDriver, respx_mock: respx.MockRouter
) -> None:
    body = {"choices": [{"message": {"content": [{"type": "text", "text": "a"}, {"text": "b"}]}}]}
    respx_mock.post(URL).mock(return_value=httpx.Response(200, json=body))
    response = await driver.complete(CALL)
    assert response.text == "ab"
    assert response.usage == Usage()
    assert response.model == "deepseek-r1"
    assert response.finish_reason == "stop"
    assert response.message.reasoning is None


@pytest.mark.anyio
async def test_the_reasoning_field_is_read_too(
    driver: OpenAIChatDriver, respx_mock: respx.MockRouter
) -> None:
    body = completion({"role": "assistant", "content": "x", "reasoning": "thought"})
    respx_mock.post(URL).mock(return_value=httpx.Response(200, json=body))
    response = await driver.complete(CALL)
    assert response.message.reasoning is not None
    assert response.message.reasoning.text == "thought"


MALFORMED = [
    pytest.param(b"<html>oops</html>", "not JSON", id="not json"),
    pytest.param(b"[]", "the response should be a JSON object", id="a list"),
    pytest.param(b"{}", "no choices", id="no choices"),
    pytest.param(json.dumps({"choices": []}).encode(), "no choices", id="empty choices"),
    pytest.param(json.dumps({"choices": ["x"]}).encode(), "choices[0]", id="choice not object"),
    pytest.param(json.dumps({"choices": [{}]}).encode(), "choices[0].message", id="no message"),
    pytest.param(
        json.dumps({"choices": [{"message": {"content": 3}}]}).encode(),
        "choices[0].message.content",
        id="content not text",
    ),
    pytest.param(
        json.dumps({"choices": [{"message": {"tool_calls": {"id": 1}}}]}).encode(),
        "choices[0].message.tool_calls should be a list",
        id="tool_calls not list",
    ),
    pytest.param(
        json.dumps({"choices": [{"message": {"tool_calls": [{"function": {}}]}}]}).encode(),
        "choices[0].message.tool_calls[0].function.name is missing",
        id="tool without name",
    ),
    pytest.param(
        json.dumps(
            {"choices": [{"message": {"tool_calls": [{"function": {"name": 5}}]}}]}
        ).encode(),
        "tool_calls[0].function.name should be a string",
        id="tool name not text",
    ),
    pytest.param(
        json.dumps(
            {"choices": [{"message": {"content": "x"}}], "usage": {"prompt_tokens": "ten"}}
        ).encode(),
        "usage.prompt_tokens should be a token count",
        id="usage not int",
    ),
    pytest.param(
        json.dumps({"choices": [{"message": {}, "finish_reason": 1}]}).encode(),
        "choices[0].finish_reason should be a string",
        id="finish reason not text",
    ),
]


@pytest.mark.anyio
@pytest.mark.parametrize(("raw", "complaint"), MALFORMED)
async def test_malformed_answers_raise_a_clear_response_error(
    driver: OpenAIChatDriver, respx_mock: respx.MockRouter, raw: bytes, complaint: str
) -> None:
    respx_mock.post(URL).mock(
        return_value=httpx.Response(200, content=raw, headers={"x-request-id": "req_m"})
    )
    with pytest.raises(ProviderResponseError) as info:
        await driver.complete(CALL)
    assert complaint in str(info.value)
    assert info.value.request_id == "req_m"
    assert info.value.__cause__ is None


@pytest.mark.anyio
async def test_an_error_object_with_status_200_is_mapped(
    driver: OpenAIChatDriver, respx_mock: respx.MockRouter
) -> None:
    body = {"error": {"message": "upstream overloaded", "type": "server_error"}}
    respx_mock.post(URL).mock(return_value=httpx.Response(200, json=body))
    with pytest.raises(ProviderUnavailableError, match="upstream overloaded"):
        await driver.complete(CALL)
