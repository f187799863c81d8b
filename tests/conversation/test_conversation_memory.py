"""What a conversation keeps in memory beyond its messages: little, and not per message.

``benchmarks/bench_memory.py`` holds thousands of conversations to the target
(at most 1.3 times the messages' own size); these tests keep the structures a
conversation once held for good from coming back: the last call's transcript
(a reference per message, plus the turn's original prompt and the system
message), a copy of the agent's settings, empty dicts. Memory is traced
(``tracemalloc``) over ``n`` conversations and ``n / 2``, so what is made once
(the client, the driver, imports) cancels out, through a driver that keeps
nothing of its own.
"""

from __future__ import annotations

import gc
import sys
import tracemalloc

import anyio
import anyio.lowlevel
import pytest

from threadline import Agent, Client, Conversation, Message, Model, Origin, Usage
from threadline.counting import DefaultReplayProjection
from threadline.drivers import Driver, ProviderCall, ProviderResponse

MODEL = Model("memory-model", context_size=32_000)
CONVERSATIONS = 12


class Replying(Driver):
    """Answers every call at once, keeping nothing: what is traced is the conversations'."""

    name = "replying"

    def token_counter(self) -> None:
        return None

    def replay_projection(self, model: Model) -> DefaultReplayProjection:
        return DefaultReplayProjection()

    async def aclose(self) -> None:
        pass

    async def complete(self, call: ProviderCall) -> ProviderResponse:
        await anyio.lowlevel.checkpoint()
        sent = len(call.messages)
        return ProviderResponse(
            message=Message.assistant(
                f"You sent {sent} messages. " + "word " * 30, origin=Origin.TURN
            ),
            finish_reason="stop",
            usage=Usage(input_tokens=10 * sent, output_tokens=30),
            model=call.model.name,
        )


def _message_size(message: Message) -> int:
    # The floor bench_conversation.message_size takes for a plain text message.
    return sys.getsizeof(message) + sys.getsizeof(message.content)


async def _talk(agent: Agent, conversations: int, turns: int) -> list[Conversation]:
    threads = [Conversation(agent) for _ in range(conversations)]
    for index, conv in enumerate(threads):
        for turn in range(turns):
            await conv.run(f"conversation {index} turn {turn}: " + "text " * 20)
    return threads


def _kept(conversations: int, turns: int) -> tuple[int, int]:
    """Traced bytes ``conversations`` of ``turns`` turns keep, and their messages' own."""
    agent = Agent(Client(Replying()), model=MODEL, instructions="You are careful.")
    anyio.run(_talk, agent, 2, 2)  # imports and first-use caches, before tracing
    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        threads = anyio.run(_talk, agent, conversations, turns)
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    floor = sum(_message_size(event.message) for conv in threads for event in conv.events)
    return kept, floor


def over_floor(turns: int) -> tuple[float, float]:
    """Bytes a conversation of ``turns`` turns keeps beyond its messages' own, and the
    messages' own, each per conversation."""
    big, big_floor = _kept(CONVERSATIONS, turns)
    small, small_floor = _kept(CONVERSATIONS // 2, turns)
    extra = CONVERSATIONS - CONVERSATIONS // 2
    floor = (big_floor - small_floor) / extra
    return (big - small) / extra - floor, floor


@pytest.fixture(scope="module")
def twenty_turns() -> tuple[float, float]:
    return over_floor(20)


def test_a_conversation_keeps_less_than_a_fifth_more_than_its_messages(
    twenty_turns: tuple[float, float],
) -> None:
    # 20 turns: 1.17 times the messages' own size; 1.29 while a conversation kept its
    # last call's transcript, the turn's original prompt and a system message of its
    # own, a copy of the agent's settings and empty dicts.
    over, floor = twenty_turns
    assert over / floor <= 0.2, f"{over:.0f} bytes kept beyond {floor:.0f} of messages"


def test_a_message_costs_a_conversation_little_more_than_its_place_in_the_transcript(
    twenty_turns: tuple[float, float],
) -> None:
    # Each message more: a reference in the transcript's list (8 bytes, and the list's
    # spare room), its event packed (1 to 8), a user message's index (4): 13 to 14
    # bytes a message measured; 21 while the last call's transcript was kept too.
    over, _ = twenty_turns
    longer, _ = over_floor(100)
    per_message = (longer - over) / (2 * (100 - 20))
    assert per_message <= 16, f"{per_message:.1f} bytes kept a message"
