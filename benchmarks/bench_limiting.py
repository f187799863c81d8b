"""How drop_oldest_units scales, and how it compares with LangChain's trim_messages.

Run it with ``python benchmarks/bench_limiting.py`` (``--sizes 1000 10000``
to pick sizes). For each size it builds a transcript of agent turns (a
question, tool exchanges of 1-3 results, an answer; a system message first,
the current prompt last), prices every message once up front (a counter with
cached counts, so the timing is limiting, not tokenizing), and limits it to a
quarter of its count:

- ``drop_oldest_units``: the handler alone, on a ready event;
- ``apply_limits``: the whole engine step (integrity check, count, handler,
  checking and attributing its output, the budget report);
- LangChain's ``trim_messages`` (``strategy="last"``, system kept) on the
  same transcript with the same cached counts, when ``langchain-core`` is
  installed; it is run once as called plainly and once with
  ``start_on="human"``, and each output is checked for orphaned tool results
  with threadline's own integrity check.

Time per message should stay flat from 1,000 to 100,000 messages: limiting is
linear in the transcript's length.

Last, a conversation turn's limiting (``report_incremental``): a
``Conversation`` holding the 10,000-message transcript, ``drop_oldest_units``
as Pre and a budget of a quarter of it, runs 41 turns; the engine step of each
turn is timed where the run calls it. The first turn cuts the whole
transcript; after it a turn sends what the last cut left and costs what its
new messages and its drops cost. Printed beside ``trim_messages`` over the
same transcript with the same cached counts, as a ratio (target: at least
10 times faster). ``--incremental-only`` runs only this case.
"""

from __future__ import annotations

import argparse
import gc
import random
import statistics
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from typing import Any

import anyio
import anyio.lowlevel

import threadline.engine._run  # a conversation turn's engine step is timed where the run calls it
from threadline import (
    Agent,
    Budget,
    Client,
    Conversation,
    Message,
    Model,
    Origin,
    Role,
    Tool,
    ToolCall,
    Usage,
)
from threadline.counting import BuiltinTokenCounter, DefaultReplayProjection
from threadline.drivers import Driver, ProviderCall, ProviderResponse
from threadline.limiting import (
    TokenLimitEvent,
    TranscriptIntegrityError,
    check_integrity,
    drop_oldest_units,
)
from threadline.limiting._engine import apply_limits
from threadline.serialization import ConversationEvent

try:
    from langchain_core.messages import (
        AIMessage,
        BaseMessage,
        HumanMessage,
        SystemMessage,
        ToolMessage,
        trim_messages,
    )
except ImportError:  # the comparison is optional
    trim_messages = None


class CachedCounter:
    """Counts looked up from a table filled once: limiting is what gets timed."""

    def __init__(self, costs: dict[int, int]) -> None:
        self.costs = costs

    def message_tokens(self, message: Message) -> int:
        return self.costs[id(message)]

    def overhead_tokens(self, tools: Sequence[Tool] = ()) -> int:
        return 3

    def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        costs = self.costs
        return sum(costs[id(m)] for m in messages) + 3


def build_transcript(size: int, seed: int = 7) -> list[Message]:
    """About ``size`` messages of agent turns, ending with the current prompt."""
    rng = random.Random(seed)
    messages = [Message.system("You are a careful assistant. " * 20)]
    turn = 0
    while len(messages) < size - 1:
        messages.append(Message.user(f"question {turn} " + "word " * rng.randint(5, 60)))
        for exchange in range(rng.randint(0, 2)):
            ids = [f"call-{turn}-{exchange}-{k}" for k in range(rng.randint(1, 3))]
            calls = [ToolCall(id=i, name="search", arguments='{"q": "x"}') for i in ids]
            messages.append(Message.assistant("", tool_calls=calls))
            messages.extend(Message.tool(i, "result " * rng.randint(20, 400)) for i in ids)
        messages.append(Message.assistant(f"answer {turn} " + "word " * rng.randint(10, 200)))
        turn += 1
    messages.append(Message.user("and now?", origin=Origin.TURN))
    return messages


def price(messages: Sequence[Message]) -> dict[int, int]:
    # A stand-in tokenizer: 4 of framing plus a token per word and per call.
    return {id(m): 4 + len(m.text.split()) + 8 * len(m.tool_calls) for m in messages}


def best_of(repeats: int, run: Callable[[], Any]) -> float:
    """The best wall time of ``repeats`` calls, with the collector off (as timeit does)."""
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        gc.disable()
        try:
            started = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - started)
        finally:
            gc.enable()
    return best


async def abest_of(repeats: int, run: Callable[[], Awaitable[Any]]) -> float:
    """:func:`best_of` for a coroutine function, timed inside the running event loop."""
    best = float("inf")
    for _ in range(repeats):
        gc.collect()
        gc.disable()
        try:
            started = time.perf_counter()
            await run()
            best = min(best, time.perf_counter() - started)
        finally:
            gc.enable()
    return best


async def time_handler(messages: list[Message], counter: CachedCounter, budget: int) -> float:
    handler = drop_oldest_units(None)
    best = float("inf")
    for _ in range(repeats_for(len(messages))):
        # The event is built outside the timed part: it copies the list and
        # finds the pinned messages, which the engine does once per round.
        event = TokenLimitEvent(messages, budget_tokens=budget, counter=counter)

        async def run(event: TokenLimitEvent = event) -> None:
            await handler(event)  # type: ignore[misc]

        best = min(best, await abest_of(1, run))
    return best


async def time_engine(messages: list[Message], counter: CachedCounter, budget: int) -> float:
    # The budget is resolved once per request, before limiting, as trim_messages is
    # handed its max_tokens: making it is not part of the step.
    resolved = Budget(limit=budget + 1, reserve=1)

    async def step() -> None:
        await apply_limits(messages, counter=counter, budget=resolved)

    return await abest_of(repeats_for(len(messages)), step)


def time_baseline(messages: list[Message], costs: dict[int, int]) -> float:
    """One bare pass reading each message's role and cached count: the memory floor."""

    def run() -> None:
        for message in messages:
            _ = (message.role, costs[id(message)])

    return best_of(repeats_for(len(messages)), run)


def repeats_for(size: int) -> int:
    return 7 if size <= 10_000 else 3


def to_langchain(messages: Sequence[Message]) -> list[Any]:
    converted: list[Any] = []
    for m in messages:
        if m.role is Role.SYSTEM:
            converted.append(SystemMessage(m.text))
        elif m.role is Role.USER:
            converted.append(HumanMessage(m.text))
        elif m.role is Role.ASSISTANT:
            calls = [{"id": c.id, "name": c.name, "args": {"q": "x"}} for c in m.tool_calls]
            converted.append(AIMessage(m.text, tool_calls=calls))
        else:
            converted.append(ToolMessage(m.text, tool_call_id=m.tool_call_id or ""))
    return converted


def time_langchain(
    messages: list[Message], costs: dict[int, int], budget: int, **options: Any
) -> tuple[float, str]:
    converted = to_langchain(messages)
    back = {id(lc): m for lc, m in zip(converted, messages, strict=True)}
    lc_costs = {id(lc): costs[id(m)] for lc, m in zip(converted, messages, strict=True)}

    def lc_count(batch: list[BaseMessage]) -> int:
        return sum(lc_costs[id(m)] for m in batch)

    result: list[Any] = []

    def run() -> None:
        result[:] = trim_messages(
            converted,
            max_tokens=budget - 3,  # our counter's fixed overhead, which LangChain has no notion of
            token_counter=lc_count,
            strategy="last",
            include_system=True,
            **options,
        )

    elapsed = best_of(repeats_for(len(messages)), run)
    kept = [back[id(m)] for m in result]
    try:
        check_integrity(kept)
        verdict = "whole"
    except TranscriptIntegrityError as exc:
        verdict = f"BROKEN at message {exc.index}: {exc.reason}"
    if kept and kept[-1] is not messages[-1]:
        verdict += "; current prompt lost"
    return elapsed, verdict


# -- a conversation turn's limiting: incremental ------------------------------------------

INCREMENTAL_SIZE = 10_000
INCREMENTAL_TARGET = 10.0
"""A conversation turn's limiting at 10k messages is at least this much faster than
trim_messages over the same transcript."""


class Replies(Driver):
    """A driver that answers every call with a short text, at no cost of its own."""

    name = "replies"

    def token_counter(self) -> None:
        return None

    def replay_projection(self, model: Model) -> DefaultReplayProjection:
        return DefaultReplayProjection()

    async def aclose(self) -> None:
        pass

    async def complete(self, call: ProviderCall) -> ProviderResponse:
        await anyio.lowlevel.checkpoint()
        return ProviderResponse(
            message=Message.assistant("noted " * 20, origin=Origin.TURN),
            finish_reason="stop",
            usage=Usage(input_tokens=1, output_tokens=1),
            model=call.model.name,
        )

    def stream(self, call: ProviderCall) -> AbstractAsyncContextManager[AsyncIterator[Any]]:
        raise NotImplementedError


def conversation_events(messages: Sequence[Message]) -> list[ConversationEvent]:
    """``messages`` (after the system message, before the current prompt) as answered
    turns: a new turn at every user message."""
    events: list[ConversationEvent] = []
    turn = -1
    for message in messages:
        if message.role is Role.USER:
            turn += 1
        events.append(ConversationEvent(message=message.with_origin(Origin.TURN), turn_id=turn))
    return events


async def time_conversation_turns(
    messages: list[Message], budget: int, turns: int = 41
) -> tuple[float, list[tuple[float, bool]]]:
    """The engine step of each of ``turns`` conversation turns over ``messages``, with
    ``drop_oldest_units``: the first turn's (which cuts the whole transcript) and, for
    the others, each one's time and whether a handler cut."""
    agent = Agent(
        Client(Replies()),
        model=Model("replies", context_size=10_000_000),
        instructions=messages[0].text,
    )
    conv = Conversation(
        agent,
        max_context_tokens=budget,
        output_reserve_tokens=0,
        pre_max_tokens_reached=drop_oldest_units(None),
    )
    await conv.replace_events(conversation_events(messages[1:-1]))
    steps: list[tuple[float, bool]] = []
    engine = threadline.engine._run.apply_limits

    async def timed(*args: Any, **kwargs: Any) -> Any:
        gc.disable()
        try:
            started = time.perf_counter()
            outcome = await engine(*args, **kwargs)
            steps.append((time.perf_counter() - started, bool(outcome.record.handlers)))
            return outcome
        finally:
            gc.enable()

    threadline.engine._run.apply_limits = timed  # type: ignore[assignment]
    try:
        for turn in range(turns):
            await conv.run(f"and now, question {turn}? " + "word " * 30)
    finally:
        threadline.engine._run.apply_limits = engine
    return steps[0][0], steps[1:]


def report_incremental(size: int = INCREMENTAL_SIZE) -> bool:
    """A conversation turn's limiting at ``size`` messages, beside trim_messages;
    whether the target is met (true when there is nothing to compare with)."""
    messages = build_transcript(size)
    # The built-in counter, a conversation's default, prices both sides: it remembers
    # each message's count, and trim_messages is given the same counts, cached.
    builtin = BuiltinTokenCounter()
    costs = {id(m): builtin.message_tokens(m) for m in messages}
    budget = sum(costs.values()) // 4
    first, rest = anyio.run(time_conversation_turns, messages, budget)
    cuts = [step for step, cut in rest if cut]
    ours = max(statistics.median(step for step, _ in rest), statistics.median(cuts or [0.0]))
    line = (
        f"conversation turn at {len(messages):,} messages, drop_oldest_units, budget a quarter: "
        f"limiting step {1e3 * ours:.3f} ms per turn (the median of {len(rest)} turns, or of "
        f"the {len(cuts)} that cut, whichever is more; the first turn, which cuts the whole "
        f"transcript once, {1e3 * first:.2f} ms)"
    )
    if trim_messages is None:
        print(line + "; trim_messages not installed, no ratio")
        return True
    theirs, _ = time_langchain(messages, costs, budget, start_on="human")
    ratio = theirs / ours
    print(
        f"{line}; trim_messages over the same transcript {1e3 * theirs:.3f} ms; "
        f"trim_messages / threadline = {ratio:.1f}x (target >= {INCREMENTAL_TARGET:.0f}x: "
        f"{'met' if ratio >= INCREMENTAL_TARGET else 'MISSED'})"
    )
    return ratio >= INCREMENTAL_TARGET


ENGINE_TO_HANDLER_TARGET = 1.5
ENGINE_TO_TRIM_MESSAGES_TARGET = 1.0
ROUNDS = 5


def measure_size(size: int, rounds: int) -> dict[str, Any]:
    """Each timing taken in turn, ``rounds`` times: the ratios are medians of paired ratios.

    A load spike on a shared machine then hits the handler, the engine and
    trim_messages of one round alike, and a single spike cannot move a median.
    """
    messages = build_transcript(size)
    costs = price(messages)
    counter = CachedCounter(costs)
    budget = counter.count(messages) // 4
    taken: dict[str, list[float]] = {"floor": [], "handler": [], "engine": [], "lc": []}
    verdicts = ""
    for _ in range(rounds):
        taken["floor"].append(time_baseline(messages, costs))
        taken["handler"].append(anyio.run(time_handler, messages, counter, budget))
        taken["engine"].append(anyio.run(time_engine, messages, counter, budget))
        if trim_messages is not None:
            theirs, plain = time_langchain(messages, costs, budget)
            taken["lc"].append(theirs)
            if not verdicts:
                _, start_on_human = time_langchain(messages, costs, budget, start_on="human")
                verdicts = f"trim_messages plain: {plain}; with start_on='human': {start_on_human}"
    paired = zip(taken["engine"], taken["handler"], strict=True)
    result: dict[str, Any] = {
        "size": len(messages),
        "verdicts": verdicts,
        "engine/handler": statistics.median(e / h for e, h in paired),
    }
    if taken["lc"]:
        result["engine/lc"] = statistics.median(
            e / t for e, t in zip(taken["engine"], taken["lc"], strict=True)
        )
        result["handler/lc"] = statistics.median(
            h / t for h, t in zip(taken["handler"], taken["lc"], strict=True)
        )
    for name, times in taken.items():
        if times:
            result[name] = statistics.median(times) / len(messages)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--rounds", type=int, default=ROUNDS)
    parser.add_argument(
        "--incremental-only", action="store_true", help="only the conversation-turn case"
    )
    args = parser.parse_args()
    if args.incremental_only:
        return 0 if report_incremental() else 1

    if trim_messages is None:
        print(
            "langchain-core is not installed: skipping the comparison with trim_messages "
            "(pip install langchain-core to run it)"
        )
    print(
        f"{'messages':>9} {'bare pass':>10} {'drop_oldest_units':>18} {'apply_limits':>13} "
        f"{'trim_messages':>14} {'engine/handler':>15} {'engine/LC':>10}"
        "   (microseconds per message, medians)"
    )
    results = [measure_size(size, args.rounds) for size in args.sizes]
    failures: list[str] = []
    for r in results:
        lc = f"{1e6 * r['lc']:>14.3f}" if "lc" in r else f"{'-':>14}"
        vs_lc = f"{r['engine/lc']:>10.2f}" if "engine/lc" in r else f"{'-':>10}"
        print(
            f"{r['size']:>9} {1e6 * r['floor']:>10.3f} {1e6 * r['handler']:>18.3f} "
            f"{1e6 * r['engine']:>13.3f} {lc} {r['engine/handler']:>15.2f} {vs_lc}"
        )
        if r["engine/handler"] > ENGINE_TO_HANDLER_TARGET:
            failures.append(
                f"apply_limits/drop_oldest_units {r['engine/handler']:.2f} > "
                f"{ENGINE_TO_HANDLER_TARGET} at {r['size']:,} messages"
            )
        if "engine/lc" in r and r["engine/lc"] > ENGINE_TO_TRIM_MESSAGES_TARGET:
            failures.append(
                f"apply_limits/trim_messages {r['engine/lc']:.2f} > "
                f"{ENGINE_TO_TRIM_MESSAGES_TARGET} at {r['size']:,} messages"
            )
    if len(results) > 1:
        first, last = results[0], results[-1]
        print(
            f"drop_oldest_units time per message at {last['size']:,} vs {first['size']:,} "
            f"messages: x{last['handler'] / first['handler']:.2f}; in bare passes: "
            + ", ".join(f"{r['handler'] / r['floor']:.1f} at {r['size']:,}" for r in results)
            + " (a constant number of passes is linear; the bare pass itself slows down"
            " once the transcript outgrows the CPU caches)"
        )
    print(
        f"ratios: medians over {args.rounds} rounds of paired timings (each the best of a few "
        "runs, garbage collector off, as timeit does), taken in turn in one process"
    )
    print(
        f"targets: apply_limits <= {ENGINE_TO_HANDLER_TARGET}x drop_oldest_units, and "
        f"<= {ENGINE_TO_TRIM_MESSAGES_TARGET}x trim_messages, at every size"
    )
    if any(r["verdicts"] for r in results):
        print("LangChain output, checked with threadline's check_integrity:")
        for r in results:
            print(f"{r['size']:>9}: {r['verdicts']}")
    if not report_incremental():
        failures.append(f"a conversation turn's limiting at {INCREMENTAL_SIZE:,} messages")
    for failure in failures:
        print(f"MISSED: {failure}")
    print("all targets met" if not failures else f"{len(failures)} target(s) missed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
