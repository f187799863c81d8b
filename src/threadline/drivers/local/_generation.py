"""One reply of the local model, sampled token by token in a worker thread.

A reply is sampled in phases. A plain turn is one phase of free text. A turn
with tools first lets a grammar make the model open its reply with
``message:`` or ``functions.<name>:`` (what ``tool_choice`` allows), then
samples the message's text, or the call's arguments under a grammar made
from the tool's JSON schema. Every phase checks the stop flag before each
token.
"""

from __future__ import annotations

import codecs
import json
import threading
import uuid
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Final, Protocol

import attrs

from threadline._messages import Usage
from threadline._provider import (
    ProviderCall,
    ProviderResponse,
    StreamChunk,
    TextChunk,
    ToolCallChunk,
)
from threadline.drivers.local._chat import MESSAGE_PREFIX, choice_grammar, from_llama_message
from threadline.drivers.local._llama import Bindings, Llama

__all__ = ["ConsumerGone", "Generation", "GenerationHost", "Prepared", "held_back", "reused_prefix"]

_LOCK_POLL_SECONDS: Final = 0.05


class Tokenizer(Protocol):
    """The model's tokenizer over a prompt text (``special``: parse special tokens)."""

    def __call__(self, text: str, *, special: bool = True) -> list[int]: ...


@attrs.frozen(kw_only=True)
class GenerationHost:
    """What a generation needs from its driver, handed over as one value.

    The driver makes it once and keeps its loading to itself: a generation
    asks for the bindings and the weights (each loaded on first use, once),
    tokenizes with the model's tokenizer, and takes turns on ``lock``, as one
    llama.cpp model is not thread-safe.
    """

    model_name: str
    """What the response says answered."""
    lock: threading.Lock
    bindings: Callable[[], Bindings]
    weights: Callable[[], Llama]
    tokenize: Tokenizer


class _Stopped(Exception):
    """Generation was asked to stop (the caller left or was cancelled)."""


class _OutOfRoom(Exception):
    """The output budget ended before the model finished opening its reply."""


class ConsumerGone(Exception):
    """The async side closed its end of the stream."""


@attrs.frozen(kw_only=True)
class Prepared:
    """A call turned into what the model needs: prompt text, tokens and limits."""

    call: ProviderCall
    prompt: str
    prompt_tokens: int
    max_tokens: int
    uses_functions: bool
    sampling: dict[str, Any]
    seed: int


class Generation:
    """One reply, sampled token by token in a worker thread.

    ``emit`` receives each chunk as it is decoded (``None``: nobody streams).
    ``stop()`` may be called from any thread; the sampling loop checks it
    before every token. ``finished`` is set when the thread is done with the
    model, whatever the outcome; ``tokens_sampled`` and ``stopped_early``
    say how far it went.
    """

    def __init__(
        self,
        host: GenerationHost,
        prepared: Prepared,
        emit: Callable[[StreamChunk], None] | None,
    ) -> None:
        self._host = host
        self._prepared = prepared
        self._emit = emit
        self._stop = threading.Event()
        self.finished = threading.Event()
        self.tokens_sampled = 0
        self.stopped_early = False
        self.response: ProviderResponse | None = None
        self.error: Exception | None = None
        self._completion_tokens = 0
        self._cached_tokens: int | None = None
        """Prompt tokens the model's KV cache served, taken at the reply's first phase."""

    def stop(self) -> None:
        self._stop.set()

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    def run(self) -> None:
        """Sample the reply; never raises (the outcome is in ``response`` or ``error``)."""
        lock = self._host.lock
        try:
            while not lock.acquire(timeout=_LOCK_POLL_SECONDS):
                if self._stop.is_set():
                    raise _Stopped
            try:
                self.response = self._reply(self._host.weights())
            finally:
                lock.release()
        except (_Stopped, ConsumerGone):
            self.stopped_early = True
        except Exception as exc:
            self.error = exc
        finally:
            self.finished.set()

    def _send(self, chunk: StreamChunk) -> None:
        if self._emit is not None:
            self._emit(chunk)

    # -- the reply, phase by phase ----------------------------------------

    def _reply(self, model: Llama) -> ProviderResponse:
        prepared = self._prepared
        model.set_seed(prepared.seed)
        sampler = _Sampler(self, model)
        call = prepared.call
        if not prepared.uses_functions:
            text, finish = sampler.answer(prepared.prompt, call)
            return self._response({"role": "assistant", "content": text}, finish)

        names = [tool.name for tool in call.tools]
        choice = call.tool_choice
        if choice == "none" or not names:
            offered, allow_message = [], True
        elif choice == "required":
            offered, allow_message = names, False
        elif choice in names:
            offered, allow_message = [choice], False
        else:
            offered, allow_message = names, True
        gbnf, openings = choice_grammar(offered, allow_message=allow_message)
        try:
            opening = sampler.choose(prepared.prompt, gbnf, openings)
        except _OutOfRoom:
            return self._response({"role": "assistant", "content": ""}, "length")
        if opening == MESSAGE_PREFIX:
            text, finish = sampler.answer(prepared.prompt + opening, call)
            return self._response({"role": "assistant", "content": text}, finish)

        # One call per reply: small models asked for more repeat the first
        # call; the run loop sends the result and the model may call again.
        name = opening[len("functions.") : -len(":\n")]
        call_id = f"call_{uuid.uuid4().hex[:24]}"
        self._send(ToolCallChunk(index=0, id=call_id, name=name))
        schema = next(tool.parameters for tool in call.tools if tool.name == name)
        arguments, ended = sampler.arguments(prepared.prompt + opening, schema, index=0)
        tool_call = {
            "id": call_id,
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }
        finish = "length" if ended == "length" else "tool_calls"
        return self._response(
            {"role": "assistant", "content": "", "tool_calls": [tool_call]}, finish
        )

    def _response(self, entry: dict[str, Any], finish: str) -> ProviderResponse:
        return ProviderResponse(
            message=from_llama_message(entry),
            finish_reason=finish,
            usage=Usage(
                input_tokens=self._prepared.prompt_tokens,
                output_tokens=self._completion_tokens,
                cached_input_tokens=min(self._cached_tokens or 0, self._prepared.prompt_tokens),
            ),
            model=self._host.model_name,
        )


class _Sampler:
    """Samples one phase of a reply from a prompt text, token by token."""

    def __init__(self, generation: Generation, model: Llama) -> None:
        self._generation = generation
        self._model = model
        self._host = generation._host
        self._is_eog = self._host.bindings().end_of_generation(model)
        self._n_ctx = model.n_ctx()
        self._budget = generation._prepared.max_tokens
        self.ended = "stop"
        """Why the last phase ended: ``"stop"`` (the model ended) or ``"length"``."""

    def _tokens(
        self, prompt: str, *, grammar: object | None, greedy: bool = False
    ) -> Iterator[tuple[int, str]]:
        """Sampled tokens with their decoded text, until the model ends or a limit is hit.

        Stops (returns) at the end of generation, and at the output budget or
        the context's end; raises ``_Stopped`` when asked to stop.
        """
        generation = self._generation
        tokens = self._host.tokenize(prompt)
        room = min(self._budget - generation._completion_tokens, self._n_ctx - len(tokens))
        self.ended = "length"
        if room <= 0:
            return
        settings = dict(generation._prepared.sampling)
        if greedy:
            settings["temp"] = 0.0
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        produced = 0
        if generation._cached_tokens is None:
            generation._cached_tokens = reused_prefix(self._model, tokens)
        generator = self._model.generate(tokens, grammar=grammar, **settings)
        try:
            for token in generator:
                if generation.stop_requested:
                    raise _Stopped
                generation.tokens_sampled += 1
                if self._is_eog(token):
                    self.ended = "stop"
                    return
                generation._completion_tokens += 1
                produced += 1
                yield token, decoder.decode(self._model.detokenize([token]))
                if produced >= room:
                    return
        finally:
            # llama-cpp-python's generate() is a generator today; the Llama
            # protocol promises only an iterator, so close it when it can be.
            close = getattr(generator, "close", None)
            if close is not None:
                close()

    def text(self, prompt: str, *, stop: Sequence[str]) -> tuple[str, str]:
        """Free text, sent on as ``TextChunk`` pieces; returns it and the finish reason."""
        text = ""
        sent = 0
        longest_stop = max((len(s) for s in stop), default=0)
        for _, piece in self._tokens(prompt, grammar=None):
            text += piece
            for marker in stop:
                found = text.find(marker, max(0, sent - longest_stop))
                if found != -1:
                    if found > sent:
                        self._generation._send(TextChunk(text=text[sent:found]))
                    return text[:found], "stop"
            safe = len(text) - held_back(text, stop)
            if safe > sent:
                self._generation._send(TextChunk(text=text[sent:safe]))
                sent = safe
        if len(text) > sent:
            self._generation._send(TextChunk(text=text[sent:]))
        return text, self.ended

    def answer(self, prompt: str, call: ProviderCall) -> tuple[str, str]:
        """The reply's message: free text, or JSON under the grammar of the call's
        output schema (``output_type``), sent on as ``TextChunk`` pieces."""
        if call.output is None:
            return self.text(prompt, stop=call.sampling.stop or ())
        schema = json.loads(json.dumps(call.output.schema))
        grammar = self._host.bindings().grammar_from_schema(schema)
        text = ""
        for _, piece in self._tokens(prompt, grammar=grammar):
            text += piece
            if piece:
                self._generation._send(TextChunk(text=piece))
            if text.rstrip().endswith("}") and _is_json_object(text):
                return text, "stop"
        return text, "stop" if _is_json_object(text) else "length"

    def choose(self, prompt: str, gbnf: str, options: Sequence[str]) -> str:
        """Which of ``options`` the model opens its reply with."""
        if len(options) == 1:
            # Only one way to go: write it without asking the model.
            self._generation._completion_tokens += len(
                self._host.tokenize(options[0], special=False)
            )
            return options[0]
        grammar = self._host.bindings().grammar_from_gbnf(gbnf)
        text = ""
        for _, piece in self._tokens(prompt, grammar=grammar, greedy=True):
            text += piece
            if text in options:
                return text
        if text not in options:  # the output budget ran out mid-way
            raise _OutOfRoom
        return text

    def arguments(self, prompt: str, schema: object, index: int) -> tuple[str, str]:
        """A call's JSON arguments under its schema's grammar, sent on as they come."""
        grammar = self._host.bindings().grammar_from_schema(json.loads(json.dumps(schema)))
        text = ""
        for _, piece in self._tokens(prompt, grammar=grammar):
            text += piece
            if piece:
                self._generation._send(ToolCallChunk(index=index, arguments=piece))
            if text.rstrip().endswith("}") and _is_json_object(text):
                return text, "stop"
        return text, "stop" if _is_json_object(text) else "length"


def reused_prefix(model: object, tokens: Sequence[int]) -> int:
    """How many of ``tokens`` llama-cpp-python's ``Llama.generate`` takes from its KV cache.

    It keeps the prefix the prompt shares with what the model evaluated last
    (``input_ids[:n_tokens]``) and evaluates the rest; a prompt it holds whole
    has its last token evaluated again, so at most all but one are reused.
    """
    # Internals of llama_cpp.Llama, outside the narrow Llama protocol: read
    # with defaults so a version without them reports no reuse, not a crash.
    evaluated = int(getattr(model, "n_tokens", 0) or 0)
    previous = getattr(model, "input_ids", None)
    if evaluated <= 0 or previous is None:
        return 0
    shared = 0
    for old, new in zip(previous[:evaluated], tokens, strict=False):
        if old != new:
            break
        shared += 1
    return max(0, min(shared, len(tokens) - 1))


def held_back(text: str, stop: Sequence[str]) -> int:
    """How many trailing characters of ``text`` could still begin a stop sequence."""
    held = 0
    for marker in stop:
        for size in range(min(len(marker) - 1, len(text)), held, -1):
            if text.endswith(marker[:size]):
                held = size
                break
    return held


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False
