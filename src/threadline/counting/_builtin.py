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
one message tokenizes only that message.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING, Any

from threadline._messages import ImagePart, Message
from threadline._tools import Tool
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

    def __len__(self) -> int:
        return len(self.recent) + len(self.previous)


class _SharedState:
    """What a counter and the counters derived from it share: the cache and the encoding."""

    def __init__(self, encoding: TextEncoder | None, capacity: int) -> None:
        self.cache = _CostCache(capacity)
        self._encoding = encoding

    def encoding(self) -> TextEncoder:
        encoding = self._encoding
        if encoding is None:
            # o200k_base_encoding() loads once per process under its own lock.
            encoding = self._encoding = o200k_base_encoding()
        return encoding


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
        if isinstance(cache_size, bool) or not isinstance(cache_size, int) or cache_size < 1:
            raise ValueError(f"cache_size must be a positive int, not {cache_size!r}")
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
        # The hot path of a warm count: one dict lookup per message.
        recent = self._shared.cache.recent
        total = 0
        for message in messages:
            cost = recent.get(message)
            if cost is None:
                cost = self.message_tokens(message)
            total += cost
        return total + self.overhead_tokens(tools)

    def message_tokens(self, message: Message) -> int:
        """What ``message`` adds to a transcript's count."""
        if message.reasoning is None:
            key: Hashable = message
        elif self._projection_key is not None:
            key = (self._projection_key, message)
        else:
            return self._price_message(message)
        cache = self._shared.cache
        cost = cache.get(key)
        if cost is None:
            cost = self._price_message(message)
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

    def _price_message(self, message: Message) -> int:
        encode = self._shared.encoding().encode_ordinary
        cost = MESSAGE_TOKENS
        content = message.content
        if isinstance(content, str):
            if content:
                cost += len(encode(content))
        else:
            for part in content:
                if isinstance(part, ImagePart):
                    cost += image_tokens(part)
                elif part.text:
                    cost += len(encode(part.text))
        if message.name:
            cost += len(encode(message.name)) + NAME_TOKENS
        if message.tool_call_id is not None:
            cost += TOOL_RESULT_TOKENS + len(encode(message.tool_call_id))
        for call in message.tool_calls:
            cost += TOOL_CALL_TOKENS + len(encode(call.name))
            if call.id:
                cost += len(encode(call.id))
            if call.arguments:
                cost += len(encode(call.arguments))
        if message.reasoning is not None:
            projection = self._projection or _DEFAULT_PROJECTION
            for piece in projection.replayed_reasoning(message.reasoning):
                if piece:
                    cost += len(encode(piece))
        return cost

    def _price_tool(self, tool: Tool) -> int:
        encode = self._shared.encoding().encode_ordinary
        cost = TOOL_SCHEMA_TOKENS + len(encode(tool.name))
        if tool.description:
            cost += len(encode(tool.description))
        return cost + len(encode(schema_json(tool.parameters)))

    def __repr__(self) -> str:
        return f"BuiltinTokenCounter(projection={self._projection!r})"


def schema_json(parameters: Any) -> str:
    """A tool's parameters as the JSON text that is counted for them."""
    return json.dumps(parameters, ensure_ascii=False, default=str)
