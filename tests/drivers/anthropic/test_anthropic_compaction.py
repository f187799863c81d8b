"""Anthropic server-side compaction: the ``compaction`` block kept opaque and sent back.

``context_management`` (and its beta) go through ``extra_body`` and ``betas``
as given. A ``{"type": "compaction"}`` block in the answer is kept exactly as
received in the message's replay state, tagged with the driver and model,
and sent back every turn (not only in the open tool-use cycle, as thinking
is) to that model only; the usage of the compaction iterations
(``usage.iterations``) is added to the response's, so the run's totals hold it.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import respx

from threadline import Client, Message, Model, Reasoning, Usage
from threadline.drivers import AnthropicDriver, ProviderCall, ResponseDone, RetryPolicy

pytestmark = pytest.mark.anyio

BASE = "https://anthropic.example"
URL = f"{BASE}/v1/messages"
MODEL = Model("claude-test", context_size=200_000)
LABEL = "anthropic:claude-test"
COMPACTION: dict[str, Any] = {"type": "compaction", "content": "The user is Ada; she asked..."}
THINKING: dict[str, Any] = {"type": "thinking", "thinking": "Hmm.", "signature": "EqQB"}
ITERATIONS = [
    {"type": "compaction", "input_tokens": 180_000, "output_tokens": 3_000},
    {"type": "message", "input_tokens": 4_000, "output_tokens": 200},
]


def message(*content: dict[str, Any], usage: dict[str, Any] | None = None) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": "claude-test",
        "content": list(content),
        "stop_reason": "end_turn",
        "usage": usage or {"input_tokens": 4_000, "output_tokens": 200, "iterations": ITERATIONS},
    }


def driver(**options: Any) -> AnthropicDriver:
    return AnthropicDriver(
        base_url=BASE, api_key="k", retry_policy=RetryPolicy(max_retries=0), **options
    )


def sent_messages(route: respx.Route) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = json.loads(route.calls[-1].request.content)["messages"]
    return messages


async def test_the_block_is_kept_opaque_and_its_iterations_join_the_usage() -> None:
    edits = {"edits": [{"type": "compact_20260112"}]}
    with respx.mock() as mock:
        route = mock.post(URL).respond(
            json=message(COMPACTION, {"type": "text", "text": "Hello Ada."})
        )
        async with driver(betas=["compact-2026-01-12"]) as d:
            call = ProviderCall(
                model=MODEL,
                messages=(Message.user("hi"),),
                extra_body={"context_management": edits},
            )
            reply = await d.complete(call)
    request = route.calls[0].request
    assert json.loads(request.content)["context_management"] == edits
    assert request.headers["anthropic-beta"] == "compact-2026-01-12"
    assert reply.text == "Hello Ada."
    reasoning = reply.message.reasoning
    assert reasoning is not None
    assert reasoning.provider == LABEL
    assert reasoning.text == ""  # nothing of it is shown as thinking
    assert json.loads(reasoning.provider_reasoning) == [COMPACTION]
    assert reply.usage == Usage(input_tokens=184_000, output_tokens=3_200)


async def test_the_block_goes_back_every_turn_but_earlier_thinking_does_not() -> None:
    state = json.dumps([THINKING, COMPACTION])
    earlier = Message.assistant(
        "Hello Ada.", reasoning=Reasoning(provider_reasoning=state, provider=LABEL)
    )
    transcript = (Message.user("hi"), earlier, Message.user("And now?"))
    with respx.mock() as mock:
        route = mock.post(URL).respond(json=message({"type": "text", "text": "Yes."}))
        async with driver() as d:
            await d.complete(ProviderCall(model=MODEL, messages=transcript))
    assistant = sent_messages(route)[1]
    assert assistant["role"] == "assistant"
    assert assistant["content"][0] == COMPACTION
    assert assistant["content"][1]["text"] == "Hello Ada."
    assert len(assistant["content"]) == 2  # the old turn's thinking is not sent


async def test_another_models_block_is_never_sent() -> None:
    state = json.dumps([COMPACTION])
    earlier = Message.assistant(
        "Hello.", reasoning=Reasoning(provider_reasoning=state, provider="anthropic:other")
    )
    with respx.mock() as mock:
        route = mock.post(URL).respond(json=message({"type": "text", "text": "Yes."}))
        async with driver() as d:
            await d.complete(
                ProviderCall(model=MODEL, messages=(Message.user("a"), earlier, Message.user("b")))
            )
    assert [block["type"] for block in sent_messages(route)[1]["content"]] == ["text"]


async def test_a_streamed_block_is_assembled_and_its_iterations_counted() -> None:
    def ev(kind: str, **fields: Any) -> str:
        return f"event: {kind}\ndata: {json.dumps({'type': kind, **fields})}\n\n"

    start = {**message(), "content": [], "usage": {"input_tokens": 4_000, "output_tokens": 1}}
    body = "".join(
        [
            ev("message_start", message=start),
            ev("content_block_start", index=0, content_block={"type": "compaction"}),
            ev(
                "content_block_delta",
                index=0,
                delta={"type": "compaction_delta", "content": "The user is Ada; "},
            ),
            ev(
                "content_block_delta",
                index=0,
                delta={"type": "compaction_delta", "content": "she asked..."},
            ),
            ev("content_block_stop", index=0),
            ev("content_block_start", index=1, content_block={"type": "text", "text": ""}),
            ev("content_block_delta", index=1, delta={"type": "text_delta", "text": "Hi."}),
            ev("content_block_stop", index=1),
            ev(
                "message_delta",
                delta={"stop_reason": "end_turn"},
                usage={"output_tokens": 200, "iterations": ITERATIONS},
            ),
            ev("message_stop"),
        ]
    ).encode()
    with respx.mock() as mock:
        mock.post(URL).respond(content=body, headers={"content-type": "text/event-stream"})
        async with (
            driver() as d,
            d.stream(ProviderCall(model=MODEL, messages=(Message.user("hi"),))) as chunks,
        ):
            done = [c async for c in chunks if isinstance(c, ResponseDone)]
    reply = done[0].response
    reasoning = reply.message.reasoning
    assert reasoning is not None
    assert json.loads(reasoning.provider_reasoning) == [
        {"type": "compaction", "content": "The user is Ada; she asked..."}
    ]
    assert reply.usage == Usage(input_tokens=184_000, output_tokens=3_200)


async def test_a_runs_totals_hold_the_compaction_iterations() -> None:
    with respx.mock() as mock:
        mock.post(URL).respond(json=message(COMPACTION, {"type": "text", "text": "Hi."}))
        async with driver() as d:
            result = await Client(d, default_model=MODEL).request().with_prompt("hi").run()
    assert result.usage.input_tokens == 184_000
    assert result.usage.output_tokens == 3_200


async def test_the_run_loop_hands_the_block_over_outside_the_tool_cycle() -> None:
    earlier = Message.assistant(
        "Hello Ada.",
        reasoning=Reasoning(provider_reasoning=json.dumps([THINKING, COMPACTION]), provider=LABEL),
    )
    with respx.mock() as mock:
        route = mock.post(URL).respond(json=message({"type": "text", "text": "Yes."}))
        async with driver() as d:
            await (
                Client(d, default_model=MODEL)
                .request()
                .with_messages([Message.user("hi"), earlier])
                .with_prompt("And now?")
                .run()
            )
    assert sent_messages(route)[1]["content"][0] == COMPACTION


def test_kept_blocks_must_be_sent_too() -> None:
    from threadline import InvalidRequestError
    from threadline.drivers import ReplayRules, ReplayScope

    with pytest.raises(InvalidRequestError, match="kept"):
        ReplayRules({"thinking"}, scope=ReplayScope.OPEN_TOOL_CYCLE, kept={"compaction"})
