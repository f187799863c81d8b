"""What running a tool call gives back: ``ToolResult``, ``ToolOutcome`` and their text.

A tool's return value becomes the text of its tool message here, and every
way a call can fail (bad arguments, an unknown tool, a function that raised or
ran past its time limit) becomes an error outcome whose text starts with
``error:``, so the model can read it and recover.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import attrs

from threadline._errors import InvalidRequestError, ToolArgumentsError
from threadline._messages import Message, Origin, Role, ToolCall
from threadline._validate import fail
from threadline.serialization._json import json_default

__all__ = [
    "ToolOutcome",
    "ToolResult",
    "describe_exception",
    "result_text",
    "timed_out_outcome",
    "unknown_tool_outcome",
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

    ``content`` is the tool's answer, turned into text like any return value.
    Each ``inject`` item is added to the transcript after the tool results
    with origin ``Origin.INJECTION``: pinned until the model answers, never
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
