"""A reasoning item and the item it belongs to travel together, whatever limiting cuts (hypothesis).

threadline keeps reasoning on the assistant message, and a unit of limiting
holds the assistant message whole (with its tool calls and their results),
so no handler can part a reasoning item from the message or call after it.
These properties check that on the wire: any history, cut by any handler to
any budget, then encoded by the driver, never holds a reasoning item that is
not followed by its own item, nor an item of a reasoned message without its
reasoning in front.
"""

from __future__ import annotations

import itertools
import json
import random
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import httpx
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from threadline import (
    Client,
    Message,
    Model,
    Reasoning,
    Role,
    Tool,
    ToolCall,
)
from threadline.drivers import OpenAIResponsesDriver
from threadline.limiting import (
    TokenLimitEvent,
    TokenLimitHandler,
    cache_stable_units,
    drop_oldest_units,
    summarize_oldest,
)
from threadline.testing import FunctionDriver

BASE = "https://responses.example/v1"
MODEL = Model("gpt-test", context_size=1_000_000)
LABEL = "openai-responses:gpt-test"


class WordCounter:
    """Three per message, one per word, call and 16 bytes of replay state."""

    def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        return sum(
            3
            + len(m.text.split())
            + len(m.tool_calls)
            + (len(m.reasoning.provider_reasoning) // 16 if m.reasoning else 0)
            for m in messages
        )


# -- histories: every reasoning item names the message it was made for ---------------------


def reasoning_for(owner: str, provider: str, items: int, *, compacted: bool = False) -> Reasoning:
    made: list[dict[str, Any]] = [
        {
            "id": f"rs_{owner}_{k}",
            "type": "reasoning",
            "summary": [{"type": "summary_text", "text": f"thinking about {owner}"}],
            "encrypted_content": f"enc-{owner}-{k}",
        }
        for k in range(items)
    ]
    if compacted:
        # Server-side compaction: the compaction item comes first in the answer.
        tag = "ours" if provider == LABEL else "foreign"
        made.insert(0, {"id": f"cmp_{owner}_{tag}", "type": "compaction", "encrypted_content": "c"})
    raw = json.dumps(made[0] if len(made) == 1 else made)
    return Reasoning(text=f"thinking about {owner}", provider_reasoning=raw, provider=provider)


@st.composite
def histories(draw: st.DrawFn) -> tuple[list[Message], dict[str, str]]:
    """Turns of questions, tool exchanges and answers, many of them reasoned.

    Returns the messages and, for every reasoned message sent with its
    reasoning, the owner tag its items carry (its text, or its first call id).
    """
    serial = itertools.count()
    owners: dict[str, str] = {}

    def reasoning(owner: str) -> Reasoning | None:
        kind = draw(st.sampled_from(["none", "ours", "ours", "foreign"]))
        if kind == "none":
            return None
        provider = LABEL if kind == "ours" else "openai-responses:other-model"
        compacted = draw(st.integers(0, 5)) == 0
        return reasoning_for(owner, provider, draw(st.integers(1, 2)), compacted=compacted)

    messages: list[Message] = []
    if draw(st.booleans()):
        messages.append(Message.system("be brief"))
    for _ in range(draw(st.integers(1, 8))):
        messages.append(Message.user(f"question {next(serial)} " * draw(st.integers(1, 6))))
        for _ in range(draw(st.integers(0, 2))):
            ids = [f"call{next(serial)}" for _ in range(draw(st.integers(1, 3)))]
            text = draw(st.sampled_from(["", f"checking {next(serial)}"]))
            owner = text or ids[0]
            thought = reasoning(owner)
            calls = [ToolCall(id=i, name="lookup", arguments="{}") for i in ids]
            messages.append(Message.assistant(text, tool_calls=calls, reasoning=thought))
            messages.extend(Message.tool(i, f"result {i} " * draw(st.integers(1, 5))) for i in ids)
            if thought is not None and thought.provider == LABEL:
                owners[owner] = owner
        if draw(st.integers(0, 6)) == 0:
            # A reply cut off while reasoning: nothing for its items to precede (or
            # only a compaction item, as /responses/compact answers).
            cut = f"cut{next(serial)}"
            compacted = draw(st.booleans())
            thought = reasoning_for(cut, LABEL, 1, compacted=compacted)
            messages.append(Message.assistant("", reasoning=thought))
        if draw(st.integers(0, 4)) > 0:
            answer = f"answer {next(serial)} " * draw(st.integers(1, 6))
            thought = reasoning(answer)
            messages.append(Message.assistant(answer, reasoning=thought))
            if thought is not None and thought.provider == LABEL:
                owners[answer] = answer
    return messages, owners


# -- handlers: the built-in ones, and one that drops any droppable units --------------------


def drop_at_random(seed: int) -> TokenLimitHandler:
    chooser = random.Random(seed)

    def handler(event: TokenLimitEvent) -> None:
        droppable = list(event.units(pinned=False))
        event.drop_units(
            [unit for unit in droppable if chooser.random() < 0.5], reason="random cut"
        )

    return handler


def summarizer() -> Client:
    return Client(FunctionDriver(lambda call: "a summary"), default_model=MODEL)


HANDLERS: dict[str, Callable[[int], TokenLimitHandler]] = {
    "drop_oldest_units": lambda seed: drop_oldest_units(),
    "cache_stable_units": lambda seed: cache_stable_units(),
    "summarize_oldest": lambda seed: summarize_oldest(summarizer(), keep_last_turns=1),
    "random": drop_at_random,
}


# -- the wire check --------------------------------------------------------------------------


def owner_of(item: dict[str, Any]) -> str | None:
    """The owner tag of an assistant item: its text, or its call id."""
    if item.get("type") == "function_call":
        return str(item["call_id"])
    if item.get("role") == "assistant":
        return str(item["content"])
    return None


def check_window(items: list[dict[str, Any]]) -> None:
    """Only this model's compaction items are sent, and only the latest, first of all."""
    compactions = [at for at, item in enumerate(items) if item.get("type") == "compaction"]
    assert compactions in ([], [0]), f"compaction items at {compactions}"
    assert all(str(items[at]["id"]).endswith("_ours") for at in compactions)


def check_pairs(items: list[dict[str, Any]], owners: dict[str, str]) -> None:
    check_window(items)
    items = [item for item in items if item.get("type") != "compaction"]
    for position, item in enumerate(items):
        if item.get("type") == "reasoning":
            owner = str(item["id"]).split("_")[1]
            following = next(
                (later for later in items[position + 1 :] if later.get("type") != "reasoning"),
                None,
            )
            assert following is not None, f"reasoning {item['id']} is the last item"
            assert owner_of(following) == owner, f"reasoning {item['id']} before {following}"
            assert all(
                later.get("type") == "reasoning" and str(later["id"]).split("_")[1] == owner
                for later in items[position + 1 : items.index(following)]
            )
    seen_owners: set[str] = set()
    for position, item in enumerate(items):
        owner = owner_of(item)
        if owner is None or owner not in owners or owner in seen_owners:
            continue
        seen_owners.add(owner)
        before = items[position - 1] if position else {}
        assert before.get("type") == "reasoning", f"{owner} was sent without its reasoning"
        assert str(before["id"]).split("_")[1] == owner


def answer(request: httpx.Request) -> httpx.Response:
    if request.url.path.endswith("/input_tokens"):
        return httpx.Response(200, json={"input_tokens": len(request.content) // 12})
    message = {"type": "message", "content": [{"type": "output_text", "text": "ok"}]}
    return httpx.Response(
        200, json={"object": "response", "status": "completed", "output": [message]}
    )


@pytest.mark.parametrize("handler_name", sorted(HANDLERS))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories(), share=st.integers(5, 110), seed=st.integers(0, 2**16))
def test_no_cut_parts_a_reasoning_item_from_its_item(
    handler_name: str, history: tuple[list[Message], dict[str, str]], share: int, seed: int
) -> None:
    messages, owners = history
    bodies: list[dict[str, Any]] = []

    def record(request: httpx.Request) -> httpx.Response:
        if request.url.path.endswith("/responses"):
            bodies.append(json.loads(request.content))
        return answer(request)

    limit = max(20, WordCounter().count(messages) * share // 100)

    async def run() -> None:
        transport = httpx.MockTransport(record)
        async with httpx.AsyncClient(transport=transport) as http:
            driver = OpenAIResponsesDriver(BASE, http_client=http)
            request = (
                Client(driver, default_model=MODEL)
                .request()
                .with_messages(messages)
                .with_prompt("q")
                .with_token_counter(WordCounter())
                .with_max_context_tokens(limit)
                .with_output_reserve_tokens(0)
                .pre_max_tokens_reached(HANDLERS[handler_name](seed))
            )
            await request.run()

    anyio.run(run)
    for body in bodies:
        check_pairs(body["input"], owners)
        items = body["input"]
        event(f"reasoning sent: {any(item.get('type') == 'reasoning' for item in items)}")
        event(f"window opened: {any(item.get('type') == 'compaction' for item in items)}")
        event(f"cut: {len(items) < sum(m.role is not Role.SYSTEM for m in messages)}")


def test_the_check_itself_catches_an_orphan_and_a_widow() -> None:
    reasoning = {"type": "reasoning", "id": "rs_x_0"}
    with pytest.raises(AssertionError):
        check_pairs([reasoning, {"role": "user", "content": "q"}], {})
    with pytest.raises(AssertionError):
        check_pairs([{"role": "assistant", "content": "x"}], {"x": "x"})
    check_pairs([reasoning, {"role": "assistant", "content": "x"}], {"x": "x"})
    ours = {"type": "compaction", "id": "cmp_x_ours"}
    with pytest.raises(AssertionError):
        check_window([{"role": "user", "content": "q"}, ours])
    with pytest.raises(AssertionError):
        check_window([{**ours, "id": "cmp_x_foreign"}])
    check_window([ours, {"role": "user", "content": "q"}])
