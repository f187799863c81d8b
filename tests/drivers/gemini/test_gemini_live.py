"""The Gemini driver against the real API, for whoever has a key: ``GEMINI_API_KEY=...``.

Skipped without the key, so in CI, which proves the wire against the fixtures
of ``fixtures/`` (written from the documented shapes), not a live server.
``GEMINI_LIVE_MODEL`` picks the model (default ``gemini-2.5-flash``).
"""

from __future__ import annotations

import os

import pytest

from threadline import Client, FinalResult, Model, tool
from threadline.drivers.gemini import GeminiDriver, ThinkingConfig

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not os.environ.get("GEMINI_API_KEY"), reason="needs GEMINI_API_KEY"),
]

MODEL = Model(os.environ.get("GEMINI_LIVE_MODEL", "gemini-2.5-flash"), context_size=1_048_576)


@tool
def check_flight(flight: str) -> str:
    """A flight's status.

    Args:
        flight: the flight number, such as AA100.
    """
    return f"{flight} is delayed by two hours"


@tool
def book_taxi(time: str) -> str:
    """Book a taxi.

    Args:
        time: when the taxi should come.
    """
    return f"a taxi is booked for {time}"


async def test_a_sequential_tool_conversation_replays_its_signatures_across_turns() -> None:
    async with GeminiDriver(thinking=ThinkingConfig(include_thoughts=True)) as gemini:
        client = Client(gemini, default_model=MODEL)
        first = await (
            client.request()
            .with_tools([check_flight, book_taxi])
            .with_prompt("Check flight AA100; if it is delayed, book a taxi for 2 PM.")
            .run()
        )
        assert first.text
        assert any(message.tool_calls for message in first.messages)
        again = await (
            client.request()
            .with_messages(first.messages)
            .with_tools([check_flight, book_taxi])
            .with_prompt("Which flight did you check?")
            .run()
        )
        assert "AA100" in again.text
        counted = await gemini.exact_token_counter(MODEL).count(again.messages)
        assert counted > 0


async def test_a_streamed_answer_arrives_whole() -> None:
    async with GeminiDriver() as gemini:
        request = Client(gemini, default_model=MODEL).request().with_prompt("Say hello.")
        async with request.stream() as events:
            finals = [event async for event in events if isinstance(event, FinalResult)]
    assert finals[0].result.text
