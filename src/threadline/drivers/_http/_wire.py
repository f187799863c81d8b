"""JSON on the wire, shared by every HTTP driver's translation module.

Encoding: :func:`encode_body` (compact UTF-8 JSON, one encoder for every body)
and :class:`JSONCache`, which keeps each message's encoded JSON so a long
history is encoded once, not every round. Decoding: response JSON is
untrusted, and the small checks here (``json_object``, ``optional_str``,
``count_field``) raise :class:`MalformedResponse` naming where the shape broke,
which a driver turns into a ``ProviderResponseError``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence, Sized
from itertools import compress, repeat
from json.encoder import encode_basestring
from operator import add, attrgetter, is_, is_not
from typing import Any, Final, cast

from threadline._errors import InvalidRequestError
from threadline._messages import Message, Role

__all__ = [
    "DEFAULT_CACHE_BYTES",
    "DEFAULT_CACHE_MIN_MESSAGES",
    "NOT_JSON",
    "JSONCache",
    "MalformedResponse",
    "arguments_object",
    "count_field",
    "encode_body",
    "json_kind",
    "json_object",
    "loads_or_not",
    "optional_str",
    "without_system",
]

DEFAULT_CACHE_BYTES = 1024 * 1024
"""What one driver's :class:`JSONCache` holds at most: a history of ~500 KB of
JSON (~125k tokens) stays warm, and memory does not grow with the number of
conversations a driver serves (at 32 MiB, memory per conversation was 1.9 times
the messages' own size at 40 turns, ``benchmarks/bench_memory.py``)."""
DEFAULT_CACHE_MIN_MESSAGES = 64
"""The shortest history whose messages :class:`JSONCache` keeps: encoding fewer
costs less than 0.2 ms a request, and keeping their JSON would double the
memory a short conversation holds (each message's text a second time)."""


def arguments_object(arguments: str) -> dict[str, Any] | None:
    """A tool call's ``arguments`` as the JSON object they spell (``{}`` when empty);
    ``None`` when they are not one: a reply cut off mid-arguments, which the
    protocols that take an object (Anthropic's ``input``, Gemini's ``args``) get
    as ``{}``."""
    text = arguments.strip()
    try:
        value = json.loads(text) if text else {}
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class MalformedResponse(Exception):
    """A response that is not the shape the protocol promises (internal)."""


# --- encoding ----------------------------------------------------------------


def _json_default(value: object) -> object:
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, set | frozenset):
        return sorted(value)
    raise TypeError(f"a {type(value).__name__} cannot be sent as JSON")


# One encoder for every body: json.dumps with options builds a new one per call,
# which costs more than encoding a short message.
_ENCODER = json.JSONEncoder(
    ensure_ascii=False, separators=(",", ":"), allow_nan=False, default=_json_default
)


def encode_body(body: Mapping[str, Any]) -> bytes:
    """``body`` as compact UTF-8 JSON.

    Raises:
        InvalidRequestError: a value JSON cannot carry (an object, NaN), or
            text that is not valid Unicode (a lone surrogate).
    """
    try:
        text = _ENCODER.encode(body)
    except (TypeError, ValueError) as exc:
        raise InvalidRequestError(f"the request cannot be encoded as JSON: {exc}") from None
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        # A lone surrogate, usually from input decoded with errors="surrogateescape".
        bad = exc.object[exc.start : exc.end]
        raise InvalidRequestError(
            f"the request holds text that is not valid Unicode ({bad!r}, a lone surrogate, "
            "often left by undecodable input); clean the text before sending it"
        ) from None


_PROBE = "threadline-probe-text"
_QUOTED_PROBE = '"' + _PROBE + '"'
_UNKNOWN: Final = ("", "")  # a role whose frame was not learnt yet
# What a plain message (text and a role) has in its other fields, read in one C call.
_extras_of = attrgetter("tool_calls", "tool_call_id", "name", "reasoning")
_PLAIN: Final = ((), None, None, None)
_content_of = attrgetter("content")
_role_of = attrgetter("role")


def without_system(messages: Sequence[Message]) -> list[Message]:
    """``messages`` but the system ones, in one C pass: what a driver that sends its
    system prompt apart asks :meth:`JSONCache.get_all` for."""
    return list(compress(messages, map(is_not, map(_role_of, messages), repeat(Role.SYSTEM))))


class JSONCache:
    """Each message's JSON, encoded once and reused while it is still sent.

    A run re-sends its whole history every round and a conversation every
    turn; messages are immutable, so their JSON never changes. Encoding each
    message once makes a request cost what its new messages cost, instead of
    re-encoding a thousand-message history every time. Memory is bounded: two
    generations of at most ``max_bytes / 2`` each, the older dropped when the
    newer fills, so what is no longer sent is forgotten. A message whose JSON
    alone is larger than a generation is encoded every time.

    The bound is small (:data:`DEFAULT_CACHE_BYTES`): a driver serving many
    conversations re-encodes most messages, so a miss must be cheap. A plain
    message (text and a role, most of a conversation) is encoded as the
    driver's frame for its role (learnt once, by encoding a probe message)
    around its text escaped in C, at a third of the cost of the driver's own
    encoder; the misses of one request (a first request's whole history) are
    looked up and encoded together, in C passes over them all, at about what
    ``json.dumps`` of the same messages costs.

    Only long histories are kept (:meth:`serves`): a request of fewer than
    ``min_messages`` messages is encoded afresh, since keeping a second copy
    of every short conversation's text costs more than encoding it again.

    A message is found by identity (``id``), never hashed: hashing an attrs
    message keeps its hash on it for good (64 bytes a message, a fifth of what
    a conversation's messages take), where the cache's own entries go with
    their generation. Each generation holds the messages it has JSON for, so an
    id it knows cannot be another object's while the entry lives. A message
    equal to one encoded before but not the same object is encoded again.

    ``encode_message`` is the driver's encoding of one message.
    """

    __slots__ = (
        "_encode_message",
        "_frames",
        "_generation_bytes",
        "_min_messages",
        "_previous",
        "_previous_held",
        "_recent",
        "_recent_bytes",
        "_recent_held",
    )

    def __init__(
        self,
        encode_message: Callable[[Message], bytes],
        max_bytes: int = DEFAULT_CACHE_BYTES,
        min_messages: int = DEFAULT_CACHE_MIN_MESSAGES,
    ) -> None:
        self._encode_message = encode_message
        self._generation_bytes = max(1, max_bytes // 2)
        self._min_messages = min_messages
        # id(message) -> its JSON, and the messages themselves (their ids stay theirs).
        self._recent: dict[int, bytes] = {}
        self._previous: dict[int, bytes] = {}
        self._recent_held: list[Message] = []
        self._previous_held: list[Message] = []
        self._recent_bytes = 0
        self._frames: dict[Role, tuple[str, str] | None] = {}

    def _frame(self, role: Role) -> tuple[str, str] | None:
        """What the driver writes before and after a plain message's quoted text."""
        frames = self._frames
        if role not in frames:
            encoded = self._encode_message(Message(role=role, content=_PROBE)).decode()
            before, found, after = encoded.partition(_QUOTED_PROBE)
            plain = found and _QUOTED_PROBE not in after
            frames[role] = (before, after) if plain else None
        return frames[role]

    def _encoded(self, message: Message) -> bytes:
        """``message``'s JSON, made now: a plain message as its role's frame around its
        text escaped in C, any other by the driver's encoder."""
        content = message.content
        if content.__class__ is str and content and _extras_of(message) == _PLAIN:
            frame = self._frames.get(message.role, _UNKNOWN)
            if frame is _UNKNOWN:
                frame = self._frame(message.role)
            if frame is not None:
                try:
                    return (frame[0] + encode_basestring(content) + frame[1]).encode()
                except UnicodeEncodeError:
                    pass  # a lone surrogate: the driver's encoder names it
        return self._encode_message(message)

    def _encoded_all(self, messages: list[Message]) -> list[bytes]:
        """:meth:`_encoded` of each message; when all are plain (a first request's long
        history, most often), in C passes over them all."""
        contents = list(map(_content_of, messages))
        plain = (
            list(map(_extras_of, messages)).count(_PLAIN) == len(messages)
            and all(map(is_, map(type, contents), repeat(str)))
            and all(contents)
        )
        if plain:
            roles = list(map(_role_of, messages))
            for role in set(roles).difference(self._frames):
                self._frame(role)
            frames = list(map(self._frames.__getitem__, roles))
            if None not in frames:
                befores: list[str] = [frame[0] for frame in cast("list[tuple[str, str]]", frames)]
                afters = [frame[1] for frame in cast("list[tuple[str, str]]", frames)]
                # Not the ASCII escaper, though faster: it escapes DEL (U+007F), which
                # the driver's encoder sends as it is.
                framed = map(add, map(add, befores, map(encode_basestring, contents)), afters)
                try:
                    return list(map(str.encode, framed))
                except UnicodeEncodeError:
                    pass  # a lone surrogate: the driver's encoder names it
        return list(map(self._encoded, messages))

    def __len__(self) -> int:
        return len(self._recent) + len(self._previous)

    def __contains__(self, message: object) -> bool:
        return id(message) in self._recent or id(message) in self._previous

    def serves(self, messages: Sized) -> bool:
        """Whether a request carrying ``messages`` is encoded through the cache."""
        return len(messages) >= self._min_messages

    def get(self, message: Message) -> bytes:
        """The encoded JSON of ``message``, from the cache when it was encoded before."""
        encoded = self._recent.get(id(message))
        if encoded is None:
            encoded = self._previous.get(id(message))
            if encoded is None:
                encoded = self._encoded(message)
            self._remember([message], [encoded])
        return encoded

    def get_all(self, messages: Sequence[Message]) -> list[bytes]:
        """:meth:`get` of each of ``messages``, in order: the hits in one C pass, the
        misses encoded together (a driver's loop then takes them one by one)."""
        pieces = list(map(self._recent.get, map(id, messages)))  # the warm path: one C loop
        if None in pieces:
            self._fill(messages, pieces)
        return cast("list[bytes]", pieces)

    def encode(self, messages: tuple[Message, ...]) -> bytes:
        """The JSON array of ``messages``, each encoded once (callers ask :meth:`serves`
        first, and encode a short history without the cache)."""
        return b"[" + b",".join(self.get_all(messages)) + b"]"

    def _fill(self, messages: Sequence[Message], pieces: list[bytes | None]) -> None:
        """Put each missing message's JSON in ``pieces``: from the older generation, or
        encoded now; then remember them together."""
        missing = list(compress(messages, map(is_, pieces, repeat(None))))
        found = list(map(self._previous.get, map(id, missing)))
        if None in found:
            unknown = list(compress(missing, map(is_, found, repeat(None))))
            made = iter(self._encoded_all(unknown))
            found = [piece if piece is not None else next(made) for piece in found]
        places = iter(cast("list[bytes]", found))
        pieces[:] = [piece if piece is not None else next(places) for piece in pieces]
        self._remember(missing, cast("list[bytes]", found))

    def _remember(self, messages: list[Message], encoded: list[bytes]) -> None:
        """Keep ``encoded`` for ``messages`` in the newer generation, which becomes the
        older one when it fills; a JSON larger than a generation is not kept."""
        limit = self._generation_bytes
        sizes = list(map(len, encoded))
        if self._recent_bytes + sum(sizes) <= limit and max(sizes) <= limit:
            self._recent.update(zip(map(id, messages), encoded, strict=True))
            self._recent_held += messages
            self._recent_bytes += sum(sizes)
            return
        for message, piece, size in zip(messages, encoded, sizes, strict=True):
            if size > limit:
                continue
            if self._recent_bytes + size > limit:
                self._previous, self._previous_held = self._recent, self._recent_held
                self._recent, self._recent_held, self._recent_bytes = {}, [], 0
            self._recent[id(message)] = piece
            self._recent_held.append(message)
            self._recent_bytes += size


# --- decoding ----------------------------------------------------------------

NOT_JSON: Final = object()
"""What :func:`loads_or_not` returns for text that is not JSON."""


def loads_or_not(content: bytes | str) -> object:
    """``content`` decoded as JSON, or :data:`NOT_JSON`.

    No exception escapes: a ``JSONDecodeError`` keeps the whole text in its
    ``doc``, and as the ``__context__`` of an error raised while handling it,
    it would keep whatever secret a server echoed there.
    """
    if type(content) is str:
        # One streamed event's data is decoded per token: the decoder's own entry
        # point first, which json.loads reaches after two whitespace scans.
        try:
            value, end = _RAW_DECODE(content)
        except ValueError:
            pass  # leading whitespace, or not JSON: json.loads decides below
        else:
            if end == len(content):
                return value
    try:
        return json.loads(content)
    except ValueError:  # JSONDecodeError, or bytes that are not UTF-8
        return NOT_JSON


_RAW_DECODE = json.JSONDecoder().raw_decode


def json_kind(value: object) -> str:
    """The JSON name of ``value``'s kind, for error messages."""
    return "null" if value is None else type(value).__name__


def json_object(value: object, where: str) -> dict[str, Any]:
    """``value`` when it is a JSON object; otherwise ``MalformedResponse`` naming ``where``."""
    if not isinstance(value, dict):
        raise MalformedResponse(f"{where} should be a JSON object, not {json_kind(value)}")
    return value


def optional_str(obj: Mapping[str, Any], key: str, where: str) -> str | None:
    """``obj[key]`` when it is a string or absent; otherwise ``MalformedResponse``."""
    value = obj.get(key)
    if value is None or isinstance(value, str):
        return value
    raise MalformedResponse(f"{where}.{key} should be a string, not {json_kind(value)}")


def count_field(obj: Mapping[str, Any] | None, key: str, where: str) -> int:
    """``obj[key]`` as a token count (0 when absent); otherwise ``MalformedResponse``."""
    value = None if obj is None else obj.get(key)
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MalformedResponse(f"{where}.{key} should be a token count, not {value!r}")
    return value
