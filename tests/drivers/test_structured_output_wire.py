"""Structured output on the Responses, Anthropic and Gemini wires: the field each sends the
schema in, and the refused or cut-off answer each reads back as one."""

from __future__ import annotations

import json
from typing import Any

import attrs
import httpx
import pytest
import respx

from threadline import Client, Model
from threadline.drivers import AnthropicDriver, OpenAIResponsesDriver
from threadline.drivers.gemini import GeminiDriver
from threadline.tools import OutputValidationError

pytestmark = pytest.mark.anyio

RESPONSES = "https://responses.example/v1"
ANTHROPIC = "https://anthropic.example"
GEMINI = "https://gemini.example/v1beta"
MODEL = Model("model-test", context_size=8192, max_output_tokens=1024)


@attrs.frozen
class Forecast:
    city: str
    days: int = 1


@attrs.frozen
class Shelf:
    books: list[str]


def responses_reply(text: str, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "resp_1",
        "object": "response",
        "status": "completed",
        "model": "model-test",
        "output": [
            {
                "id": "msg_1",
                "type": "message",
                "role": "assistant",
                "status": "completed",
                "content": [{"type": "output_text", "text": text, "annotations": []}],
            }
        ],
        "usage": {"input_tokens": 5, "output_tokens": 3, "total_tokens": 8},
    }
    body.update(fields)
    return body


def anthropic_reply(text: str, stop: str = "end_turn") -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "model-test",
        "content": [{"type": "text", "text": text}],
        "stop_reason": stop,
        "usage": {"input_tokens": 5, "output_tokens": 3},
    }


async def responses_run(
    respx_mock: respx.MockRouter, output_type: Any, *replies: dict[str, Any]
) -> tuple[Any, respx.Route]:
    route = respx_mock.post(f"{RESPONSES}/responses").mock(
        side_effect=[httpx.Response(200, json=reply) for reply in replies]
    )
    async with OpenAIResponsesDriver(RESPONSES, api_key="sk-test", max_retries=0) as driver:
        request = Client(driver, default_model=MODEL).request().with_prompt("forecast?")
        return await request.with_output_type(output_type).run(), route


async def anthropic_run(
    respx_mock: respx.MockRouter, output_type: Any, *replies: dict[str, Any]
) -> tuple[Any, respx.Route]:
    route = respx_mock.post(f"{ANTHROPIC}/v1/messages").mock(
        side_effect=[httpx.Response(200, json=reply) for reply in replies]
    )
    async with AnthropicDriver(base_url=ANTHROPIC, api_key="sk-ant-test", max_retries=0) as driver:
        request = Client(driver, default_model=MODEL).request().with_prompt("forecast?")
        return await request.with_output_type(output_type).run(), route


async def test_responses_sends_the_schema_as_text_format(respx_mock: respx.MockRouter) -> None:
    result, route = await responses_run(respx_mock, Forecast, responses_reply('{"city": "Porto"}'))
    assert result.output == Forecast(city="Porto")
    body = json.loads(route.calls.last.request.content)
    assert body["text"] == {
        "format": {
            "type": "json_schema",
            "name": "Forecast",
            "schema": {
                "type": "object",
                "properties": {
                    "city": {"type": "string"},
                    "days": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
                },
                "required": ["city", "days"],
                "additionalProperties": False,
            },
            "strict": True,
        }
    }
    assert "instructions" not in body  # the API holds the answer to it: no note


async def test_responses_incomplete_answer_raises_without_a_repair(
    respx_mock: respx.MockRouter,
) -> None:
    cut = responses_reply(
        '{"books": ["Dune", "Emm',
        status="incomplete",
        incomplete_details={"reason": "max_output_tokens"},
    )
    with pytest.raises(OutputValidationError, match="cut off") as caught:
        await responses_run(respx_mock, Shelf, cut, cut)
    assert caught.value.text == '{"books": ["Dune", "Emm'
    assert respx_mock.calls.call_count == 1


async def test_responses_refusal_raises_without_a_repair(respx_mock: respx.MockRouter) -> None:
    refused = responses_reply("")
    refused["output"][0]["content"] = [{"type": "refusal", "refusal": "I can't help with that."}]
    with pytest.raises(OutputValidationError, match="refus") as caught:
        await responses_run(respx_mock, Shelf, refused, refused)
    assert caught.value.text == "I can't help with that."
    assert respx_mock.calls.call_count == 1


async def test_anthropic_sends_the_native_output_format(respx_mock: respx.MockRouter) -> None:
    result, route = await anthropic_run(respx_mock, Shelf, anthropic_reply('{"books": ["Dune"]}'))
    assert result.output == Shelf(books=["Dune"])
    body = json.loads(route.calls.last.request.content)
    assert body["output_config"] == {
        "format": {
            "type": "json_schema",
            "schema": {
                "type": "object",
                "properties": {"books": {"type": "array", "items": {"type": "string"}}},
                "required": ["books"],
                "additionalProperties": False,
            },
        }
    }
    assert "tools" not in body
    assert "system" not in body


async def test_anthropic_refusal_raises_at_once(respx_mock: respx.MockRouter) -> None:
    refused = anthropic_reply("I won't answer that.", stop="refusal")
    with pytest.raises(OutputValidationError, match="stopped the answer") as caught:
        await anthropic_run(respx_mock, Shelf, refused, refused)
    assert caught.value.text == "I won't answer that."
    assert respx_mock.calls.call_count == 1


async def test_anthropic_invalid_answer_is_repaired_with_the_error(
    respx_mock: respx.MockRouter,
) -> None:
    result, route = await anthropic_run(
        respx_mock, Shelf, anthropic_reply('{"books": "Dune"}'), anthropic_reply('{"books": []}')
    )
    assert result.output == Shelf(books=[])
    repair = json.loads(route.calls[1].request.content)["messages"][-1]
    assert "must be an array" in json.dumps(repair)


async def test_anthropic_keeps_an_output_config_given_in_extra_body(
    respx_mock: respx.MockRouter,
) -> None:
    route = respx_mock.post(f"{ANTHROPIC}/v1/messages").mock(
        return_value=httpx.Response(200, json=anthropic_reply('{"books": []}'))
    )
    async with AnthropicDriver(base_url=ANTHROPIC, api_key="sk-ant-test", max_retries=0) as driver:
        request = Client(driver, default_model=MODEL).request().with_prompt("books?")
        request.with_extra_body({"output_config": {"effort": "low"}})
        await request.with_output_type(Shelf).run()
    config = json.loads(route.calls.last.request.content)["output_config"]
    assert config["effort"] == "low"
    assert config["format"]["type"] == "json_schema"


def gemini_reply(text: str, finish: str = "STOP") -> dict[str, Any]:
    return {
        "candidates": [
            {"content": {"role": "model", "parts": [{"text": text}]}, "finishReason": finish}
        ],
        "usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 3},
    }


async def gemini_run(
    respx_mock: respx.MockRouter, output_type: Any, *replies: dict[str, Any]
) -> tuple[Any, respx.Route]:
    route = respx_mock.post(f"{GEMINI}/models/model-test:generateContent").mock(
        side_effect=[httpx.Response(200, json=reply) for reply in replies]
    )
    async with GeminiDriver(base_url=GEMINI, api_key="gm-test", max_retries=0) as driver:
        request = Client(driver, default_model=MODEL).request().with_prompt("forecast?")
        return await request.with_output_type(output_type).run(), route


async def test_gemini_sends_the_schema_as_response_json_schema(
    respx_mock: respx.MockRouter,
) -> None:
    result, route = await gemini_run(respx_mock, Shelf, gemini_reply('{"books": ["Dune"]}'))
    assert result.output == Shelf(books=["Dune"])
    body = json.loads(route.calls.last.request.content)
    config = body["generationConfig"]
    assert config["responseMimeType"] == "application/json"
    assert config["responseJsonSchema"]["required"] == ["books"]
    assert config["responseJsonSchema"]["properties"]["books"]["type"] == "array"
    assert "systemInstruction" not in body  # the API holds the answer to it: no note


async def test_gemini_without_output_type_asks_for_no_json(respx_mock: respx.MockRouter) -> None:
    route = respx_mock.post(f"{GEMINI}/models/model-test:generateContent").mock(
        return_value=httpx.Response(200, json=gemini_reply("hello"))
    )
    async with GeminiDriver(base_url=GEMINI, api_key="gm-test", max_retries=0) as driver:
        await Client(driver, default_model=MODEL).request().with_prompt("hi").run()
    config = json.loads(route.calls.last.request.content).get("generationConfig", {})
    assert "responseMimeType" not in config
    assert "responseJsonSchema" not in config


@pytest.mark.parametrize(
    ("finish", "reason"), [("MAX_TOKENS", "cut off"), ("SAFETY", "content filter")]
)
async def test_gemini_cut_or_filtered_answer_raises_without_a_repair(
    respx_mock: respx.MockRouter, finish: str, reason: str
) -> None:
    cut = gemini_reply('{"books": ["Du', finish=finish)
    with pytest.raises(OutputValidationError, match=reason) as caught:
        await gemini_run(respx_mock, Shelf, cut, cut)
    assert caught.value.text == '{"books": ["Du'
    assert respx_mock.calls.call_count == 1
