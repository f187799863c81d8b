"""How many tokens a text has: the tokenizer under the built-in counter.

o200k_base texts are counted by one of two exact tokenizers:

- **bpe-openai** (the ``fast-tokenizer`` extra), when it is installed: a
  Python package wrapping GitHub's ``bpe-openai`` Rust crate, which carries
  its own copy of the o200k_base vocabulary. It counts without building a list of
  token ids, about 1.6 times as fast as tiktoken on chat-sized texts, and
  loads in ~70 ms where tiktoken takes ~0.7 s to build the shipped vocabulary;
- **tiktoken** otherwise, from the vocabulary shipped with threadline
  (``_encoding``).

Both give the same counts; tests/test_counting_lengths.py compares them on
generated and hand-picked texts whenever both are installed. A counter built
with ``encoding=`` counts with that encoding's ``encode_ordinary`` instead.

A ``TokenLengths`` has a fast path for batches and for single texts, which
may refuse a text with lone surrogates (``UnicodeEncodeError``), and a safe
path that first repairs such text as tiktoken does: each lone surrogate
counts as U+FFFD.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable
from typing import Any, Final, final

from threadline.counting._encoding import TextEncoder, o200k_base_encoding

__all__ = ["TokenLengths", "o200k_base_lengths", "repair_surrogates", "token_lengths_of"]

_log = logging.getLogger("threadline.counting")

Count = Callable[[str], int]


@final
class TokenLengths:
    """Three ways to count tokens with one tokenizer.

    Attributes:
        count: the tokens of one text (may raise ``UnicodeEncodeError``).
        counts: the tokens of each text of a list (may raise the same).
        safe_count: the tokens of one text, lone surrogates repaired.
        tokenizer: ``"bpe-openai"``, ``"tiktoken"`` or ``"custom"``.
    """

    __slots__ = ("count", "counts", "safe_count", "tokenizer")

    def __init__(
        self,
        count: Count,
        counts: Callable[[list[str]], list[int]],
        safe_count: Count,
        tokenizer: str,
    ) -> None:
        self.count: Final = count
        self.counts: Final = counts
        self.safe_count: Final = safe_count
        self.tokenizer: Final = tokenizer


def repair_surrogates(text: str) -> str:
    """``text`` with each lone surrogate replaced by U+FFFD, as tiktoken repairs it."""
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def token_lengths_of(encoding: TextEncoder, tokenizer: str = "custom") -> TokenLengths:
    """``TokenLengths`` from an object with ``encode_ordinary`` (a tiktoken encoding or not).

    For a ``tiktoken.Encoding`` the fast paths call its Rust encoder directly,
    without the Python method around it (which saves a Python call per text);
    the method stays the safe path, as it repairs lone surrogates.
    """
    from tiktoken import Encoding  # imported with a vocabulary, never at threadline's import

    method = encoding.encode_ordinary
    core = getattr(encoding, "_core_bpe", None) if isinstance(encoding, Encoding) else None
    found = getattr(core, "encode_ordinary", None)
    encode: Callable[[str], list[int]] = found if callable(found) else method

    def counts(texts: list[str]) -> list[int]:
        return list(map(len, map(encode, texts)))

    return TokenLengths(
        lambda text: len(encode(text)), counts, lambda text: len(method(text)), tokenizer
    )


_lock = threading.Lock()
_o200k_base: TokenLengths | None = None


def o200k_base_lengths() -> TokenLengths:
    """o200k_base's ``TokenLengths``: bpe-openai's when it is installed, else tiktoken's.

    Made once per process, on first use.

    Raises:
        TokenizerDataError: bpe-openai is not installed and the vocabulary
            shipped with threadline is missing or damaged.
    """
    global _o200k_base
    found = _o200k_base
    if found is None:
        with _lock:
            found = _o200k_base
            if found is None:
                found = _bpe_openai() or token_lengths_of(o200k_base_encoding(), "tiktoken")
                _o200k_base = found
    return found


def _bpe_openai() -> TokenLengths | None:
    """bpe-openai's o200k_base, or ``None`` when it is not installed or does not load."""
    try:
        bindings = _bpe_openai_bindings()
        if bindings is None:
            return None
        tokenizer = bindings.tokenizer_for_encoding("o200k_base")
        count: Count = tokenizer.count
        # 5 tokens in o200k_base, 6 in cl100k_base: a cheap check of the vocabulary.
        if count("I'm sure THEY'LL") != 5:
            raise ValueError("its o200k_base does not count as tiktoken's")
    except Exception as exc:  # tiktoken counts the same, just slower
        _log.warning("bpe-openai is installed but unusable (%s); counting with tiktoken", exc)
        return None

    def counts(texts: list[str]) -> list[int]:
        return list(map(count, texts))

    return TokenLengths(count, counts, lambda text: count(repair_surrogates(text)), "bpe-openai")


_BINDINGS = "bpe_openai._bindings"


def _bpe_openai_bindings() -> Any:
    """The Rust extension inside bpe-openai, loaded without the package around it,
    or ``None`` when bpe-openai is not installed.

    The package's ``__init__`` builds Python tables of every vocabulary it
    knows (~0.7 s, and a ``DeprecationWarning``) for its tiktoken-like wrapper,
    which the counter does not use: it calls the extension's ``count``. The
    extension is registered under its own name, so a later ``import bpe_openai``
    finds it instead of initializing it twice.

    Raises:
        ImportError: bpe-openai is installed but its extension is missing or
            does not load (any error of loading it propagates).
    """
    loaded = sys.modules.get(_BINDINGS)
    if loaded is not None:
        return loaded
    import importlib.machinery  # at the first count, not at threadline's import
    import importlib.util
    import os

    package = importlib.util.find_spec("bpe_openai")  # found, not run
    if package is None or not package.submodule_search_locations:
        return None
    paths = (
        os.path.join(folder, "_bindings" + suffix)
        for folder in package.submodule_search_locations
        for suffix in importlib.machinery.EXTENSION_SUFFIXES
    )
    path = next((path for path in paths if os.path.isfile(path)), None)
    if path is None:
        raise ImportError(f"bpe-openai is installed without its {_BINDINGS} extension")
    loader = importlib.machinery.ExtensionFileLoader(_BINDINGS, path)
    module = importlib.util.module_from_spec(
        importlib.machinery.ModuleSpec(_BINDINGS, loader, origin=path)
    )
    loader.exec_module(module)
    return sys.modules.setdefault(_BINDINGS, module)
