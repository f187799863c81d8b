"""What OpenAIResponsesDriver sends and reads unstreamed: body, replay, errors, counting."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import respx

from threadline import (
    AuthenticationError,
    BadRequestError,
    ContextLengthExceededError,
    ImagePart,
    InvalidRequestError,
    Message,
    Model,
    ProviderResponseError,
    ProviderUnavailableError,
    Reasoning,
    TextPart,
    ToolCall,
    Usage,
    tool,
)
from threadline.drivers import OpenAIResponsesDriver, ProviderCall, RetryPolicy, SamplingSettings

pytestmark = pytest.mark.anyio

BASE = "https://responses.example/v1"
URL = f"{BASE}/responses"
KEY = "sk-proj-very-secret-responses-key"
MODEL = Model("gpt-test")
LABEL = "openai-responses:gpt-test"
NO_WAIT = RetryPolicy(max_retries=2, initial_delay=0, jitter=0)

REASONING_ITEM: dict[str, Any] = {
    "id": "rs_1",
    "type": "reasoning",
    "summary": [{"type": "summary_text", "text": "The user wants the weather."}],
    "encrypted_content": "gAAAAABo-encrypted==",
}
CALL_ITEM: dict[str, Any] = {
    "id": "fc_1",
    "type": "function_call",
    "status": "completed",
    "call_id": "call_1",
    "name": "get_weather",
    "arguments": '{"city":"Paris"}',
}


def response_json(*output: dict[str, Any], **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": "resp_1",
        "object": "response",
        "status": "completed",
        "model": "gpt-test-2026",
        "output": list(output),
        "error": None,
        "incomplete_details": None,
        "usage": {
            "input_tokens": 120,
            "input_tokens_details": {"cached_tokens": 64},
            "output_tokens": 50,
            "output_tokens_details": {"reasoning_tokens": 32},
            "total_tokens": 170,
        },
    }
    body.update(fields)
    return body


def text_item(text: str) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def driver(**kwargs: Any) -> OpenAIResponsesDriver:
    return OpenAIResponsesDriver(BASE, api_key=KEY, retry_policy=NO_WAIT, **kwargs)


def sent(route: respx.Route, call: int = -1) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(route.calls[call].request.content)
    return body


@tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return "sunny"


async def test_the_body_is_stateless_with_instructions_items_and_fields() -> None:
    history = (
        Message.system("Be brief."),
        Message.user("Weather in Paris?"),
        Message.assistant(
            "", tool_calls=[ToolCall(id="call_0", name="get_weather", arguments="{}")]
        ),
        Message.tool("call_0", "sunny"),
    )
    call = ProviderCall(
        model=MODEL,
        messages=history,
        tools=(get_weather,),
        tool_choice="get_weather",
        max_output_tokens=300,
        sampling=SamplingSettings(temperature=0.2, top_p=0.9, seed=7),
        extra_body={"parallel_tool_calls": False},
    )
    with respx.mock() as mock:
        route = mock.post(URL).respond(json=response_json(text_item("Sunny.")))
        async with driver(reasoning_effort="low", reasoning_summary="auto") as d:
            response = await d.complete(call)
    body = sent(route)
    assert route.calls.last.request.headers["authorization"] == f"Bearer {KEY}"
    assert body["store"] is False
    assert body["include"] == ["reasoning.encrypted_content"]
    assert body["instructions"] == "Be brief."
    assert body["input"] == [
        {"type": "message", "role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "call_0", "name": "get_weather", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "call_0", "output": "sunny"},
    ]
    assert body["tools"] == [
        {
            "type": "function",
            "name": "get_weather",
            "description": "The weather in a city.",
            "parameters": get_weather.parameters,
        }
    ]
    assert body["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert body["max_output_tokens"] == 300
    assert (body["temperature"], body["top_p"]) == (0.2, 0.9)
    assert "seed" not in body
    assert "stream" not in body
    assert body["parallel_tool_calls"] is False
    assert body["reasoning"] == {"effort": "low", "summary": "auto"}
    assert response.text == "Sunny."
    assert response.finish_reason == "stop"
    assert response.model == "gpt-test-2026"


async def test_reasoning_and_a_call_are_kept_then_replayed_byte_for_byte() -> None:
    first = response_json(REASONING_ITEM, CALL_ITEM)
    with respx.mock() as mock:
        route = mock.post(URL).respond(json=first)
        async with driver() as d:
            reply = await d.complete(ProviderCall(model=MODEL, messages=(Message.user("Paris?"),)))
            message = reply.message
            reasoning = message.reasoning
            assert reasoning is not None
            assert json.loads(reasoning.provider_reasoning) == REASONING_ITEM
            assert reasoning.text == "The user wants the weather."
            assert reasoning.provider == LABEL
            assert reply.finish_reason == "tool_calls"
            assert reply.usage == Usage(
                input_tokens=120, output_tokens=50, cached_input_tokens=64, reasoning_tokens=32
            )
            follow_up = (Message.user("Paris?"), message, Message.tool("call_1", "sunny"))
            await d.complete(ProviderCall(model=MODEL, messages=follow_up))
    raw = route.calls.last.request.content
    # The stored bytes themselves, straight before the call they belong to.
    assert reasoning.provider_reasoning + b',{"type":"function_call","call_id":"call_1"' in raw
    assert [item.get("type") for item in sent(route)["input"]] == [
        "message",
        "reasoning",
        "function_call",
        "function_call_output",
    ]


async def test_several_reasoning_items_are_kept_as_a_list_and_sent_in_order() -> None:
    second = {**REASONING_ITEM, "id": "rs_2", "summary": []}
    with respx.mock() as mock:
        route = mock.post(URL).respond(json=response_json(REASONING_ITEM, second, text_item("Hi")))
        async with driver() as d:
            reply = await d.complete(ProviderCall(model=MODEL, messages=(Message.user("hi"),)))
            messages = (Message.user("hi"), reply.message, Message.user("again"))
            await d.complete(ProviderCall(model=MODEL, messages=messages))
    reasoning = reply.message.reasoning
    assert reasoning is not None
    assert json.loads(reasoning.provider_reasoning) == [REASONING_ITEM, second]
    items = sent(route)["input"]
    assert [item.get("id") for item in items[1:3]] == ["rs_1", "rs_2"]
    assert items[3] == {"type": "message", "role": "assistant", "content": "Hi"}


async def test_reasoning_of_another_provider_or_model_is_left_out(
    caplog: pytest.LogCaptureFixture,
) -> None:
    foreign = Message.assistant(
        "Hi",
        reasoning=Reasoning(
            text="thought",
            provider_reasoning=json.dumps(REASONING_ITEM),
            provider="openai-responses:other-model",
        ),
    )
    with respx.mock() as mock:
        route = mock.post(URL).respond(json=response_json(text_item("ok")))
        async with driver() as d:
            with caplog.at_level("INFO", logger="threadline.drivers.openai_responses"):
                await d.complete(ProviderCall(model=MODEL, messages=(foreign, Message.user("x"))))
    assert sent(route)["input"] == [
        {"type": "message", "role": "assistant", "content": "Hi"},
        {"type": "message", "role": "user", "content": "x"},
    ]
    assert "other-model" in caplog.text


async def test_reasoning_with_no_item_after_it_is_never_sent_alone() -> None:
    # A reply cut off while it was still reasoning: nothing for the item to precede.
    cut = Message.assistant(
        "", reasoning=Reasoning(provider_reasoning=json.dumps(REASONING_ITEM), provider=LABEL)
    )
    with respx.mock() as mock:
        route = mock.post(URL).respond(json=response_json(text_item("ok")))
        async with driver() as d:
            await d.complete(ProviderCall(model=MODEL, messages=(Message.user("a"), cut)))
    assert all(item.get("type") != "reasoning" for item in sent(route)["input"])


async def test_replay_state_that_is_not_reasoning_items_is_refused() -> None:
    odd = Message.assistant(
        "Hi", reasoning=Reasoning(provider_reasoning=b'{"type":"message"}', provider=LABEL)
    )
    async with driver() as d:
        with pytest.raises(InvalidRequestError, match="message 0"):
            await d.complete(ProviderCall(model=MODEL, messages=(odd,)))


@pytest.mark.parametrize(
    ("details", "finish"),
    [({"reason": "max_output_tokens"}, "length"), ({"reason": "content_filter"}, "content_filter")],
)
async def test_an_incomplete_response_maps_its_reason(details: dict[str, str], finish: str) -> None:
    body = response_json(text_item("Part"), status="incomplete", incomplete_details=details)
    with respx.mock() as mock:
        mock.post(URL).respond(json=body)
        async with driver() as d:
            reply = await d.complete(ProviderCall(model=MODEL, messages=(Message.user("a"),)))
    assert (reply.text, reply.finish_reason) == ("Part", finish)


async def test_a_failed_response_raises_its_error() -> None:
    body = response_json(
        status="failed", error={"code": "server_error", "message": "the model broke"}
    )
    with respx.mock() as mock:
        mock.post(URL).respond(json=body)
        async with driver() as d:
            with pytest.raises(ProviderUnavailableError, match="the model broke"):
                await d.complete(ProviderCall(model=MODEL, messages=(Message.user("a"),)))


async def test_errors_are_mapped_and_never_show_the_key() -> None:
    too_long = {
        "error": {
            "message": "Your input exceeds the context window of this model.",
            "type": "invalid_request_error",
            "code": "context_length_exceeded",
        }
    }
    with respx.mock() as mock:
        route = mock.post(URL)
        route.side_effect = [
            httpx.Response(400, json=too_long),
            httpx.Response(401, json={"error": {"message": f"bad key {KEY}"}}),
        ]
        async with driver() as d:
            call = ProviderCall(model=MODEL, messages=(Message.user("a"),))
            with pytest.raises(ContextLengthExceededError):
                await d.complete(call)
            with pytest.raises(AuthenticationError) as caught:
                await d.complete(call)
    assert KEY not in str(caught.value)
    assert KEY not in (caught.value.body or "")
    assert KEY not in repr(d)


async def test_a_missing_stored_item_is_explained() -> None:
    refusal = {
        "error": {
            "message": "Item with id 'rs_0123' not found. Items are not persisted when "
            "`store` is set to false.",
            "type": "invalid_request_error",
        }
    }
    with respx.mock() as mock:
        mock.post(URL).respond(404, json=refusal)
        async with driver() as d:
            with pytest.raises(BadRequestError) as caught:
                await d.complete(ProviderCall(model=MODEL, messages=(Message.user("a"),)))
    assert "rs_0123" in str(caught.value)
    assert "store: false" in str(caught.value)
    assert caught.value.status == 404


async def test_a_rate_limit_is_retried() -> None:
    with respx.mock() as mock:
        route = mock.post(URL)
        route.side_effect = [
            httpx.Response(429, json={"error": {"message": "slow down"}}),
            httpx.Response(200, json=response_json(text_item("ok"))),
        ]
        async with driver() as d:
            reply = await d.complete(ProviderCall(model=MODEL, messages=(Message.user("a"),)))
    assert reply.text == "ok"
    assert route.call_count == 2


async def test_the_cache_key_goes_to_openai_as_prompt_cache_key() -> None:
    call = ProviderCall(model=MODEL, messages=(Message.user("a"),), cache_key="conv-1")
    with respx.mock() as mock:
        route = mock.post("https://api.openai.com/v1/responses").respond(
            json=response_json(text_item("ok"))
        )
        local = mock.post(URL).respond(json=response_json(text_item("ok")))
        async with OpenAIResponsesDriver("https://api.openai.com/v1", api_key=KEY) as d:
            await d.complete(call)
        async with driver() as d:
            await d.complete(call)
    assert sent(route)["prompt_cache_key"] == "conv-1"
    assert "prompt_cache_key" not in sent(local)


async def test_key_and_base_url_come_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", KEY)
    monkeypatch.setenv("OPENAI_BASE_URL", BASE)
    with respx.mock() as mock:
        route = mock.post(URL).respond(json=response_json(text_item("ok")))
        async with OpenAIResponsesDriver() as d:
            await d.complete(ProviderCall(model=MODEL, messages=(Message.user("a"),)))
    assert route.calls.last.request.headers["authorization"] == f"Bearer {KEY}"


async def test_input_tokens_are_counted_by_the_server_with_the_same_prompt() -> None:
    messages = (Message.system("Be brief."), Message.user("Weather?"))
    with respx.mock() as mock:
        route = mock.post(f"{URL}/input_tokens").respond(
            json={"object": "response.input_tokens", "input_tokens": 42}
        )
        async with driver(reasoning_effort="high") as d:
            counter = d.exact_token_counter(MODEL)
            assert await counter.count(messages, (get_weather,)) == 42
    body = sent(route)
    assert body["instructions"] == "Be brief."
    assert body["input"] == [{"type": "message", "role": "user", "content": "Weather?"}]
    assert body["tools"][0]["name"] == "get_weather"
    assert body["reasoning"] == {"effort": "high"}
    assert "store" not in body
    assert "include" not in body


async def test_a_count_without_input_tokens_is_malformed() -> None:
    with respx.mock() as mock:
        mock.post(f"{URL}/input_tokens").respond(json={"tokens": 3})
        async with driver() as d:
            with pytest.raises(ProviderResponseError, match="input_tokens"):
                await d.exact_token_counter(MODEL).count([Message.user("a")])


def test_a_wrong_reasoning_effort_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="reasoning_effort"):
        OpenAIResponsesDriver(BASE, reasoning_effort="extreme")


async def test_without_encrypted_reasoning_the_summary_is_kept_for_display_only() -> None:
    plain = {key: value for key, value in REASONING_ITEM.items() if key != "encrypted_content"}
    with respx.mock() as mock:
        route = mock.post(URL).respond(json=response_json(plain, text_item("Hi")))
        async with driver(encrypted_reasoning=False) as d:
            reply = await d.complete(ProviderCall(model=MODEL, messages=(Message.user("a"),)))
            await d.complete(ProviderCall(model=MODEL, messages=(reply.message, Message.user("b"))))
    assert "include" not in sent(route, 0)
    assert reply.message.reasoning == Reasoning(text="The user wants the weather.", provider=LABEL)
    assert all(item.get("type") != "reasoning" for item in sent(route)["input"])


async def test_an_image_is_sent_with_a_detail_level() -> None:
    picture = Message.user([TextPart(text="What is this?"), ImagePart(url="https://x.test/a.png")])
    with respx.mock() as mock:
        route = mock.post(URL).respond(json=response_json(text_item("A cat.")))
        async with driver() as d:
            await d.complete(ProviderCall(model=MODEL, messages=(picture,)))
    assert sent(route)["input"][0]["content"] == [
        {"type": "input_text", "text": "What is this?"},
        {"type": "input_image", "image_url": "https://x.test/a.png", "detail": "auto"},
    ]


async def test_a_traced_run_names_openai_as_its_provider_and_carries_the_usage() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from threadline import Client
    from threadline import telemetry as threadline_telemetry

    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    threadline_telemetry.set_tracer_provider(provider)
    try:
        with respx.mock() as mock:
            mock.post(URL).respond(json=response_json(text_item("ok")))
            async with Client(driver(), default_model=MODEL) as client:
                await client.request().with_prompt("hi").run()
    finally:
        threadline_telemetry.set_tracer_provider(None)
        provider.shutdown()
    (chat,) = [span for span in memory.get_finished_spans() if span.name == "chat gpt-test"]
    assert chat.attributes is not None
    assert chat.attributes["gen_ai.provider.name"] == "openai"
    assert chat.attributes["gen_ai.usage.input_tokens"] == 120
    assert chat.attributes["gen_ai.usage.output_tokens"] == 50
