"""The o200k_base encoding, built from the vocabulary shipped inside the package.

tiktoken normally downloads a vocabulary the first time it is asked for one
and keeps it in a cache directory. threadline promises to count offline, so it
never calls ``tiktoken.get_encoding``: it reads
``counting/_data/o200k_base.tiktoken.gz``, checks the sha256 of the
decompressed bytes against the hash tiktoken itself pins for o200k_base, and
builds the ``tiktoken.Encoding`` from it. Neither the network nor
``TIKTOKEN_CACHE_DIR`` is touched.

The load happens on first use (importing threadline stays cheap), once per
process, under a lock so concurrent first counts build it once. A failed load
is not remembered: the next call tries again and raises again.
"""

from __future__ import annotations

import base64
import binascii
import gzip
import hashlib
import threading
import zlib
from typing import TYPE_CHECKING, Protocol

from threadline._errors import TokenizerDataError

if TYPE_CHECKING:
    # Imported when the vocabulary is first loaded: tiktoken costs ~40 ms at import.
    import tiktoken

__all__ = ["O200K_BASE_SHA256", "TextEncoder", "o200k_base_encoding"]

O200K_BASE_SHA256 = "446a9538cb6c348e3516120d7c08b09f57c36495e2acfffe59a5bf8b0cfb1a2d"
"""sha256 of the decompressed vocabulary: the hash tiktoken pins for o200k_base."""

_VOCABULARY_FILE = "o200k_base.tiktoken.gz"

# The pre-tokenizer of o200k_base, one alternative per line: a word in mixed
# or lower case with an optional English contraction; a word in upper case
# with the same; up to three digits; a run of punctuation (with trailing line
# breaks or slashes); line breaks with the blanks before them; blanks not
# followed by text; any other blanks. It must match tiktoken's definition
# character for character; tests/test_counting_encoding.py compares the two.
_O200K_PATTERN = "|".join(
    [
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
        r"""\p{N}{1,3}""",
        r""" ?[^\s\p{L}\p{N}]+[\r\n/]*""",
        r"""\s*[\r\n]+""",
        r"""\s+(?!\S)""",
        r"""\s+""",
    ]
)

_O200K_SPECIAL_TOKENS = {"<|endoftext|>": 199999, "<|endofprompt|>": 200018}


class TextEncoder(Protocol):
    """The one method of ``tiktoken.Encoding`` the built-in counter uses."""

    def encode_ordinary(self, text: str) -> list[int]:
        """Token ids of ``text``, special-token markers treated as plain text."""
        ...


_lock = threading.Lock()
_encoding: tiktoken.Encoding | None = None


def o200k_base_encoding() -> tiktoken.Encoding:
    """The o200k_base ``tiktoken.Encoding``, loaded from the shipped vocabulary.

    The first call reads and checks the file (a fraction of a second); later
    calls return the same object.

    Raises:
        TokenizerDataError: the shipped vocabulary is missing or damaged
            (reinstalling threadline restores it).
    """
    encoding = _encoding
    if encoding is not None:
        return encoding
    return _load_once()


def _load_once() -> tiktoken.Encoding:
    global _encoding
    with _lock:
        if _encoding is None:
            from importlib import resources  # only when the vocabulary is loaded

            source = resources.files("threadline.counting") / "_data" / _VOCABULARY_FILE
            try:
                compressed = source.read_bytes()
            except OSError as exc:
                raise TokenizerDataError(
                    f"the tokenizer vocabulary {_VOCABULARY_FILE} is missing from the "
                    f"threadline package ({exc}); reinstall threadline"
                ) from exc
            _encoding = build_o200k_base(compressed)
        return _encoding


def build_o200k_base(compressed: bytes) -> tiktoken.Encoding:
    """Build o200k_base from the gzipped vocabulary ``compressed``, checking its hash.

    Raises:
        TokenizerDataError: the bytes are not the o200k_base vocabulary.
    """
    try:
        contents = gzip.decompress(compressed)
    except (OSError, EOFError, zlib.error) as exc:
        raise _damaged(f"it is not a readable gzip file ({exc})") from exc
    digest = hashlib.sha256(contents).hexdigest()
    if digest != O200K_BASE_SHA256:
        raise _damaged(f"its sha256 is {digest}, expected {O200K_BASE_SHA256}")
    import tiktoken

    return tiktoken.Encoding(
        name="o200k_base",
        pat_str=_O200K_PATTERN,
        mergeable_ranks=_parse_ranks(contents),
        special_tokens=dict(_O200K_SPECIAL_TOKENS),
    )


def _parse_ranks(contents: bytes) -> dict[bytes, int]:
    # One "<base64 token> <rank>" pair per line. The hash already vouches for
    # the content, so a failure here means a bug, but it still gets a clear error.
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(contents.splitlines(), start=1):
        if not line:
            continue
        try:
            token, rank = line.split()
            ranks[base64.b64decode(token, validate=True)] = int(rank)
        except (ValueError, binascii.Error) as exc:
            raise _damaged(f"line {number} is not '<base64 token> <rank>'") from exc
    return ranks


def _damaged(reason: str) -> TokenizerDataError:
    return TokenizerDataError(
        f"the tokenizer vocabulary {_VOCABULARY_FILE} shipped with threadline is damaged: "
        f"{reason}; reinstall threadline"
    )
