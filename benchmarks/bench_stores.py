"""Committed turns per second and commit latency of every store, beside the OpenAI
Agents SDK's sessions on the same servers.

Run it with ``python benchmarks/bench_stores.py`` (``--quick`` for a short
look). It starts a PostgreSQL cluster (fsync on) and a Redis server (no
persistence) of its own on 127.0.0.1, as the tests do, and measures on
asyncio:

- for 1, 8 and 64 conversations written at once, each turn a threadline turn
  as a ``Conversation`` writes it: the prompt stored pending, then the
  commit of prompt and answer that drops the pending copy, each with its
  version check. Turns per second and the p50/p99 latency of a whole turn.
- under contention: 8 writers on one conversation; a refused writer loads
  the conversation again and retries, so every turn is committed once.
- the same workload through the Agents SDK's ``SQLAlchemySession`` (asyncpg,
  on the same PostgreSQL) and ``RedisSession`` (redis.asyncio, on the same
  Redis): one ``add_items`` of prompt and answer per turn, no version check,
  no pending step; under contention the writers simply append.

Each shape runs ``REPEATS`` times, every store and session in turn within a
round, and the run with the median turns per second of each is printed and
compared: on a shared machine one burst of a second or less swings by 2x
either way (RedisStore / RedisSession at 8 conversations read 0.62, 1.86
and 2.22 in three rounds of one run), and interleaving puts a busy moment on
both sides alike.

Targets: each threadline server store at least as fast as its peer (ratio
>= 1), and faster than ``SQLiteStore`` at 64 concurrent conversations.
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from statistics import quantiles
from typing import Any

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from servers import PostgresServer, RedisServer
from threadline import ConcurrentModificationError, Message, Origin, Usage
from threadline.serialization import ConversationDocument, ConversationEvent
from threadline.stores import ConversationStore
from threadline.stores.postgres import PostgresStore
from threadline.stores.redis import RedisStore
from threadline.stores.sqlite import SQLiteStore

PROMPT = "What is the weather like in Porto today, and should I take an umbrella?"
ANSWER = (
    "Porto is mild today: around 17 degrees, light wind from the north-west and a "
    "thirty percent chance of showers in the afternoon. A small umbrella is a good idea."
)
POOL = 20
REPEATS = 5


class Measure:
    def __init__(self) -> None:
        self.latencies: list[float] = []
        self.elapsed = 0.0

    @property
    def turns_per_second(self) -> float:
        return len(self.latencies) / self.elapsed if self.elapsed else 0.0

    @staticmethod
    def median(measures: list[Measure]) -> Measure:
        """The run with the median turns per second."""
        return sorted(measures, key=lambda measure: measure.turns_per_second)[len(measures) // 2]

    def percentile(self, which: int) -> float:
        if len(self.latencies) < 2:
            return self.latencies[0] if self.latencies else 0.0
        return quantiles(self.latencies, n=100, method="inclusive")[which - 1]


async def timed(measure: Measure, tasks: list[Callable[[], Awaitable[None]]]) -> Measure:
    """Run ``tasks`` at once; ``measure.elapsed`` is how long they took together."""
    started = time.perf_counter()
    async with anyio.create_task_group() as group:
        for task in tasks:
            group.start_soon(task)
    measure.elapsed = time.perf_counter() - started
    return measure


# --- threadline -------------------------------------------------------------------------


def _events(turn: int) -> tuple[ConversationEvent, ConversationEvent, ConversationEvent]:
    user = Message.user(PROMPT, origin=Origin.TURN)
    return (
        ConversationEvent(message=user, turn_id=turn, pending=True),
        ConversationEvent(message=user, turn_id=turn),
        ConversationEvent(
            message=Message.assistant(ANSWER, origin=Origin.TURN),
            turn_id=turn,
            usage=Usage(input_tokens=40, output_tokens=35),
            model="bench",
            finish_reason="stop",
        ),
    )


async def threadline_turn(
    store: ConversationStore, conversation_id: str, version: int, turn: int
) -> int:
    pending, prompt, answer = _events(turn)
    header = ConversationDocument(id=conversation_id, next_turn_id=turn + 1)
    marker = uuid.uuid4().hex
    version = await store.append_events(
        conversation_id, [pending], header=header, expected_version=version, pending_marker=marker
    )
    try:
        return await store.append_events(
            conversation_id,
            [prompt, answer],
            header=header,
            expected_version=version,
            drop_pending=marker,
        )
    except ConcurrentModificationError:
        await store.remove_pending(conversation_id, marker)
        raise


async def run_threadline(store: ConversationStore, conversations: int, turns: int) -> Measure:
    measure = Measure()
    run = uuid.uuid4().hex[:8]

    async def one(index: int) -> None:
        version = 0
        for turn in range(turns):
            started = time.perf_counter()
            version = await threadline_turn(store, f"{run}-{index}", version, turn)
            measure.latencies.append(time.perf_counter() - started)

    return await timed(measure, [functools.partial(one, index) for index in range(conversations)])


async def run_threadline_contended(store: ConversationStore, writers: int, turns: int) -> Measure:
    measure = Measure()
    conversation_id = f"contended-{uuid.uuid4().hex[:8]}"
    await store.save(ConversationDocument(id=conversation_id), expected_version=0)

    async def writer() -> None:
        for _ in range(turns):
            started = time.perf_counter()
            while True:
                stored = await store.load(conversation_id)
                try:
                    await threadline_turn(
                        store, conversation_id, stored.version, stored.document.next_turn_id
                    )
                    break
                except ConcurrentModificationError:
                    continue
            measure.latencies.append(time.perf_counter() - started)

    return await timed(measure, [writer] * writers)


# --- the Agents SDK's sessions ------------------------------------------------------------


async def run_sessions(
    make: Callable[[str], Any], conversations: int, turns: int, *, shared: bool = False
) -> Measure:
    measure = Measure()
    run = uuid.uuid4().hex[:8]
    items = [{"role": "user", "content": PROMPT}, {"role": "assistant", "content": ANSWER}]

    async def one(index: int) -> None:
        session = make(f"{run}-{0 if shared else index}")
        for _ in range(turns):
            started = time.perf_counter()
            await session.add_items(items)
            measure.latencies.append(time.perf_counter() - started)

    return await timed(measure, [functools.partial(one, index) for index in range(conversations)])


# --- the run ------------------------------------------------------------------------------


def line(name: str, measure: Measure) -> None:
    print(
        f"  {name:<26} {measure.turns_per_second:9.0f} turns/s   "
        f"p50 {measure.percentile(50) * 1000:7.2f} ms   p99 {measure.percentile(99) * 1000:7.2f} ms"
    )


async def bench(pg_url: str, sa_url: str, redis_url: str, db_dir: Path, quick: bool) -> bool:
    from agents.extensions.memory.redis_session import RedisSession
    from agents.extensions.memory.sqlalchemy_session import SQLAlchemySession
    from redis.asyncio import Redis
    from sqlalchemy.ext.asyncio import create_async_engine

    engine = create_async_engine(sa_url, pool_size=POOL, max_overflow=0)
    redis_client = Redis.from_url(redis_url, max_connections=64)
    warm = SQLAlchemySession("warm", engine=engine, create_tables=True)
    await warm.add_items([{"role": "user", "content": "hi"}])

    def sqlalchemy_session(session_id: str) -> Any:
        return SQLAlchemySession(session_id, engine=engine)

    def redis_session(session_id: str) -> Any:
        return RedisSession(session_id, redis_client=redis_client, key_prefix="bench:agents")

    stores: dict[str, ConversationStore] = {
        "SQLiteStore": SQLiteStore(db_dir / "bench.db"),
        "PostgresStore": PostgresStore(pg_url, max_connections=POOL),
        "RedisStore": RedisStore(redis_url, prefix="bench:threadline:", max_connections=64),
    }
    peers = {
        "PostgresStore": ("SQLAlchemySession", sqlalchemy_session),
        "RedisStore": ("RedisSession", redis_session),
    }
    shapes = [(1, 60 if quick else 150), (8, 20 if quick else 40), (64, 4 if quick else 8)]
    repeats = 3 if quick else REPEATS
    met = True
    results: dict[tuple[str, int], Measure] = {}
    for conversations, turns in shapes:
        print(
            f"\n{conversations} concurrent conversation(s), {turns} turns each; the median of "
            f"{repeats} rounds, each store and session in turn"
        )
        for store in stores.values():
            await run_threadline(store, conversations, 2)  # warm the pools
        rounds: dict[str, list[Measure]] = {}
        for _ in range(repeats):
            for name, store in stores.items():
                measure = await run_threadline(store, conversations, turns)
                rounds.setdefault(name, []).append(measure)
            for peer, make in peers.values():
                rounds.setdefault(peer, []).append(await run_sessions(make, conversations, turns))
        for name, measures in rounds.items():
            results[name, conversations] = measure = Measure.median(measures)
            line(name, measure)
        for name, (peer, _) in peers.items():
            ratio = (
                results[name, conversations].turns_per_second
                / results[peer, conversations].turns_per_second
            )
            ok = ratio >= 1.0
            met &= ok
            print(f"  {name} / {peer}: {ratio:.2f}  (target >= 1: {'met' if ok else 'NOT met'})")
    for name in ("PostgresStore", "RedisStore"):
        ratio = results[name, 64].turns_per_second / results["SQLiteStore", 64].turns_per_second
        ok = ratio > 1.0
        met &= ok
        print(
            f"  {name} / SQLiteStore at 64: {ratio:.2f}  (target > 1: {'met' if ok else 'NOT met'})"
        )

    writers, turns = 8, 8 if quick else 25
    print(f"\ncontention: {writers} writers on one conversation, {turns} turns each")
    contended: dict[str, Measure] = {}
    for name, store in stores.items():
        contended[name] = measure = await run_threadline_contended(store, writers, turns)
        line(name + " (version-checked)", measure)
    for peer, make in peers.values():
        contended[peer] = measure = await run_sessions(make, writers, turns, shared=True)
        line(peer + " (no check)", measure)
    for name, (peer, _) in peers.items():
        ratio = contended[name].turns_per_second / contended[peer].turns_per_second
        print(f"  {name} / {peer}: {ratio:.2f}  (a peer that checks nothing; no target)")

    for store in stores.values():
        await store.aclose()
    await redis_client.aclose()
    await engine.dispose()
    return met


def load_line(when: str) -> str:
    """The machine's load, so a reader can tell a quiet run from a shared one."""
    one, five, _ = os.getloadavg()
    cpus = os.cpu_count()
    return f"\nload average {when} the run: {one:.1f} (1 min), {five:.1f} (5 min), {cpus} CPUs"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer turns, for a quick look")
    args = parser.parse_args()
    bindir, redis_binary = PostgresServer.find(), RedisServer.find()
    if bindir is None or redis_binary is None:
        sys.exit("bench_stores needs PostgreSQL and Redis: apt-get install postgresql redis-server")
    postgres, redis_server = PostgresServer(bindir, fsync=True), RedisServer(redis_binary)
    try:
        postgres.init()
        postgres.start()
        redis_server.start()
        pg_url, sa_db = postgres.create_database(), postgres.create_database()
        sa_url = sa_db.replace("postgresql://", "postgresql+asyncpg://", 1)
        with tempfile.TemporaryDirectory() as db_dir:
            print(load_line("before"))
            met = anyio.run(bench, pg_url, sa_url, redis_server.url(), Path(db_dir), args.quick)
            print(load_line("after"))
    finally:
        postgres.remove()
        redis_server.remove()
    print("\nall targets met" if met else "\nsome targets NOT met")


if __name__ == "__main__":
    main()
