"""Drivers read the provider's own cache diagnosis, when the user asked for one.

Anthropic: ``diagnostics.previous_message_id`` sent (with the
``cache-diagnosis-2026-04-07`` beta) only with ``cache_diagnosis=True``;
``diagnostics.cache_miss_reason`` read from the message (a stream: from
``message_start``). OpenAI Responses: ``prompt_cache_options.comparison_response_id``
sent only with ``cache_diagnosis=True`` and a previous response; ``prompt_cache_diagnostics``
read from the response. A response without the field leaves ``cache_diagnosis`` None.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import respx

from threadline import Agent, Client, Conversation, Message, Model
from threadline.drivers import (
    AnthropicDriver,
    OpenAIResponsesDriver,
    ProviderCall,
    ResponseDone,
    RetryPolicy,
)
from threadline.limiting import CacheDiagnosis

pytestmark = pytest.mark.anyio

NO_WAIT = RetryPolicy(max_retries=0)
A_BASE = "https://anthropic.example"
A_URL = f"{A_BASE}/v1/messages"
R_BASE = "https://responses.example/v1"
R_URL = f"{R_BASE}/responses"
MODEL = Model("m-test", context_size=100_000)


def message(diagnostics: object = None, *, msg_id: str = "msg_1") -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": msg_id,
        "type": "message",
        "role": "assistant",
        "model": "m-test",
        "content": [{"type": "text", "text": "ok"}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": 10, "output_tokens": 2},
    }
    if diagnostics is not None:
        body["diagnostics"] = diagnostics
    return body


def response(diagnostics: object = None, *, resp_id: str = "resp_1") -> dict[str, Any]:
    body: dict[str, Any] = {
        "id": resp_id,
        "object": "response",
        "status": "completed",
        "model": "m-test",
        "output": [
            {
                "id": "msg_9",
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "ok"}],
            }
        ],
        "usage": {"input_tokens": 10, "output_tokens": 2},
    }
    if diagnostics is not None:
        body["prompt_cache_diagnostics"] = diagnostics
    return body


def call(previous: str | None = None) -> ProviderCall:
    return ProviderCall(model=MODEL, messages=(Message.user("hi"),), previous_response_id=previous)


# --- Anthropic ---------------------------------------------------------------


async def test_anthropic_sends_no_diagnostics_unless_asked() -> None:
    with respx.mock() as mock:
        route = mock.post(A_URL).respond(json=message())
        async with AnthropicDriver(base_url=A_BASE, api_key="k", retry_policy=NO_WAIT) as d:
            reply = await d.complete(call("msg_0"))
    request = route.calls[0].request
    assert "diagnostics" not in json.loads(request.content)
    assert "anthropic-beta" not in request.headers
    assert reply.cache_diagnosis is None
    assert reply.response_id == "msg_1"


async def test_anthropic_asks_against_the_previous_message_and_reads_the_reason() -> None:
    miss = {"cache_miss_reason": {"type": "tools_changed", "cache_missed_input_tokens": 1234}}
    with respx.mock() as mock:
        route = mock.post(A_URL).respond(json=message(miss))
        async with AnthropicDriver(
            base_url=A_BASE, api_key="k", retry_policy=NO_WAIT, cache_diagnosis=True, betas=["x"]
        ) as d:
            first = await d.complete(call(None))
            second = await d.complete(call("msg_0"))
    bodies = [json.loads(c.request.content) for c in route.calls]
    assert bodies[0]["diagnostics"] == {"previous_message_id": None}  # opts in, nothing to compare
    assert bodies[1]["diagnostics"] == {"previous_message_id": "msg_0"}
    assert route.calls[0].request.headers["anthropic-beta"] == "x,cache-diagnosis-2026-04-07"
    expected = CacheDiagnosis(
        provider="anthropic:m-test", reason="tools_changed", missed_tokens=1234
    )
    assert first.cache_diagnosis == second.cache_diagnosis == expected


@pytest.mark.parametrize(
    "diagnostics",
    [{"cache_miss_reason": None}, {}, "odd", {"cache_miss_reason": {"type": 3}}],
)
async def test_anthropic_no_reason_is_no_diagnosis(diagnostics: object) -> None:
    with respx.mock() as mock:
        mock.post(A_URL).respond(json=message(diagnostics))
        async with AnthropicDriver(
            base_url=A_BASE, api_key="k", retry_policy=NO_WAIT, cache_diagnosis=True
        ) as d:
            reply = await d.complete(call("msg_0"))
    assert reply.cache_diagnosis is None


async def test_anthropic_stream_reads_the_diagnosis_from_message_start() -> None:
    start = message({"cache_miss_reason": {"type": "previous_message_not_found"}}, msg_id="msg_7")
    start["content"] = []
    events = [
        ("message_start", {"type": "message_start", "message": start}),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}},
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": "ok"},
            },
        ),
        ("content_block_stop", {"type": "content_block_stop", "index": 0}),
        (
            "message_delta",
            {"type": "message_delta", "delta": {"stop_reason": "end_turn"}, "usage": {}},
        ),
        ("message_stop", {"type": "message_stop"}),
    ]
    body = b"".join(f"event: {n}\ndata: {json.dumps(d)}\n\n".encode() for n, d in events)
    with respx.mock() as mock:
        mock.post(A_URL).respond(content=body, headers={"content-type": "text/event-stream"})
        async with (
            AnthropicDriver(
                base_url=A_BASE, api_key="k", retry_policy=NO_WAIT, cache_diagnosis=True
            ) as d,
            d.stream(call("msg_0")) as chunks,
        ):
            done = [c async for c in chunks if isinstance(c, ResponseDone)]
    reply = done[0].response
    assert reply.response_id == "msg_7"
    assert reply.cache_diagnosis == CacheDiagnosis(
        provider="anthropic:m-test", reason="previous_message_not_found"
    )


async def test_a_conversation_names_the_previous_message_id_not_the_request_id() -> None:
    with respx.mock() as mock:
        route = mock.post(A_URL)
        route.side_effect = [
            respx.MockResponse(json=message(msg_id="msg_A"), headers={"request-id": "req_A"}),
            respx.MockResponse(json=message(msg_id="msg_B"), headers={"request-id": "req_B"}),
        ]
        async with AnthropicDriver(
            base_url=A_BASE, api_key="k", retry_policy=NO_WAIT, cache_diagnosis=True
        ) as d:
            conv = Conversation(Agent(client=Client(d, default_model=MODEL)))
            await conv.run("one")
            await conv.run("two")
    bodies = [json.loads(c.request.content) for c in route.calls]
    assert [b["diagnostics"]["previous_message_id"] for b in bodies] == [None, "msg_A"]


# --- OpenAI Responses ----------------------------------------------------------


async def test_responses_sends_no_comparison_unless_asked() -> None:
    with respx.mock() as mock:
        route = mock.post(R_URL).respond(json=response())
        async with OpenAIResponsesDriver(R_BASE, api_key="k", retry_policy=NO_WAIT) as d:
            reply = await d.complete(call("resp_0"))
    assert "prompt_cache_options" not in json.loads(route.calls[0].request.content)
    assert reply.cache_diagnosis is None
    assert reply.response_id == "resp_1"


@pytest.mark.parametrize(
    ("diagnostics", "expected"),
    [
        (
            {"type": "cache_miss", "reason": "tools_changed", "cache_missed_tokens": 900},
            CacheDiagnosis(
                provider="openai-responses:m-test", reason="tools_changed", missed_tokens=900
            ),
        ),
        (
            {"type": "cache_hit"},
            CacheDiagnosis(provider="openai-responses:m-test", reason="cache_hit"),
        ),
        (
            {"type": "comparison_response_not_found"},
            CacheDiagnosis(
                provider="openai-responses:m-test", reason="comparison_response_not_found"
            ),
        ),
        ({"type": None}, None),
        ([1, 2], None),
    ],
)
async def test_responses_reads_prompt_cache_diagnostics(
    diagnostics: object, expected: CacheDiagnosis | None
) -> None:
    with respx.mock() as mock:
        route = mock.post(R_URL).respond(json=response(diagnostics))
        async with OpenAIResponsesDriver(
            R_BASE, api_key="k", retry_policy=NO_WAIT, cache_diagnosis=True
        ) as d:
            reply = await d.complete(call("resp_0"))
    body = json.loads(route.calls[0].request.content)
    assert body["prompt_cache_options"] == {"comparison_response_id": "resp_0"}
    assert reply.cache_diagnosis == expected


async def test_responses_first_call_has_nothing_to_compare() -> None:
    with respx.mock() as mock:
        route = mock.post(R_URL).respond(json=response())
        async with OpenAIResponsesDriver(
            R_BASE, api_key="k", retry_policy=NO_WAIT, cache_diagnosis=True
        ) as d:
            await d.complete(call(None))
    assert "prompt_cache_options" not in json.loads(route.calls[0].request.content)


async def test_responses_stream_reads_the_diagnosis_from_the_final_response() -> None:
    final = response({"type": "cache_miss", "reason": "input_changed", "cache_missed_tokens": 5})
    events = [
        {"type": "response.created", "response": {**final, "status": "in_progress", "output": []}},
        {"type": "response.completed", "response": final},
    ]
    body = b"".join(f"data: {json.dumps(e)}\n\n".encode() for e in events)
    with respx.mock() as mock:
        mock.post(R_URL).respond(content=body, headers={"content-type": "text/event-stream"})
        async with (
            OpenAIResponsesDriver(
                R_BASE, api_key="k", retry_policy=NO_WAIT, cache_diagnosis=True
            ) as d,
            d.stream(call("resp_0")) as chunks,
        ):
            done = [c async for c in chunks if isinstance(c, ResponseDone)]
    reply = done[0].response
    assert reply.response_id == "resp_1"
    assert reply.cache_diagnosis == CacheDiagnosis(
        provider="openai-responses:m-test", reason="input_changed", missed_tokens=5
    )
