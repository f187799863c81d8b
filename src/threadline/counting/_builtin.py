"""``BuiltinTokenCounter``: o200k_base tokens plus deterministic framing, counted once.

The count of a transcript is the sum of its messages' costs plus an overhead
for the reply and the tool schemas (``IncrementalTokenCounter``):

- a message costs ``MESSAGE_TOKENS`` (4) plus the o200k tokens of its text
  parts, a fixed amount per image (85 at low detail, else 765), its ``name``
  (tokens + 1), each tool call (7 + tokens of id, name and arguments), for a
  tool result 4 + the tokens of ``tool_call_id``, and the reasoning pieces the
  replay projection says go back to the model;
- the overhead is 3 for the reply, and when tools are declared 13 for the
  tools section plus, per tool, 13 + the tokens of its name, description and
  JSON schema.

Where each number comes from is in ``threadline.counting._framing`` and
docs/counting.md.

Messages are immutable, so a message's cost is computed once and kept in a
bounded cache shared by a counter and the counters derived from it
(``with_projection``, ``for_model``). Equal messages share an entry, so equal
content is not tokenized twice; counting a transcript again after appending
one message tokenizes only that message. The last transcript counted is kept
too, so one that only grew at its end is summed from the new messages alone.
"""

from __future__ import annotations

import json
import threading
import weakref
from collections import deque
from collections.abc import Callable, Hashable, Iterable, Sequence
from itertools import accumulate, compress, count, islice, repeat
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from operator import add, and_, attrgetter, is_, is_not, itemgetter, not_, sub
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from threadline._messages import Content, ImagePart, Message, Reasoning, ToolCall
from threadline._validate import positive_int
from threadline.counting._encoding import TextEncoder, o200k_base_encoding
from threadline.counting._framing import (
    MESSAGE_TOKENS,
    NAME_TOKENS,
    REPLY_TOKENS,
    TOOL_CALL_TOKENS,
    TOOL_RESULT_TOKENS,
    TOOL_SCHEMA_TOKENS,
    TOOLS_SECTION_TOKENS,
    image_tokens,
)
from threadline.counting._projection import DefaultReplayProjection
from threadline.tools._tools import Tool

if TYPE_CHECKING:
    from threadline._models import Model
    from threadline.counting._protocol import ReplayProjection

__all__ = ["DEFAULT_CACHE_SIZE", "BuiltinTokenCounter"]

DEFAULT_CACHE_SIZE = 32_768
"""How many message (and tool) costs a built-in counter keeps by default."""

_DEFAULT_PROJECTION = DefaultReplayProjection()

# What a message's cost depends on besides its content, read in one C call per message;
# a plain text message (the commonest) has exactly ``_PLAIN``.
_Extras: TypeAlias = "tuple[tuple[ToolCall, ...], str | None, str | None, Reasoning | None]"
_content_of = attrgetter("content")
_extras_of = attrgetter("tool_calls", "tool_call_id", "name", "reasoning")
_PLAIN: _Extras = ((), None, None, None)
_call_texts = attrgetter("id", "name", "arguments")
_reasoning_in = itemgetter(3)
_reasoning_of = attrgetter("reasoning")


def _gather(
    shapes: Iterable[tuple[Content, _Extras]], texts: list[str]
) -> tuple[list[int], list[int]]:
    """Append the texts of each message, given as its content and extras (reasoning
    aside), to ``texts``; return each one's fixed cost and where its texts end."""
    fixed_costs: list[int] = []
    ends: list[int] = []
    add_fixed, add_end, add_text, add_texts = (
        fixed_costs.append,
        ends.append,
        texts.append,
        texts.extend,
    )
    for content, (calls, call_id, name, _) in shapes:
        fixed = MESSAGE_TOKENS
        if isinstance(content, str):
            if content:
                add_text(content)
        else:
            for part in content:
                if isinstance(part, ImagePart):
                    fixed += image_tokens(part)
                else:
                    add_text(part.text)
        if name:
            fixed += NAME_TOKENS
            add_text(name)
        if call_id is not None:
            fixed += TOOL_RESULT_TOKENS
            add_text(call_id)
        for call in calls:
            fixed += TOOL_CALL_TOKENS
            add_texts(_call_texts(call))
        add_fixed(fixed)
        add_end(len(texts))
    return fixed_costs, ends


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


_NO_COST = -1
"""What an unset slot reads as: no cost yet, shape unknown."""
_mark_of = attrgetter(_SLOT)
_is_cost = (0).__lt__
_is_no_cost = (0).__ge__


def marks_of(messages: Sequence[Message]) -> list[int]:
    """What each message's cost slot holds (0 or less: nothing yet), read in C."""
    try:
        return list(map(_mark_of, messages))
    except AttributeError:  # a message made without __init__ (unpickled): its slot is unset
        return list(map(getattr, messages, repeat(_SLOT), repeat(_NO_COST)))


class _CostCache:
    """Token costs: plain messages on the message (a slot of its own) or, for a message
    priced with another encoding first, by identity; everything else by value.

    A message's cost is looked up under ``id(message)``, which is a C call,
    where hashing an attrs message is a Python call over every field (it was
    the largest cost of a cold count). The entry holds a weak reference to
    the message, so the cache keeps no message alive (a dead copy is not held
    until eviction), and a hit checks that the reference still leads to the
    very same object, so a reused id is never taken for another message's.
    Tools and reasoning messages (whose cost depends on the projection) are
    keyed by value in ``by_value``. Equal texts inside
    one batch are tokenized once (``_SharedState.token_lengths``).
    """

    def __init__(self, capacity: int, *, own_encoding: bool) -> None:
        self.by_id = _Generations(capacity)
        self.by_value = _Generations(capacity)
        self.base = next(_encoding_tags) << _COST_BITS if own_encoding else 0
        """A cost this cache wrote on a message reads ``base + cost``."""
        self.top = self.base + _COST_MASK
        """The largest slot value that is one of this cache's costs."""

    def message_cost(self, message: Message) -> int | None:
        packed: int = getattr(message, _SLOT, _NO_COST)
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
            packed = getattr(message, _SLOT, _NO_COST)
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


_Encode: TypeAlias = Callable[[str], list[int]]
_o200k_base: tuple[_Encode, _Encode] | None = None
"""o200k_base's ``encode_ordinary`` and the Rust method beneath it, found once per process."""


def _encoders(encoding: TextEncoder | None) -> tuple[_Encode, _Encode]:
    """``encoding``'s ``encode_ordinary`` (o200k_base's for ``None``), and the method to
    tokenize a batch with: for a tiktoken encoding, its Rust encoder's own, without the
    Python method around it, which saves a Python call per text. ``_tokenize`` falls
    back to the method for the one input the Rust side refuses: text with lone
    surrogates, which the method repairs."""
    global _o200k_base
    if encoding is None and _o200k_base is not None:
        return _o200k_base
    # o200k_base_encoding() loads once per process under its own lock.
    chosen = encoding if encoding is not None else o200k_base_encoding()
    from tiktoken import Encoding  # loaded with the vocabulary, not at import

    core = getattr(chosen, "_core_bpe", None) if isinstance(chosen, Encoding) else None
    batch = getattr(core, "encode_ordinary", None)
    found = (chosen.encode_ordinary, batch if callable(batch) else chosen.encode_ordinary)
    if encoding is None:
        _o200k_base = found  # the same pair whichever thread stores it
    return found


class _SharedState:
    """What a counter and the counters derived from it share: the cache and the encoder."""

    def __init__(self, encoding: TextEncoder | None, capacity: int) -> None:
        self.cache = _CostCache(capacity, own_encoding=encoding is not None)
        self.last_count: tuple[object, tuple[Message, ...], int] | None = None
        """The projection key, messages and message total of the last count."""
        self._encoding = encoding
        self._encoders: tuple[_Encode, _Encode] | None = None

    def encoders(self) -> tuple[_Encode, _Encode]:
        """``encode_ordinary`` and the method a batch is tokenized with (``_encoders``);
        o200k_base is loaded on first use."""
        found = self._encoders
        if found is None:
            found = self._encoders = _encoders(self._encoding)
        return found

    def token_lengths(self, texts: list[str]) -> list[int]:
        """How many tokens each of ``texts`` has, tokenized in one tight loop.

        A text that occurs more than once is tokenized once.
        """
        unique: dict[str, int | None] = dict.fromkeys(texts)
        if len(unique) == len(texts):
            return self._tokenize(texts)
        once = list(unique)
        unique.update(zip(once, self._tokenize(once), strict=True))
        return cast("list[int]", list(map(unique.__getitem__, texts)))

    def _tokenize(self, texts: list[str]) -> list[int]:
        encode, batch = self.encoders()
        try:
            return list(map(len, map(batch, texts)))
        except UnicodeEncodeError:
            return list(map(len, map(encode, texts)))


class BuiltinTokenCounter:
    """The counter used when nothing else is configured: o200k_base plus framing.

    ``projection`` decides which reasoning is counted (see
    ``DefaultReplayProjection``); left ``None``, the counter is *unbound*:
    it counts with the default projection, and ``resolve_token_counter``
    binds it to the driver's projection. ``encoding`` replaces o200k_base
    with any object that has ``encode_ordinary`` (tests use it to watch
    tokenization). ``cache_size`` bounds how many message costs are kept.

    Creating one is cheap: the vocabulary is loaded on the first count.

    Example::

        counter = BuiltinTokenCounter()
        counter.count([Message.user("hello world")])  # 4 + 2 + 3 = 9

    Raises:
        InvalidRequestError: ``cache_size`` is not a positive int (also a ``ValueError``).
        TokenizerDataError: (on the first count) the shipped vocabulary is
            missing or damaged.
    """

    __slots__ = ("_projection", "_projection_key", "_shared")

    def __init__(
        self,
        *,
        projection: ReplayProjection | None = None,
        encoding: TextEncoder | None = None,
        cache_size: int = DEFAULT_CACHE_SIZE,
    ) -> None:
        positive_int("cache_size", cache_size)
        self._bind(_SharedState(encoding, cache_size), projection)

    def _bind(self, shared: _SharedState, projection: ReplayProjection | None) -> None:
        self._shared = shared
        self._projection = projection
        # A reasoning message's cost depends on the projection, so it is cached
        # under (projection, message); an unhashable projection is not cached.
        key: object = projection if projection is not None else _DEFAULT_PROJECTION
        try:
            hash(key)
        except TypeError:
            key = None
        self._projection_key = key

    @property
    def projection(self) -> ReplayProjection | None:
        """The projection this counter was bound to, or ``None`` when unbound."""
        return self._projection

    def with_projection(self, projection: ReplayProjection) -> BuiltinTokenCounter:
        """The same counter bound to ``projection``, sharing this counter's cache."""
        derived = BuiltinTokenCounter.__new__(BuiltinTokenCounter)
        derived._bind(self._shared, projection)
        return derived

    def for_model(self, model: Model) -> BuiltinTokenCounter:
        """This counter: o200k_base and the framing do not depend on the model.

        The driver's replay projection is bound by ``resolve_token_counter``,
        which knows the driver.
        """
        return self

    def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        """The estimated prompt tokens of ``messages`` and ``tools``.

        Equals ``sum(map(self.message_tokens, messages)) + self.overhead_tokens(tools)``.
        """
        return self._messages_total(messages) + self.overhead_tokens(tools)

    def _messages_total(self, messages: Sequence[Message]) -> int:
        # Counting the transcript that was counted last, grown at its end, is
        # the common case (the next round, the next turn): its counted prefix
        # is recognised with one tuple comparison, which checks identity
        # before equality, element by element, in C.
        shared = self._shared
        snapshot = tuple(messages)
        last = shared.last_count
        total = 0
        new = snapshot
        if last is not None and last[0] == self._projection_key:
            counted = last[1]
            size = len(counted)
            if size <= len(snapshot) and snapshot[:size] == counted:
                total = last[2]
                new = snapshot[size:]
        total += self._sum_messages(new)
        if self._projection_key is not None:
            shared.last_count = (self._projection_key, snapshot, total)
        return total

    def _sum_messages(self, messages: Sequence[Message]) -> int:
        # Every pass here runs in C. A message that carries no cost (0) was priced by
        # no cache, so when none carries one (a first count, the new end of a grown
        # transcript) there is nothing to look up: they are priced together.
        if not messages:
            return 0
        marks = marks_of(messages)
        if max(marks) <= 0:
            return self._price_new(messages, marks)
        cache = self._shared.cache
        base, top = cache.base, cache.top
        if min(marks) > base and max(marks) <= top:
            return sum(marks) - base * len(marks)  # all priced by this cache before
        priced = list(filter(_is_cost, marks))
        if min(priced) > base and max(priced) <= top:
            # This cache's costs and new messages (a transcript cut at its start and grown).
            new = list(compress(messages, map(_is_no_cost, marks)))
            unpriced = list(filter(_is_no_cost, marks))
            return sum(priced) - base * len(priced) + self._price_new(new, unpriced)
        return self._sum_mixed(messages, marks)

    def _sum_mixed(self, messages: Sequence[Message], marks: list[int]) -> int:
        """The total of ``messages``, some of which were priced with another encoding."""
        cache = self._shared.cache
        base, top = cache.base, cache.top
        total = 0
        missed: list[Message] = []
        for message, packed in zip(messages, marks, strict=True):
            if base < packed <= top:
                total += packed - base
                continue
            cost = cache.by_identity(message) if packed > 0 else None
            if cost is None:
                missed.append(message)
            else:
                total += cost
        return total + (self._price_new(missed, unmarked=False) if missed else 0)

    def _price_new(
        self, messages: Sequence[Message], marks: list[int] | None = None, *, unmarked: bool = True
    ) -> int:
        """Price and remember ``messages``, which this cache has no cost of. ``marks``:
        their slots, which carry no cost (``unmarked``: nor another encoding's, so they
        are written unchecked) and say which are plain; ``None``: read their fields."""
        contents = list(map(_content_of, messages))
        if marks is not None:
            if any(marks):
                return self._price_shapes(messages, contents, list(map(not_, marks)), unmarked)
        else:
            plain = list(map(_PLAIN.__eq__, map(_extras_of, messages)))
            plain = list(map(and_, plain, map(is_, map(type, contents), repeat(str))))
            if plain.count(True) != len(plain):
                return self._price_shapes(messages, contents, plain, unmarked)
        # The commonest transcript, plain text messages only: the framing is a constant.
        lengths = self._shared.token_lengths(contents)
        cache = self._shared.cache
        if unmarked:
            cache.write(messages, map(add, lengths, repeat(cache.base + MESSAGE_TOKENS)))
        else:
            cache.put_messages(messages, list(map(add, lengths, repeat(MESSAGE_TOKENS))))
        return sum(lengths) + MESSAGE_TOKENS * len(lengths)

    def _price_shapes(
        self,
        messages: Sequence[Message],
        contents: list[Content],
        plain: list[bool],
        unmarked: bool,
    ) -> int:
        """``_price_new`` for messages of every shape: the plain ones still in C, the
        others gathered one by one; all their texts are tokenized together."""
        plain_texts = cast("list[str]", list(compress(contents, plain)))
        rest = list(map(not_, plain))
        rest_extras = list(map(_extras_of, compress(messages, rest)))
        total = 0
        if list(map(_reasoning_in, rest_extras)).count(None) != len(rest_extras):
            # Reasoning is priced by the projection, and cached by value: one by one.
            with_reasoning = list(map(is_not, map(_reasoning_of, messages), repeat(None)))
            total = sum(map(self.message_tokens, compress(messages, with_reasoning)))
            rest = list(map(and_, rest, map(not_, with_reasoning)))
            rest_extras = list(map(_extras_of, compress(messages, rest)))
        shaped = list(compress(messages, rest))
        texts: list[str] = []
        fixed_costs, ends = _gather(zip(compress(contents, rest), rest_extras, strict=True), texts)
        simple = len(plain_texts)
        lengths = self._shared.token_lengths(plain_texts + texts)
        # Message i's texts are texts[ends[i - 1]:ends[i]]; its text tokens are a
        # difference of running totals.
        running = list(accumulate(islice(lengths, simple, None), initial=0))
        at = running.__getitem__
        costs = list(map(add, fixed_costs, map(sub, map(at, ends), map(at, [0, *ends[:-1]]))))
        cache = self._shared.cache
        if unmarked:
            base = cache.base
            cache.write(
                compress(messages, plain),
                map(add, islice(lengths, simple), repeat(base + MESSAGE_TOKENS)),
            )
            cache.write(shaped, map(add, costs, repeat(base)))
        else:
            plain_costs = list(map(add, islice(lengths, simple), repeat(MESSAGE_TOKENS)))
            cache.put_messages(list(compress(messages, plain)), plain_costs)
            cache.put_messages(shaped, costs)
        return total + sum(lengths) + MESSAGE_TOKENS * simple + sum(fixed_costs)

    def message_tokens(self, message: Message) -> int:
        """What ``message`` adds to a transcript's count."""
        # A message's cost is cached under the message itself, unless its
        # reasoning makes the cost depend on the projection.
        cache = self._shared.cache
        if message.reasoning is None:
            cost = cache.message_cost(message)
            if cost is None:
                cost = self._price_one(message)
                cache.put_messages([message], [cost])
            return cost
        if self._projection_key is None:
            return self._price_one(message)
        key = (self._projection_key, message)
        cost = cache.get(key)
        if cost is None:
            cost = self._price_one(message)
            cache.put(key, cost)
        return cost

    def overhead_tokens(self, tools: Sequence[Tool] = ()) -> int:
        """The reply priming, plus the tools section and each tool's schema when tools are given."""
        if not tools:
            return REPLY_TOKENS
        return REPLY_TOKENS + TOOLS_SECTION_TOKENS + sum(map(self.tool_tokens, tools))

    def tool_tokens(self, tool: Tool) -> int:
        """What declaring ``tool`` costs: its name, description and JSON schema, plus framing.

        A tool is priced once and remembered by identity, so do not change a
        tool's ``parameters`` mapping after its first count.
        """
        cache = self._shared.cache
        key = ("tool", tool)
        try:
            cost = cache.get(key)
        except TypeError:  # a tool type that cannot be hashed: price it every time
            return self._price_tool(tool)
        if cost is None:
            cost = self._price_tool(tool)
            cache.put(key, cost)
        return cost

    def _price_one(self, message: Message) -> int:
        """The cost of ``message``, computed without the cache."""
        texts: list[str] = []
        fixed = _gather([(message.content, _extras_of(message))], texts)[0][0]
        if message.reasoning is not None:
            projection = self._projection or _DEFAULT_PROJECTION
            texts.extend(filter(None, projection.replayed_reasoning(message.reasoning)))
        return fixed + sum(self._shared.token_lengths(texts))

    def _price_tool(self, tool: Tool) -> int:
        texts = [tool.name, tool.description, schema_json(tool.parameters)]
        return TOOL_SCHEMA_TOKENS + sum(self._shared.token_lengths(texts))

    def __repr__(self) -> str:
        return f"BuiltinTokenCounter(projection={self._projection!r})"


_SCHEMA_ENCODER = json.JSONEncoder(ensure_ascii=False, default=str)


def schema_json(parameters: Any) -> str:
    """A tool's parameters as the JSON text that is counted for them."""
    if c_make_encoder is None:
        return _SCHEMA_ENCODER.encode(parameters)
    # What _SCHEMA_ENCODER.encode() does, without the Python frames around it.
    chunks = c_make_encoder({}, str, encode_basestring, None, ": ", ", ", False, False, True)
    return "".join(chunks(parameters, 0))
