"""clear_tool_results and the cache-miss record against the upstream llama.cpp server.

Every turn reads a document (the model's call is scripted, so the conversation
is the same on every run; the server processes every prompt). What this proves:
the cleared transcript is accepted, the conversation's history keeps every
result whole, each round's cache record names the cleared round, and the
server's own count of cached prompt tokens agrees: rounds whose prefix was kept
are served mostly from its KV cache, a clearing round much less.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import attrs
import pytest

from threadline import Agent, Client, Conversation, Message, Model, Role, ToolCall, tool
from threadline.drivers import OpenAIChatDriver, ProviderCall, ProviderResponse
from threadline.limiting import cache_stable_units, clear_tool_results

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

MODEL = Model("smollm2-135m-instruct", context_size=2048)
TURNS = 8


def document(n: int) -> str:
    return f"notes/{n}: " + " ".join(f"item{(n * 13 + i) % 50}" for i in range(120))


@tool
def read_notes(n: int) -> str:
    """Read note file n."""
    return document(n)


class ScriptedCalls(OpenAIChatDriver):
    """The server answers every call; a step's question gets a read_notes call in place
    of the 135M model's words. The tools are not declared to the server, so it never
    parses the small model's words as a call (every prompt is rendered alike)."""

    async def complete(self, call: ProviderCall) -> ProviderResponse:
        response = await super().complete(attrs.evolve(call, tools=(), tool_choice=None))
        last = call.messages[-1]
        if last.role is Role.USER and last.text.startswith("Step "):
            n = int(last.text.split()[1])
            arguments = json.dumps({"n": n})
            message = Message.assistant(
                tool_calls=[ToolCall(id=f"call_{n}", name="read_notes", arguments=arguments)]
            )
            return attrs.evolve(response, message=message, finish_reason="tool_calls")
        return response


@pytest.fixture
async def client(llama_server_upstream: str) -> AsyncIterator[Client]:
    driver = ScriptedCalls(f"{llama_server_upstream}/v1", max_retries=0)
    async with Client(driver, default_model=MODEL) as opened:
        yield opened


async def test_cleared_results_are_accepted_and_the_cache_record_matches_the_server(
    client: Client,
) -> None:
    agent = Agent(
        client,
        instructions="You keep notes. Reply in a few words.",
        tools=[read_notes],
        max_output_tokens=4,
        temperature=0,
        max_context_tokens=1_300,
        output_reserve_tokens=4,
        pre_max_tokens_reached=clear_tool_results(keep=1, min_tokens=50),
        post_max_tokens_reached=cache_stable_units(),
    )
    conv = Conversation(agent)
    rounds = []
    for n in range(TURNS):
        result = await conv.run(f"Step {n} please read note file {n}.")
        rounds += list(result.rounds)

    reports = [r.cache for r in rounds if r.cache is not None]
    assert len(reports) == len(rounds)
    reasons = [report.prefix.reason for report in reports]
    assert "cleared" in reasons
    assert set(reasons) <= {"first call", "unchanged", "cleared", "cut by limiting"}
    kept = [r.cached_share for r in reports if r.prefix.kept and r.cached_share is not None]
    changed = [
        r.cached_share
        for r in reports
        if r.prefix.reason == "cleared" and r.cached_share is not None
    ]
    assert kept
    assert changed
    assert sum(kept) / len(kept) >= 0.7  # the server served the kept prefix from cache
    assert max(changed) < sum(kept) / len(kept)  # and a clearing round much less of it
    # The history keeps every result whole; only what was sent was cleared.
    results = [e.message.text for e in conv.events if e.message.role is Role.TOOL]
    assert results == [document(n) for n in range(TURNS)]
