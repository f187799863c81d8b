"""What running a tool call gives back: ``ToolResult``, ``ToolOutcome`` and their text.

A tool's return value becomes the text of its tool message here, and every
way a call can fail (bad arguments, an unknown tool, a function that raised or
ran past its time limit) becomes an error outcome whose text starts with
``error:``, so the model can read it and recover.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from threadline._errors import InvalidRequestError, ToolArgumentsError, ToolError
from threadline._messages import ContentPart, ImagePart, Message, Origin, Role, TextPart, ToolCall
from threadline._validate import fail
from threadline.serialization._json import json_default

__all__ = [
    "ToolOutcome",
    "ToolResult",
    "clamped",
    "describe_exception",
    "reported_error_outcome",
    "result_message",
    "result_text",
    "timed_out_outcome",
    "unknown_tool_outcome",
    "without_images",
]

_DETAIL_LIMIT = 2_000
"""The most characters of an exception's message a model is shown."""


def _to_injected(value: str | Message | Iterable[str | Message]) -> tuple[Message, ...]:
    items: Iterable[str | Message] = [value] if isinstance(value, str | Message) else value
    if not isinstance(items, Iterable) or isinstance(items, bytes | bytearray):
        fail("inject", "a str, a Message or a list of them", value)
    injected = []
    for index, item in enumerate(items):
        if isinstance(item, str):
            injected.append(Message.user(item, origin=Origin.INJECTION))
        elif isinstance(item, Message):
            if item.role is Role.TOOL or item.tool_calls:
                raise InvalidRequestError(
                    f"injected message {index} is a tool exchange; inject user or system "
                    "messages (the tool's own answer is the result's content)"
                )
            injected.append(item.with_origin(Origin.INJECTION))
        else:
            raise InvalidRequestError(
                f"injected message {index} has type {type(item).__name__}; use a str or a Message"
            )
    return tuple(injected)


@attrs.frozen
class ToolResult:
    """What a tool returns when it also has context to add to the run.

    ``content`` is the tool's answer, turned into text like any return value;
    a tuple of ``TextPart`` and ``ImagePart`` is kept as parts (an image
    reaches the model where its driver takes images in tool results, else a
    note says one was left out). ``is_error`` makes the answer an error
    result (its text starts ``error:``), as a failing tool's is. Each
    ``inject`` item is added to the transcript after the tool results with
    origin ``Origin.INJECTION``: pinned until the model answers, never
    persisted. A ``str`` becomes a user message; a ``Message`` keeps its role
    and gets the injection origin.

    Example::

        @tool
        def open_ticket(ticket_id: str) -> ToolResult:
            ticket = tickets.load(ticket_id)
            return ToolResult(ticket.summary, inject=[f"Ticket body:\\n{ticket.body}"])

    Raises:
        InvalidRequestError: an injected item that is not a str or a Message,
            or a tool message or a message with tool calls (which would break
            the transcript's tool exchanges).
    """

    content: Any = None
    inject: tuple[Message, ...] = attrs.field(default=(), converter=_to_injected, kw_only=True)
    is_error: bool = attrs.field(default=False, kw_only=True)


def result_message(call: ToolCall, name: str, content: Any) -> Message:
    """The tool message of ``content``: parts kept as parts, anything else as text.

    Raises:
        TypeError, ValueError: a value with no JSON form (see :func:`result_text`).
    """
    if isinstance(content, tuple) and content and all(_is_part(p) for p in content):
        return Message(
            role=Role.TOOL, content=content, tool_call_id=call.id, name=name, origin=Origin.TURN
        )
    return Message.tool(call.id, result_text(content), name=name, origin=Origin.TURN)


def _is_part(value: object) -> bool:
    return isinstance(value, TextPart | ImagePart)


def result_text(value: Any) -> str:
    """A tool's return value as the text of its tool message.

    A ``str`` is kept as it is, ``None`` is empty, anything else is JSON
    (Enum members as their values, attrs and dataclass instances as objects,
    dates in ISO form).

    Raises:
        TypeError: a value with no JSON form.
    """
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return json.dumps(value, default=json_default, ensure_ascii=False)


@attrs.frozen(kw_only=True)
class ToolOutcome:
    """What running one tool call produced.

    ``message`` is the tool message for the transcript (origin ``TURN``);
    ``is_error`` tells whether its text reports a failure (bad arguments, an
    unknown tool, the function raised), in which case ``exception`` holds the
    cause. ``injected`` are the messages the tool added (origin
    ``INJECTION``).
    """

    call: ToolCall
    message: Message
    is_error: bool = False
    exception: BaseException | None = attrs.field(default=None, eq=False)
    injected: tuple[Message, ...] = ()

    @property
    def text(self) -> str:
        """The tool message's text."""
        return self.message.text

    @classmethod
    def failure(
        cls, call: ToolCall, reason: str, exception: BaseException, *, name: str | None = None
    ) -> ToolOutcome:
        """An error outcome whose message reads ``error: <reason>``."""
        message = Message.tool(
            call.id, f"error: {reason}", name=name or call.name, origin=Origin.TURN
        )
        return cls(call=call, message=message, is_error=True, exception=exception)


def unknown_tool_outcome(call: ToolCall, available: Iterable[str]) -> ToolOutcome:
    """The error outcome for a call to a tool that is not offered."""
    names = ", ".join(available) or "none"
    reason = f"unknown tool {call.name!r}; available: {names}"
    return ToolOutcome.failure(call, reason, ToolArgumentsError(reason))


def reported_error_outcome(call: ToolCall, name: str, text: str) -> ToolOutcome:
    """The error outcome of a tool that answered with an error of its own (``is_error``)."""
    return ToolOutcome.failure(call, text, ToolError(f"tool {name!r} reported an error"), name=name)


def timed_out_outcome(call: ToolCall, name: str, seconds: float) -> ToolOutcome:
    """The error outcome for a call that ran past its time limit of ``seconds``."""
    reason = f"the tool did not finish within its time limit of {seconds:g} s and was given up on"
    exception = TimeoutError(f"tool {name!r} ran past its time limit of {seconds:g} s")
    return ToolOutcome.failure(call, reason, exception, name=name)


def describe_exception(exc: BaseException, *, kind: bool = True) -> str:
    """``"LookupError: no such city"`` (``kind=False``: only the message), safely: a
    message that cannot be read, or one too long to show a model, does not stop it."""
    name = type(exc).__name__
    try:
        detail = str(exc)
    except Exception:
        return f"{name} (its message could not be read)"
    if len(detail) > _DETAIL_LIMIT:
        detail = detail[: _DETAIL_LIMIT - 3] + "..."
    if not kind and detail:
        return detail
    return f"{name}: {detail}" if detail else name


# ---------------------------------------------------------------------------
# What a result may be when it enters the transcript


def without_images(outcome: ToolOutcome) -> ToolOutcome:
    """``outcome`` with each image of its message replaced by a note, for a driver
    that cannot send images in tool results."""
    content = outcome.message.content
    if isinstance(content, str) or not any(isinstance(p, ImagePart) for p in content):
        return outcome
    parts = tuple(_image_note(p) if isinstance(p, ImagePart) else p for p in content)
    return attrs.evolve(outcome, message=_with_content(outcome.message, parts))


def _image_note(part: ImagePart) -> TextPart:
    kind = part.url[5:].partition(";")[0] if part.url.startswith("data:") else "by URL"
    return TextPart(
        text=f"[the tool returned an image ({kind or 'image'}) that this model's driver "
        "cannot take in a tool result; it was left out]"
    )


def _with_content(message: Message, content: str | tuple[ContentPart, ...]) -> Message:
    return Message(
        role=message.role,
        content=content,
        tool_call_id=message.tool_call_id,
        name=message.name,
        origin=message.origin,
    )


def clamped(outcome: ToolOutcome, limit: int, count: Callable[[Message], int]) -> ToolOutcome:
    """``outcome`` with its message's text cut to ``limit`` tokens (``count`` counts a
    message), a marker at the cut saying how much was left out; as it was when it fits.

    Images are kept; only text is cut. Made once, when a result enters the
    transcript, so the result the model saw never changes afterwards.
    """
    message = outcome.message
    tokens = count(message)
    if tokens <= limit:
        return outcome
    text = message.text
    images = () if isinstance(message.content, str) else message.content
    images = tuple(p for p in images if isinstance(p, ImagePart))
    keep = int(len(text) * limit / tokens * 0.9)
    for _ in range(12):
        marker = (
            f"\n[threadline cut this result: {len(text) - keep:,} of {len(text):,} characters "
            f"left out; it was about {tokens:,} tokens, over this tool's limit of {limit:,}]"
        )
        kept = text[:keep] + marker
        candidate = _with_content(message, (TextPart(text=kept), *images) if images else kept)
        if keep == 0 or count(candidate) <= limit:
            break
        keep = int(keep * 0.8)
    return attrs.evolve(outcome, message=candidate)
