"""How the calibrated count holds on tokenizers it was never tuned on.

Run it with ``python benchmarks/bench_counting_heldout.py`` (it needs
llama-cpp-python and jinja2; the vocabularies come from llama-cpp-python's
sdist, downloaded once with pip: see ``_heldout_families.py``). For every
tokenizer family it starts an OpenAI-compatible provider on 127.0.0.1 that
renders each request with the family's real chat template, tokenizes it with
the family's real tokenizer, reports ``usage.prompt_tokens`` and refuses with
OpenAI's ``context_length_exceeded`` 400 when the prompt plus ``max_tokens``
is more than the window. Against it, a user's setup exactly as
docs/counting.md shows it: ``Agent`` + ``Conversation`` +
``Client(driver, calibration=TokenCalibration())``, with the output reserve at
2% of the window and no exact counter, holds the 60-turn conversation of
``_heldout_conversation.py`` (twelve scripts and notations, a tool exchange
every fourth turn). Calibration's prior is measured over thirteen vocabularies,
three of them families measured here (Llama 3's, Command-R's, DeepSeek's), so
each family's calibration is made on the prior without its own vocabulary's
row, which it then never saw; the tool call's bound is measured over
llama.cpp's templates, every family's among them, and each family's is left
out of it too (``--full-prior``: the prior users get).

Per family it prints, against the provider's report of each call: the
built-in o200k estimate's mean error (the baseline: what limiting would
decide on without calibration), and the calibrated estimate's share within
3% from turn 4, its worst under and over (the count each round shows: the
fitted price where the transcript fits the budget even at the bound); the
worst under of the count that decided (at the bound, :class:`DecidingCalibration`;
no target); the requests the provider refused; and, after the first cut, the
history kept as a share of the prompt budget.

Targets, per family: from turn 4 the calibrated estimate within 3% on at
least 95% of calls and never more than 3% under; 0 refused; after the first
cut the kept history averages at least 60% of the budget. Families marked
``tuning`` are those the calibration's model was developed against; the
others were only measured. ``--families A,B`` runs some; ``--turns N`` the
first N turns; ``--window N`` another window (default 4,096); ``--order K`` the
scripts and tool exchanges shuffled into another order (a conversation the model was
not developed on).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

import anyio
import attrs
from _heldout_conversation import SYSTEM, TURNS, Turn, conversation, lookup
from _heldout_families import FAMILIES, Family, Tokenizer, serve, vocab_dir

from threadline import Agent, Client, Conversation, Model
from threadline.counting import TokenCalibration
from threadline.counting._calibration._priors import MEASURED, TOOL_CALL_SPELLED
from threadline.counting._calibration._token_calibration import calibration_without
from threadline.drivers import OpenAIChatDriver

WINDOW = 4096
RESERVE_SHARE = 0.02
CALIBRATION_TURNS = 3
WITHIN = 0.03
MIN_KEPT = 0.60


def get_weather(city: str) -> str:
    """The current weather in a city."""
    for turn in TURNS:
        if turn.tool == "get_weather" and json.loads(turn.arguments)["city"] == city:
            return turn.result
    return json.dumps({"city": city, "error": "unknown city"})


def lookup_tool(query: str) -> str:
    """Look something up in the team's travel notes."""
    return lookup(query)


lookup_tool.__name__ = "lookup"


def _script(turns: Sequence[Turn]) -> Any:
    """The provider's answers: a turn's tool call first (when it has one), then its answer."""
    by_prompt = {turn.prompt: (number, turn) for number, turn in enumerate(turns, start=1)}

    def answer(messages: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
        last_user = next(m for m in reversed(messages) if m["role"] == "user")
        content = last_user["content"]
        text = content if isinstance(content, str) else "".join(p["text"] for p in content)
        number, turn = by_prompt[text]
        if turn.tool is not None and messages[-1]["role"] == "user":
            call = {
                "id": f"call{number:05d}",  # nine letters and digits, as Mistral's template wants
                "type": "function",
                "function": {"name": turn.tool, "arguments": turn.arguments},
            }
            return {"role": "assistant", "content": None, "tool_calls": [call]}
        return {"role": "assistant", "content": turn.answer}

    return answer


class DecidingCalibration(TokenCalibration):
    """A calibration that also keeps, for every report, the count its fit gave the
    reported prompt at the bound (``deciding``): what limiting decided with, on every
    call, since a transcript is sent whole only when it fits the budget at the bound.
    A round shows its fitted price instead when it fits (``calibrated_input_tokens``);
    the targets are on that one. ``None`` before a fit (the count shown decided)."""

    __slots__ = ("_tools", "deciding")

    def __init__(self) -> None:
        super().__init__()
        self._tools: tuple[Any, ...] = ()
        self.deciding: list[int | None] = []

    def estimate(
        self, model: str, counter: Any, transcript: Any, tools: Any = (), **kw: Any
    ) -> Any:
        self._tools = tuple(tools)
        return super().estimate(model, counter, transcript, tools, **kw)

    def observe(self, model: str, **kw: Any) -> float | None:
        sent, counter, tools = kw.get("sent"), kw.get("counter"), kw.get("tools", ())
        bound = None
        if sent is not None and counter is not None and self.fitted(model, tools) is not None:
            bound = super().estimate(model, counter, sent, self._tools).count(sent, self._tools)
        self.deciding.append(bound)
        return super().observe(model, **kw)


@attrs.define(kw_only=True)
class Call:
    turn: int
    estimated: int
    calibrated: int | None
    deciding: int | None
    reported: int
    after_cut: bool


@attrs.frozen(kw_only=True)
class Summary:
    family: Family
    calls: int
    builtin_mean: float
    builtin_worst_under: float
    within: float
    worst_under: float
    worst_over: float
    deciding_worst_under: float
    """The count at the bound, what limiting decided with: its worst under (no target)."""
    refused: int
    kept: float | None
    seconds: float

    def failures(self) -> list[str]:
        name = self.family.name
        found = []
        if self.within < 0.95:
            found.append(f"{name}: calibrated within 3% on {self.within:.0%}")
        if self.worst_under < -WITHIN:
            found.append(f"{name}: calibrated under by {-self.worst_under:.1%}")
        if self.refused:
            found.append(f"{name}: {self.refused} requests refused")
        if self.kept is None:
            found.append(f"{name}: the conversation never reached its first cut")
        elif self.kept < MIN_KEPT:
            found.append(f"{name}: kept {self.kept:.0%} of the budget after the first cut")
        return found


def held_out_calibration(family: Family) -> DecidingCalibration:
    """A new calibration whose prior never saw ``family``'s vocabulary or template: the
    text prior is measured over thirteen vocabularies (``_priors.MEASURED``), three of
    which are families measured here, and the tool call's spread over llama.cpp's
    templates (``_priors.TOOL_CALL_SPELLED``), every family's among them, so each family
    is measured on the prior without its own."""
    calibration = DecidingCalibration()
    own = {family.vocabulary, family.template.removesuffix(".jinja")}
    calibration_without(own & (MEASURED.keys() | TOOL_CALL_SPELLED.keys()), calibration)
    return calibration


def error(count: int | None, reported: int) -> float:
    return 0.0 if count is None else (count - reported) / reported


async def converse(
    family: Family,
    tokenizer: Tokenizer,
    turns: int,
    window: int,
    progress: bool = False,
    calibration: DecidingCalibration | None = None,
    system: str = SYSTEM,
    script: Sequence[Turn] = TURNS,
) -> Summary:
    """Hold the conversation's first ``turns`` turns with ``family``'s provider (with
    ``calibration``, that one: otherwise a new one whose prior never saw the family's
    vocabulary, :func:`held_out_calibration`), ``system`` the agent's instructions,
    ``script`` the turns (:data:`TURNS`, or another order of them)."""
    started = time.monotonic()
    reserve = math.ceil(RESERVE_SHARE * window)
    budget = window - reserve
    calls: list[Call] = []
    cut = False
    calibration = calibration or held_out_calibration(family)
    with serve(tokenizer, window, _script(script[:turns])) as provider:
        async with OpenAIChatDriver(provider.url, api_key="not-needed", max_retries=0) as driver:
            agent = Agent(
                Client(driver, calibration=calibration),
                model=Model(f"heldout-{family.name}", context_size=window),
                instructions=system,
                tools=[get_weather, lookup_tool],
                max_output_tokens=reserve,
            )
            conversation = Conversation(agent)
            for number, turn in enumerate(script[:turns], start=1):
                result = await conversation.run(turn.prompt)
                for record in result.rounds:
                    limiting = record.limiting
                    cut = cut or bool(limiting is not None and limiting.dropped)
                    if record.reported_input_tokens:
                        calls.append(
                            Call(
                                turn=number,
                                estimated=record.estimated_input_tokens,
                                calibrated=record.calibrated_input_tokens,
                                deciding=calibration.deciding[len(calls)],
                                reported=record.reported_input_tokens,
                                after_cut=cut,
                            )
                        )
                if progress:
                    shown = " ".join(
                        f"{c.reported}({error(c.calibrated, c.reported):+.1%})"
                        for c in calls
                        if c.turn == number
                    )
                    print(f"{family.name} {number} {turn.kind}: {shown}", file=sys.stderr)
            refused = provider.refused
    return summarize(family, calls, refused, budget, time.monotonic() - started)


def summarize(
    family: Family, calls: Sequence[Call], refused: int, budget: int, seconds: float
) -> Summary:
    builtin = [error(c.estimated, c.reported) for c in calls]
    later = [error(c.calibrated, c.reported) for c in calls if c.turn > CALIBRATION_TURNS]
    deciding = [
        error(c.calibrated if c.deciding is None else c.deciding, c.reported)
        for c in calls
        if c.turn > CALIBRATION_TURNS
    ]
    kept = [c.reported / budget for c in calls if c.after_cut]
    return Summary(
        family=family,
        calls=len(calls),
        builtin_mean=sum(builtin) / max(1, len(builtin)),
        builtin_worst_under=min(builtin, default=0.0),
        within=sum(abs(e) <= WITHIN for e in later) / max(1, len(later)),
        worst_under=min(later, default=0.0),
        worst_over=max(later, default=0.0),
        deciding_worst_under=min(deciding, default=0.0),
        refused=refused,
        kept=sum(kept) / len(kept) if kept else None,
        seconds=seconds,
    )


def _split(family: Family) -> str:
    if family.tuning:
        return "tuning"
    return "held out, added after" if family.frozen else "held out"


def table(summaries: Sequence[Summary]) -> str:
    """The docs table: one line per family."""
    lines = [
        "| family | tuned on | calls | o200k estimate: mean error | calibrated within 3% "
        "(from turn 4) | worst under | worst over | at the bound, what decided: worst under "
        "| refused | kept after the first cut |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for s in summaries:
        kept = "no cut" if s.kept is None else f"{s.kept:.0%}"
        lines.append(
            f"| {s.family.name} | {_split(s.family)} | {s.calls} | "
            f"{s.builtin_mean:+.0%} | {s.within:.0%} | {s.worst_under:+.1%} | "
            f"{s.worst_over:+.1%} | {s.deciding_worst_under:+.1%} | {s.refused} | {kept} |"
        )
    return "\n".join(lines)


async def measure(
    families: Sequence[Family],
    turns: int,
    window: int,
    progress: bool = False,
    full_prior: bool = False,
    system_times: int = 1,
    order: int = 0,
) -> list[Summary]:
    """Every family's summary, each on the prior without its own vocabulary (with
    ``full_prior``, on the prior users get, which may hold it), on the conversation's
    turns in ``order`` (:func:`~_heldout_conversation.conversation`)."""
    directory = vocab_dir(families)
    summaries = []
    for family in families:
        tokenizer = Tokenizer(family, directory)
        calibration = DecidingCalibration() if full_prior else None
        summaries.append(
            await converse(
                family,
                tokenizer,
                turns,
                window,
                progress,
                calibration=calibration,
                system=" ".join([SYSTEM] * system_times),
                script=conversation(order),
            )
        )
    return summaries


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", help="comma-separated names (default: every family)")
    parser.add_argument("--turns", type=int, default=len(TURNS))
    parser.add_argument("--window", type=int, default=WINDOW)
    parser.add_argument("--progress", action="store_true")
    parser.add_argument(
        "--full-prior",
        action="store_true",
        help="the prior users get (default: each family on the prior without its vocabulary)",
    )
    parser.add_argument(
        "--system-times",
        type=int,
        default=1,
        help="the system message repeated this many times (11: about 360 o200k tokens)",
    )
    parser.add_argument(
        "--order",
        type=int,
        default=0,
        help="the scripts and tool exchanges in another order, shuffled by this (0: as built)",
    )
    args = parser.parse_args()
    chosen = FAMILIES
    if args.families:
        names = {n.strip().lower() for n in args.families.split(",")}
        chosen = tuple(f for f in FAMILIES if f.name.lower() in names)
    summaries = anyio.run(
        measure,
        chosen,
        args.turns,
        args.window,
        args.progress,
        args.full_prior,
        args.system_times,
        args.order,
    )
    print(table(summaries))
    failures = [f for s in summaries for f in s.failures()]
    for s in summaries:
        if not s.failures():
            print(f"targets met: {s.family.name} ({s.seconds:.0f} s)")
    for failure in failures:
        print(f"target missed: {failure}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
