"""GeminiDriver against the documented wire: the request it builds, the answers and
streams it reads, counting, and every failure mapped (fixtures: fixtures/README.md)."""

from __future__ import annotations

import json

import httpx
import pytest
import respx
from gemini_wire import (
    BASE,
    COUNT_URL,
    KEY,
    MODEL,
    STREAM_URL,
    URL,
    FakeClock,
    fixture,
    sent_body,
    sse_response,
)

from threadline import (
    AuthenticationError,
    BadRequestError,
    Client,
    ContextLengthExceededError,
    InvalidRequestError,
    Message,
    ProviderUnavailableError,
    RateLimitError,
    ToolCall,
    tool,
)
from threadline.drivers import (
    ProviderCall,
    ReasoningChunk,
    ResponseDone,
    RetryPolicy,
    SamplingSettings,
    TextChunk,
    ToolCallChunk,
)
from threadline.drivers.gemini import GeminiDriver, ThinkingConfig

pytestmark = pytest.mark.anyio


@tool
def get_weather(city: str) -> str:
    """The weather in a city.

    Args:
        city: the city's name.
    """
    return "sunny"


def driver(**kwargs: object) -> GeminiDriver:
    return GeminiDriver(base_url=BASE, api_key=KEY, **kwargs)  # type: ignore[arg-type]


def built(gemini: GeminiDriver, sent: ProviderCall, *, stream: bool) -> httpx.Request:
    request, _ = gemini._request(sent, stream=stream)
    return request


async def drain(gemini: GeminiDriver, sent: ProviderCall) -> None:
    async with gemini.stream(sent) as chunks:
        async for _ in chunks:
            pass


def call(*messages: Message, **fields: object) -> ProviderCall:
    return ProviderCall(model=MODEL, messages=messages or (Message.user("hi"),), **fields)  # type: ignore[arg-type]


# --- the request -------------------------------------------------------------


async def test_the_key_travels_in_its_header_and_never_in_the_url(
    respx_mock: respx.MockRouter,
) -> None:
    route = respx_mock.post(URL).mock(return_value=httpx.Response(200, json=fixture("plain")))
    async with driver() as gemini:
        await gemini.complete(call())
    request = route.calls.last.request
    assert request.headers["x-goog-api-key"] == KEY
    assert KEY not in str(request.url)
    assert "key=" not in str(request.url)
    assert "authorization" not in request.headers
    assert KEY not in repr(gemini)


def test_the_key_and_root_come_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GEMINI_API_KEY", raising=False)
    monkeypatch.setenv("GOOGLE_API_KEY", "google-key-0123456789")
    monkeypatch.setenv("GEMINI_BASE_URL", "https://proxy.example/v1beta/")
    fallback = GeminiDriver()
    assert "api_key=<set>" in repr(fallback)
    assert "proxy.example/v1beta" in repr(fallback)
    monkeypatch.setenv("GEMINI_API_KEY", "gemini-key-0123456789")
    request = built(GeminiDriver(), call(), stream=False)
    assert request.headers["x-goog-api-key"] == "gemini-key-0123456789"  # GEMINI_ first
    assert str(request.url) == (
        "https://proxy.example/v1beta/models/gemini-3-flash-preview:generateContent"
    )
    monkeypatch.delenv("GEMINI_BASE_URL")
    default = built(GeminiDriver(), call(), stream=True)
    assert str(default.url) == (
        "https://generativelanguage.googleapis.com/v1beta/models/"
        "gemini-3-flash-preview:streamGenerateContent?alt=sse"
    )


def test_every_field_goes_where_gemini_reads_it() -> None:
    request = built(
        driver(thinking=ThinkingConfig(level="low")),
        call(
            Message.system("Be brief."),
            Message.user("Weather in Paris?"),
            Message.system("Answer in French."),
            tools=(get_weather,),
            tool_choice="get_weather",
            max_output_tokens=256,
            sampling=SamplingSettings(temperature=0.2, top_p=0.9, stop=("END",), seed=7),
            extra_body={"safetySettings": [], "generationConfig": {"candidateCount": 1}},
        ),
        stream=False,
    )
    body = sent_body(request)
    assert body["systemInstruction"] == {
        "parts": [{"text": "Be brief."}, {"text": "Answer in French."}]
    }
    assert body["contents"] == [{"role": "user", "parts": [{"text": "Weather in Paris?"}]}]
    [declaration] = body["tools"][0]["functionDeclarations"]
    assert declaration["name"] == "get_weather"
    assert declaration["parametersJsonSchema"]["properties"]["city"]["type"] == "string"
    assert body["toolConfig"] == {
        "functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": ["get_weather"]}
    }
    assert body["generationConfig"] == {
        "maxOutputTokens": 256,
        "temperature": 0.2,
        "topP": 0.9,
        "stopSequences": ["END"],
        "seed": 7,
        "thinkingConfig": {"includeThoughts": True, "thinkingLevel": "low"},
        "candidateCount": 1,
    }
    assert body["safetySettings"] == []


@pytest.mark.parametrize(
    ("choice", "config"),
    [("auto", {"mode": "AUTO"}), ("none", {"mode": "NONE"}), ("required", {"mode": "ANY"})],
)
def test_tool_choice_maps_to_function_calling_modes(choice: str, config: object) -> None:
    body = sent_body(built(driver(), call(tools=(get_weather,), tool_choice=choice), stream=False))
    assert body["toolConfig"] == {"functionCallingConfig": config}


def test_a_forced_tool_not_sent_and_a_bad_thinking_config_are_refused() -> None:
    with pytest.raises(InvalidRequestError, match="tool_choice 'nope'"):
        built(driver(), call(tools=(get_weather,), tool_choice="nope"), stream=False)
    with pytest.raises(InvalidRequestError, match="budget or a level"):
        ThinkingConfig(budget=100, level="low")
    with pytest.raises(InvalidRequestError, match="level"):
        ThinkingConfig(level="huge")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="thinking"):
        GeminiDriver(base_url=BASE, thinking={"level": "low"})  # type: ignore[arg-type]
    budget = sent_body(built(driver(thinking=ThinkingConfig(budget=0)), call(), stream=False))
    assert budget["generationConfig"]["thinkingConfig"] == {
        "includeThoughts": True,
        "thinkingBudget": 0,
    }


def test_images_go_inline_or_by_uri() -> None:
    from threadline import ImagePart, TextPart

    image = Message.user(
        [
            TextPart(text="what is this?"),
            ImagePart(url="data:image/png;base64,iVBORw0KGgo="),
            ImagePart(url="https://example.com/cat.jpg"),
        ]
    )
    body = sent_body(built(driver(), call(image), stream=False))
    assert body["contents"][0]["parts"] == [
        {"text": "what is this?"},
        {"inlineData": {"mimeType": "image/png", "data": "iVBORw0KGgo="}},
        {"fileData": {"fileUri": "https://example.com/cat.jpg"}},
    ]


# --- answers -----------------------------------------------------------------


async def test_a_plain_answer(respx_mock: respx.MockRouter) -> None:
    respx_mock.post(URL).mock(return_value=httpx.Response(200, json=fixture("plain")))
    async with driver() as gemini:
        response = await gemini.complete(call())
    assert response.text == "Paris is the capital of France."
    assert response.finish_reason == "stop"
    assert response.model == "gemini-2.5-flash"
    assert response.response_id == "rsp-plain-1"
    assert response.usage.input_tokens == 9
    assert response.usage.output_tokens == 7
    assert response.message.reasoning is None  # nothing to replay: nothing kept twice


async def test_thinking_becomes_reasoning_and_every_usage_field_is_mapped(
    respx_mock: respx.MockRouter,
) -> None:
    answer = fixture("thinking")
    respx_mock.post(URL).mock(return_value=httpx.Response(200, json=answer))
    async with driver() as gemini:
        response = await gemini.complete(call())
    assert response.text == "The smallest prime above 10 is 11."
    reasoning = response.message.reasoning
    assert reasoning is not None
    assert reasoning.text.startswith("**Weighing the question**")
    assert reasoning.provider == "gemini:gemini-3-flash-preview"
    assert json.loads(reasoning.provider_reasoning) == answer["candidates"][0]["content"]["parts"]
    usage = response.usage
    assert usage.input_tokens == 14 + 3  # the prompt (cached included) and the tool-use prompt
    assert usage.cached_input_tokens == 4
    assert usage.output_tokens == 10 + 48  # the answer and the thoughts
    assert usage.reasoning_tokens == 48


async def test_parallel_calls_get_ids_and_keep_their_parts(respx_mock: respx.MockRouter) -> None:
    answer = fixture("parallel_calls")
    respx_mock.post(URL).mock(return_value=httpx.Response(200, json=answer))
    async with driver() as gemini:
        response = await gemini.complete(call(tools=(get_weather,)))
    paris, london = response.message.tool_calls
    assert (paris.name, json.loads(paris.arguments)) == ("get_weather", {"city": "Paris"})
    assert json.loads(london.arguments) == {"city": "London"}
    assert paris.id != london.id  # made up where Gemini gave none, and distinct
    assert response.finish_reason == "tool_calls"
    assert response.message.reasoning is not None
    stored = json.loads(response.message.reasoning.provider_reasoning)
    assert stored == answer["candidates"][0]["content"]["parts"]


@pytest.mark.parametrize(
    ("reason", "mapped"),
    [
        ("MAX_TOKENS", "length"),
        ("SAFETY", "content_filter"),
        ("RECITATION", "content_filter"),
        ("PROHIBITED_CONTENT", "content_filter"),
        ("MALFORMED_FUNCTION_CALL", "malformed_function_call"),
        ("OTHER", "other"),
        ("SOMETHING_NEW", "something_new"),
    ],
)
async def test_finish_reasons_are_mapped(
    reason: str, mapped: str, respx_mock: respx.MockRouter
) -> None:
    answer = fixture("plain")
    answer["candidates"][0]["finishReason"] = reason
    respx_mock.post(URL).mock(return_value=httpx.Response(200, json=answer))
    async with driver() as gemini:
        assert (await gemini.complete(call())).finish_reason == mapped


async def test_a_withheld_candidate_is_an_empty_answer_filtered(
    respx_mock: respx.MockRouter,
) -> None:
    respx_mock.post(URL).mock(return_value=httpx.Response(200, json=fixture("safety_finish")))
    async with driver() as gemini:
        response = await gemini.complete(call())
    assert (response.text, response.finish_reason) == ("", "content_filter")


async def test_a_blocked_prompt_is_a_clear_error_not_an_empty_answer(
    respx_mock: respx.MockRouter,
) -> None:
    respx_mock.post(URL).mock(return_value=httpx.Response(200, json=fixture("safety_block")))
    respx_mock.post(STREAM_URL).mock(return_value=sse_response([fixture("safety_block")]))
    async with driver() as gemini:
        with pytest.raises(BadRequestError, match=r"blocked the prompt .*blockReason SAFETY"):
            await gemini.complete(call())
        with pytest.raises(BadRequestError, match="blockReason SAFETY"):
            await drain(gemini, call())


# --- streams -----------------------------------------------------------------


async def test_a_streamed_answer_matches_the_whole_one(respx_mock: respx.MockRouter) -> None:
    route = respx_mock.post(STREAM_URL).mock(return_value=sse_response(fixture("stream_plain")))
    async with driver() as gemini, gemini.stream(call()) as chunks:
        seen = [chunk async for chunk in chunks]
    assert route.calls.last.request.url.params["alt"] == "sse"
    assert "key" not in route.calls.last.request.url.params
    texts = [chunk.text for chunk in seen if isinstance(chunk, TextChunk)]
    assert texts == ["Paris is", " the capital", " of France."]
    done = seen[-1]
    assert isinstance(done, ResponseDone)
    assert done.response.text == "Paris is the capital of France."
    assert done.response.usage.output_tokens == 7  # the last chunk's usage holds
    assert done.response.finish_reason == "stop"
    assert done.response.response_id == "rsp-stream-1"


async def test_a_streamed_signature_stays_on_its_own_empty_part(
    respx_mock: respx.MockRouter,
) -> None:
    respx_mock.post(STREAM_URL).mock(return_value=sse_response(fixture("stream_thinking")))
    async with driver() as gemini, gemini.stream(call()) as chunks:
        seen = [chunk async for chunk in chunks]
    thoughts = "".join(chunk.text for chunk in seen if isinstance(chunk, ReasoningChunk))
    assert thoughts == "**Weighing the question**\n11 is the first prime above 10."
    done = seen[-1]
    assert isinstance(done, ResponseDone)
    reasoning = done.response.message.reasoning
    assert reasoning is not None
    assert reasoning.text == thoughts
    # Pieces of one kind are joined; the signed empty part is never merged into them.
    assert json.loads(reasoning.provider_reasoning) == [
        {"text": thoughts, "thought": True},
        {"text": "The smallest prime above 10 is 11."},
        {"text": "", "thoughtSignature": "CsYBAdHtim9STREAMsignatureONemptyPART"},
    ]


async def test_streamed_calls_keep_the_ids_they_were_announced_with(
    respx_mock: respx.MockRouter,
) -> None:
    respx_mock.post(STREAM_URL).mock(return_value=sse_response(fixture("stream_calls")))
    async with driver() as gemini, gemini.stream(call(tools=(get_weather,))) as chunks:
        seen = [chunk async for chunk in chunks]
    announced = [chunk for chunk in seen if isinstance(chunk, ToolCallChunk)]
    done = seen[-1]
    assert isinstance(done, ResponseDone)
    calls = done.response.message.tool_calls
    assert [(c.index, c.id, c.name) for c in announced] == [
        (0, calls[0].id, "get_weather"),
        (1, calls[1].id, "get_weather"),
    ]
    assert done.response.finish_reason == "tool_calls"
    assert done.response.usage.reasoning_tokens == 40


async def test_a_stream_that_ends_without_a_finish_reason_fails(
    respx_mock: respx.MockRouter,
) -> None:
    from threadline import ProviderResponseError

    respx_mock.post(STREAM_URL).mock(return_value=sse_response(fixture("stream_plain")[:2]))
    async with driver() as gemini:
        with pytest.raises(ProviderResponseError, match="finishReason"):
            await drain(gemini, call())


async def test_an_error_chunk_mid_stream_is_mapped(respx_mock: respx.MockRouter) -> None:
    chunks = [fixture("stream_plain")[0], fixture("error_unavailable")]
    respx_mock.post(STREAM_URL).mock(return_value=sse_response(chunks))
    async with driver(max_retries=0) as gemini:
        with pytest.raises(ProviderUnavailableError, match="overloaded"):
            await drain(gemini, call())


# --- counting ----------------------------------------------------------------


async def test_the_exact_counter_sends_the_whole_request_to_count_tokens(
    respx_mock: respx.MockRouter,
) -> None:
    route = respx_mock.post(COUNT_URL).mock(
        return_value=httpx.Response(200, json=fixture("count_tokens"))
    )
    async with driver() as gemini:
        counter = gemini.exact_token_counter(MODEL)
        tokens = await counter.count(
            [Message.system("Be brief."), Message.user("Weather in Paris?")], [get_weather]
        )
    assert tokens == 31
    body = sent_body(route.calls.last.request)
    inner = body["generateContentRequest"]
    assert list(body) == ["generateContentRequest"]  # not ``contents`` alone
    assert inner["model"] == "models/gemini-3-flash-preview"
    assert inner["systemInstruction"] == {"parts": [{"text": "Be brief."}]}
    assert inner["tools"][0]["functionDeclarations"][0]["name"] == "get_weather"
    assert inner["contents"] == [{"role": "user", "parts": [{"text": "Weather in Paris?"}]}]
    assert route.calls.last.request.headers["x-goog-api-key"] == KEY


# --- failures ----------------------------------------------------------------


async def test_an_overflow_is_a_context_length_error_with_both_numbers(
    respx_mock: respx.MockRouter,
) -> None:
    route = respx_mock.post(URL).mock(
        return_value=httpx.Response(400, json=fixture("error_overflow"))
    )
    async with driver() as gemini:
        with pytest.raises(ContextLengthExceededError) as caught:
            await gemini.complete(call())
    assert (caught.value.prompt_tokens, caught.value.context_limit) == (1_200_000, 1_048_576)
    assert route.call_count == 1  # never retried


async def test_a_rate_limit_waits_the_retry_delay_gemini_asks_for(
    respx_mock: respx.MockRouter,
) -> None:
    limited = httpx.Response(429, json=fixture("error_rate_limit"))
    route = respx_mock.post(URL).mock(
        side_effect=[limited, httpx.Response(200, json=fixture("plain"))]
    )
    clock = FakeClock()
    async with driver(clock=clock) as gemini:
        response = await gemini.complete(call())
    assert response.text.startswith("Paris")
    assert clock.waits == [23.0]
    assert route.call_count == 2


async def test_a_rate_limit_after_every_retry_is_a_rate_limit_error(
    respx_mock: respx.MockRouter,
) -> None:
    respx_mock.post(URL).mock(return_value=httpx.Response(429, json=fixture("error_rate_limit")))
    clock = FakeClock()
    async with driver(clock=clock, retry_policy=RetryPolicy(max_retries=1)) as gemini:
        with pytest.raises(RateLimitError, match="quota"):
            await gemini.complete(call())
    assert clock.waits == [23.0]


@pytest.mark.parametrize("status", [500, 503])
async def test_unavailable_and_internal_errors_are_retried(
    status: int, respx_mock: respx.MockRouter
) -> None:
    failing = httpx.Response(status, json=fixture("error_unavailable"))
    route = respx_mock.post(URL).mock(
        side_effect=[failing, failing, httpx.Response(200, json=fixture("plain"))]
    )
    clock = FakeClock()
    async with driver(clock=clock) as gemini:
        assert (await gemini.complete(call())).text.startswith("Paris")
    assert route.call_count == 3
    assert len(clock.waits) == 2


@pytest.mark.parametrize(
    ("status", "name"), [(400, "error_invalid_key"), (403, "error_permission"), (401, None)]
)
async def test_a_refused_key_is_an_authentication_error(
    status: int, name: str | None, respx_mock: respx.MockRouter
) -> None:
    body = fixture(name) if name else {"error": {"code": 401, "message": "unauthenticated"}}
    route = respx_mock.post(URL).mock(return_value=httpx.Response(status, json=body))
    async with driver() as gemini:
        with pytest.raises(AuthenticationError) as caught:
            await gemini.complete(call())
    assert caught.value.status == status
    assert KEY not in str(caught.value)
    assert KEY not in (caught.value.body or "")
    assert route.call_count == 1


async def test_a_run_tightens_and_retries_after_gemini_reports_an_overflow(
    respx_mock: respx.MockRouter,
) -> None:
    route = respx_mock.post(URL).mock(
        side_effect=[
            httpx.Response(400, json=fixture("error_overflow")),
            httpx.Response(200, json=fixture("plain")),
        ]
    )
    # Near the edge the run asks the exact counter (countTokens) what it sends.
    respx_mock.post(COUNT_URL).mock(return_value=httpx.Response(200, json={"totalTokens": 400}))
    history = [m for n in range(6) for m in (Message.user(f"q{n} " * 50), Message.assistant("a"))]
    async with driver() as gemini:
        result = await (
            Client(gemini, default_model=MODEL)
            .request()
            .with_messages(history)
            .with_prompt("and now?")
            .run()
        )
    assert result.text.startswith("Paris")
    assert route.call_count == 2
    assert result.rounds[0].context_retry


async def test_a_run_records_gemini_usage(respx_mock: respx.MockRouter) -> None:
    respx_mock.post(URL).mock(return_value=httpx.Response(200, json=fixture("thinking")))
    async with driver() as gemini:
        result = await Client(gemini, default_model=MODEL).request().with_prompt("prime?").run()
    assert result.usage.reasoning_tokens == 48
    assert result.rounds[0].reported_input_tokens == 17


def test_a_tool_call_with_arguments_that_are_not_an_object_is_sent_as_an_empty_one() -> None:
    broken = Message.assistant("", tool_calls=[ToolCall(id="c1", name="f", arguments='{"cut')])
    body = sent_body(
        built(driver(), call(Message.user("go"), broken, Message.tool("c1", "x")), stream=False)
    )
    assert body["contents"][1]["parts"][0]["functionCall"]["args"] == {}


async def test_a_traced_run_names_gcp_gemini_as_its_provider_and_carries_the_usage(
    respx_mock: respx.MockRouter,
) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from threadline import telemetry as threadline_telemetry

    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    threadline_telemetry.set_tracer_provider(provider)
    respx_mock.post(URL).mock(return_value=httpx.Response(200, json=fixture("thinking")))
    try:
        async with Client(driver(), default_model=MODEL) as client:
            await client.request().with_prompt("prime?").run()
    finally:
        threadline_telemetry.set_tracer_provider(None)
        provider.shutdown()
    (chat,) = [s for s in memory.get_finished_spans() if s.name == f"chat {MODEL.name}"]
    assert chat.attributes is not None
    assert chat.attributes["gen_ai.provider.name"] == "gcp.gemini"  # the GenAI convention's
    assert chat.attributes["gen_ai.usage.input_tokens"] == 17
    assert chat.attributes["gen_ai.usage.output_tokens"] == 58


async def test_a_retry_after_header_wins_over_the_retry_delay_in_the_body(
    respx_mock: respx.MockRouter,
) -> None:
    limited = httpx.Response(429, json=fixture("error_rate_limit"), headers={"retry-after": "2"})
    respx_mock.post(URL).mock(side_effect=[limited, httpx.Response(200, json=fixture("plain"))])
    clock = FakeClock()
    async with driver(clock=clock) as gemini:
        await gemini.complete(call())
    assert clock.waits == [2.0]
