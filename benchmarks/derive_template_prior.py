"""Derive calibration's prior of the ``system_dropped`` class from real chat templates.

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
"""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

import jinja2.sandbox
from _heldout_families import _as_template_message, _raise, _tojson

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
                if folder.endswith("vendor/llama.cpp/models/templates") and source:
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


def main() -> int:
    # Not immutable, unlike the benchmark's provider: some templates append to lists.
    env = jinja2.sandbox.SandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise, strftime_now=lambda _: "06 Dec 2026")
    dropping, rendered, failed = [], [], []
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
    print(f"# left out, as they do not render: {', '.join(failed)}")
    print(f"# dropping the system message when a tool result ends the prompt: {dropping}")
    print(f"TEMPLATES_DROPPING_SYSTEM = ({len(dropping)}, {len(rendered)})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
