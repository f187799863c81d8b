"""Measure calibration's template classes on real chat templates (``system_dropped``'s prior).

Run it with ``python benchmarks/derive_template_prior.py``; it prints
``TEMPLATES_DROPPING_SYSTEM`` of ``threadline/counting/_calibration/_priors.py``.
It renders every chat template llama.cpp ships (``models/templates/*.jinja``,
from llama-cpp-python's sdist, downloaded with pip as ``_heldout_families.py``
does) twice, as llama.cpp's server would: a system message, a user's
question, an assistant's tool call and its result (a prompt a tool result
ends), and the same with the assistant's answer and a second question after
it (a prompt a user's message ends). It counts the templates that show the
system message in the second and not in the first: those a calibration must
learn to price apart (Mistral Nemo's puts the system message into the last
user message, and a prompt a tool result ends has none after its results).
Templates that fail to render either prompt (they want other tool formats or
refuse a system message) are left out and listed.

It measures the other template classes too (``framing``, ``tool``,
``tool_result``: ``TEMPLATE_FACTORS``, documented in docs/counting.md, where
priors made of them did worse than the guess they would replace), from
renderings that differ by messages: a user's question and an assistant's
answer added (what each template spends on a message's framing, per token
of the estimate's framing class), a tool call and its result added, with a
short and a long result (what it shows of a result's text, per token of it,
and what it spends on the call and the result's id, per token of the
``tool`` class). Each rendering is counted with
o200k (the built-in counter's tokenizer, no family's vocabulary), a control
marker the template writes (``<|im_start|>``, ``<start_of_turn>``,
``[INST]``) as one token, as the vocabulary it was written for counts it. It
prints each class's mean and standard deviation over the templates, and how
many show none of it.
"""

from __future__ import annotations

import importlib.metadata
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import jinja2.sandbox
from _heldout_families import _as_template_message, _raise, _tojson

from threadline import Message, ToolCall
from threadline.counting import BuiltinTokenCounter
from threadline.counting._calibration._classes import CLASSES, SCRIPTS, message_classes
from threadline.counting._lengths import o200k_base_lengths

MARK = "SYSTEM-MESSAGE-MARK"
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look up a city.",
            "parameters": {
                "type": "object",
                "properties": {"city": {"type": "string"}},
                "required": ["city"],
            },
        },
    }
]
CALL = {"id": "abcdefghi", "type": "function", "function": {"name": "lookup"}}
TOOL_ENDED = [
    {"role": "system", "content": f"{MARK} You are a travel assistant."},
    {"role": "user", "content": "What is the weather in Lisbon?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [{**CALL, "function": {**CALL["function"], "arguments": '{"city": "x"}'}}],
    },
    {"role": "tool", "tool_call_id": "abcdefghi", "name": "lookup", "content": "sunny, 21 C"},
]
USER_ENDED = [
    *TOOL_ENDED,
    {"role": "assistant", "content": "It is sunny."},
    {"role": "user", "content": "And in Porto?"},
]


# A control marker of a chat template: <|...|>, the same between full-width bars
# (DeepSeek's), <tag>, </tag>, [TAG], [/TAG].
MARKER = re.compile(
    r"<\|[^<>|\s]{1,60}\|>|<\uff5c[^<>]{1,60}?\uff5c>"
    r"|</?[A-Za-z_][A-Za-z0-9_]{0,40}>|\[/?[A-Z][A-Z_]{1,30}\]"
)
BASE = [
    Message.system("You are a travel assistant. Answer briefly."),
    Message.user("What is the weather in Lisbon?"),
]
TURNS = [
    [Message.assistant("It is sunny."), Message.user("And in Porto?")],
    [
        Message.assistant("Lisbon is warm today, about 21 degrees, with a light sea wind."),
        Message.user("Thank you. Which of the two is better for a walk by the river?"),
    ],
    [Message.assistant("Yes."), Message.user("Compare them for a family with small children.")],
]
CALLS = [
    ToolCall(id="abcdefghi", name="lookup", arguments='{"city": "Lisbon"}'),
    ToolCall(id="k3j9x2m7q", name="lookup", arguments='{"city": "Porto", "days": 3, "units": "C"}'),
]
RESULTS = [
    "sunny, 21 C",
    '{"city": "Lisbon", "forecast": [{"day": "mon", "sky": "sunny", "high": 21}, '
    '{"day": "tue", "sky": "cloudy", "high": 18}, {"day": "wed", "sky": "rain", "high": 16}]}',
]
FACTORS = ("framing", "tool", "tool_result")


def templates() -> dict[str, str]:
    """Every chat template of the installed llama-cpp-python's sdist, by file name."""
    version = importlib.metadata.version("llama-cpp-python")
    with tempfile.TemporaryDirectory() as download:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
        command += ["--no-binary", "llama-cpp-python", f"llama-cpp-python=={version}"]
        subprocess.run([*command, "-d", download], check=True, capture_output=True)
        (archive,) = Path(download).glob("*.tar.gz")
        found = {}
        with tarfile.open(archive) as tar:
            for member in tar:
                folder, _, name = member.name.rpartition("/")
                source = tar.extractfile(member) if member.isfile() else None
                # The folder holds a README too: only the templates are rendered.
                template = name.endswith(".jinja")
                if folder.endswith("vendor/llama.cpp/models/templates") and template and source:
                    found[name] = source.read().decode()
        return found


def shows_system(template: jinja2.Template, messages: list[dict[str, object]]) -> bool:
    text = template.render(
        messages=[_as_template_message(m) for m in messages],
        tools=TOOLS,
        add_generation_prompt=True,
        bos_token="<s>",
        eos_token="</s>",
    )
    return MARK in text


def _wire(message: Message) -> dict[str, object]:
    # As an OpenAI-compatible request carries it, which the server hands to the template.
    wire: dict[str, object] = {"role": message.role.value, "content": message.text}
    if message.tool_calls:
        wire["tool_calls"] = [
            {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        wire["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        wire["name"] = message.name
    return wire


def _tokens(template: jinja2.Template, messages: list[Message], *, as_text: bool = False) -> int:
    text = template.render(
        messages=[_as_template_message(_wire(m)) for m in messages],
        tools=TOOLS,
        add_generation_prompt=True,
        bos_token="<s>",
        eos_token="</s>",
    )
    count = o200k_base_lengths().safe_count
    if as_text:
        return count(text)
    pieces = MARKER.split(text)
    return sum(count(p) for p in pieces if p) + len(pieces) - 1


def _classes(messages: list[Message]) -> tuple[int, int, int, int]:
    """The estimate's framing, tool and tool result classes of ``messages``, and their
    text outside tool results (priced at o200k's own slope, 1)."""
    counter = BuiltinTokenCounter()
    totals = [sum(c) for c in zip(*(message_classes(counter, m) for m in messages), strict=True)]
    return totals[0], totals[1], totals[2], sum(totals[len(CLASSES) - len(SCRIPTS) : len(CLASSES)])


def factors(template: jinja2.Template) -> tuple[float, float, float]:
    """What ``template`` spends per token of the estimate's framing, tool call and tool
    result classes, counted with o200k (so the text's own slope is 1)."""
    spend, tool, result_factor = _measured(template, as_text=False)
    # A template that shows no tool call leaves its messages' framing out too: never below 0.
    return spend, max(0.0, statistics.fmean(tool)), result_factor


def spelled(template: jinja2.Template) -> float:
    """The most ``template`` spends per token of the tool class on any call measured (the
    shortest spends most: a call's markers cost the same whatever its length), its
    control markers spelled as text, as a vocabulary that holds none of them spells
    them (a distilled model's often holds its base model's markers, not its teacher's)."""
    return max(0.0, max(_measured(template, as_text=True)[1]))


def _measured(template: jinja2.Template, *, as_text: bool) -> tuple[float, list[float], float]:
    """``template``'s framing factor, its tool call factor on each call and result
    measured, and its tool result factor."""
    before = _tokens(template, BASE, as_text=as_text)
    framing = []
    for turn in TURNS:
        count, _, _, text = _classes(turn)
        framing.append((_tokens(template, BASE + turn, as_text=as_text) - before - text) / count)
    spend = statistics.fmean(framing)
    exchanges = {}
    without = _tokens(template, BASE + TURNS[0], as_text=as_text)
    for call in CALLS:
        for result in RESULTS:
            call_message = Message.assistant("", tool_calls=[call])
            shown = [call_message, Message.tool(call.id, result, name="lookup")]
            added = _tokens(template, [*BASE, *shown, *TURNS[0]], as_text=as_text) - without
            exchanges[call, result] = added, _classes(shown)
    shows = []  # a longer result adds its text times what the template shows of it
    for call in CALLS:
        (short, of_short), (long, of_long) = (exchanges[call, r] for r in RESULTS)
        shows.append((long - short) / (of_long[2] - of_short[2]))
    result_factor = statistics.fmean(shows)
    tool = [
        (added - spend * count - result_factor * results - text) / calls
        for added, (count, calls, results, text) in exchanges.values()
    ]
    return spend, tool, result_factor


def _print_factors(measured: dict[str, tuple[float, float, float]]) -> None:
    print(f"# template factors measured on {len(measured)} templates:")
    for name, values in measured.items():
        shown = ", ".join(f"{k} {v:.2f}" for k, v in zip(FACTORS, values, strict=True))
        print(f"#   {name}: {shown}")
    print("TEMPLATE_FACTORS = {")
    for i, name in enumerate(FACTORS):
        column = [values[i] for values in measured.values()]
        none = sum(1 for v in column if v < 0.25)
        mean, spread = statistics.fmean(column), statistics.stdev(column)
        showing = [v for v in column if v >= 0.25]
        print(
            f'    "{name}": ({mean:.3f}, {spread:.3f}),  # showing none: {none}; '
            f"the others {statistics.fmean(showing):.3f} +- {statistics.stdev(showing):.3f}"
        )
    print("}")


def _print_spelled(spelling: dict[str, float]) -> None:
    print(f"# the most per tool call token, markers as text, on {len(spelling)} templates:")
    print("TOOL_CALL_SPELLED = {")
    for name, value in sorted(spelling.items(), key=lambda item: (-item[1], item[0])):
        print(f'    "{name.removesuffix(".jinja")}": {value:.3f},')
    print("}")


def environment() -> jinja2.Environment:
    """Where the templates render, as in llama.cpp's server."""
    # Not immutable, unlike the benchmark's provider: some templates append to lists.
    env = jinja2.sandbox.SandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise, strftime_now=lambda _: "06 Dec 2026")
    return env


def main() -> int:
    env = environment()
    dropping, rendered, failed = [], [], []
    measured, spelling = {}, {}
    for name, text in sorted(templates().items()):
        try:
            template = env.from_string(text)
            shown = shows_system(template, TOOL_ENDED), shows_system(template, USER_ENDED)
        except Exception as exc:
            failed.append(f"{name} ({type(exc).__name__})")
            continue
        rendered.append(name)
        if shown == (False, True):
            dropping.append(name)
        try:
            measured[name] = factors(template)
            spelling[name] = spelled(template)
        except Exception as exc:
            print(f"# no template factors: {name} ({type(exc).__name__})")
    print(f"# left out, as they do not render: {', '.join(failed)}")
    print(f"# dropping the system message when a tool result ends the prompt: {dropping}")
    print(f"TEMPLATES_DROPPING_SYSTEM = ({len(dropping)}, {len(rendered)})")
    _print_factors(measured)
    _print_spelled(spelling)
    return 0


if __name__ == "__main__":
    sys.exit(main())
