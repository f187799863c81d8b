"""Streaming a turn: it joins the conversation only when the stream completes.

Every test runs on asyncio and on trio.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import anyio
import pytest

from threadline import (
    Agent,
    Client,
    Conversation,
    FinalResult,
    Model,
    ProviderUnavailableError,
    RoundDone,
    StreamEvent,
    TextDelta,
)
from threadline.drivers import ProviderCall, StreamChunk, TextChunk
from threadline.testing import ScriptedDriver

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

MODEL = Model("scripted-model", context_size=8192)


class BreaksMidStream(ScriptedDriver):
    """Streams part of a reply, then fails the way a dropped connection does."""

    @asynccontextmanager
    async def stream(self, call: ProviderCall) -> AsyncIterator[AsyncIterator[StreamChunk]]:
        self.calls.append(call)

        async def chunks() -> AsyncGenerator[StreamChunk, None]:
            yield TextChunk(text="partial ans")
            raise ProviderUnavailableError("connection reset")

        generator = chunks()
        try:
            yield generator
        finally:
            await generator.aclose()


async def started(driver: ScriptedDriver) -> Conversation:
    conv = Conversation(Agent(Client(driver), model=MODEL))
    await conv.run("first question")
    return conv


def snapshot(conv: Conversation) -> tuple[Any, ...]:
    return (
        conv.events,
        conv.total_usage,
        conv.turns,
        conv.last_response,
        conv.messages,
        conv.pending_events,
        conv.to_json(),
    )


def sent_texts(driver: ScriptedDriver, call: int) -> list[str]:
    return [m.text for m in driver.calls[call].messages]


async def test_a_completed_stream_adds_the_turn_before_handing_out_the_final_result() -> None:
    driver = ScriptedDriver(["first answer", "a streamed answer"])
    conv = await started(driver)
    seen: list[StreamEvent] = []
    turns_at_final: int | None = None

    async with conv.stream("second question") as events:
        async for event in events:
            seen.append(event)
            if isinstance(event, FinalResult):
                turns_at_final = conv.turn_count()

    assert "".join(e.text for e in seen if isinstance(e, TextDelta)) == "a streamed answer"
    assert [type(e) for e in seen[-2:]] == [RoundDone, FinalResult]
    assert turns_at_final == 2
    assert conv.turns[-1].text == "a streamed answer"
    final = seen[-1]
    assert isinstance(final, FinalResult)
    assert conv.last_response == final.result.response


async def test_break_before_the_end_leaves_the_conversation_as_it_was() -> None:
    driver = ScriptedDriver(["first answer", "a long streamed answer", "third answer"])
    conv = await started(driver)
    before = snapshot(conv)

    async with conv.stream("second question") as events:
        async for event in events:
            if isinstance(event, TextDelta):
                break

    assert snapshot(conv) == before
    await conv.run("third question")
    assert sent_texts(driver, 2) == ["first question", "first answer", "third question"]


async def test_a_cancel_scope_leaves_the_conversation_as_it_was() -> None:
    driver = ScriptedDriver(["first answer", "a long streamed answer"])
    conv = await started(driver)
    before = snapshot(conv)

    with anyio.CancelScope() as scope:
        async with conv.stream("second question") as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    scope.cancel()
                    await anyio.lowlevel.checkpoint()

    assert scope.cancelled_caught
    assert snapshot(conv) == before


async def test_an_error_in_the_callers_loop_leaves_the_conversation_as_it_was() -> None:
    driver = ScriptedDriver(["first answer", "a long streamed answer"])
    conv = await started(driver)
    before = snapshot(conv)

    async def consume_with_a_bug() -> None:
        async with conv.stream("second question") as events:
            async for _ in events:
                raise KeyError("the caller's own bug")

    with pytest.raises(KeyError):
        await consume_with_a_bug()

    assert snapshot(conv) == before


async def test_a_provider_failure_mid_stream_is_not_used_as_context_next_time() -> None:
    driver = BreaksMidStream(["first answer", "third answer"])
    conv = await started(driver)
    before = snapshot(conv)

    async def consume() -> None:
        async with conv.stream("second question") as events:
            async for _ in events:
                pass

    with pytest.raises(ProviderUnavailableError):
        await consume()

    assert snapshot(conv) == before
    await conv.run("third question")
    assert sent_texts(driver, 2) == ["first question", "first answer", "third question"]


async def test_leaving_after_the_final_result_keeps_the_turn() -> None:
    driver = ScriptedDriver(["first answer", "second answer"])
    conv = await started(driver)

    async with conv.stream("second question") as events:
        async for event in events:
            if isinstance(event, FinalResult):
                break

    assert conv.turn_count() == 2


async def test_a_run_waits_while_a_stream_is_open() -> None:
    driver = ScriptedDriver(["first answer", "streamed", "after the stream"])
    conv = await started(driver)
    done: list[str] = []

    async with anyio.create_task_group() as tg, conv.stream("second question") as events:
        tg.start_soon(conv.run, "third question")
        await anyio.wait_all_tasks_blocked()
        # The run waits on the lock; the stream has not called the model yet either.
        assert len(driver.calls) == 1
        async for event in events:
            if isinstance(event, FinalResult):
                done.append(event.result.text)

    assert done == ["streamed"]
    assert sent_texts(driver, 2)[-3:] == ["second question", "streamed", "third question"]
    assert [t.text for t in conv.turns] == ["first answer", "streamed", "after the stream"]


async def test_the_same_conversation_gives_the_same_transcript_on_each_backend() -> None:
    driver = ScriptedDriver(["one", "two", "three"])
    conv = Conversation(Agent(Client(driver), model=MODEL), id="same")
    await conv.run("a")
    async with conv.stream("b") as events:
        async for _ in events:
            pass
    await conv.run("c")

    assert [(e.turn_id, e.message.role.value, e.message.text) for e in conv.events] == [
        (0, "user", "a"),
        (0, "assistant", "one"),
        (1, "user", "b"),
        (1, "assistant", "two"),
        (2, "user", "c"),
        (2, "assistant", "three"),
    ]
