"""Where the built-in counter keeps message and tool costs.

A message's cost lives on the message itself, in a slot ``Message`` keeps for
it (``_CostCache``); tools, reasoning messages and messages priced with a
user's own encoding first are kept in bounded maps (``_Generations``).
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Hashable, Iterable, Sequence
from itertools import count, repeat
from operator import attrgetter
from typing import Any

from threadline._messages import Message

__all__ = ["NO_COST", "CostCache", "is_cost", "is_no_cost", "marks_of"]


class _Generations:
    """A bounded map in two generations, approximating least-recently-used eviction.

    New entries go into ``recent``; when it holds half the capacity it becomes
    ``previous`` and the old ``previous`` is dropped; a hit in ``previous`` is
    copied back into ``recent``. So it never holds more than ``capacity``
    entries, and an entry used within the last ``capacity / 2`` insertions
    survives, with no bookkeeping on a hit.

    Reads take no lock (a dict read is atomic, and reading a generation that
    was just retired is harmless); writes take one, so a generation switch
    never loses a concurrent insertion's dictionary.
    """

    def __init__(self, capacity: int) -> None:
        self.generation_size = max(1, capacity // 2)
        self.recent: dict[Hashable, Any] = {}
        self.previous: dict[Hashable, Any] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> Any:
        value = self.recent.get(key)
        if value is None:
            value = self.previous.get(key)
            if value is not None:
                self.put(key, value)
        return value

    def put(self, key: Hashable, value: Any) -> None:
        with self._lock:
            recent = self.recent
            if len(recent) >= self.generation_size:
                self.previous = recent
                self.recent = recent = {}
            recent[key] = value

    def put_many(self, items: Iterable[tuple[Hashable, Any]], size: int) -> None:
        """Store ``size`` entries under one acquisition of the lock (a cold count's misses)."""
        with self._lock:
            recent = self.recent
            if len(recent) + size <= self.generation_size:
                recent.update(items)
                return
            for key, value in items:
                if len(recent) >= self.generation_size:
                    self.previous = recent
                    self.recent = recent = {}
                recent[key] = value

    def __len__(self) -> int:
        return len(self.recent) + len(self.previous)


# A message's cost is written on the message itself, in the slot Message keeps for it,
# as one int: the writing cache's base (its tag above the cost's bits) plus the cost.
# The tag names what the cost was priced with: 0 for o200k_base, shared by every
# counter that tokenizes with it (a message's cost is the same for all of them, so
# its slot holds the bare cost), a tag of its own for a counter given an ``encoding``.
# One int is written at once, so a reader never sees one tag with another's cost.
# Every cost is at least MESSAGE_TOKENS, so a value of 0 or less means "no cost yet":
# 0 for a message Message found to be plain text when it was built (content a str, no
# name, tool call, tool call id or reasoning), -1 for any other. A slot is never
# cleared: a message that carries no cost was priced by no counter's cache, which is
# what lets a cold count skip every other lookup, and plain ones need no more reading.
_SLOT = "_count_cost"
_COST_BITS = 40
_COST_MASK = (1 << _COST_BITS) - 1
_encoding_tags = count(1)
_write_slot = getattr(Message, _SLOT).__set__  # the slot's own setter: no lookup by name


NO_COST = -1
"""What an unset slot reads as: no cost yet, shape unknown."""
_mark_of = attrgetter(_SLOT)
is_cost = (0).__lt__
is_no_cost = (0).__ge__


def marks_of(messages: Sequence[Message]) -> list[int]:
    """What each message's cost slot holds (0 or less: nothing yet), read in C."""
    try:
        return list(map(_mark_of, messages))
    except AttributeError:  # a message made without __init__ (unpickled): its slot is unset
        return list(map(getattr, messages, repeat(_SLOT), repeat(NO_COST)))


class CostCache:
    """Token costs: plain messages on the message (a slot of its own) or, for a message
    priced with another encoding first, by identity; everything else by value.

    A message's cost is looked up under ``id(message)``, which is a C call,
    where hashing an attrs message is a Python call over every field (it was
    the largest cost of a cold count). The entry holds a weak reference to
    the message, so the cache keeps no message alive (a dead copy is not held
    until eviction), and a hit checks that the reference still leads to the
    very same object, so a reused id is never taken for another message's.
    Tools and reasoning messages (whose cost depends on the projection) are
    keyed by value in ``by_value``. Equal texts inside one batch are tokenized
    once (``counting._builtin``).
    """

    def __init__(self, capacity: int, *, own_encoding: bool) -> None:
        self.by_id = _Generations(capacity)
        self.by_value = _Generations(capacity)
        self.base = next(_encoding_tags) << _COST_BITS if own_encoding else 0
        """A cost this cache wrote on a message reads ``base + cost``."""
        self.top = self.base + _COST_MASK
        """The largest slot value that is one of this cache's costs."""

    def message_cost(self, message: Message) -> int | None:
        packed: int = getattr(message, _SLOT, NO_COST)
        if self.base < packed <= self.top:
            return packed - self.base
        return self.by_identity(message) if packed > 0 else None

    def by_identity(self, message: Message) -> int | None:
        """The cost kept for ``message``, which another cache priced first."""
        entry = self.by_id.get(id(message))
        if entry is not None and entry[0]() is message:
            cost: int = entry[1]
            return cost
        return None

    def write(self, messages: Iterable[Message], packed: Iterable[int]) -> None:
        """Write ``packed`` costs (``base + cost``) on messages that carry none, in C."""
        deque(map(_write_slot, messages, packed), maxlen=0)

    def put_messages(self, messages: Sequence[Message], costs: Sequence[int]) -> None:
        """Remember ``costs``; a message priced with another encoding keeps that cost
        on it, and this cache keeps its own by identity."""
        base, top = self.base, self.top
        spilled: list[tuple[Message, int]] = []
        for message, cost in zip(messages, costs, strict=True):
            packed = getattr(message, _SLOT, NO_COST)
            if packed <= 0 or base < packed <= top:
                _write_slot(message, base + cost)
            else:
                spilled.append((message, cost))  # priced with another encoding: kept here
        if spilled:
            entries = ((id(m), (weakref.ref(m), cost)) for m, cost in spilled)
            self.by_id.put_many(entries, len(spilled))

    def get(self, key: Hashable) -> int | None:
        cost: int | None = self.by_value.get(key)
        return cost

    def put(self, key: Hashable, cost: int) -> None:
        self.by_value.put(key, cost)

    def __len__(self) -> int:
        return len(self.by_id) + len(self.by_value)
