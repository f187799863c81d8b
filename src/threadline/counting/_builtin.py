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

Messages are immutable, so a message's cost is computed once and kept: on
the message itself, or in a bounded cache shared by a counter and the
counters derived from it (``with_projection``, ``for_model``; see
``_costs``). Within one count a text that occurs more than once (a tool's
name in every call to it, a call id its result repeats, equal messages) is
tokenized once; counting a transcript again after appending one message
tokenizes only that message. The last transcript counted is kept too, so one
that only grew at its end is summed from the new messages alone.

A first count prices the messages that are not plain text one by one, in one
loop that tokenizes their texts as it goes, then the plain ones (most of a
transcript) in C passes, their texts tokenized in one batch.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Sequence
from itertools import compress, repeat
from json.encoder import c_make_encoder, encode_basestring  # type: ignore[attr-defined]
from operator import add, and_, attrgetter, is_, is_not, not_
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from threadline._messages import ContentPart, ImagePart, Message, Reasoning, ToolCall
from threadline._validate import positive_int
from threadline.counting._costs import CostCache, is_cost, is_no_cost, marks_of
from threadline.counting._encoding import TextEncoder
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
from threadline.counting._lengths import TokenLengths, o200k_base_lengths, token_lengths_of
from threadline.counting._projection import DefaultReplayProjection
from threadline.counting._protocol import ModelTokenCounter
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
_reasoning_of = attrgetter("reasoning")
_is_zero = (0).__eq__  # a plain text message's cost slot, never priced


def _priced_elsewhere_or_shaped(mark: int, top: int) -> bool:
    """Whether a message whose slot reads ``mark`` is priced by neither the slot nor its
    text's length: not plain and never priced (below 0), or priced with another
    encoding (above this cache's ``top``)."""
    return mark < 0 or mark > top


def _costs_of(
    messages: Iterable[Message],
    tokens_of: dict[str, int],
    count: Callable[[str], int],
    *,
    whole: bool,
) -> list[int] | None:
    """The cost of each message, its reasoning aside, or (``whole``) ``None`` at the first
    one with reasoning, which the projection prices. Each text is tokenized with
    ``count`` unless ``tokens_of`` has it already, and is added to it."""
    costs: list[int] = []
    add_cost, known = costs.append, tokens_of.get
    for message in messages:
        if whole and message.reasoning is not None:
            return None
        cost = MESSAGE_TOKENS
        content = message.content
        if content.__class__ is str:
            texts = [content] if content else []
        else:
            texts = []
            for part in cast("tuple[ContentPart, ...]", content):
                if isinstance(part, ImagePart):
                    cost += image_tokens(part)
                else:
                    texts.append(part.text)
        name = message.name
        if name:
            cost += NAME_TOKENS
            texts.append(name)
        call_id = message.tool_call_id
        if call_id is not None:
            cost += TOOL_RESULT_TOKENS
            texts.append(call_id)
        for call in message.tool_calls:
            cost += TOOL_CALL_TOKENS
            texts += _call_texts(call)
        for text in texts:
            tokens = known(text)
            if tokens is None:
                tokens = tokens_of[text] = count(text)
            cost += tokens
        add_cost(cost)
    return costs


class _SharedState:
    """What a counter and the counters derived from it share: the cache and the encoder."""

    def __init__(self, encoding: TextEncoder | None, capacity: int) -> None:
        self.cache = CostCache(capacity, own_encoding=encoding is not None)
        self.last_count: tuple[object, tuple[Message, ...], int] | None = None
        """The projection key, messages and message total of the last count."""
        self._encoding = encoding
        self._lengths: TokenLengths | None = None

    def lengths(self) -> TokenLengths:
        """How this counter tokenizes: o200k_base's (loaded on first use) or the
        ``encoding`` it was given."""
        found = self._lengths
        if found is None:
            encoding = self._encoding
            found = o200k_base_lengths() if encoding is None else token_lengths_of(encoding)
            self._lengths = found
        return found

    def token_lengths(self, texts: list[str], known: dict[str, int] | None = None) -> list[int]:
        """How many tokens each of ``texts`` has, tokenized in one tight loop.

        A text that occurs more than once, or is in ``known`` (text: tokens), is
        tokenized at most once.
        """
        distinct = set(texts)
        if len(distinct) == len(texts) and (not known or distinct.isdisjoint(known)):
            return self._tokenize(texts)
        unique: dict[str, int | None] = dict.fromkeys(texts)
        if known:
            for text in distinct.intersection(known):
                unique[text] = known[text]
        once = [text for text, tokens in unique.items() if tokens is None]
        unique.update(zip(once, self._tokenize(once), strict=True))
        return cast("list[int]", list(map(unique.__getitem__, texts)))

    def costs_of(
        self, messages: Sequence[Message], tokens_of: dict[str, int], *, whole: bool = True
    ) -> list[int] | None:
        """``_costs_of`` these messages, tokenized on the fast path, or the safe one
        where that refuses a text."""
        lengths = self.lengths()
        try:
            return _costs_of(messages, tokens_of, lengths.count, whole=whole)
        except UnicodeEncodeError:
            return _costs_of(messages, tokens_of, lengths.safe_count, whole=whole)

    def _tokenize(self, texts: list[str]) -> list[int]:
        lengths = self.lengths()
        try:
            return lengths.counts(texts)
        except UnicodeEncodeError:
            return list(map(lengths.safe_count, texts))


class BuiltinTokenCounter(ModelTokenCounter):
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

    def for_projection(self, projection: ReplayProjection) -> BuiltinTokenCounter:
        """Bound to ``projection`` when unbound (sharing this cache); else this counter.

        ``resolve_token_counter`` passes the driver's replay projection here.
        """
        return self if self._projection is not None else self.with_projection(projection)

    def for_model(self, model: Model) -> BuiltinTokenCounter:
        """This counter: o200k_base and the framing do not depend on the model."""
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
        priced = list(filter(is_cost, marks))
        if min(priced) > base and max(priced) <= top:
            # This cache's costs and new messages (a transcript cut at its start and grown).
            new = list(compress(messages, map(is_no_cost, marks)))
            unpriced = list(filter(is_no_cost, marks))
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
        are written unchecked) and are 0 for the plain ones; ``None``: read their fields."""
        if marks is not None and any(marks):
            return self._price_shapes(messages, marks, unmarked)
        contents = list(map(_content_of, messages))
        if marks is None:
            plain = list(map(_PLAIN.__eq__, map(_extras_of, messages)))
            plain = list(map(and_, plain, map(is_, map(type, contents), repeat(str))))
            if plain.count(True) != len(plain):
                return self._price_shapes(messages, list(map(not_, plain)), unmarked)
        # The commonest transcript, plain text messages only: the framing is a constant.
        lengths = self._shared.token_lengths(cast("list[str]", contents))
        cache = self._shared.cache
        if unmarked:
            cache.write(messages, map(add, lengths, repeat(cache.base + MESSAGE_TOKENS)))
        else:
            cache.put_messages(messages, list(map(add, lengths, repeat(MESSAGE_TOKENS))))
        return sum(lengths) + MESSAGE_TOKENS * len(lengths)

    def _price_shapes(
        self, messages: Sequence[Message], shaped: Sequence[object], unmarked: bool
    ) -> int:
        """``_price_new`` for messages of every shape (``shaped``: true for each that is
        not plain text): the others priced one by one, then the plain ones in C, their
        texts tokenized together; no text is tokenized twice."""
        shared = self._shared
        others = list(compress(messages, shaped))
        tokens_of: dict[str, int] = {}
        costs = shared.costs_of(others, tokens_of)
        if costs is None:
            return self._price_reasoned(messages, shaped, unmarked)
        plain = list(compress(messages, map(not_, shaped)))
        lengths = shared.token_lengths(list(map(_content_of, plain)), tokens_of)
        cache = shared.cache
        base = cache.base if unmarked else 0
        plain_costs = list(map(add, lengths, repeat(base + MESSAGE_TOKENS)))
        if unmarked:
            cache.write(plain, plain_costs)
            cache.write(others, map(add, costs, repeat(base)) if base else costs)
        else:
            cache.put_messages(plain, plain_costs)
            cache.put_messages(others, costs)
        return sum(lengths) + MESSAGE_TOKENS * len(lengths) + sum(costs)

    def _price_reasoned(
        self, messages: Sequence[Message], shaped: Sequence[object], unmarked: bool
    ) -> int:
        """``_price_shapes`` when some messages carry reasoning, whose cost depends on the
        projection and is cached by value: those are priced one by one, the rest together."""
        reasoned = list(map(is_not, map(_reasoning_of, messages), repeat(None)))
        total = sum(map(self.message_tokens, compress(messages, reasoned)))
        rest = list(map(not_, reasoned))
        rest_messages = list(compress(messages, rest))
        return total + self._price_shapes(rest_messages, list(compress(shaped, rest)), unmarked)

    def messages_tokens_bound(self, messages: Sequence[Message]) -> int:
        """At least ``sum(map(self.message_tokens, messages))``, tokenizing no plain text.

        A message priced before adds its cost; a plain text message not priced
        yet adds its framing plus its text's UTF-8 length, which o200k_base's
        count never exceeds (each of its tokens is at least one byte; a lone
        surrogate, repaired to U+FFFD, is three either way); any other message
        is priced. With an ``encoding`` of the caller's, which may count more
        tokens than bytes, every message is priced: the bound is the count.
        """
        if not messages:
            return 0
        marks = marks_of(messages)
        cache = self._shared.cache
        base, top = cache.base, cache.top
        if min(marks) > base and max(marks) <= top:
            return sum(marks) - base * len(marks)  # all priced: the bound is the count
        if base:
            return self._messages_total(messages)
        # Every pass below runs in C: a long history is bounded in a fraction of a ms.
        priced = list(filter(is_cost, marks))
        total = sum(priced)
        texts = list(map(_content_of, compress(messages, map(_is_zero, marks))))
        if all(map(str.isascii, texts)):
            total += sum(map(len, texts))
        else:
            total += sum(len(text.encode("utf-8", "surrogatepass")) for text in texts)
        total += MESSAGE_TOKENS * len(texts)
        if len(priced) + len(texts) == len(marks) and (not priced or max(priced) <= top):
            return total
        # Priced by another encoding (a cost above top), or not plain and never priced.
        total -= sum(filter(top.__lt__, priced))
        others = compress(messages, map(_priced_elsewhere_or_shaped, marks, repeat(top)))
        return total + sum(map(self.message_tokens, others))

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
        tokens_of: dict[str, int] = {}
        cost = cast("list[int]", self._shared.costs_of([message], tokens_of, whole=False))[0]
        if message.reasoning is None:
            return cost
        projection = self._projection or _DEFAULT_PROJECTION
        replayed = list(filter(None, projection.replayed_reasoning(message.reasoning)))
        return cost + sum(self._shared.token_lengths(replayed, tokens_of))

    def _price_tool(self, tool: Tool) -> int:
        texts = [tool.name, tool.description, schema_json(tool.parameters)]
        return TOOL_SCHEMA_TOKENS + sum(self._shared.token_lengths(texts))

    def __repr__(self) -> str:
        return f"BuiltinTokenCounter(projection={self._projection!r})"


_SCHEMA_ENCODER = json.JSONEncoder(ensure_ascii=False, default=str)
# What _SCHEMA_ENCODER.encode() does, without the Python frames around it, made once. It
# keeps no markers, so it checks for no cycles: a tool's parameters were checked to be
# plain JSON when the tool was built (``json.dumps``, which does) and cannot change.
_encode_schema = (
    c_make_encoder(None, str, encode_basestring, None, ": ", ", ", False, False, True)
    if c_make_encoder is not None
    else None
)


def schema_json(parameters: Any) -> str:
    """A tool's parameters as the JSON text that is counted for them."""
    if _encode_schema is None:
        return _SCHEMA_ENCODER.encode(parameters)
    return "".join(_encode_schema(parameters, 0))
