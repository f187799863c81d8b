"""Native compaction on the Responses driver: ``POST /responses/compact``, stateless.

The compact output (the user messages it retained, then the compaction item)
is kept as the state of one assistant message with no text, tagged with the
driver and model. Later calls open their window at it and send its whole
output, in order; the store keeps every turn, and another provider is handed
the full-text history, never the opaque item.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import respx

from threadline import Agent, Client, Conversation, Message, Model, Usage
from threadline.drivers import OpenAIResponsesDriver, ProviderCall, RetryPolicy
from threadline.stores.memory import MemoryStore
from threadline.testing import FunctionDriver

pytestmark = pytest.mark.anyio

BASE = "https://responses.example/v1"
URL = f"{BASE}/responses"
COMPACT_URL = f"{BASE}/responses/compact"
MODEL = Model("gpt-test", context_size=100_000)
LABEL = "openai-responses:gpt-test"

RETAINED: dict[str, Any] = {
    "type": "message",
    "role": "user",
    "content": [{"type": "input_text", "text": "My name is Ada."}],
}
COMPACTION: dict[str, Any] = {
    "id": "cmp_1",
    "type": "compaction",
    "encrypted_content": "gAAAAABcompacted==",
}


def answer(words: str, resp_id: str = "resp_1") -> dict[str, Any]:
    return {
        "id": resp_id,
        "object": "response",
        "status": "completed",
        "model": "gpt-test",
        "output": [
            {
                "id": "msg_9",
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": words}],
            }
        ],
        "usage": {"input_tokens": 10, "output_tokens": 5},
    }


def compacted(*output: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "cmp_resp_1",
        "object": "response.compaction",
        "output": list(output),
        "usage": {"input_tokens": 300, "output_tokens": 40},
    }


def driver() -> OpenAIResponsesDriver:
    return OpenAIResponsesDriver(BASE, api_key="sk-test", retry_policy=RetryPolicy(max_retries=0))


def body_of(route: respx.Route, call: int = -1) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(route.calls[call].request.content)
    return body


async def test_compact_posts_the_transcript_and_keeps_the_output_opaque_in_order() -> None:
    messages = (
        Message.system("Be brief."),
        Message.user("My name is Ada."),
        Message.assistant("Hi"),
    )
    with respx.mock() as mock:
        route = mock.post(COMPACT_URL).respond(json=compacted(RETAINED, COMPACTION))
        async with driver() as d:
            reply = await d.compact(ProviderCall(model=MODEL, messages=messages, cache_key="k1"))
    body = body_of(route)
    assert body["model"] == "gpt-test"
    assert body["instructions"] == "Be brief."
    assert [item["role"] for item in body["input"]] == ["user", "assistant"]
    assert "store" not in body
    assert "include" not in body
    assert reply.message.text == ""
    assert not reply.message.tool_calls
    reasoning = reply.message.reasoning
    assert reasoning is not None
    assert reasoning.provider == LABEL
    assert json.loads(reasoning.provider_reasoning) == [RETAINED, COMPACTION]
    assert reply.usage == Usage(input_tokens=300, output_tokens=40)
    assert reply.finish_reason == "compaction"


@pytest.mark.parametrize(
    "output",
    [[RETAINED], [RETAINED, {"type": "function_call", "call_id": "c", "name": "f"}, COMPACTION]],
)
async def test_an_output_without_a_compaction_or_with_a_strange_item_is_refused(
    output: list[dict[str, Any]],
) -> None:
    from threadline import ProviderResponseError

    with respx.mock() as mock:
        mock.post(COMPACT_URL).respond(json=compacted(*output))
        async with driver() as d:
            with pytest.raises(ProviderResponseError, match="compaction"):
                await d.compact(ProviderCall(model=MODEL, messages=(Message.user("hi"),)))


async def test_a_conversation_compacts_sends_the_whole_output_then_moves_provider() -> None:
    store = MemoryStore()
    with respx.mock() as mock:
        route = mock.post(URL)
        route.side_effect = [
            respx.MockResponse(json=answer("Hello Ada.", "resp_1")),
            respx.MockResponse(json=answer("Sunny.", "resp_2")),
            respx.MockResponse(json=answer("You are Ada.", "resp_3")),
        ]
        compact = mock.post(COMPACT_URL).respond(json=compacted(RETAINED, COMPACTION))
        async with driver() as d:
            agent = Agent(client=Client(d, default_model=MODEL), instructions="Be brief.")
            conv = Conversation(agent, id="t1", store=store)
            await conv.run("My name is Ada.")
            await conv.run("Weather?")
            before = conv.total_usage
            outcome = await conv.compact()
            assert outcome.status == "applied", outcome
            assert outcome.covered_messages == 4
            assert conv.total_usage == before + Usage(input_tokens=300, output_tokens=40)
            assert conv.last_response is not None
            assert conv.last_response.text == "Sunny."
            await conv.run("Who am I?")
    compact_input = body_of(compact)["input"]
    assert [item.get("role") for item in compact_input] == ["user", "assistant"] * 2
    sent = body_of(route)
    # The window opens at the compaction message: its whole output, then the new prompt.
    assert sent["input"][:2] == [RETAINED, COMPACTION]
    assert sent["input"][2]["role"] == "user"
    assert sent["input"][2]["content"] == "Who am I?"
    assert len(sent["input"]) == 3
    assert sent["instructions"] == "Be brief."

    # The store kept every turn; another provider is handed the full text, no opaque item.
    seen: list[ProviderCall] = []

    def elsewhere(call: ProviderCall) -> str:
        seen.append(call)
        return "Still Ada."

    other = Agent(
        client=Client(
            FunctionDriver(elsewhere), default_model=Model("other", context_size=100_000)
        ),
        instructions="Be brief.",
    )
    moved = await Conversation.load(other, store, "t1")
    await moved.run("And now?")
    texts = [m.text for m in seen[0].messages]
    assert texts[:5] == ["Be brief.", "My name is Ada.", "Hello Ada.", "Weather?", "Sunny."]
    assert texts[-1] == "And now?"
    assert all(m.reasoning is None or not m.reasoning.provider_reasoning for m in seen[0].messages)
    assert "gAAAAABcompacted" not in repr(seen[0].messages)


async def test_a_failed_compaction_changes_nothing_and_says_why() -> None:
    store = MemoryStore()
    with respx.mock() as mock:
        mock.post(URL).respond(json=answer("Hello."))
        mock.post(COMPACT_URL).respond(
            status_code=400, json={"error": {"message": "compaction is not available"}}
        )
        async with driver() as d:
            conv = Conversation(Agent(client=Client(d, default_model=MODEL)), store=store)
            await conv.run("hi")
            version, events = conv.version, conv.events
            outcome = await conv.compact()
    assert outcome.status == "failed"
    assert "compaction is not available" in outcome.detail
    assert (conv.version, conv.events) == (version, events)


async def test_a_message_item_that_no_compaction_follows_is_refused() -> None:
    from threadline import InvalidRequestError, Reasoning

    reasoning_item = {"id": "rs_1", "type": "reasoning", "summary": [], "encrypted_content": "x"}
    state = json.dumps([RETAINED, reasoning_item])
    odd = Message.assistant("Hi", reasoning=Reasoning(provider_reasoning=state, provider=LABEL))
    async with driver() as d:
        with pytest.raises(InvalidRequestError, match=r"message 1: .*no compaction item follows"):
            await d.complete(ProviderCall(model=MODEL, messages=(Message.user("a"), odd)))


async def test_a_later_compaction_supersedes_an_earlier_one_and_its_retained_messages() -> None:
    from threadline import Reasoning

    def carrier(*items: dict[str, Any]) -> Message:
        raw = json.dumps(list(items))
        return Message.assistant("", reasoning=Reasoning(provider_reasoning=raw, provider=LABEL))

    later = {**COMPACTION, "id": "cmp_2", "encrypted_content": "gAAAAABlater=="}
    retained_later = {**RETAINED, "content": [{"type": "input_text", "text": "Later."}]}
    messages = (
        Message.user("My name is Ada."),
        carrier(RETAINED, COMPACTION),
        Message.user("Later."),
        Message.assistant("Noted."),
        carrier(retained_later, later),
        Message.user("Now?"),
    )
    with respx.mock() as mock:
        route = mock.post(URL).respond(json=answer("Yes."))
        async with driver() as d:
            await d.complete(ProviderCall(model=MODEL, messages=messages))
    sent = body_of(route)["input"]
    assert sent[:2] == [retained_later, later]
    assert sent[2]["content"] == "Now?"
    assert len(sent) == 3
