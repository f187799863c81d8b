"""Compaction items: kept opaque like reasoning, and a boundary for what is sent.

A ``{"type": "compaction"}`` item carries everything before it. It is kept
in the assistant message's ``provider_reasoning`` exactly as received; when
sending, only the items from the latest one this model made are sent, while
the transcript keeps everything. Another model's compaction item is never
sent, and never opens the window.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
import respx

from threadline import Agent, Client, Conversation, Message, Model, Reasoning, tool
from threadline.counting import BuiltinTokenCounter
from threadline.drivers import OpenAIResponsesDriver, ProviderCall, RetryPolicy

pytestmark = pytest.mark.anyio

BASE = "https://responses.example/v1"
URL = f"{BASE}/responses"
MODEL = Model("gpt-test", context_size=100_000)
LABEL = "openai-responses:gpt-test"
NO_WAIT = RetryPolicy(max_retries=0)

COMPACTION: dict[str, Any] = {
    "id": "cmp_1",
    "type": "compaction",
    "encrypted_content": "gAAAAABcompacted-window==",
}
REASONING: dict[str, Any] = {
    "id": "rs_1",
    "type": "reasoning",
    "summary": [{"type": "summary_text", "text": "Go on."}],
    "encrypted_content": "gAAAAABreasoning==",
}


def answer(*output: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "resp_1",
        "object": "response",
        "status": "completed",
        "model": "gpt-test",
        "output": list(output),
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }


def text(words: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": words}]
    return {"id": "msg_9", "type": "message", "role": "assistant", "content": content}


def carrying(*items: dict[str, Any], words: str = "", provider: str = LABEL, **kw: Any) -> Message:
    raw = json.dumps(items[0] if len(items) == 1 else list(items))
    return Message.assistant(
        words, reasoning=Reasoning(provider_reasoning=raw, provider=provider), **kw
    )


@tool
def lookup() -> str:
    """Look something up."""
    return "found"


def driver() -> OpenAIResponsesDriver:
    return OpenAIResponsesDriver(BASE, api_key="sk-test", retry_policy=NO_WAIT)


def sent(route: respx.Route, call: int = -1) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(route.calls[call].request.content)["input"]
    return items


async def test_a_compaction_item_is_kept_opaque_beside_reasoning_in_output_order() -> None:
    with respx.mock() as mock:
        mock.post(URL).respond(json=answer(COMPACTION, REASONING, text("Done.")))
        async with driver() as d:
            reply = await d.complete(ProviderCall(model=MODEL, messages=(Message.user("go"),)))
    reasoning = reply.message.reasoning
    assert reasoning is not None
    assert json.loads(reasoning.provider_reasoning) == [COMPACTION, REASONING]
    assert reasoning.provider == LABEL
    assert reasoning.text == "Go on."  # a compaction item shows nothing
    assert reply.text == "Done."


async def test_only_the_items_from_the_latest_compaction_on_are_sent() -> None:
    old = carrying({**COMPACTION, "id": "cmp_0"}, words="first answer")
    latest = carrying(COMPACTION, REASONING, words="second answer")
    messages = (
        Message.system("be brief"),
        Message.user("q1"),
        old,
        Message.user("q2"),
        latest,
        Message.user("q3"),
    )
    with respx.mock() as mock:
        route = mock.post(URL).respond(json=answer(text("ok")))
        async with driver() as d:
            await d.complete(ProviderCall(model=MODEL, messages=messages))
    body = json.loads(route.calls.last.request.content)
    assert body["instructions"] == "be brief"  # system messages still go
    assert [item.get("id") or item["content"] for item in body["input"]] == [
        "cmp_1",
        "rs_1",
        "second answer",
        "q3",
    ]
    # Byte for byte, as the state holds it.
    assert json.dumps(COMPACTION).encode() in route.calls.last.request.content


async def test_items_before_the_compaction_item_in_its_own_answer_are_not_sent() -> None:
    latest = carrying(REASONING, COMPACTION, {**REASONING, "id": "rs_2"}, words="answer")
    with respx.mock() as mock:
        route = mock.post(URL).respond(json=answer(text("ok")))
        async with driver() as d:
            messages = (Message.user("q"), latest, Message.user("q2"))
            await d.complete(ProviderCall(model=MODEL, messages=messages))
            # The same when the window opens at the very first message.
            await d.complete(ProviderCall(model=MODEL, messages=messages[1:]))
    assert [item.get("id") for item in sent(route, 0)[:2]] == ["cmp_1", "rs_2"]
    assert [item.get("id") for item in sent(route, 1)[:2]] == ["cmp_1", "rs_2"]


async def test_a_compaction_only_message_sends_the_item_alone() -> None:
    # The shape of a /responses/compact answer: no text, no call, the item.
    compacted = carrying(COMPACTION, REASONING)
    with respx.mock() as mock:
        route = mock.post(URL).respond(json=answer(text("ok")))
        async with driver() as d:
            messages = (Message.user("old"), compacted, Message.user("next"))
            await d.complete(ProviderCall(model=MODEL, messages=messages))
    # No empty assistant message, and no reasoning item with nothing after it.
    assert sent(route) == [COMPACTION, {"type": "message", "role": "user", "content": "next"}]


async def test_another_models_compaction_item_is_never_sent_nor_a_boundary(
    caplog: pytest.LogCaptureFixture,
) -> None:
    foreign = carrying(COMPACTION, words="answer", provider="openai-responses:other")
    with respx.mock() as mock:
        route = mock.post(URL).respond(json=answer(text("ok")))
        async with driver() as d:
            with caplog.at_level("INFO", logger="threadline.drivers.openai_responses"):
                messages = (Message.user("q"), foreign, Message.user("q2"))
                await d.complete(ProviderCall(model=MODEL, messages=messages))
    assert [item.get("content") for item in sent(route)] == ["q", "answer", "q2"]
    assert "openai-responses:other" in caplog.text


async def test_a_run_counts_and_sends_from_the_window_and_keeps_the_rest() -> None:
    latest = carrying(COMPACTION, words="compacted answer")
    history = [Message.user("long ago " * 400), carrying(REASONING, words="old " * 400)]
    history += [Message.user("q2"), latest]
    bodies: list[list[dict[str, Any]]] = []

    def reply(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content)["input"])
        return httpx.Response(200, json=answer(text("ok")))

    transport = httpx.MockTransport(reply)
    async with httpx.AsyncClient(transport=transport) as http:
        d = OpenAIResponsesDriver(BASE, http_client=http)
        request = Client(d, default_model=MODEL).request().with_messages(history)
        result = await request.with_prompt("q3").run()
    assert [item.get("id") or item["content"] for item in bodies[0]] == [
        "cmp_1",
        "compacted answer",
        "q3",
    ]
    # Counted as sent: the 800 words before the window are not in the estimate.
    assert result.rounds[0].estimated_input_tokens < 100
    assert not result.rounds[0].limiting.limited


async def test_a_compaction_in_a_tool_round_cuts_the_prompt_of_the_same_run() -> None:
    bodies: list[list[dict[str, Any]]] = []

    def reply(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content)["input"])
        if len(bodies) == 1:
            call = {"id": "fc_1", "call_id": "call_1", "name": "lookup", "arguments": "{}"}
            output = [COMPACTION, REASONING, {"type": "function_call", **call}]
            return httpx.Response(200, json=answer(*output))
        return httpx.Response(200, json=answer(text("done")))

    transport = httpx.MockTransport(reply)
    async with httpx.AsyncClient(transport=transport) as http:
        d = OpenAIResponsesDriver(BASE, http_client=http)
        client = Client(d, default_model=MODEL)
        request = client.request().with_messages([Message.user("before")]).with_prompt("go")
        result = await request.with_tools([lookup]).run()
    assert result.text == "done"
    # Round two: the compaction item opens the window; its call and output follow it.
    assert [item["type"] for item in bodies[1]] == [
        "compaction",
        "reasoning",
        "function_call",
        "function_call_output",
    ]
    # The turn's messages keep everything that happened.
    assert result.turn_messages[0].text == "go"


async def test_a_conversation_sends_from_its_latest_compaction_item_and_keeps_all() -> None:
    bodies: list[list[dict[str, Any]]] = []

    def reply(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content)["input"])
        output = [text(f"answer {len(bodies)}")]
        if len(bodies) == 2:
            output.insert(0, COMPACTION)  # server-side compaction in the second turn
        return httpx.Response(200, json=answer(*output))

    transport = httpx.MockTransport(reply)
    async with httpx.AsyncClient(transport=transport) as http:
        driver = OpenAIResponsesDriver(BASE, http_client=http)
        agent = Agent(Client(driver), model=MODEL, instructions="be brief")
        chat = Conversation(agent)
        for turn in range(1, 5):
            result = await chat.run(f"q{turn}")
            assert result.rounds[0].reasoning_dropped == ()
    assert [item.get("id") or item["content"] for item in bodies[2]] == [
        "cmp_1",
        "answer 2",
        "q3",
    ]
    assert [item.get("id") or item["content"] for item in bodies[3]] == [
        "cmp_1",
        "answer 2",
        "q3",
        "answer 3",
        "q4",
    ]
    # The conversation keeps every turn.
    assert [m.text for m in chat.messages if m.role.value == "user"] == ["q1", "q2", "q3", "q4"]


async def test_replayed_reasoning_and_compaction_items_are_counted_as_sent() -> None:
    big = {**REASONING, "encrypted_content": "gAAAAB" + "x9Q/" * 500}
    history = [Message.user("q1"), carrying(COMPACTION, big, words="answer")]
    counter = BuiltinTokenCounter()

    def reply(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=answer(text("ok")))

    transport = httpx.MockTransport(reply)
    async with httpx.AsyncClient(transport=transport) as http:
        d = OpenAIResponsesDriver(BASE, http_client=http)
        client = Client(d, default_model=MODEL, token_counter=counter)
        result = await client.request().with_messages(history).with_prompt("q2").run()
    estimated = result.rounds[0].estimated_input_tokens
    plain = [Message.assistant("answer"), Message.user("q2")]
    # What is sent: the items' string values, the encrypted content above all.
    assert estimated == counter.with_projection(d.replay_projection(MODEL)).count(
        [history[1], Message.user("q2")]
    )
    assert estimated > counter.count(plain) + 500
    # Another model's items are not sent, so not counted.
    foreign = carrying(COMPACTION, big, words="answer", provider="openai-responses:other")
    assert d.replay_projection(MODEL).replayed_reasoning(foreign.reasoning)  # type: ignore[arg-type]
    async with httpx.AsyncClient(transport=transport) as http:
        d = OpenAIResponsesDriver(BASE, http_client=http)
        client = Client(d, default_model=MODEL, token_counter=counter)
        other = await client.request().with_messages([history[0], foreign]).with_prompt("q2").run()
    assert other.rounds[0].estimated_input_tokens < counter.count(plain) + 30
