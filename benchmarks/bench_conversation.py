"""What a conversation turn costs the SDK, over a long thread and across many threads.

Run it with ``python benchmarks/bench_conversation.py`` (``--turns``,
``--conversations`` and ``--turns-each`` shrink it for a quick look). It prints:

- **long conversation**: one conversation of 2,000 turns with no history
  window (``history_limit=0``), in five configurations: a model with no
  window (nothing is counted); a model with a 1M-token window, far from full
  (every turn is counted against it, as for every 1M-window model for
  hours); a budget of 4,000 tokens with the conversation's default
  ``cache_stable_units``; the same budget with ``drop_oldest_units``, which
  cuts on every turn once over it; and a user's test, the 1M window on
  ``threadline.testing.ScriptedDriver`` (so the test double's own cost is
  in the turn). Each runs on ``MemoryStore`` and on ``SQLiteStore``. The
  other models are a driver that costs nothing of its own
  (``ReplyingModel``). Two ratios of the mean CPU time per turn (the whole
  ``conv.run``, the store's worker thread included), both with the target
  at most 1.3 in every configuration: a turn must cost what its new
  messages cost, not what the transcript costs. *Plain*: the last 100 turns
  over the first 100 of the same conversation, what a user timing their
  conversation sees. *Paired*: the last 100 turns over the first 100 turns
  of a new conversation of the same setup, on a store of its own, timed
  beside them in alternating blocks of 10 turns, so the load of a shared
  machine falls on both alike (the plain ratio moved from 0.7 to 2.0
  between runs of the same code on 2 shared cores). For SQLite, the part of each turn spent
  in the store's worker thread is printed too. ``--profile`` adds a cProfile
  of the last 100 turns.
- **concurrent conversations**: 1,000 conversations, each running a few
  turns, all at once on one event loop, through ``OpenAIChatDriver`` against a
  minimal OpenAI-compatible server started here on 127.0.0.1 in a separate
  process (so its work does not share our interpreter). At most
  ``--in-flight`` turns (default 32, the pool's size) wait on the HTTP pool
  at once; httpcore's pool rescans its whole queue on every event, so 1,000
  queued requests would time httpcore rather than threadline. Turns per
  second and CPU per turn, then, in a second run under ``tracemalloc``, the
  memory the conversations keep (and the peak) per conversation, over a
  floor: the messages' own size, each message object and what only it holds
  (its text, parts, tool calls) by ``sys.getsizeof`` (target: at most 1.3
  times the floor).

Times are CPU time of the process (``time.process_time``) for the long
conversation, with the cycle collector off while a turn is timed, as
``timeit`` does; wall time for the concurrent run, which waits on sockets.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gc
import json
import os
import pstats
import re
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, AsyncExitStack, asynccontextmanager
from statistics import mean
from typing import Any, NamedTuple

import anyio
import anyio.lowlevel
import httpx

from threadline import Agent, Client, Conversation, Message, Model, Origin, Usage
from threadline.counting import DefaultReplayProjection
from threadline.drivers import Driver, OpenAIChatDriver, ProviderCall, ProviderResponse
from threadline.limiting import TokenLimitHandler, drop_oldest_units
from threadline.stores import ConversationStore, MemoryStore, SQLiteStore
from threadline.testing import ScriptedDriver

RATIO_TARGET = 1.3
BLOCK = 10
"""Turns in a row of one conversation while two are timed side by side."""
MEMORY_TARGET = 1.3
BUDGET_TOKENS = 4_000
BIG_WINDOW = 1_000_000
_WORDS = [
    "the",
    "model",
    "reads",
    "every",
    "message",
    "in",
    "the",
    "window",
    "before",
    "it",
    "answers",
    "so",
    "a",
    "long",
    "transcript",
    "costs",
    "time",
    "budget",
    "tokens",
    "context",
    "limit",
    "weather",
    "city",
    "forecast",
    "rain",
    "sun",
    "wind",
    "report",
    "summary",
    "question",
    "answer",
    "careful",
    "precise",
    "quick",
    "value",
    "number",
    "Paris",
    "Oslo",
    "Tokyo",
    "2024",
    "17",
]


def _sentence(turn: int, salt: int, words: int = 40) -> str:
    return " ".join(_WORDS[(turn * 7 + salt * 13 + k * 5) % len(_WORDS)] for k in range(words))


# -- one long conversation --------------------------------------------------------------


class Setup(NamedTuple):
    """One configuration of the long conversation."""

    name: str
    window: int | None
    """The model's context size (``None``: no window, so nothing is counted)."""
    pre: TokenLimitHandler | None = None
    budgeted: bool = False
    """A prompt budget of ``BUDGET_TOKENS``."""
    scripted: bool = False
    """A user's test: ``ScriptedDriver`` rather than ``ReplyingModel``."""


# cache_stable_units, the conversation's default Pre handler, cuts to 60% of the
# budget every few turns; drop_oldest_units drops the oldest units on every turn
# once over budget.
LIMITING: tuple[Setup, ...] = (
    Setup("no window", None),
    Setup("1M window", BIG_WINDOW),
    Setup("cache_stable_units", BIG_WINDOW, budgeted=True),
    Setup("drop_oldest_units", BIG_WINDOW, drop_oldest_units(None), budgeted=True),
    Setup("ScriptedDriver, 1M", BIG_WINDOW, scripted=True),
)
STORES = ("MemoryStore", "SQLiteStore")


class ReplyingModel(Driver):
    """A driver that answers each call with the next scripted text, at no cost of its own.

    ``ScriptedDriver`` prices what each call adds and keeps it in its call log
    (the "ScriptedDriver" configuration times that); here the model's side
    costs nothing, so what is timed is threadline's own work.
    """

    name = "replying"

    def __init__(self) -> None:
        self.replies: list[str] = []

    def token_counter(self) -> None:
        return None

    def replay_projection(self, model: Model) -> DefaultReplayProjection:
        return DefaultReplayProjection()

    async def aclose(self) -> None:
        pass

    async def complete(self, call: ProviderCall) -> ProviderResponse:
        await anyio.lowlevel.checkpoint()
        return ProviderResponse(
            message=Message.assistant(self.replies.pop(0), origin=Origin.TURN),
            finish_reason="stop",
            usage=Usage(input_tokens=len(call.messages), output_tokens=40),
            model=call.model.name,
        )

    def stream(self, call: ProviderCall) -> AbstractAsyncContextManager[AsyncIterator[Any]]:
        raise NotImplementedError("the benchmark does not stream")


def _store(kind: str, path: str) -> ConversationStore:
    if kind == "MemoryStore":
        return MemoryStore()
    return SQLiteStore(path)


class _Thread:
    """One timed conversation of the long-conversation run, on a store of its own."""

    def __init__(self, conv: Conversation, driver: ReplyingModel | ScriptedDriver) -> None:
        self.conv, self.driver = conv, driver
        self.durations: list[float] = []
        self.elsewhere: list[float] = []
        """CPU of the turn outside the calling thread: a SQLite store's worker thread."""
        self.limited = 0

    async def turn(self, turn: int, profile: cProfile.Profile | None = None) -> None:
        """Run turn ``turn`` (its texts are made from the number) and time it."""
        reply = f"answer {turn}: {_sentence(turn, 1)}"
        if isinstance(self.driver, ScriptedDriver):
            self.driver.add_replies([reply])
        else:
            self.driver.replies.append(reply)
        prompt = f"question {turn}: {_sentence(turn, 2)}"
        gc.disable()
        if profile is not None:
            profile.enable()
        started, here = time.process_time(), time.thread_time()
        result = await self.conv.run(prompt)
        self.durations.append(time.process_time() - started)
        self.elsewhere.append(self.durations[-1] - (time.thread_time() - here))
        if profile is not None:
            profile.disable()
        gc.enable()
        if result.limiting and result.limiting[0].handlers:
            self.limited += 1


@asynccontextmanager
async def _thread(store_kind: str, path: str, setup: Setup) -> AsyncIterator[_Thread]:
    driver = ScriptedDriver() if setup.scripted else ReplyingModel()
    agent = Agent(
        Client(driver),
        model=Model("replying", context_size=setup.window),
        instructions="You are a careful assistant.",
    )
    options: dict[str, Any] = {}
    if setup.budgeted:
        options = {"max_context_tokens": BUDGET_TOKENS, "output_reserve_tokens": 0}
    if setup.pre is not None:
        options["pre_max_tokens_reached"] = setup.pre
    async with _store(store_kind, path) as store:
        yield _Thread(Conversation(agent, store=store, **options), driver)


async def long_conversation(
    turns: int,
    store_kind: str = "MemoryStore",
    limiting: Setup = LIMITING[0],
    profile_from: int | None = None,
    beside: int = 0,
) -> tuple[_Thread, _Thread | None, cProfile.Profile | None]:
    """Run ``turns`` turns of one conversation, timing each, with a profile of the
    turns from ``profile_from`` on (when asked).

    ``beside``: the last ``beside`` turns alternate, in blocks of ``BLOCK`` turns,
    with the first ``beside`` turns of a new conversation of the same setup on a
    store of its own (its texts never sent before), so that both are timed in the
    same seconds and the load of the machine falls on both alike.
    """
    profile = cProfile.Profile() if profile_from is not None else None
    with tempfile.TemporaryDirectory() as directory:
        async with AsyncExitStack() as stack:
            long = await stack.enter_async_context(
                _thread(store_kind, os.path.join(directory, "long.db"), limiting)
            )
            fresh = None
            if beside:
                fresh = await stack.enter_async_context(
                    _thread(store_kind, os.path.join(directory, "fresh.db"), limiting)
                )
            for turn in range(turns - beside):
                await _long_turn(long, turn, profile_from, profile)
            for block in range(0, beside, BLOCK):
                order = (long, fresh) if block // BLOCK % 2 else (fresh, long)
                for thread in order:
                    for offset in range(block, min(block + BLOCK, beside)):
                        if thread is long:
                            await _long_turn(long, turns - beside + offset, profile_from, profile)
                        else:
                            assert fresh is not None
                            await fresh.turn(turns + offset)  # texts the long one never sent
            assert long.conv.turn_count() == turns
    return long, fresh, profile


async def _long_turn(
    long: _Thread, turn: int, profile_from: int | None, profile: cProfile.Profile | None
) -> None:
    profiling = profile_from is not None and turn >= profile_from
    await long.turn(turn, profile if profiling else None)
    if turn % 100 == 99:
        gc.collect()


def report_long(turns: int, profile: bool) -> None:
    anyio.run(long_conversation, 50)  # load the vocabulary and warm the code paths
    print(
        f"long conversation: {turns:,} turns, no history window (history_limit=0), prompt "
        f"budget {BUDGET_TOKENS:,} tokens where there is one; ms of CPU per turn (conv.run, "
        "store included)"
    )
    head = max(1, min(100, turns // 2))
    print(
        f"  plain: the last {head} turns over the first {head} of the same conversation; "
        f"paired: over the first {head} of a new conversation of the same setup timed beside "
        f"them (in alternating blocks of {BLOCK}); target <= {RATIO_TARGET} on both"
    )
    missed = 0
    for limiting in LIMITING:
        for store_kind in STORES:
            long, fresh, _ = anyio.run(long_conversation, turns, store_kind, limiting, None, head)
            assert fresh is not None
            first, last = mean(long.durations[:head]), mean(long.durations[-head:])
            beside = mean(fresh.durations)
            plain, paired = last / first, last / beside
            met = plain <= RATIO_TARGET and paired <= RATIO_TARGET
            missed += not met
            print(
                f"  {limiting.name:<19} {store_kind:<12} first {head} {1e3 * first:6.3f}, "
                f"last {head} {1e3 * last:6.3f}: plain {plain:4.2f}; first {head} beside "
                f"them {1e3 * beside:6.3f}: paired {paired:4.2f} ({'met' if met else 'MISSED'});"
                f" limited on {long.limited:,} turns"
            )
            if store_kind == "SQLiteStore":
                worker = mean(long.elsewhere[-head:]), mean(fresh.elsewhere)
                print(
                    f"  {'':<19} {'':<12} of which the store's worker thread: last {head} "
                    f"{1e3 * worker[0]:6.3f}, first {head} beside them {1e3 * worker[1]:6.3f}"
                )
    print(f"  long conversation targets: {'all met' if not missed else f'{missed} MISSED'}")
    if profile:
        for limiting in LIMITING:
            *_, found = anyio.run(long_conversation, turns, "MemoryStore", limiting, turns - 100)
            assert found is not None
            print(f"profile of the last 100 turns, {limiting.name}, MemoryStore:")
            pstats.Stats(found).sort_stats("cumulative").print_stats(25)


# -- a minimal OpenAI-compatible server, in its own process --------------------------------


_HEADER_END = b"\r\n\r\n"
_LENGTH = re.compile(rb"(?im)^content-length:\s*(\d+)\s*$")


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while True:
            head = await reader.readuntil(_HEADER_END)
            match = _LENGTH.search(head)
            body = await reader.readexactly(int(match.group(1)) if match else 0)
            request = json.loads(body)
            sent = len(request["messages"])
            payload = json.dumps(
                {
                    "id": "chatcmpl-bench",
                    "object": "chat.completion",
                    "model": request["model"],
                    "choices": [
                        {
                            "index": 0,
                            "message": {
                                "role": "assistant",
                                "content": f"You sent {sent} messages. " + _sentence(sent, 3, 20),
                            },
                            "finish_reason": "stop",
                        }
                    ],
                    "usage": {"prompt_tokens": 10 * sent, "completion_tokens": 30},
                }
            ).encode()
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Content-Length: %d\r\n\r\n%s" % (len(payload), payload)
            )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _serve() -> None:
    server = await asyncio.start_server(_answer, "127.0.0.1", 0, backlog=2048)
    port = server.sockets[0].getsockname()[1]
    print(port, flush=True)
    async with server:
        await server.serve_forever()


# -- many conversations at once ---------------------------------------------------------------


async def many_conversations(
    base_url: str, conversations: int, turns_each: int, in_flight: int
) -> list[Conversation]:
    limits = httpx.Limits(max_connections=in_flight, max_keepalive_connections=in_flight)
    http = httpx.AsyncClient(limits=limits, timeout=60.0)
    driver = OpenAIChatDriver(base_url, api_key="bench", http_client=http, max_retries=0)
    # At most `in_flight` turns wait on the pool at once: httpcore scans its whole
    # queue on every pool event, so a queue of 1,000 requests would measure httpcore.
    pool_turns = anyio.CapacityLimiter(in_flight)
    async with Client(driver) as client:
        agent = Agent(
            client,
            model=Model("mock", context_size=32_000),
            instructions="You are a careful assistant.",
            max_output_tokens=256,
        )
        threads = [Conversation(agent) for _ in range(conversations)]

        async def talk(conv: Conversation, index: int) -> None:
            for turn in range(turns_each):
                async with pool_turns:
                    await conv.run(
                        f"conversation {index} turn {turn}: {_sentence(turn, index, 20)}"
                    )

        async with anyio.create_task_group() as tg:
            for index, conv in enumerate(threads):
                tg.start_soon(talk, conv, index)
    return threads


def message_size(message: Message) -> int:
    """What a message itself takes: the object and everything only it holds, by
    ``sys.getsizeof`` (its text, parts, tool calls and reasoning); shared constants
    (roles, origins, ``None``) are not counted."""
    size = sys.getsizeof(message) + sys.getsizeof(message.content)
    if not isinstance(message.content, str):
        size += sum(sys.getsizeof(part) + sys.getsizeof(part.text) for part in message.content)
    for call in message.tool_calls:
        size += sys.getsizeof(call) + sum(map(sys.getsizeof, (call.id, call.name, call.arguments)))
    for text in (message.tool_call_id, message.name):
        if text is not None:
            size += sys.getsizeof(text)
    if message.reasoning is not None:
        reasoning = message.reasoning
        size += sys.getsizeof(reasoning) + sys.getsizeof(reasoning.text)
        size += sys.getsizeof(reasoning.provider_reasoning)
    return size


def messages_floor(threads: list[Conversation]) -> int:
    """The floor: the conversations' messages' own size, each message once."""
    return sum(message_size(event.message) for conv in threads for event in conv.events)


def report_many(conversations: int, turns_each: int, in_flight: int) -> None:
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        base_url = f"http://127.0.0.1:{int(server.stdout.readline())}/v1"
        anyio.run(many_conversations, base_url, 10, 1, in_flight)  # warm up

        started, cpu = time.perf_counter(), time.process_time()
        threads = anyio.run(many_conversations, base_url, conversations, turns_each, in_flight)
        elapsed, cpu = time.perf_counter() - started, time.process_time() - cpu
        done = sum(conv.turn_count() for conv in threads)
        del threads

        gc.collect()
        tracemalloc.start()
        baseline = tracemalloc.get_traced_memory()[0]
        threads = anyio.run(many_conversations, base_url, conversations, turns_each, in_flight)
        gc.collect()
        retained, peak = (value - baseline for value in tracemalloc.get_traced_memory())
        tracemalloc.stop()
        floor = messages_floor(threads)
    finally:
        server.terminate()
        server.wait()
    print(
        f"concurrent conversations: {conversations:,} x {turns_each} turns on one event loop, "
        f"{in_flight} turns in flight on a pool of {in_flight} connections, against a local "
        f"mock server: {done:,} turns in {elapsed:.2f} s = {done / elapsed:,.0f} turns/s "
        f"({1e3 * cpu / done:.2f} ms of this process's CPU per turn, HTTP stack included)"
    )
    per_conversation = 1024 * conversations
    ratio = retained / floor
    print(
        f"  traced memory per conversation, kept after the run (conversations alive): "
        f"{retained / per_conversation:.1f} KiB (peak during it {peak / per_conversation:.1f}"
        f" KiB; client, driver, caches and pool included); floor, the messages' own size "
        f"(sys.getsizeof): {floor / per_conversation:.1f} KiB; ratio {ratio:.2f} (target <= "
        f"{MEMORY_TARGET}: {'met' if ratio <= MEMORY_TARGET else 'MISSED'})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=2_000)
    parser.add_argument("--conversations", type=int, default=1_000)
    parser.add_argument("--turns-each", type=int, default=20)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--profile", action="store_true", help="profile the last 100 turns")
    parser.add_argument("--skip-many", action="store_true", help="only the long conversation")
    parser.add_argument("--skip-long", action="store_true", help="only the many conversations")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve())
        return
    if not args.skip_long:
        report_long(args.turns, args.profile)
    if not args.skip_many:
        report_many(args.conversations, args.turns_each, args.in_flight)


if __name__ == "__main__":
    main()
