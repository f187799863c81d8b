"""Tokenizer families for ``bench_counting_heldout.py``: real vocabularies, real chat
templates, and an OpenAI-compatible provider on 127.0.0.1 that counts with them.

llama.cpp's source tree ships vocabulary-only GGUF files of many model
families (``models/ggml-vocab-*.gguf``, a few MB each: the tokenizer without
weights) and the chat templates of many models (``models/templates/*.jinja``).
llama-cpp-python's sdist carries that tree under ``vendor/llama.cpp/``, so
:func:`vocab_dir` downloads the sdist of the llama-cpp-python installed (with
pip, into a cache directory; once) and extracts only the files named here.
``llama_cpp.Llama(model_path=..., vocab_only=True)`` tokenizes with them in
process.

:class:`Provider` is a real HTTP server (``http.server`` in a thread) speaking
OpenAI's Chat Completions: it renders each request with the family's chat
template (jinja2, as llama.cpp's server does: tool-call arguments parsed to
objects, a missing content as ""), tokenizes the prompt with the family's
tokenizer, reports it as ``usage.prompt_tokens``, and refuses with OpenAI's
``context_length_exceeded`` 400 when the prompt plus ``max_tokens`` is more
than the window. Its answers are scripted by the conversation: the tool call
of a turn that has one, then the turn's answer. It reports each answer's
``usage.completion_tokens`` as a server that generated it would: the family's
tokens of its text, and one for the end of the turn (a tool call's: of its name
and arguments, as JSON).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import attrs

__all__ = ["FAMILIES", "Family", "Provider", "serve", "vocab_dir"]


@attrs.frozen(kw_only=True)
class Family:
    """A tokenizer family: its vocabulary file, its chat template, and whether the
    calibration's model was tuned while looking at it."""

    name: str
    vocab: str
    template: str
    tuning: bool
    note: str = ""
    frozen: bool = False
    """Added after the calibration's model was frozen: nobody saw its numbers before."""
    arguments_as_text: bool = False
    """The template writes a call's arguments as the request's JSON text: llama.cpp
    parses them to an object only for a template that renders nothing else."""
    tools_as_functions: bool = False
    """llama.cpp renders the template with the tools as JSON text in ``functions``
    (FireFunction v2's), and the date in ``datetime``, not with ``tools``."""

    @property
    def vocabulary(self) -> str:
        """The vocabulary's name, as calibration's measured priors name it (``llama-bpe``)."""
        return self.vocab.removeprefix("ggml-vocab-").removesuffix(".gguf")


FAMILIES: tuple[Family, ...] = (
    Family(
        name="Llama 3",
        vocab="ggml-vocab-llama-bpe.gguf",
        template="meta-llama-Llama-3.1-8B-Instruct.jinja",
        tuning=True,
    ),
    Family(
        name="Phi-3",
        vocab="ggml-vocab-phi-3.gguf",
        template="microsoft-Phi-3.5-mini-instruct.jinja",
        tuning=False,
        note="its template shows no tool call or result",
    ),
    Family(
        name="Command-R",
        vocab="ggml-vocab-command-r.gguf",
        template="CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja",
        tuning=True,
    ),
    Family(
        name="Qwen 2.5",
        vocab="ggml-vocab-qwen2.gguf",
        template="Qwen-Qwen2.5-7B-Instruct.jinja",
        tuning=False,
    ),
    Family(
        name="Qwen 3.5",
        vocab="ggml-vocab-qwen35.gguf",
        template="Qwen3.5-4B.jinja",
        tuning=False,
    ),
    Family(
        name="Gemma 4",
        vocab="ggml-vocab-gemma-4.gguf",
        template="google-gemma-4-31B-it.jinja",
        tuning=False,
    ),
    Family(
        name="DeepSeek",
        vocab="ggml-vocab-deepseek-llm.gguf",
        template="deepseek-ai-DeepSeek-V3.1.jinja",
        tuning=True,
        note="DeepSeek LLM's vocabulary with DeepSeek V3.1's template",
    ),
    Family(
        name="Mistral (SentencePiece)",
        vocab="ggml-vocab-llama-spm.gguf",
        template="mistralai-Mistral-Nemo-Instruct-2407.jinja",
        tuning=False,
        note="the Llama 2 / Mistral 7B SentencePiece vocabulary with Mistral's template",
    ),
    Family(
        name="Qwen 3",
        vocab="ggml-vocab-qwen2.gguf",
        template="Qwen-Qwen3-0.6B.jinja",
        tuning=False,
        frozen=True,
    ),
    Family(
        name="Hermes 3 (Llama 3.1)",
        vocab="ggml-vocab-llama-bpe.gguf",
        template="NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja",
        tuning=False,
        frozen=True,
    ),
    Family(
        name="DeepSeek R1 Distill (Llama)",
        vocab="ggml-vocab-llama-bpe.gguf",
        template="deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja",
        tuning=False,
        frozen=True,
    ),
    # Added after the prior's correlations were shrunk by their own estimate, as the check
    # on what nobody had looked at: nothing was changed for them.
    Family(
        name="DeepSeek R1 Distill (Qwen)",
        vocab="ggml-vocab-qwen2.gguf",
        template="deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
        tuning=False,
        frozen=True,
    ),
    Family(
        name="SmolLM3",
        vocab="ggml-vocab-llama-bpe.gguf",
        template="HuggingFaceTB-SmolLM3-3B.jinja",
        tuning=False,
        frozen=True,
        note="SmolLM3 uses Llama 3.2's vocabulary",
    ),
    Family(
        name="Functionary v3.1 (Llama 3.1)",
        vocab="ggml-vocab-llama-bpe.gguf",
        template="meetkai-functionary-medium-v3.1.jinja",
        tuning=False,
        frozen=True,
    ),
    Family(
        name="Qwen3 Coder",
        vocab="ggml-vocab-qwen2.gguf",
        template="Qwen3-Coder.jinja",
        tuning=False,
        frozen=True,
    ),
    Family(
        name="Hermes 2 Pro (Llama 3)",
        vocab="ggml-vocab-llama-bpe.gguf",
        template="NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja",
        tuning=False,
        frozen=True,
    ),
    # Added two stops after the last change to the calibration, run once, nothing changed
    # for them: the templates llama.cpp ships whose model's vocabulary it ships too and
    # that no row had run. (Command R+'s tool-use template is left out: it reads Cohere's
    # own tool format, and llama.cpp renders it with its generic tool polyfill.)
    Family(
        name="Llama 3.2",
        vocab="ggml-vocab-llama-bpe.gguf",
        template="meta-llama-Llama-3.2-3B-Instruct.jinja",
        tuning=False,
        frozen=True,
    ),
    Family(
        name="FireFunction v2 (Llama 3)",
        vocab="ggml-vocab-llama-bpe.gguf",
        template="fireworks-ai-llama-3-firefunction-v2.jinja",
        tuning=False,
        frozen=True,
        tools_as_functions=True,
    ),
    Family(
        name="Functionary v3.2 (Llama 3.1)",
        vocab="ggml-vocab-llama-bpe.gguf",
        template="meetkai-functionary-medium-v3.2.jinja",
        tuning=False,
        frozen=True,
        arguments_as_text=True,
    ),
    Family(
        name="QwQ",
        vocab="ggml-vocab-qwen2.gguf",
        template="Qwen-QwQ-32B.jinja",
        tuning=False,
        frozen=True,
    ),
)

_VENDORED = "vendor/llama.cpp/models/"


def _cache_root() -> Path:
    given = os.environ.get("THREADLINE_VOCAB_CACHE")
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "threadline" / "llama-vocab"


def vocab_dir(families: Sequence[Family] = FAMILIES) -> Path:
    """A directory holding every vocabulary and template ``families`` need: the
    vendored llama.cpp files of the installed llama-cpp-python's own sdist, downloaded
    with pip on first use and cached (``THREADLINE_VOCAB_CACHE``, else
    ``~/.cache/threadline/llama-vocab``).

    Raises:
        RuntimeError: pip could not download the sdist, or it lacks a file.
    """
    version = importlib.metadata.version("llama-cpp-python")
    target = _cache_root() / version
    wanted = {f.vocab for f in families} | {f"templates/{f.template}" for f in families}
    if all((target / name).is_file() for name in wanted):
        return target
    with tempfile.TemporaryDirectory() as download:
        command = [
            sys.executable,
            "-m",
            "pip",
            "download",
            "--quiet",
            "--no-deps",
            "--no-binary",
            "llama-cpp-python",
            f"llama-cpp-python=={version}",
            "-d",
            download,
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        archives = list(Path(download).glob("*.tar.gz"))
        if done.returncode != 0 or not archives:
            raise RuntimeError(f"pip could not download llama-cpp-python's sdist: {done.stderr}")
        _extract(archives[0], target, wanted)
    missing = sorted(name for name in wanted if not (target / name).is_file())
    if missing:
        raise RuntimeError(f"llama-cpp-python {version}'s sdist lacks {missing}")
    return target


def _extract(archive: Path, target: Path, wanted: set[str]) -> None:
    target.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive) as tar:
        for member in tar:
            _, _, inside = member.name.partition("/")
            name = inside.removeprefix(_VENDORED)
            if inside.startswith(_VENDORED) and name in wanted and member.isfile():
                source = tar.extractfile(member)
                assert source is not None
                path = target / name
                path.parent.mkdir(parents=True, exist_ok=True)
                partial = path.with_suffix(path.suffix + ".part")
                partial.write_bytes(source.read())
                partial.replace(path)


def _raise(message: str) -> None:
    raise ValueError(message)


class Tokenizer:
    """One family's chat template and tokenizer: a request's prompt tokens."""

    def __init__(self, family: Family, directory: Path) -> None:
        import jinja2.sandbox
        import llama_cpp

        self.llm = llama_cpp.Llama(
            model_path=str(directory / family.vocab), vocab_only=True, verbose=False
        )
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = _tojson
        env.globals.update(raise_exception=_raise, strftime_now=lambda _: "06 Dec 2026")
        self.template = env.from_string((directory / "templates" / family.template).read_text())
        self.family = family
        bos = self.llm.token_bos()
        self.bos = self.llm.detokenize([bos], special=True).decode() if bos >= 0 else ""
        self.lock = threading.Lock()

    def prompt_tokens(self, body: Mapping[str, Any]) -> int:
        """The tokens of ``body``'s prompt as the family's server would count them."""
        family = self.family
        tools = body.get("tools") or None
        extra = {}
        if family.tools_as_functions:
            extra = {"functions": json.dumps(tools or "", indent=2), "datetime": "Dec 06 2026"}
            tools = None
        text = self.template.render(
            messages=[
                _as_template_message(m, parse=not family.arguments_as_text)
                for m in body["messages"]
            ],
            tools=tools,
            add_generation_prompt=True,
            bos_token=self.bos,
            eos_token="",
            **extra,
        )
        with self.lock:
            return len(self.llm.tokenize(text.encode(), add_bos=False, special=True))

    def completion_tokens(self, reply: Mapping[str, Any]) -> int:
        """The tokens of ``reply`` as the model would have generated them: its text's
        (a tool call's name and arguments, as JSON), and the end of the turn."""
        calls = reply.get("tool_calls") or ()
        text = reply.get("content") or "".join(
            json.dumps({"name": c["function"]["name"], "arguments": c["function"]["arguments"]})
            for c in calls
        )
        with self.lock:
            return len(self.llm.tokenize(text.encode(), add_bos=False, special=False)) + 1


def _tojson(
    value: Any,
    indent: int | None = None,
    ensure_ascii: bool = False,
    separators: Any = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, indent=indent, ensure_ascii=ensure_ascii, separators=separators, sort_keys=sort_keys
    )


def _as_template_message(message: Mapping[str, Any], *, parse: bool = True) -> dict[str, Any]:
    """A message as llama.cpp's server hands it to a template (with ``parse``, a call's
    arguments as an object)."""
    shown = dict(message)
    content = shown.get("content")
    if isinstance(content, list):
        content = "".join(p.get("text", "") for p in content)
    shown["content"] = content or ""
    calls = []
    for call in shown.get("tool_calls") or ():
        function = dict(call["function"])
        if parse:
            with contextlib.suppress(ValueError):
                function["arguments"] = json.loads(function["arguments"])
        calls.append({**call, "function": function})
    if calls:
        shown["tool_calls"] = calls
    return shown


Script = Callable[[Sequence[Mapping[str, Any]]], dict[str, Any]]
"""What the provider answers, given the request's messages: an assistant message."""


class Provider(ThreadingHTTPServer):
    """The OpenAI-compatible server of one family (see the module docstring)."""

    daemon_threads = True

    def __init__(self, tokenizer: Tokenizer, window: int, script: Script) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.tokenizer = tokenizer
        self.window = window
        self.script = script
        self.refused = 0
        """The requests refused as longer than the window."""

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _Handler(BaseHTTPRequestHandler):
    server: Provider

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def _send(self, status: int, payload: Mapping[str, Any]) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["content-length"])))
        server = self.server
        prompt = server.tokenizer.prompt_tokens(body)
        limit = body.get("max_completion_tokens") or body.get("max_tokens") or 0
        if prompt + limit > server.window:
            message = (
                f"This model's maximum context length is {server.window} tokens. However, you "
                f"requested {prompt + limit} tokens ({prompt} in the messages, {limit} in the "
                "completion). Please reduce the length of the messages or completion."
            )
            error = {
                "message": message,
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
            server.refused += 1
            self._send(400, {"error": error})
            return
        reply = server.script(body["messages"])
        finish = "tool_calls" if reply.get("tool_calls") else "stop"
        completion = server.tokenizer.completion_tokens(reply)
        self._send(
            200,
            {
                "id": "chatcmpl-heldout",
                "object": "chat.completion",
                "created": 0,
                "model": body["model"],
                "choices": [{"index": 0, "message": reply, "finish_reason": finish}],
                "usage": {
                    "prompt_tokens": prompt,
                    "completion_tokens": completion,
                    "total_tokens": prompt + completion,
                },
            },
        )


@contextlib.contextmanager
def serve(tokenizer: Tokenizer, window: int, script: Script) -> Iterator[Provider]:
    """A :class:`Provider` answering on 127.0.0.1 until the block ends."""
    provider = Provider(tokenizer, window, script)
    thread = threading.Thread(target=provider.serve_forever, daemon=True)
    thread.start()
    try:
        yield provider
    finally:
        provider.shutdown()
        provider.server_close()
        thread.join()
