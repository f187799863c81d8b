"""Structured output on the Chat Completions wire: ``response_format`` in each style,
strict where the schema allows, and refusals and cut-off answers read back."""

from __future__ import annotations

import json
from typing import Any

import attrs
import httpx
import pytest
import respx

from threadline import Client, InvalidRequestError, Model
from threadline.drivers import OpenAIChatDriver
from threadline.tools import OutputValidationError

pytestmark = pytest.mark.anyio

BASE = "https://llm.example/v1"
URL = f"{BASE}/chat/completions"
MODEL = Model("gpt-test", context_size=8192)


@attrs.frozen
class Forecast:
    """A forecast.

    Attributes:
        city: Where.
        days: How many days ahead.
    """

    city: str
    days: int = 1


@attrs.frozen
class Tagged:
    labels: dict[str, int]


def completion(content: str | None, finish: str = "stop", **message: Any) -> dict[str, Any]:
    return {
        "id": "c1",
        "model": "gpt-test",
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": content, **message},
                "finish_reason": finish,
            }
        ],
        "usage": {"prompt_tokens": 5, "completion_tokens": 3},
    }


def sent(route: respx.Route, index: int = -1) -> Any:
    return json.loads(route.calls[index].request.content)


async def run_with(
    respx_mock: respx.MockRouter, output_type: Any, *replies: dict[str, Any], **driver: Any
) -> tuple[Any, respx.Route]:
    route = respx_mock.post(URL).mock(
        side_effect=[httpx.Response(200, json=reply) for reply in replies]
    )
    async with OpenAIChatDriver(BASE, api_key="sk-test", max_retries=0, **driver) as chat:
        request = Client(chat, default_model=MODEL).request().with_prompt("forecast?")
        return await request.with_output_type(output_type).run(), route


async def test_a_schema_that_fits_strict_mode_is_sent_strict_with_optional_fields_nullable(
    respx_mock: respx.MockRouter,
) -> None:
    result, route = await run_with(
        respx_mock, Forecast, completion('{"city": "Porto", "days": null}')
    )
    assert result.output == Forecast(city="Porto", days=1)  # null: the field's default
    assert sent(route)["response_format"] == {
        "type": "json_schema",
        "json_schema": {
            "name": "Forecast",
            "description": "A forecast.",
            "schema": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "Where."},
                    "days": {
                        "anyOf": [
                            {"type": "integer", "description": "How many days ahead."},
                            {"type": "null"},
                        ]
                    },
                },
                "required": ["city", "days"],
                "additionalProperties": False,
                "description": "A forecast.",
            },
            "strict": True,
        },
    }
    assert [m["role"] for m in sent(route)["messages"]] == ["user"]  # no note: the server holds it


async def test_a_schema_strict_mode_cannot_take_is_sent_non_strict(
    respx_mock: respx.MockRouter,
) -> None:
    result, route = await run_with(respx_mock, Tagged, completion('{"labels": {"a": 1}}'))
    assert result.output == Tagged(labels={"a": 1})
    format_ = sent(route)["response_format"]["json_schema"]
    assert format_["strict"] is False
    assert format_["schema"]["properties"]["labels"]["additionalProperties"] == {"type": "integer"}


async def test_json_object_style_is_what_llama_cpp_pythons_server_takes(
    respx_mock: respx.MockRouter,
) -> None:
    _, route = await run_with(
        respx_mock, list[int], completion('{"value": [1, 2]}'), structured_output="json_object"
    )
    assert sent(route)["response_format"] == {
        "type": "json_object",
        "schema": {
            "type": "object",
            "properties": {"value": {"type": "array", "items": {"type": "integer"}}},
            "required": ["value"],
            "additionalProperties": False,
        },
    }


async def test_prompt_style_sends_no_response_format_and_asks_in_the_system_message(
    respx_mock: respx.MockRouter,
) -> None:
    result, route = await run_with(
        respx_mock, int, completion('{"value": 7}'), structured_output="prompt"
    )
    assert result.output == 7
    body = sent(route)
    assert "response_format" not in body
    assert body["messages"][0]["role"] == "system"
    assert "JSON schema" in body["messages"][0]["content"]


async def test_an_unknown_style_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="structured_output"):
        OpenAIChatDriver(BASE, structured_output="xml")  # type: ignore[arg-type]


async def test_a_refusal_raises_at_once_with_the_refusal_text(respx_mock: respx.MockRouter) -> None:
    refused = completion(None, refusal="I can't help with that.")
    with pytest.raises(OutputValidationError, match="refused") as caught:
        await run_with(respx_mock, Forecast, refused, refused)
    assert caught.value.text == "I can't help with that."
    assert respx_mock.calls.call_count == 1


async def test_a_streamed_refusal_is_read_as_one(respx_mock: respx.MockRouter) -> None:
    events = [
        {"model": "gpt-test", "choices": [{"index": 0, "delta": {"refusal": "I can't"}}]},
        {"model": "gpt-test", "choices": [{"index": 0, "delta": {"refusal": " do that."}}]},
        {"model": "gpt-test", "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
    ]
    body = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events) + b"data: [DONE]\n\n"
    stream_headers = {"content-type": "text/event-stream"}
    reply = httpx.Response(200, content=body, headers=stream_headers)
    respx_mock.post(URL).mock(return_value=reply)

    async def drain() -> None:
        async with OpenAIChatDriver(BASE, api_key="sk-test", max_retries=0) as chat:
            request = Client(chat, default_model=MODEL).request().with_prompt("x")
            async with request.with_output_type(Forecast).stream() as stream:
                async for _ in stream:
                    pass

    with pytest.raises(OutputValidationError, match="refused") as caught:
        await drain()
    assert caught.value.text == "I can't do that."


async def test_an_answer_cut_off_at_the_length_limit_raises_without_a_repair(
    respx_mock: respx.MockRouter,
) -> None:
    cut = completion('{"city": "Por', finish="length")
    with pytest.raises(OutputValidationError, match="max_output_tokens"):
        await run_with(respx_mock, Forecast, cut, cut)
    assert respx_mock.calls.call_count == 1


async def test_an_invalid_answer_gets_a_repair_round_on_the_wire(
    respx_mock: respx.MockRouter,
) -> None:
    result, route = await run_with(
        respx_mock, Forecast, completion('{"town": "Porto"}'), completion('{"city": "Porto"}')
    )
    assert result.output == Forecast(city="Porto")
    repair = sent(route, 1)["messages"]
    assert [m["role"] for m in repair] == ["user", "assistant", "user"]
    assert "field 'city' is required" in repair[-1]["content"]
    assert "response_format" in sent(route, 1)
