"""summarize_oldest in a Conversation against llama-cpp-python's real server.

The same server writes the answers and the summaries. What this proves is
that a summary request built by the handler is accepted and read, and that
the compacted transcript the conversation then sends is accepted too; the
135M model's prose is not judged.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from threadline import Agent, Client, Conversation, Model
from threadline.drivers import OpenAIChatDriver
from threadline.limiting import SUMMARY_HEADING, drop_oldest_units, summarize_oldest

pytestmark = [pytest.mark.integration, pytest.mark.anyio]


@pytest.fixture
async def client(llama_server: str, llama_model: Model) -> AsyncIterator[Client]:
    driver = OpenAIChatDriver(llama_server, api_key="not-needed", max_retries=0)
    async with Client(driver, default_model=llama_model) as client:
        yield client


async def test_a_long_conversation_is_summarized_and_the_server_accepts_it(
    client: Client,
) -> None:
    agent = Agent(
        client,
        instructions="You are a helpful assistant. Answer in one short sentence.",
        max_output_tokens=24,
        temperature=0,
    )
    conv = Conversation(
        agent,
        max_context_tokens=200,
        output_reserve_tokens=48,
        pre_max_tokens_reached=summarize_oldest(agent, keep_last_turns=1, max_summary_tokens=64),
        post_max_tokens_reached=drop_oldest_units(None),
    )
    prompts = [
        "My name is Ada and I live in Lisbon, a city by the river Tagus.",
        "I work as an engineer building bridges, mostly steel ones.",
        "My favourite food is grilled sardines with bread and salad.",
        "On weekends I walk along the river and read books about history.",
        "Next year I plan to travel to Porto by train with my sister.",
        "What is my name?",
    ]

    results = [await conv.run(prompt) for prompt in prompts]

    print(
        [(rec.tokens_before, rec.budget_tokens) for r in results for rec in r.limiting],
        [r.text for r in results],
    )
    handlers = [h.handler for r in results for record in r.limiting for h in record.handlers]
    assert "summarize_oldest" in handlers
    summarized = [
        r
        for r in results
        if any(m.text.startswith(SUMMARY_HEADING) for m in r.messages if m.role.value == "user")
    ]
    # A summary cut off at max_summary_tokens is not used (a reported no-op), so the
    # summaries are written at the agent's temperature 0; the outcomes say why when
    # none was sent.
    outcomes = [c for r in results for record in r.limiting for c in record.compactions]
    assert summarized, f"a summary message must have been sent; outcomes: {outcomes}"
    summary_text = next(
        m.text for m in summarized[-1].messages if m.text.startswith(SUMMARY_HEADING)
    )
    assert summary_text.removeprefix(SUMMARY_HEADING).strip()
    assert all(r.response.finish_reason in ("stop", "length") for r in results)
    assert conv.turn_count() == len(prompts)
    assert len(conv.events) == 2 * len(prompts)
