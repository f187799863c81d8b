"""The classes of a message's tokens that calibration prices apart.

Two tokenizers agree on some text and not on other: o200k_base and SmolLM2's
spend about the same on English and code and part threefold on Russian. So a
calibration that learns one number per model prices the window right only
while its mixture of scripts holds still. :func:`message_classes` splits a
message's estimate into classes, each of which calibration learns a ratio of
its own for (see ``_slopes``):

- ``latin``, ``cyrillic``, ``cjk``, ``other``: the o200k tokens of the
  message's text (its content and ``name``), run by run of one script;
  digits, spaces and punctuation belong to the run they sit in;
- ``tool``: a tool call's id, name and arguments and a tool result's
  ``tool_call_id``, with the estimate's framing of each (7 tokens a call, 4
  a result), which chat templates render each in their own way (some in
  full, some not at all);
- ``framing``: the rest of the counter's estimate of the message (its fixed
  overhead, images, replayed reasoning), never below 0.

The split is computed only when a client calibrates, and once per message
value (a bounded cache keyed by the message, its origin aside). It is
deterministic and safe to use from several threads.
"""

from __future__ import annotations

import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from threadline._messages import ImagePart, Message
from threadline.counting._anchored import message_key
from threadline.counting._framing import TOOL_CALL_TOKENS, TOOL_RESULT_TOKENS
from threadline.counting._lengths import o200k_base_lengths
from threadline.counting._protocol import is_incremental

if TYPE_CHECKING:
    from threadline.counting._protocol import TokenCounter

__all__ = ["CLASSES", "ClassCounts", "classify_text", "message_classes", "transcript_classes"]

CLASSES = ("framing", "tool", "latin", "cyrillic", "cjk", "other")
"""Every class, in the order a :data:`ClassCounts` holds them."""

ClassCounts = tuple[int, ...]
"""A count per class of :data:`CLASSES`."""

_SCRIPTS = CLASSES[2:]
_FRAMING, _TOOL = 0, 1
_CACHE_SIZE = 32_768


def _script_of(char: str) -> int | None:
    """The script class (an index into ``_SCRIPTS``) of a letter; ``None`` for a
    character that takes its neighbours' class (digits, spaces, punctuation, symbols)."""
    code = ord(char)
    if code < 0x80:
        return 0 if char.isalpha() else None
    if (
        0x0400 <= code <= 0x052F
        or 0x1C80 <= code <= 0x1C8F
        or 0x2DE0 <= code <= 0x2DFF
        or 0xA640 <= code <= 0xA69F
    ):
        return 1
    wide = _wide(code)
    if wide is not None:
        return wide
    if not unicodedata.category(char).startswith("L"):
        return None
    return 0 if code < 0x0250 or 0x1E00 <= code <= 0x1EFF else 3


def _wide(code: int) -> int | None:
    """``2`` for Chinese, Japanese and Korean characters and their full-width punctuation."""
    if (
        0x2E80 <= code <= 0x9FFF
        or 0xAC00 <= code <= 0xD7AF
        or 0xF900 <= code <= 0xFAFF
        or 0xFF00 <= code <= 0xFFEF
        or 0x20000 <= code <= 0x3FFFF
    ):
        return 2
    return None


def classify_text(text: str) -> list[tuple[int, str]]:
    """``text`` as runs of one script: ``(index into the script classes, run)``.
    Characters of no script join the run they follow (or, at the start, the first run)."""
    if text.isascii():
        return [(0, text)] if text else []
    runs: list[tuple[int, str]] = []
    current: int | None = None
    start = 0
    for at, char in enumerate(text):
        script = _script_of(char)
        if script is None or script == current:
            continue
        if current is not None:
            runs.append((current, text[start:at]))
            start = at
        current = script
    runs.append((0 if current is None else current, text[start:]))
    return runs


class _Splitter:
    """The class counts of messages, cached by message value."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[Message, int], ClassCounts] = OrderedDict()
        self._count: Callable[[str], int] | None = None

    def _tokens(self, text: str) -> int:
        count = self._count
        if count is None:
            count = self._count = o200k_base_lengths().safe_count
        return count(text) if text else 0

    def split(self, message: Message, estimated: int) -> ClassCounts:
        # The framing class depends on the counter's estimate: it is part of the key.
        key = (message_key(message), estimated)
        with self._lock:
            found = self._cache.get(key)
            if found is not None:
                self._cache.move_to_end(key)
                return found
        counts = self._compute(message, estimated)
        with self._lock:
            self._cache[key] = counts
            if len(self._cache) > _CACHE_SIZE:
                self._cache.popitem(last=False)
        return counts

    def _compute(self, message: Message, estimated: int) -> ClassCounts:
        counts = [0] * len(CLASSES)
        texts = [message.content] if isinstance(message.content, str) else []
        if not isinstance(message.content, str):
            texts += [p.text for p in message.content if not isinstance(p, ImagePart)]
        if message.name:
            texts.append(message.name)
        for text in texts:
            for script, run in classify_text(text):
                counts[2 + script] += self._tokens(run)
        tool = [call.id + call.name + call.arguments for call in message.tool_calls]
        fixed = TOOL_CALL_TOKENS * len(message.tool_calls)
        if message.tool_call_id is not None:
            tool.append(message.tool_call_id)
            fixed += TOOL_RESULT_TOKENS
        counts[_TOOL] = sum(map(self._tokens, tool)) + fixed
        counts[_FRAMING] = max(0, estimated - sum(counts))
        return tuple(counts)


_SPLITTER = _Splitter()


def _estimated(counter: TokenCounter, message: Message) -> int:
    if is_incremental(counter):
        return counter.message_tokens(message)
    return counter.count([message], ()) - counter.count([], ())


def message_classes(counter: TokenCounter, message: Message) -> ClassCounts:
    """``message``'s tokens by class (see the module docstring); the framing class is
    what ``counter``'s estimate of it holds beside its text and tool tokens."""
    return _SPLITTER.split(message, _estimated(counter, message))


def transcript_classes(counter: TokenCounter, messages: Sequence[Message]) -> ClassCounts:
    """The class counts of ``messages``, summed."""
    totals = [0] * len(CLASSES)
    for message in messages:
        for index, value in enumerate(message_classes(counter, message)):
            totals[index] += value
    return tuple(totals)
