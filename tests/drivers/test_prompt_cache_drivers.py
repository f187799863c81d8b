"""Drivers help the prompt cache: Anthropic breakpoints, OpenAI's cache key, cached tokens."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import respx

from threadline import Agent, Client, Conversation, Message, Model, ToolCall, tool
from threadline.drivers import AnthropicDriver, OpenAIChatDriver, ProviderCall

pytestmark = pytest.mark.anyio

MODEL = Model("model-test", context_size=8192)
EPHEMERAL = {"type": "ephemeral"}
ANTHROPIC_OK = {
    "id": "msg_1",
    "type": "message",
    "role": "assistant",
    "model": "model-test",
    "content": [{"type": "text", "text": "ok"}],
    "stop_reason": "end_turn",
    "usage": {"input_tokens": 3, "cache_read_input_tokens": 40, "output_tokens": 1},
}


def openai_reply(usage: dict[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "model": "model-test",
        "choices": [
            {"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "stop"}
        ],
        "usage": usage,
        **extra,
    }


@tool
def lookup(query: str) -> str:
    """Look something up.

    Args:
        query: what to look up.
    """
    return "found"


async def anthropic_body(call: ProviderCall, **options: Any) -> dict[str, Any]:
    with respx.mock(assert_all_called=True) as mock:
        route = mock.post("https://anthropic.example/v1/messages").mock(
            return_value=httpx.Response(200, json=ANTHROPIC_OK)
        )
        async with AnthropicDriver(base_url="https://anthropic.example", **options) as driver:
            response = await driver.complete(call)
    assert response.usage.cached_input_tokens == 40
    body: dict[str, Any] = json.loads(route.calls.last.request.content)
    return body


def breakpoints(body: dict[str, Any]) -> list[str]:
    """Where ``cache_control`` marks are, as readable paths."""
    found = [f"system[{i}]" for i, b in enumerate(body.get("system", [])) if "cache_control" in b]
    found += [f"tools[{i}]" for i, t in enumerate(body.get("tools", [])) if "cache_control" in t]
    for m, turn in enumerate(body["messages"]):
        found += [
            f"messages[{m}].content[{b}]"
            for b, block in enumerate(turn["content"])
            if block.get("cache_control") == EPHEMERAL
        ]
    return found


def history(turns: int) -> list[Message]:
    messages = [Message.system("Be terse.")]
    for t in range(turns):
        messages += [Message.user(f"question {t}"), Message.assistant(f"answer {t}")]
    return messages


async def test_anthropic_marks_the_system_the_history_before_the_prompt_and_the_end() -> None:
    call = ProviderCall(model=MODEL, messages=(*history(3), Message.user("now")))
    body = await anthropic_body(call)
    # system; the last answer (what the last call wrote); the prompt (for the next call)
    assert breakpoints(body) == ["system[0]", "messages[5].content[0]", "messages[6].content[0]"]


async def test_anthropic_marks_the_last_tool_when_there_is_no_system_prompt() -> None:
    call = ProviderCall(model=MODEL, messages=(Message.user("now"),), tools=(lookup,))
    body = await anthropic_body(call)
    assert breakpoints(body) == ["tools[0]", "messages[0].content[0]"]


async def test_anthropic_never_places_more_than_four_breakpoints_in_a_tool_round() -> None:
    exchange = [
        Message.assistant("", tool_calls=[ToolCall(id="t1", name="lookup", arguments="{}")]),
        Message.tool("t1", "found"),
    ]
    call = ProviderCall(
        model=MODEL, messages=(*history(30), Message.user("now"), *exchange), tools=(lookup,)
    )
    body = await anthropic_body(call)
    marks = breakpoints(body)
    assert len(marks) <= 4
    assert marks[0] == "system[0]"
    assert marks[-1].startswith(f"messages[{len(body['messages']) - 1}]")  # the tool result


async def test_anthropic_places_no_breakpoint_when_told_not_to() -> None:
    call = ProviderCall(model=MODEL, messages=(*history(2), Message.user("now")))
    body = await anthropic_body(call, prompt_caching=False)
    assert breakpoints(body) == []


async def test_openai_sends_a_conversations_cache_key_to_openai_only() -> None:
    reply = openai_reply({"prompt_tokens": 10, "completion_tokens": 1})
    bodies: dict[str, dict[str, Any]] = {}
    with respx.mock(assert_all_called=True) as mock:
        for base in ("https://api.openai.com/v1", "http://127.0.0.1:8080/v1"):
            route = mock.post(f"{base}/chat/completions").mock(
                return_value=httpx.Response(200, json=reply)
            )
            async with OpenAIChatDriver(base, api_key="sk-test") as driver:
                conv = Conversation(Agent(Client(driver), model=MODEL), id="ada@example.com")
                await conv.run("hello")
                await conv.run("again")
            first, second = (json.loads(c.request.content) for c in route.calls)
            assert first.get("prompt_cache_key") == second.get("prompt_cache_key")
            bodies[base] = second
    key = bodies["https://api.openai.com/v1"]["prompt_cache_key"]
    assert key.startswith("threadline-")
    assert "ada" not in key  # a digest of the id, never the id
    assert "prompt_cache_key" not in bodies["http://127.0.0.1:8080/v1"]


async def test_openai_sends_the_cache_key_to_any_server_when_told_to() -> None:
    with respx.mock(assert_all_called=True) as mock:
        route = mock.post("http://127.0.0.1:8080/v1/chat/completions").mock(
            return_value=httpx.Response(200, json=openai_reply({"prompt_tokens": 1}))
        )
        async with OpenAIChatDriver("http://127.0.0.1:8080/v1", send_cache_key=True) as driver:
            call = ProviderCall(model=MODEL, messages=(Message.user("hi"),), cache_key="k1")
            await driver.complete(call)
            explicit = ProviderCall(
                model=MODEL,
                messages=(Message.user("hi"),),
                cache_key="k1",
                extra_body={"prompt_cache_key": "mine"},
            )
            await driver.complete(explicit)
    assert json.loads(route.calls[0].request.content)["prompt_cache_key"] == "k1"
    assert json.loads(route.calls[1].request.content)["prompt_cache_key"] == "mine"


@pytest.mark.parametrize(
    ("usage", "timings", "cached"),
    [
        ({"prompt_tokens": 50, "prompt_tokens_details": {"cached_tokens": 30}}, None, 30),
        # An older llama.cpp server: no details, but its timings say what the KV cache served.
        ({"prompt_tokens": 50}, {"cache_n": 42, "prompt_n": 8, "prompt_ms": 3.5}, 42),
        # Details win over timings when both are there.
        (
            {"prompt_tokens": 50, "prompt_tokens_details": {"cached_tokens": 30}},
            {"cache_n": 42},
            30,
        ),
        ({"prompt_tokens": 50}, None, 0),
    ],
)
async def test_openai_reports_cached_input_tokens_from_details_or_llama_cpp_timings(
    usage: dict[str, Any], timings: dict[str, Any] | None, cached: int
) -> None:
    extra = {} if timings is None else {"timings": timings}
    with respx.mock(assert_all_called=True) as mock:
        mock.post("http://127.0.0.1:8080/v1/chat/completions").mock(
            return_value=httpx.Response(200, json=openai_reply(usage, **extra))
        )
        async with OpenAIChatDriver("http://127.0.0.1:8080/v1") as driver:
            client = Client(driver, default_model=MODEL)
            result = await client.request().with_prompt("hi").run()
    assert result.usage.cached_input_tokens == cached
    assert result.rounds[0].cached_input_tokens == cached  # the ledger, per round


async def test_a_streamed_llama_cpp_answer_reports_its_cache_n_too() -> None:
    events = [
        {"choices": [{"index": 0, "delta": {"content": "ok"}}]},
        {
            "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            "usage": {"prompt_tokens": 50, "completion_tokens": 1},
            "timings": {"cache_n": 44, "prompt_n": 6},
        },
    ]
    stream = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
    with respx.mock(assert_all_called=True) as mock:
        mock.post("http://127.0.0.1:8080/v1/chat/completions").mock(
            return_value=httpx.Response(
                200, content=stream.encode(), headers={"content-type": "text/event-stream"}
            )
        )
        async with OpenAIChatDriver("http://127.0.0.1:8080/v1") as driver:
            call = ProviderCall(model=MODEL, messages=(Message.user("hi"),))
            async with driver.stream(call) as chunks:
                done = [c async for c in chunks][-1]
    assert done.response.usage.cached_input_tokens == 44  # type: ignore[attr-defined]
