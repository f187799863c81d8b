"""The llama.cpp server's own count, faked at the transport: what is asked, what is refused."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import respx

from threadline import (
    InvalidRequestError,
    Message,
    Model,
    ProviderError,
    ProviderResponseError,
    RateLimitError,
    Tool,
)
from threadline.counting import AsyncTokenCounter
from threadline.drivers import OpenAIChatDriver

ROOT = "http://llama.test:8080"
BASE = f"{ROOT}/v1"
MODEL = Model("smollm2", context_size=2048)
FAKE_KEY = "sk-FAKE-llama-cpp-counting-0000"
LOOKUP = Tool(
    name="lookup",
    description="Look a word up.",
    parameters={"type": "object", "properties": {"word": {"type": "string"}}},
)
PROMPT = "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n"


def fake_server(tokens: int = 7) -> tuple[respx.Route, respx.Route]:
    template = respx.post(f"{ROOT}/apply-template").mock(
        return_value=httpx.Response(200, json={"prompt": PROMPT})
    )
    tokenize = respx.post(f"{ROOT}/tokenize").mock(
        return_value=httpx.Response(200, json={"tokens": list(range(tokens))})
    )
    return template, tokenize


def test_without_the_option_the_driver_offers_no_exact_counter() -> None:
    assert OpenAIChatDriver(BASE).exact_token_counter(MODEL) is None


def test_an_unknown_counting_option_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="exact_counting"):
        OpenAIChatDriver(BASE, exact_counting="vllm")  # type: ignore[arg-type]


@pytest.mark.anyio
@respx.mock
async def test_the_count_is_the_length_of_the_tokenized_rendered_prompt() -> None:
    template, tokenize = fake_server(tokens=7)
    async with OpenAIChatDriver(BASE, api_key=FAKE_KEY, exact_counting="llama.cpp") as driver:
        counter = driver.exact_token_counter(MODEL)
        assert isinstance(counter, AsyncTokenCounter)
        assert await counter.count([Message.user("hello")], [LOOKUP]) == 7

    rendered: Any = json.loads(template.calls.last.request.content)
    # The body a completion would carry: the same messages and tools.
    assert rendered["model"] == "smollm2"
    assert rendered["messages"] == [{"role": "user", "content": "hello"}]
    assert rendered["tools"][0]["function"]["name"] == "lookup"
    assert "stream" not in rendered or rendered["stream"] is False
    asked: Any = json.loads(tokenize.calls.last.request.content)
    # Tokenized as the server tokenizes a prompt: special tokens added and parsed.
    assert asked == {"content": PROMPT, "add_special": True, "parse_special": True}
    assert template.calls.last.request.headers["authorization"] == f"Bearer {FAKE_KEY}"


@pytest.mark.anyio
@respx.mock
async def test_a_base_url_without_v1_is_the_root_itself() -> None:
    respx.post("http://llama.test:8080/apply-template").mock(
        return_value=httpx.Response(200, json={"prompt": "x"})
    )
    respx.post("http://llama.test:8080/tokenize").mock(
        return_value=httpx.Response(200, json={"tokens": [1, 2]})
    )
    async with OpenAIChatDriver(ROOT + "/", exact_counting="llama.cpp") as driver:
        counter = driver.exact_token_counter(MODEL)
        assert counter is not None
        assert await counter.count([Message.user("x")]) == 2


@pytest.mark.anyio
@respx.mock
async def test_an_answer_without_a_prompt_or_tokens_is_a_provider_response_error() -> None:
    respx.post(f"{ROOT}/apply-template").mock(return_value=httpx.Response(200, json={"x": 1}))
    async with OpenAIChatDriver(BASE, exact_counting="llama.cpp") as driver:
        counter = driver.exact_token_counter(MODEL)
        assert counter is not None
        with pytest.raises(ProviderResponseError, match="without a prompt"):
            await counter.count([Message.user("x")])

    respx.post(f"{ROOT}/apply-template").mock(
        return_value=httpx.Response(200, json={"prompt": "x"})
    )
    respx.post(f"{ROOT}/tokenize").mock(return_value=httpx.Response(200, text="not json"))
    async with OpenAIChatDriver(BASE, exact_counting="llama.cpp") as driver:
        counter = driver.exact_token_counter(MODEL)
        assert counter is not None
        with pytest.raises(ProviderResponseError, match="JSON object"):
            await counter.count([Message.user("x")])


@pytest.mark.anyio
@respx.mock
async def test_a_refusal_is_mapped_and_never_shows_the_key() -> None:
    respx.post(f"{ROOT}/apply-template").mock(
        return_value=httpx.Response(
            429, json={"error": {"message": f"slow down {FAKE_KEY}", "type": "rate_limit"}}
        )
    )
    async with OpenAIChatDriver(
        BASE, api_key=FAKE_KEY, max_retries=0, exact_counting="llama.cpp"
    ) as driver:
        counter = driver.exact_token_counter(MODEL)
        assert counter is not None
        with pytest.raises(RateLimitError) as caught:
            await counter.count([Message.user("x")])
    assert FAKE_KEY not in str(caught.value)
    assert FAKE_KEY not in repr(counter)


@pytest.mark.anyio
@respx.mock
async def test_a_server_without_the_endpoints_is_asked_once_and_warned_about_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # llama-cpp-python's server, or any other OpenAI-compatible one, answers 404.
    template = respx.post(f"{ROOT}/apply-template").mock(return_value=httpx.Response(404))
    async with OpenAIChatDriver(
        BASE, api_key=FAKE_KEY, max_retries=0, exact_counting="llama.cpp"
    ) as driver:
        counter = driver.exact_token_counter(MODEL)
        assert counter is not None
        with caplog.at_level("WARNING", logger="threadline.drivers.openai_chat"):
            with pytest.raises(ProviderError) as caught:
                await counter.count([Message.user("x")])
            assert caught.value.status == 404
            # The same counter asked again raises again, but warns no more.
            with pytest.raises(ProviderError):
                await counter.count([Message.user("x")])
        assert driver.exact_token_counter(MODEL) is None
    warnings = [r for r in caplog.records if "exact counting is off" in r.getMessage()]
    assert len(warnings) == 1
    assert FAKE_KEY not in caplog.text
    assert template.call_count == 2


@pytest.mark.anyio
@respx.mock
async def test_a_passing_refusal_keeps_the_exact_counter() -> None:
    respx.post(f"{ROOT}/apply-template").mock(return_value=httpx.Response(503))
    async with OpenAIChatDriver(
        BASE, api_key=FAKE_KEY, max_retries=0, exact_counting="llama.cpp"
    ) as driver:
        counter = driver.exact_token_counter(MODEL)
        assert counter is not None
        with pytest.raises(ProviderError):
            await counter.count([Message.user("x")])
        assert driver.exact_token_counter(MODEL) is not None
