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
from collections.abc import Callable, Hashable, Iterable, Sequence
from itertools import accumulate
from operator import add, sub
from typing import TYPE_CHECKING, Any

from tiktoken import Encoding

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


class _CostCache:
    """A bounded map from messages (and tools) to their token costs.

    Two generations approximate least-recently-used eviction without any
    bookkeeping on a hit: new entries go into ``recent``; when it holds half
    the capacity it becomes ``previous`` and the old ``previous`` is dropped;
    a hit in ``previous`` is copied back into ``recent``. So the cache never
    holds more than ``capacity`` entries, and an entry used within the last
    ``capacity / 2`` insertions survives.

    Reads take no lock (a dict read is atomic, and reading a generation that
    was just retired is harmless); writes take one, so a generation switch
    never loses a concurrent insertion's dictionary.
    """

    def __init__(self, capacity: int) -> None:
        self.generation_size = max(1, capacity // 2)
        self.recent: dict[Hashable, int] = {}
        self.previous: dict[Hashable, int] = {}
        self._lock = threading.Lock()

    def get(self, key: Hashable) -> int | None:
        cost = self.recent.get(key)
        if cost is None:
            cost = self.previous.get(key)
            if cost is not None:
                self.put(key, cost)
        return cost

    def put(self, key: Hashable, cost: int) -> None:
        with self._lock:
            recent = self.recent
            if len(recent) >= self.generation_size:
                self.previous = recent
                self.recent = recent = {}
            recent[key] = cost

    def put_many(self, costs: Iterable[tuple[Hashable, int]], size: int) -> None:
        """Store ``size`` costs under one acquisition of the lock (a cold count's misses)."""
        with self._lock:
            recent = self.recent
            if len(recent) + size <= self.generation_size:
                recent.update(costs)
                return
            for key, cost in costs:
                if len(recent) >= self.generation_size:
                    self.previous = recent
                    self.recent = recent = {}
                recent[key] = cost

    def __len__(self) -> int:
        return len(self.recent) + len(self.previous)


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
            core = getattr(encoding, "_core_bpe", None) if isinstance(encoding, Encoding) else None
            batch = getattr(core, "encode_ordinary", None)
            self._encode_batch = batch if callable(batch) else encoding.encode_ordinary
            encode = self._encode = encoding.encode_ordinary
        return encode

    def token_lengths(self, texts: list[str]) -> list[int]:
        """How many tokens each of ``texts`` has, tokenized in one tight loop."""
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
        # A warm count is one dict lookup per message. The messages that miss
        # are priced together: their texts are gathered first and tokenized in
        # one tight loop, which keeps the tokenizer's tables hot in the CPU
        # cache, and their costs are stored under one lock.
        cache = self._shared.cache
        recent = cache.recent
        previous = cache.previous
        total = 0
        missed: dict[Message, None] = {}  # an ordered set
        repeated: list[Message] = []
        revived: dict[Hashable, int] = {}
        for message in messages:
            cost = recent.get(message)
            if cost is None:
                cost = previous.get(message) if previous else None
                if cost is not None:
                    revived[message] = cost  # used again: back into the recent generation
                elif message.reasoning is not None:
                    cost = self.message_tokens(message)  # keyed by projection too
                else:
                    # One insertion tells a repeat from a first miss: hashing a
                    # message is a Python call, so a cold count makes as few as it can.
                    before = len(missed)
                    missed[message] = None
                    if len(missed) == before:
                        repeated.append(message)
                    continue
            total += cost
        if revived:
            cache.put_many(revived.items(), len(revived))
        if missed:
            priced = self._price_messages(list(missed))
            total += sum(priced)
            if repeated:
                fresh = dict(zip(missed, priced, strict=True))
                total += sum(map(fresh.__getitem__, repeated))
            cache.put_many(zip(missed, priced, strict=True), len(missed))
        return total

    def message_tokens(self, message: Message) -> int:
        """What ``message`` adds to a transcript's count."""
        # A message's cost is cached under the message itself, unless its
        # reasoning makes the cost depend on the projection.
        key: Hashable
        if message.reasoning is None:
            key = message
        elif self._projection_key is not None:
            key = (self._projection_key, message)
        else:
            return self._price_messages([message])[0]
        cache = self._shared.cache
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
        for message in messages:
            fixed_costs.append(gather(message, texts))
            ends.append(len(texts))
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
