"""The transcript's value types: messages, tool calls, reasoning and usage.

Everything here is data only: frozen, slotted, keyword-only attrs classes whose
sequences are tuples, so a message can be shared, hashed and cached without
anyone changing it under you. Serialization lives in ``_serialization``;
wire formats live in the drivers.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Iterable, Mapping
from typing import Any, TypeAlias, cast

import attrs

from threadline._errors import InvalidRequestError, ToolArgumentsError
from threadline._validate import fail

__all__ = [
    "ContentPart",
    "ImagePart",
    "Message",
    "Origin",
    "Reasoning",
    "Role",
    "TextPart",
    "ToolCall",
    "Usage",
]


class Role(enum.StrEnum):
    """Who speaks a message."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    TOOL = "tool"


class Origin(enum.StrEnum):
    """Where a message came from, which decides whether it is persisted.

    ``SEED``: history the caller passed in (already theirs).
    ``TURN``: this run's output: the submitted prompt, replies, tool results.
    ``INJECTION``: ephemeral context added during a run; never persisted.
    """

    SEED = "seed"
    TURN = "turn"
    INJECTION = "injection"


# A saved transcript must load again: a field of the wrong type is refused here.
_optional_str = attrs.validators.optional(attrs.validators.instance_of(str))


def _count(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    # ``True`` is an int to Python; as a token count it is a provider's (or a caller's)
    # mistake that calibration would otherwise learn from as 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{attribute.name} must be an int token count, not {value!r}")


@attrs.frozen(kw_only=True, cache_hash=True)
class TextPart:
    """A piece of text inside a multi-part message."""

    text: str = attrs.field(validator=attrs.validators.instance_of(str))


@attrs.frozen(kw_only=True, cache_hash=True)
class ImagePart:
    """An image, by URL (``https://`` or a ``data:`` URL)."""

    url: str = attrs.field(validator=attrs.validators.instance_of(str))
    detail: str | None = attrs.field(default=None, validator=_optional_str)


ContentPart: TypeAlias = TextPart | ImagePart
Content: TypeAlias = str | tuple[ContentPart, ...]


@attrs.frozen(kw_only=True, cache_hash=True)
class ToolCall:
    """A tool call the model made.

    ``arguments`` is the raw JSON text the model sent, kept exactly; call
    :meth:`parsed` to decode it.
    """

    id: str = attrs.field(validator=attrs.validators.instance_of(str))
    name: str = attrs.field(validator=attrs.validators.instance_of(str))
    arguments: str = attrs.field(default="{}", validator=attrs.validators.instance_of(str))

    def parsed(self) -> Any:
        """Decode ``arguments``.

        Raises:
            ToolArgumentsError: the arguments are not valid JSON.
        """
        try:
            return json.loads(self.arguments) if self.arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise ToolArgumentsError(
                f"tool call {self.id!r} to {self.name!r} has arguments that are not valid "
                f"JSON ({exc.msg} at position {exc.pos}): {self.arguments[:200]!r}"
            ) from None
        except RecursionError:
            raise ToolArgumentsError(
                f"tool call {self.id!r} to {self.name!r} has arguments nested too deeply to read"
            ) from None


def _to_bytes(value: bytes | str | None) -> bytes:
    if value is None:
        return b""
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise TypeError(f"provider_reasoning must be bytes or str, not {type(value).__name__}")


@attrs.frozen(kw_only=True, cache_hash=True)
class Reasoning:
    """The model's reasoning attached to an assistant message.

    ``text`` is what a person may be shown. ``provider_reasoning`` is the
    provider's opaque replay state as JSON bytes, kept byte for byte and never
    displayed, interpreted or rewritten. ``provider`` names the driver and
    model that produced it (``"anthropic:claude-sonnet-4-5"``), so a replay to
    another provider can drop it.
    """

    text: str = attrs.field(default="", validator=attrs.validators.instance_of(str))
    provider_reasoning: bytes = attrs.field(default=b"", converter=_to_bytes)
    provider: str | None = attrs.field(default=None, validator=_optional_str)

    def has_provider_reasoning(self) -> bool:
        """True when ``provider_reasoning`` holds something: not empty, blank or ``null``."""
        return has_provider_reasoning(self.provider_reasoning)


def has_provider_reasoning(raw: bytes) -> bool:
    """Apply the "empty, blank or ``null`` means no reasoning" rule to raw bytes."""
    stripped = raw.strip()
    return bool(stripped) and stripped != b"null"


def _choice(name: str, kind: type[enum.Enum], value: Any) -> Any:
    """``kind(value)``, or a refusal naming the argument and the choices."""
    try:
        return kind(value)
    except ValueError:
        choices = ", ".join(str(member.value) for member in kind)
        fail(name, f"one of {choices}", value)


def _to_role(value: Any) -> Role:
    role: Role = _choice("role", Role, value)
    return role


def _to_origin(value: Any) -> Origin:
    origin: Origin = _choice("origin", Origin, value)
    return origin


def _is_sequence(value: object) -> bool:
    # A str, bytes or a mapping is iterable too, but never a list of items.
    return isinstance(value, Iterable) and not isinstance(value, str | bytes | bytearray | Mapping)


def _to_content(value: str | Iterable[ContentPart]) -> Content:
    if isinstance(value, str):
        return value
    if not _is_sequence(value):
        fail("content", "a str or a sequence of TextPart and ImagePart", value)
    parts = tuple(value)
    for index, part in enumerate(parts):
        if not isinstance(part, TextPart | ImagePart):
            raise InvalidRequestError(
                f"content part {index} is a {type(part).__name__}; "
                "use threadline.TextPart or threadline.ImagePart"
            )
    return parts


def _to_tool_calls(value: Iterable[ToolCall]) -> tuple[ToolCall, ...]:
    if not _is_sequence(value):
        fail("tool_calls", "a sequence of ToolCall", value)
    calls = tuple(value)
    for index, call in enumerate(calls):
        if not isinstance(call, ToolCall):
            raise InvalidRequestError(
                f"tool call {index} is a {type(call).__name__}; use threadline.ToolCall"
            )
    return calls


def _validate_message(message: Message) -> None:
    role = message.role
    if message.tool_calls and role is not Role.ASSISTANT:
        raise InvalidRequestError(f"only assistant messages carry tool calls, not {role}")
    if role is Role.TOOL and not message.tool_call_id:
        raise InvalidRequestError("a tool message needs the tool_call_id it answers")
    if role is not Role.TOOL and message.tool_call_id is not None:
        raise InvalidRequestError(f"only tool messages carry a tool_call_id, not {role}")
    if message.reasoning is not None and role is not Role.ASSISTANT:
        raise InvalidRequestError(f"only assistant messages carry reasoning, not {role}")


class _MessageSlots:
    """What a message keeps beside its fields, never compared, hashed, printed or saved:
    its ``seed`` copy, made once when first asked for (see ``Message.with_origin``),
    and the built-in counter's price of it (``counting._builtin``), so neither needs
    a process-wide map beside the message."""

    __slots__ = ("_count_cost", "_seed_copy")


@attrs.frozen(kw_only=True, cache_hash=True)
class Message(_MessageSlots):
    """One message of a transcript.

    Build them with the constructors::

        Message.system("You are terse.")
        Message.user("What is 2 + 2?")
        Message.assistant("4")
        Message.tool("call_1", '{"temp": 21}')

    Raises:
        InvalidRequestError: a field that does not fit the role (tool calls on
            a user message, a tool result without the call id it answers).
    """

    role: Role = attrs.field(converter=_to_role)
    content: Content = attrs.field(default="", converter=_to_content)
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=_to_tool_calls)
    tool_call_id: str | None = attrs.field(default=None, validator=_optional_str)
    name: str | None = attrs.field(default=None, validator=_optional_str)
    reasoning: Reasoning | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(Reasoning))
    )
    origin: Origin = attrs.field(default=Origin.SEED, converter=_to_origin)

    def __attrs_post_init__(self) -> None:
        _validate_message(self)
        # No cost yet, and whether the built-in counter may price the message as plain
        # text (0) or must read its other fields (-1): it reads this slot of every
        # message it counts (an unset one costs it an AttributeError).
        plain = type(self.content) is str and self.name is None and not self.tool_calls
        plain = plain and self.tool_call_id is None and self.reasoning is None
        object.__setattr__(self, "_count_cost", 0 if plain else -1)

    @classmethod
    def system(cls, content: str, *, origin: Origin = Origin.SEED) -> Message:
        """A system (instructions) message."""
        return cls(role=Role.SYSTEM, content=content, origin=origin)

    @classmethod
    def user(
        cls,
        content: str | Iterable[ContentPart],
        *,
        name: str | None = None,
        origin: Origin = Origin.SEED,
    ) -> Message:
        """A user message: text, or a sequence of text and image parts."""
        return cls(role=Role.USER, content=content, name=name, origin=origin)

    @classmethod
    def assistant(
        cls,
        content: str = "",
        *,
        tool_calls: Iterable[ToolCall] = (),
        reasoning: Reasoning | None = None,
        name: str | None = None,
        origin: Origin = Origin.SEED,
    ) -> Message:
        """An assistant reply, possibly carrying tool calls and reasoning."""
        return cls(
            role=Role.ASSISTANT,
            content=content,
            tool_calls=tool_calls,
            reasoning=reasoning,
            name=name,
            origin=origin,
        )

    @classmethod
    def tool(
        cls,
        tool_call_id: str,
        content: str,
        *,
        name: str | None = None,
        origin: Origin = Origin.SEED,
    ) -> Message:
        """The result of the tool call ``tool_call_id``."""
        return cls(
            role=Role.TOOL,
            content=content,
            tool_call_id=tool_call_id,
            name=name,
            origin=origin,
        )

    @property
    def text(self) -> str:
        """The message's text: the content, or its text parts joined."""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content if isinstance(part, TextPart))

    def with_origin(self, origin: Origin) -> Message:
        """The same message with another origin.

        The ``seed`` copy is made once and kept by the message: asking again
        for it returns that very copy (a request's history is re-origined as
        seed on every call, and a stable copy is counted once).
        """
        if origin is self.origin:
            return self
        if origin is not Origin.SEED:
            return _copy_with_origin(self, origin)
        twin: Message | None = getattr(self, "_seed_copy", None)
        if twin is None:
            twin = _copy_with_origin(self, origin)
            object.__setattr__(self, "_seed_copy", twin)  # not a field: frozen as it was
        return twin


def _copy_with_origin(message: Message, origin: Origin) -> Message:
    # The fields are valid already: copied without converters or validators,
    # through attrs' own pickling state (whose __setstate__ resets the cached hash).
    state: dict[str, Any] = cast(Any, message).__getstate__()
    state["origin"] = origin
    copy = object.__new__(Message)
    cast(Any, copy).__setstate__(state)
    # The built-in counter's price does not depend on the origin: the copy keeps it.
    object.__setattr__(copy, "_count_cost", getattr(message, "_count_cost", -1))
    return copy


@attrs.frozen(kw_only=True)
class Usage:
    """Tokens a provider reported for one call, or a sum of calls (``+``).

    Raises:
        TypeError: a count that is not an int (``True`` is not a count).
    """

    input_tokens: int = attrs.field(default=0, validator=_count)
    output_tokens: int = attrs.field(default=0, validator=_count)
    cached_input_tokens: int = attrs.field(default=0, validator=_count)
    reasoning_tokens: int = attrs.field(default=0, validator=_count)

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cached_input_tokens=self.cached_input_tokens + other.cached_input_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
        )

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens
