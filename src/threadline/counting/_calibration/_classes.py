"""The classes of a message's tokens that calibration prices apart.

Two tokenizers agree on some text and not on other: o200k_base and SmolLM2's
spend about the same on English and code and part threefold on Russian, and
each vocabulary has scripts it covers well and scripts it spells byte by
byte (Llama 3 spends 2.5 tokens per o200k token on Hebrew and 1.2 on
Arabic; Qwen 2.5 the other way round on Hindi and Hebrew). So a calibration
that learns one number per model, or one for every script outside a few,
prices the window right only while its mixture of scripts holds still.
:func:`message_classes` splits a message's estimate into classes, each of
which calibration learns a ratio of its own for (see ``_slopes``):

- the scripts (:data:`SCRIPTS`): the o200k tokens of the message's text (its
  content and ``name``), run by run of one script: ``latin``, ``cyrillic``,
  ``greek``, ``cjk`` (Chinese characters, kana, full-width punctuation),
  ``hangul``, ``arabic``, ``hebrew``, ``indic`` (Devanagari and the other
  Brahmic scripts of India), ``thai`` (Thai, Lao, Khmer, Myanmar),
  ``emoji`` (pictographs and other symbols), ``digits`` (numbers, with the
  punctuation between them: dates, prices, CSV and JSON values) and
  ``other`` (every other script). Spaces and punctuation belong to the run
  they sit in;
- ``tool_result``: a tool result's text (its o200k tokens, whatever its
  script). A result's text costs what its scripts cost, times how much of it
  the template shows (most all of it, some none): the count keeps the text of
  results by script apart (after the classes), and calibration learns that
  factor as the ``tool_result`` slope;
- ``tool``: a tool call's id, name and arguments and a tool result's
  ``tool_call_id``, with the estimate's framing of each (7 tokens a call, 4
  a result);
- ``framing``: the rest of the counter's estimate of the message (its fixed
  overhead, images, replayed reasoning), never below 0;
- ``system_dropped``: no message's, a prompt's (:func:`transcript_classes`):
  minus the estimate of its system messages when a tool result ends it, as
  a template may leave them out of such a prompt (:func:`dropped_system`).

The split is computed only when a client calibrates, and once per message
value (a bounded cache keyed by the message, its origin aside). It is
deterministic and safe to use from several threads.
"""

from __future__ import annotations

import re
import threading
import unicodedata
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Final

from threadline._messages import ImagePart, Message, Role
from threadline.counting._anchored import message_key
from threadline.counting._framing import TOOL_CALL_TOKENS, TOOL_RESULT_TOKENS
from threadline.counting._lengths import o200k_base_lengths
from threadline.counting._protocol import is_incremental

if TYPE_CHECKING:
    from threadline.counting._protocol import TokenCounter

__all__ = [
    "CLASSES",
    "SCRIPTS",
    "ClassCounts",
    "classify_text",
    "dropped_system",
    "message_classes",
    "reply_classes",
    "transcript_classes",
]

SCRIPTS: Final = (
    "latin",
    "cyrillic",
    "greek",
    "cjk",
    "hangul",
    "arabic",
    "hebrew",
    "indic",
    "thai",
    "emoji",
    "digits",
    "other",
)
"""The classes of text by script, in the order :func:`classify_text` numbers them."""

CLASSES: Final = ("framing", "tool", "tool_result", "system_dropped", *SCRIPTS)
"""Every class, in the order a :data:`ClassCounts` holds them."""

ClassCounts = tuple[int, ...]
"""A count per class of :data:`CLASSES`, then the tool results' text by script (of
:data:`SCRIPTS`): how a template renders a result is its own (the ``tool_result``
slope), but what its text costs is its script's."""

_FRAMING, _TOOL, _TOOL_RESULT, _DROPPED = 0, 1, 2, 3
_FIRST_SCRIPT = 4
_CACHE_SIZE = 32_768

# Code point ranges of each script class but Latin (ASCII letters, Latin-1 and the
# Latin Extended blocks), Cyrillic and digits, which are found by other means: (first,
# last, index into SCRIPTS), sorted.
_RANGES: Final = (
    (0x0370, 0x03FF, 2),  # Greek and Coptic
    (0x0400, 0x052F, 1),  # Cyrillic
    (0x0590, 0x05FF, 6),  # Hebrew
    (0x0600, 0x06FF, 5),  # Arabic
    (0x0750, 0x077F, 5),
    (0x0870, 0x08FF, 5),
    (0x0900, 0x0DFF, 7),  # Devanagari to Sinhala
    (0x0E00, 0x0EFF, 8),  # Thai, Lao
    (0x1000, 0x109F, 8),  # Myanmar
    (0x1100, 0x11FF, 4),  # Hangul Jamo
    (0x1780, 0x17FF, 8),  # Khmer
    (0x1C80, 0x1C8F, 1),
    (0x1F00, 0x1FFF, 2),  # Greek Extended
    (0x2DE0, 0x2DFF, 1),
    (0x2E80, 0x312F, 3),  # CJK radicals, punctuation, kana, bopomofo
    (0x3130, 0x318F, 4),  # Hangul compatibility Jamo
    (0x3190, 0x9FFF, 3),  # CJK
    (0xA640, 0xA69F, 1),
    (0xA960, 0xA97F, 4),
    (0xAC00, 0xD7FF, 4),  # Hangul syllables
    (0xF900, 0xFAFF, 3),
    (0xFB1D, 0xFB4F, 6),
    (0xFB50, 0xFDFF, 5),
    (0xFE70, 0xFEFF, 5),
    (0xFF00, 0xFFEF, 3),  # full-width forms
    (0x1F000, 0x1FAFF, 9),  # emoji and pictographs
    (0x20000, 0x3FFFF, 3),
)
_LATIN, _EMOJI, _DIGITS, _OTHER = 0, 9, 10, 11
_DIGIT = re.compile(r"[0-9]")


def _script_of(char: str) -> int | None:
    """The script class (an index into :data:`SCRIPTS`) of a character; ``None`` for one
    that takes its neighbours' class (spaces, punctuation, marks)."""
    code = ord(char)
    if code < 0x80:
        if char.isalpha():
            return _LATIN
        return _DIGITS if char.isdigit() else None
    for first, last, script in _RANGES:
        if code < first:
            break
        if code <= last:
            return script
    category = unicodedata.category(char)
    if category == "So" or 0x2600 <= code <= 0x27BF:
        return _EMOJI
    if category == "Nd":
        return _DIGITS
    if not category.startswith("L"):
        return None
    return _LATIN if code < 0x0250 or 0x1E00 <= code <= 0x1EFF else _OTHER


def classify_text(text: str) -> list[tuple[int, str]]:
    """``text`` as runs of one script: ``(index into SCRIPTS, run)``. Characters of
    no script join the run they follow (or, at the start, the first run)."""
    if not text:
        return []
    if text.isascii() and _DIGIT.search(text) is None:
        return [(_LATIN, text)]
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
    runs.append((_LATIN if current is None else current, text[start:]))
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
        counts = [0] * (len(CLASSES) + len(SCRIPTS))
        texts = [message.content] if isinstance(message.content, str) else []
        if not isinstance(message.content, str):
            texts += [p.text for p in message.content if not isinstance(p, ImagePart)]
        if message.name:
            texts.append(message.name)
        for text in texts:
            result = message.role is Role.TOOL
            for script, run in classify_text(text):
                tokens = self._tokens(run)
                if result:
                    counts[_TOOL_RESULT] += tokens
                    counts[len(CLASSES) + script] += tokens
                else:
                    counts[_FIRST_SCRIPT + script] += tokens
        tool = [call.id + call.name + call.arguments for call in message.tool_calls]
        fixed = TOOL_CALL_TOKENS * len(message.tool_calls)
        if message.tool_call_id is not None:
            tool.append(message.tool_call_id)
            fixed += TOOL_RESULT_TOKENS
        counts[_TOOL] = sum(map(self._tokens, tool)) + fixed
        counts[_FRAMING] = max(0, estimated - sum(counts[: len(CLASSES)]))
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
    """The class counts of ``messages``, summed, with the prompt's ``system_dropped``."""
    totals = [0] * (len(CLASSES) + len(SCRIPTS))
    for message in messages:
        for index, value in enumerate(message_classes(counter, message)):
            totals[index] += value
    totals[_DROPPED] = -dropped_system(counter, messages)
    return tuple(totals)


def reply_classes(counter: TokenCounter, message: Message) -> ClassCounts | None:
    """The text classes of a reply of text alone (its framing and the rest 0), or
    ``None`` for one whose output tokens hold more than its text (tool calls,
    reasoning, an image) or whose text the model did not write all of (a ``name``)."""
    if message.role is not Role.ASSISTANT or message.tool_calls or message.reasoning is not None:
        return None
    if message.name is not None:
        return None
    if not isinstance(message.content, str) and any(
        isinstance(p, ImagePart) for p in message.content
    ):
        return None
    counts = list(message_classes(counter, message))
    counts[:_FIRST_SCRIPT] = [0] * _FIRST_SCRIPT
    return tuple(counts)


def dropped_system(counter: TokenCounter, messages: Sequence[Message]) -> int:
    """The estimate of the system messages a template may leave out of ``messages``:
    those of a prompt a tool result ends (Mistral's puts them in the last user message,
    and such a prompt has none after its results); 0 for any other prompt."""
    if not messages or messages[-1].role is not Role.TOOL:
        return 0
    return sum(_estimated(counter, m) for m in messages if m.role is Role.SYSTEM)
