"""What a transcript keeps of each event beside its message, packed in bytes.

A conversation of hours holds thousands of events. As objects, each would
cost a ``ConversationEvent`` and a ``Usage`` (well over a hundred bytes)
beside the message itself; packed, a user message costs a byte and a reply
about eight. :class:`PackedEvents` appends each event's turn id, usage,
model and finish reason to one ``bytearray`` as variable-length integers
(LEB128, zigzag for the sign) and reads them back in order, which is how
events are rebuilt (``Transcript.events``).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

from threadline._messages import Usage
from threadline.serialization._documents import ConversationEvent

__all__ = ["Packed", "PackedEvents"]

# The flags of an event, in the low bits of its first number (the turn id's step).
_USAGE = 1
_MODEL = 2  # a model is named: the last one again, or (with _NEW_MODEL) the next label
_NEW_MODEL = 4
_FINISH = 8
_NEW_FINISH = 16
_FLAG_BITS = 5

Packed = tuple[int, Usage | None, str | None, str | None]
"""One event's turn id, usage, model and finish reason."""


def _put(out: bytearray, value: int) -> None:
    """``value`` (any int) appended as zigzag LEB128: seven bits a byte, low first."""
    value = value << 1 if value >= 0 else (-value << 1) - 1
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)


def _numbers(data: bytearray) -> Iterator[int]:
    """The ints :func:`_put` appended to ``data``, in order."""
    value = shift = 0
    for byte in data:
        value |= (byte & 0x7F) << shift
        if byte & 0x80:
            shift += 7
            continue
        yield value >> 1 if not value & 1 else -((value + 1) >> 1)
        value = shift = 0


class PackedEvents:
    """Each event's turn id, usage, model and finish reason, appended in order.

    A model or finish reason equal to the last one named is not stored again;
    a new one is kept in ``labels``, whose length is the number of distinct
    runs of names (one or two for a conversation with one model).
    """

    __slots__ = ("_data", "_labels", "_last_finish", "_last_model", "_last_turn")

    def __init__(self) -> None:
        self._data = bytearray()
        self._labels: list[str] = []
        self._last_turn = 0
        self._last_model: str | None = None
        self._last_finish: str | None = None

    @property
    def last_turn(self) -> int:
        """The turn id of the last event appended (0 before the first)."""
        return self._last_turn

    def append(self, event: ConversationEvent) -> None:
        """Keep what ``event`` holds beside its message."""
        flags, usage = 0, event.usage
        if usage is not None:
            flags |= _USAGE
        model, finish = event.model, event.finish_reason
        if model is not None:
            flags |= _MODEL if model == self._last_model else _MODEL | _NEW_MODEL
        if finish is not None:
            flags |= _FINISH if finish == self._last_finish else _FINISH | _NEW_FINISH
        step = event.turn_id - self._last_turn
        self._last_turn = event.turn_id
        data = self._data
        _put(data, step << _FLAG_BITS | flags)  # a step back is negative: its flags read alike
        if usage is not None:
            for count in (
                usage.input_tokens,
                usage.output_tokens,
                usage.cached_input_tokens,
                usage.reasoning_tokens,
            ):
                _put(data, count)
        # Interned: every conversation with a model names it, and finish reasons are
        # few; one string each for all of them, not one per conversation.
        if flags & _NEW_MODEL:
            self._last_model = model = sys.intern(model)  # type: ignore[arg-type]  # flagged
            self._labels.append(model)
        if flags & _NEW_FINISH:
            self._last_finish = finish = sys.intern(finish)  # type: ignore[arg-type]
            self._labels.append(finish)

    def __iter__(self) -> Iterator[Packed]:
        """Each event's fields, in the order they were appended."""
        numbers, labels = _numbers(self._data), iter(self._labels)
        turn, model, finish = 0, None, None
        for head in numbers:
            flags = head & ((1 << _FLAG_BITS) - 1)
            turn += head >> _FLAG_BITS
            usage = None
            if flags & _USAGE:
                usage = Usage(
                    input_tokens=next(numbers),
                    output_tokens=next(numbers),
                    cached_input_tokens=next(numbers),
                    reasoning_tokens=next(numbers),
                )
            if flags & _NEW_MODEL:
                model = next(labels)
            if flags & _NEW_FINISH:
                finish = next(labels)
            yield (
                turn,
                usage,
                model if flags & _MODEL else None,
                finish if flags & _FINISH else None,
            )
