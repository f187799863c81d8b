"""Compaction as a transaction, with a fault injected at every step.

``summarize_oldest`` writes its summary first; only a usable one changes what
is sent, and the summary and the cut reach the store with the turn, in the
turn's one versioned write. A summarizer that raises, returns nothing, writes
too much, runs out of time; a store write that fails; a second writer that
commits in between: each leaves every turn in the store verbatim, no summary
saved in place of them, and an outcome the user can read.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import attrs
import pytest

from threadline import (
    Agent,
    Client,
    ConcurrentModificationError,
    Conversation,
    Model,
    RunResult,
)
from threadline.counting import ApproximateCounter
from threadline.drivers import ProviderCall, ProviderResponse
from threadline.limiting import SUMMARY_HEADING, cache_stable_units, summarize_oldest
from threadline.stores import ConversationStore
from threadline.stores.sqlite import SQLiteStore
from threadline.testing import ScriptedDriver

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

MODEL = Model("scripted-model", context_size=100_000)
BUDGET = 400
PROMPT = "tell me one more thing about the weather in the mountains today, please"
REPLY = "it is cold and windy up there, so bring a warm coat and good boots along"
SUMMARY = "The user asks about mountain weather; it is cold and windy."
COMPACTING_TURN = 9  # the first turn over the budget: it summarizes (see the applied test)


def _sqlite(request: pytest.FixtureRequest, tmp_path: Path) -> ConversationStore:
    return SQLiteStore(tmp_path / "threads.db")


def _postgres(request: pytest.FixtureRequest, tmp_path: Path) -> ConversationStore:
    from threadline.stores.postgres import PostgresStore

    return PostgresStore(request.getfixturevalue("postgres_server").create_database())


def _redis(request: pytest.FixtureRequest, tmp_path: Path) -> ConversationStore:
    from threadline.stores.redis import RedisStore

    server = request.getfixturevalue("redis_server")
    return RedisStore(server.url(), prefix=f"test-{uuid.uuid4().hex}:")


@pytest.fixture(
    params=[
        pytest.param(_sqlite, id="sqlite"),
        pytest.param(_postgres, id="postgres", marks=pytest.mark.integration),
        pytest.param(_redis, id="redis", marks=pytest.mark.integration),
    ]
)
async def store(
    request: pytest.FixtureRequest, tmp_path: Path, anyio_backend: str
) -> AsyncIterator[ConversationStore]:
    factory: Callable[[pytest.FixtureRequest, Path], ConversationStore] = request.param
    opened = factory(request, tmp_path)
    try:
        yield opened
    finally:
        await opened.aclose()


class CutOff(ScriptedDriver):
    """Answers as scripted, but says each answer stopped at the output limit."""

    async def complete(self, call: ProviderCall) -> ProviderResponse:
        return attrs.evolve(await super().complete(call), finish_reason="length")


class Stuck(ScriptedDriver):
    """Never answers: the summarizer's own timeout has to end the wait."""

    async def complete(self, call: ProviderCall) -> ProviderResponse:
        await anyio.sleep_forever()
        raise AssertionError("unreachable")


def agent_for(driver: ScriptedDriver, writer: ScriptedDriver, **options: Any) -> Agent:
    summarize = summarize_oldest(Client(writer), model=MODEL, keep_last_turns=2, **options)
    return Agent(
        Client(driver),
        model=MODEL,
        instructions="You answer in one sentence.",
        max_context_tokens=BUDGET + 50,
        output_reserve_tokens=50,
        token_counter=ApproximateCounter(),
        pre_max_tokens_reached=summarize,
        # A Post that keeps a stable prefix: the window (and the summary heading
        # it) is the conversation's, saved with each turn.
        post_max_tokens_reached=cache_stable_units(),
    )


async def fill(conv: Conversation, driver: ScriptedDriver, turns: int) -> list[RunResult]:
    driver.add_replies([REPLY] * turns)
    return [await conv.run(f"{PROMPT} {t}") for t in range(turns)]


async def stored_texts(store: ConversationStore, id: str) -> list[str]:
    return [event.message.text for event in (await store.load(id)).document.events]


def every_turn(turns: int) -> list[str]:
    return [text for t in range(turns) for text in (f"{PROMPT} {t}", REPLY)]


def outcomes(results: list[RunResult]) -> list[str]:
    return [c.status for r in results for record in r.limiting for c in record.compactions]


@pytest.mark.parametrize(
    ("make_writer", "status"),
    [
        (lambda: ScriptedDriver([RuntimeError("summarizer down")] * 20), "failed"),
        (lambda: ScriptedDriver(["   "] * 20), "empty"),
        (lambda: ScriptedDriver([" ".join(["very long summary"] * 400)] * 20), "too long"),
    ],
    ids=["raises", "empty", "longer-than-what-it-covers"],
)
async def test_a_summary_that_cannot_be_used_is_a_reported_no_op(
    store: ConversationStore, make_writer: Callable[[], ScriptedDriver], status: str
) -> None:
    writer = make_writer()
    driver = ScriptedDriver()
    conv = Conversation(agent_for(driver, writer), id="t", store=store)
    results = await fill(conv, driver, 10)

    assert status in outcomes(results)
    assert set(outcomes(results)) == {status}
    failed = next(c for r in results for rec in r.limiting for c in rec.compactions)
    assert not failed.applied
    assert failed.summary_tokens != 0
    assert f"compaction {status}" in next(
        rec.summary() for r in results for rec in r.limiting if rec.compactions
    )
    # Nothing stands in for the turns: every one is stored verbatim, no summary anywhere.
    assert await stored_texts(store, "t") == every_turn(10)
    assert not any(m.text.startswith(SUMMARY_HEADING) for m in conv.messages)
    loaded = await Conversation.load(agent_for(driver, writer), store, "t")
    assert not any(m.text.startswith(SUMMARY_HEADING) for m in loaded.model_input)


async def test_a_summary_cut_off_at_its_cap_is_used_and_says_so(store: ConversationStore) -> None:
    driver = ScriptedDriver()
    conv = Conversation(agent_for(driver, CutOff([SUMMARY] * 20)), id="t", store=store)
    results = await fill(conv, driver, 10)

    cut = [c for r in results for rec in r.limiting for c in rec.compactions if c.applied]
    assert cut
    assert all("cut off at max_summary_tokens" in c.detail for c in cut)
    assert any(m.text.startswith(SUMMARY_HEADING) for m in conv.model_input)
    assert await stored_texts(store, "t") == every_turn(10)  # the turns themselves are kept


async def test_a_summarizer_out_of_time_is_a_reported_no_op(store: ConversationStore) -> None:
    driver = ScriptedDriver()
    conv = Conversation(agent_for(driver, Stuck(), timeout=0.05), id="t", store=store)
    results = await fill(conv, driver, 10)

    assert "cancelled" in outcomes(results)
    assert await stored_texts(store, "t") == every_turn(10)
    assert not any(m.text.startswith(SUMMARY_HEADING) for m in conv.messages)


async def test_a_summary_and_its_cut_ride_in_the_turns_one_write(
    store: ConversationStore,
) -> None:
    driver = ScriptedDriver()
    writer = ScriptedDriver([SUMMARY] * 20)
    conv = Conversation(agent_for(driver, writer), id="t", store=store)
    versions = []
    results = []
    for t in range(10):
        driver.add_replies([REPLY])
        results.append(await conv.run(f"{PROMPT} {t}"))
        versions.append((await store.load("t")).version)

    assert outcomes(results) == ["applied"]
    assert [bool(outcomes([r])) for r in results].index(True) == COMPACTING_TURN
    # Two writes a turn (the pending prompt, then the turn), with a summary or without.
    assert [b - a for a, b in itertools.pairwise(versions)] == [versions[1] - versions[0]] * 9
    # The store keeps every turn; the summary heads the window it saved.
    assert await stored_texts(store, "t") == every_turn(10)
    loaded = await Conversation.load(agent_for(driver, writer), store, "t")
    assert loaded.messages[0].text == f"{SUMMARY_HEADING}\n{SUMMARY}"
    assert loaded.model_input == conv.model_input


class FailingCommit:
    """A store whose next turn commit fails (the pending write before it succeeds)."""

    def __init__(self, inner: ConversationStore) -> None:
        self._inner = inner
        self.fail_next_commit = False

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def append_events(self, *args: Any, **kwargs: Any) -> int:
        if self.fail_next_commit and kwargs.get("drop_pending") not in (None, False):
            self.fail_next_commit = False
            raise OSError("disk full")
        result: int = await self._inner.append_events(*args, **kwargs)
        return result


async def test_a_failed_store_write_saves_neither_summary_nor_cut(
    store: ConversationStore,
) -> None:
    driver = ScriptedDriver()
    writer = ScriptedDriver([SUMMARY] * 20)
    failing = FailingCommit(store)
    conv = Conversation(agent_for(driver, writer), id="t", store=failing)  # type: ignore[arg-type]
    await fill(conv, driver, COMPACTING_TURN)
    before_window = conv.model_input
    driver.add_replies([REPLY])
    failing.fail_next_commit = True
    with pytest.raises(OSError, match="disk full"):
        await conv.run(f"{PROMPT} {COMPACTING_TURN}")

    assert len(writer.calls) == 1  # the summary was written; the write that carried it failed
    assert conv.model_input == before_window  # nothing changed in memory
    assert await stored_texts(store, "t") == every_turn(COMPACTING_TURN)
    loaded = await Conversation.load(agent_for(driver, writer), store, "t")
    assert loaded.model_input == before_window


async def test_a_second_writer_in_between_refuses_the_compaction(
    store: ConversationStore,
) -> None:
    driver = ScriptedDriver()
    writer = ScriptedDriver([SUMMARY] * 20)
    conv = Conversation(agent_for(driver, writer), id="t", store=store)
    await fill(conv, driver, COMPACTING_TURN)
    other_driver = ScriptedDriver(["the other writer's answer"])

    class Interleaving(ScriptedDriver):
        """The main model's call: another process loads the conversation and commits a
        turn while the model works (after this turn's summary was written)."""

        async def complete(self, call: ProviderCall) -> ProviderResponse:
            other_writer = ScriptedDriver(["The other writer's summary."])
            other = await Conversation.load(agent_for(other_driver, other_writer), store, "t")
            await other.run("the other writer's question")
            return await super().complete(call)

    racing = await Conversation.load(agent_for(Interleaving([REPLY]), writer), store, "t")
    with pytest.raises(ConcurrentModificationError) as refused:
        await racing.run(f"{PROMPT} {COMPACTING_TURN}")

    unsaved = refused.value.unsaved_result
    assert unsaved is not None
    assert "applied" in outcomes([unsaved])  # the summary was written, then refused with it
    texts = await stored_texts(store, "t")
    assert texts == [
        *every_turn(COMPACTING_TURN),
        "the other writer's question",
        "the other writer's answer",
    ]
    # The window saved is the other writer's (its turn compacted too); this one's is not.
    loaded = await Conversation.load(agent_for(driver, writer), store, "t")
    assert loaded.messages[0].text == f"{SUMMARY_HEADING}\nThe other writer's summary."
    assert not any(m.text.endswith(SUMMARY) for m in loaded.model_input)
