"""Anthropic server-side compaction: the ``compaction`` block kept opaque and sent back.

``context_management`` (and its beta) go through ``extra_body`` and ``betas``
as given. A ``{"type": "compaction"}`` block in the answer is kept exactly as
received in the message's replay state, tagged with the driver and model,
and sent back every turn (not only in the open tool-use cycle, as thinking
is) to that model only; the latest one opens what is sent (the API ignores
every block before it), while the store keeps every turn; the usage of the compaction iterations
(``usage.iterations``) is added to the response's, so the run's totals hold it.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
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
    transcript = (
        Message.user("hi"),
        earlier,
        Message.user("And now?"),
        Message.assistant("Now this."),
        Message.user("Then?"),
    )
    with respx.mock() as mock:
        route = mock.post(URL).respond(json=message({"type": "text", "text": "Yes."}))
        async with driver() as d:
            await d.complete(ProviderCall(model=MODEL, messages=transcript))
    assistant = sent_messages(route)[0]  # the window opens at the block (see below)
    assert assistant["role"] == "assistant"
    assert assistant["content"][0] == COMPACTION
    assert assistant["content"][1]["text"] == "Hello Ada."
    assert len(assistant["content"]) == 2  # the old turn's thinking is not sent


def text_of(turn: dict[str, Any]) -> str:
    return " ".join(block.get("text", "") for block in turn["content"])


async def test_the_latest_block_opens_what_is_sent_and_system_messages_stay() -> None:
    # The API ignores every block before the latest compaction block, so they are
    # neither sent nor paid for; the system prompt is not part of the messages.
    def compacted(summary: str, words: str) -> Message:
        block = {"type": "compaction", "content": summary}
        state = json.dumps([block])
        return Message.assistant(
            words, reasoning=Reasoning(provider_reasoning=state, provider=LABEL)
        )

    transcript = (
        Message.system("Be brief."),
        Message.user("old " * 50),
        compacted("first summary", "one"),
        Message.user("q2"),
        compacted("second summary", "two"),
        Message.user("q3"),
    )
    with respx.mock() as mock:
        route = mock.post(URL).respond(json=message({"type": "text", "text": "Yes."}))
        async with driver() as d:
            await d.complete(ProviderCall(model=MODEL, messages=transcript))
    body = json.loads(route.calls[0].request.content)
    assert body["system"][0]["text"] == "Be brief."
    sent = body["messages"]
    assert [turn["role"] for turn in sent] == ["assistant", "user"]
    assert sent[0]["content"][0] == {"type": "compaction", "content": "second summary"}
    assert [text_of(turn).strip() for turn in sent] == ["two", "q3"]
    assert "first summary" not in route.calls[0].request.content.decode()


async def test_another_models_block_is_never_sent_and_opens_nothing() -> None:
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
    sent = sent_messages(route)
    assert [text_of(turn) for turn in sent] == ["a", "Hello.", "b"]  # the whole history
    assert [block["type"] for block in sent[1]["content"]] == ["text"]


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


async def test_the_run_loop_hands_over_and_counts_only_the_window() -> None:
    earlier = Message.assistant(
        "Hello Ada.",
        reasoning=Reasoning(provider_reasoning=json.dumps([THINKING, COMPACTION]), provider=LABEL),
    )
    old = Message.user("word " * 2_000)
    with respx.mock() as mock:
        route = mock.post(URL).respond(json=message({"type": "text", "text": "Yes."}))
        async with driver() as d:
            result = await (
                Client(d, default_model=MODEL)
                .request()
                .with_messages([old, earlier])
                .with_prompt("And now?")
                .run()
            )
    sent = sent_messages(route)
    assert sent[0]["content"][0] == COMPACTION
    assert [turn["role"] for turn in sent] == ["assistant", "user"]
    assert result.rounds[0].estimated_input_tokens < 200  # not the 2,000 words cut


def test_kept_blocks_must_be_sent_too() -> None:
    from threadline import InvalidRequestError
    from threadline.drivers import ReplayRules, ReplayScope

    with pytest.raises(InvalidRequestError, match="kept"):
        ReplayRules({"thinking"}, scope=ReplayScope.OPEN_TOOL_CYCLE, kept={"compaction"})


async def test_a_conversation_sends_from_the_block_keeps_every_turn_and_moves_providers() -> None:
    from threadline import Agent, Conversation
    from threadline.drivers import OpenAIChatDriver
    from threadline.stores.memory import MemoryStore

    answers = iter(
        [
            message(
                {"type": "text", "text": "one"}, usage={"input_tokens": 10, "output_tokens": 1}
            ),
            message(COMPACTION, {"type": "text", "text": "two"}),
            message(
                {"type": "text", "text": "three"}, usage={"input_tokens": 9, "output_tokens": 1}
            ),
        ]
    )
    store = MemoryStore()
    with respx.mock() as mock:
        route = mock.post(URL).mock(side_effect=lambda _: httpx.Response(200, json=next(answers)))
        chat_route = mock.post("https://openai.example/v1/chat/completions").respond(
            json={
                "id": "c1",
                "object": "chat.completion",
                "model": "gpt-test",
                "choices": [
                    {
                        "index": 0,
                        "message": {"role": "assistant", "content": "four"},
                        "finish_reason": "stop",
                    }
                ],
                "usage": {"prompt_tokens": 30, "completion_tokens": 1},
            }
        )
        async with driver() as d, OpenAIChatDriver("https://openai.example/v1", api_key="k") as o:
            agent = Agent(Client(d), model=MODEL, instructions="Be brief.")
            conv = Conversation(agent, id="c", store=store)
            for prompt in ("q1", "q2", "q3"):
                await conv.run(prompt)
            third = json.loads(route.calls[2].request.content)
            moved = Agent(Client(o), model=Model("gpt-test", context_size=100_000))
            loaded = await Conversation.load(moved, store, "c")
            await loaded.run("q4")
    # Anthropic: the third call opens at the block; the API would ignore q1 and "one".
    assert [turn["role"] for turn in third["messages"]] == ["assistant", "user"]
    assert third["messages"][0]["content"][0] == COMPACTION
    # The compaction iterations joined the conversation's totals: 184,000 in, 3,200 out.
    assert conv.total_usage.input_tokens == 10 + 184_000 + 9
    assert conv.total_usage.output_tokens == 1 + 3_200 + 1
    # The store kept every turn, and another provider is handed all of it, without the block.
    assert [m.text for m in loaded.messages[:6]] == ["q1", "one", "q2", "two", "q3", "three"]
    sent = json.loads(chat_route.calls[0].request.content)["messages"]
    assert [m["content"] for m in sent] == [
        "q1",
        "one",
        "q2",
        "two",
        "q3",
        "three",
        "q4",
    ]
    assert b"compaction" not in chat_route.calls[0].request.content


async def test_a_message_that_is_only_the_block_opens_the_window() -> None:
    # pause_after_compaction answers with the block alone (stop_reason "compaction").
    paused = Message.assistant(
        "", reasoning=Reasoning(provider_reasoning=json.dumps([COMPACTION]), provider=LABEL)
    )
    transcript = (Message.user("old " * 100), paused, Message.user("Go on."))
    with respx.mock() as mock:
        route = mock.post(URL).respond(json=message({"type": "text", "text": "Yes."}))
        async with driver() as d:
            await d.complete(ProviderCall(model=MODEL, messages=transcript))
    sent = sent_messages(route)
    assert sent[0] == {"role": "assistant", "content": [COMPACTION]}
    assert [turn["role"] for turn in sent] == ["assistant", "user"]
    assert text_of(sent[1]) == "Go on."
