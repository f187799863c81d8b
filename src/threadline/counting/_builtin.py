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
from itertools import accumulate, count, repeat
from operator import add, and_, attrgetter, lshift, or_, rshift, sub
from typing import TYPE_CHECKING, Any

from threadline._messages import ImagePart, Message
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
_reasoning = attrgetter("reasoning")


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
# as one int: the cost above the writing cache's tag. One int is written at once, so
# a reader never sees one cache's tag with another's cost.
_SLOT = "_count_cost"
_TAG_BITS = 20
_TAG_MASK = (1 << _TAG_BITS) - 1
_cache_tags = count(1)


def marks_of(messages: Sequence[Message]) -> list[int]:
    """What each message's cost slot holds (0: nothing yet), read in C."""
    return list(map(getattr, messages, repeat(_SLOT), repeat(0)))


def tags_of(messages: Sequence[Message], marks: list[int] | None = None) -> list[int]:
    """Which cache wrote each message's cost (0: none), read in C."""
    return list(map(and_, marks_of(messages) if marks is None else marks, repeat(_TAG_MASK)))


class _CostCache:
    """Token costs: plain messages on the message (a slot of its own) or, for a message
    another cache priced first, by identity; everything else by value.

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

    def __init__(self, capacity: int) -> None:
        self.by_id = _Generations(capacity)
        self.by_value = _Generations(capacity)
        tag = next(_cache_tags)
        self.tag = tag if tag <= _TAG_MASK else 0  # 0: this cache writes no message slot

    def message_cost(self, message: Message) -> int | None:
        packed: int = getattr(message, _SLOT, 0)
        if self.tag and packed & _TAG_MASK == self.tag:
            return packed >> _TAG_BITS
        entry = self.by_id.get(id(message))
        if entry is not None and entry[0]() is message:
            cost: int = entry[1]
            return cost
        return None

    def put_messages(
        self,
        messages: Sequence[Message],
        costs: Sequence[int],
        *,
        unmarked: bool = False,
    ) -> None:
        """Remember ``costs``; ``unmarked``: the caller has read that no message of
        ``messages`` carries a cost yet, so they are not read again."""
        tag = self.tag
        if tag:
            tags = () if unmarked else tags_of(messages)
            if unmarked or tags.count(0) + tags.count(tag) == len(tags):
                # No other cache's message among them (a cold count): written in C.
                packed = map(or_, map(lshift, costs, repeat(_TAG_BITS)), repeat(tag))
                deque(map(object.__setattr__, messages, repeat(_SLOT), packed), maxlen=0)
                return
        spilled: list[tuple[Message, int]] = []
        for message, cost in zip(messages, costs, strict=True):
            if tag and getattr(message, _SLOT, 0) & _TAG_MASK in (0, tag):
                object.__setattr__(message, _SLOT, cost << _TAG_BITS | tag)
            else:
                spilled.append((message, cost))  # another cache's message: kept here
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


class _SharedState:
    """What a counter and the counters derived from it share: the cache and the encoder."""

    def __init__(self, encoding: TextEncoder | None, capacity: int) -> None:
        self.cache = _CostCache(capacity)
        self.last_count: tuple[object, tuple[Message, ...], int] | None = None
        """The projection key, messages and message total of the last count."""
        self._encoding = encoding
        self._encode: Callable[[str], list[int]] | None = None
        self._encode_batch: Callable[[str], list[int]] | None = None

    def encoder(self) -> Callable[[str], list[int]]:
        """The ``encode_ordinary`` to tokenize with; o200k_base is loaded on first use."""
        encode = self._encode
        if encode is None:
            # o200k_base_encoding() loads once per process under its own lock.
            encoding = self._encoding if self._encoding is not None else o200k_base_encoding()
            # For batches, tiktoken's Rust encoder is called without the
            # Python method around it, which saves a Python call per text;
            # token_lengths falls back to the method for the one input the
            # Rust side refuses: text with lone surrogates, which it repairs.
            from tiktoken import Encoding  # loaded with the vocabulary, not at import

            core = getattr(encoding, "_core_bpe", None) if isinstance(encoding, Encoding) else None
            batch = getattr(core, "encode_ordinary", None)
            self._encode_batch = batch if callable(batch) else encoding.encode_ordinary
            encode = self._encode = encoding.encode_ordinary
        return encode

    def token_lengths(self, texts: list[str]) -> list[int]:
        """How many tokens each of ``texts`` has, tokenized in one tight loop.

        A text that occurs more than once is tokenized once.
        """
        unique = dict.fromkeys(texts)
        if len(unique) == len(texts):
            return self._tokenize(texts)
        lengths = dict(zip(unique, self._tokenize(list(unique)), strict=True))
        return list(map(lengths.__getitem__, texts))

    def _tokenize(self, texts: list[str]) -> list[int]:
        encode = self.encoder()
        batch = self._encode_batch or encode
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
        # A warm count is one identity lookup per message. The messages that
        # miss are priced together: their texts are gathered first and
        # tokenized in one tight loop, which keeps the tokenizer's tables hot
        # in the CPU cache, and their costs are stored under one lock.
        cache = self._shared.cache
        by_id = cache.by_id
        recent = by_id.recent
        previous = by_id.previous
        if not messages:
            return 0
        tag = cache.tag
        marks = marks_of(messages)
        tags = tags_of(messages, marks)
        if tag and tags.count(tag) == len(tags):
            # Every message priced before by this cache: read in C.
            return sum(map(rshift, marks, repeat(_TAG_BITS)))
        unmarked = tags.count(0) == len(tags)
        ids = list(map(id, messages))
        cached = (
            (bool(tag) and not unmarked and tag in tags)
            or any(map(recent.__contains__, ids))
            or (bool(previous) and any(map(previous.__contains__, ids)))
        )
        # Nothing of it cached (a first count, the new end of a grown
        # transcript) and no reasoning: no lookups one by one, priced together.
        if not cached and list(map(_reasoning, messages)).count(None) == len(messages):
            return self._price_misses(list(messages), unmarked=unmarked)
        total = 0
        missed: list[Message] = []
        for message in messages:
            packed = getattr(message, _SLOT, 0)
            if tag and packed & _TAG_MASK == tag:
                total += packed >> _TAG_BITS
                continue
            entry = recent.get(id(message))
            if entry is None and previous:
                entry = previous.get(id(message))
                if entry is not None and entry[0]() is message:
                    by_id.put(id(message), entry)  # used again: back into the recent generation
            if entry is not None and entry[0]() is message:
                total += entry[1]
            elif message.reasoning is not None:
                total += self.message_tokens(message)  # keyed by projection too
            else:
                missed.append(message)
        if missed:
            total += self._price_misses(missed)
        return total

    def _price_misses(self, missed: list[Message], *, unmarked: bool = False) -> int:
        """Price and remember the messages a count missed; the same object twice is priced
        once (``unmarked``: see ``_CostCache.put_messages``)."""
        if len(set(map(id, missed))) == len(missed):
            priced = self._price_messages(missed)
            self._shared.cache.put_messages(missed, priced, unmarked=unmarked)
            return sum(priced)
        unique = {id(message): message for message in missed}
        once = list(unique.values())
        priced = self._price_messages(once)
        self._shared.cache.put_messages(once, priced, unmarked=unmarked)
        cost_of = dict(zip(unique, priced, strict=True))
        return sum(cost_of[id(message)] for message in missed)

    def message_tokens(self, message: Message) -> int:
        """What ``message`` adds to a transcript's count."""
        # A message's cost is cached under the message itself, unless its
        # reasoning makes the cost depend on the projection.
        cache = self._shared.cache
        if message.reasoning is None:
            cost = cache.message_cost(message)
            if cost is None:
                cost = self._price_messages([message])[0]
                cache.put_messages([message], [cost])
            return cost
        key: Hashable
        if self._projection_key is not None:
            key = (self._projection_key, message)
        else:
            return self._price_messages([message])[0]
        cost = cache.get(key)
        if cost is None:
            cost = self._price_messages([message])[0]
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

    def _price_messages(self, messages: list[Message]) -> list[int]:
        """The costs of ``messages``, computed without the cache."""
        gather = self._gather
        texts: list[str] = []
        fixed_costs: list[int] = []
        ends: list[int] = []  # where each message's texts end in ``texts``
        add_text, add_fixed, add_end = texts.append, fixed_costs.append, ends.append
        for message in messages:
            content = message.content
            # Most messages are plain text: no call for them.
            if (
                type(content) is str
                and not message.tool_calls
                and message.tool_call_id is None
                and not message.name
                and message.reasoning is None
            ):
                if content:
                    add_text(content)
                add_fixed(MESSAGE_TOKENS)
            else:
                add_fixed(gather(message, texts))
            add_end(len(texts))
        # Message i's texts are texts[ends[i - 1]:ends[i]]; its text tokens are
        # a difference of running totals. All of it runs in C, in tight loops.
        running = [0, *accumulate(self._shared.token_lengths(texts))]
        at = running.__getitem__
        text_tokens = map(sub, map(at, ends), map(at, [0, *ends[:-1]]))
        return list(map(add, fixed_costs, text_tokens))

    def _gather(self, message: Message, texts: list[str]) -> int:
        """Append ``message``'s texts to ``texts``; return its fixed (non-text) cost."""
        fixed = MESSAGE_TOKENS
        content = message.content
        if isinstance(content, str):
            if content:
                texts.append(content)
        else:
            for part in content:
                if isinstance(part, ImagePart):
                    fixed += image_tokens(part)
                elif part.text:
                    texts.append(part.text)
        if message.name:
            fixed += NAME_TOKENS
            texts.append(message.name)
        if message.tool_call_id is not None:
            fixed += TOOL_RESULT_TOKENS
            if message.tool_call_id:
                texts.append(message.tool_call_id)
        for call in message.tool_calls:
            fixed += TOOL_CALL_TOKENS
            texts.extend(text for text in (call.id, call.name, call.arguments) if text)
        if message.reasoning is not None:
            projection = self._projection or _DEFAULT_PROJECTION
            texts.extend(p for p in projection.replayed_reasoning(message.reasoning) if p)
        return fixed

    def _price_tool(self, tool: Tool) -> int:
        encode = self._shared.encoder()
        cost = TOOL_SCHEMA_TOKENS + len(encode(tool.name))
        if tool.description:
            cost += len(encode(tool.description))
        return cost + len(encode(schema_json(tool.parameters)))

    def __repr__(self) -> str:
        return f"BuiltinTokenCounter(projection={self._projection!r})"


_SCHEMA_ENCODER = json.JSONEncoder(ensure_ascii=False, default=str)


def schema_json(parameters: Any) -> str:
    """A tool's parameters as the JSON text that is counted for them."""
    return _SCHEMA_ENCODER.encode(parameters)
