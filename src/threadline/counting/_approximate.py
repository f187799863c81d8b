"""``ApproximateCounter``: a cheap estimate that needs no tokenizer.

A message costs ``4 + ceil(utf8_bytes / 4)``, where ``utf8_bytes`` is the
UTF-8 size of everything in it that reaches the model as text: its text
parts, its ``name``, a tool result's ``tool_call_id``, each tool call's id,
name and arguments, and the reasoning pieces the replay projection says are
replayed. Images add the same fixed cost as in the built-in counter (85 at
low detail, else 765). A declared tool costs ``4 + ceil(utf8_bytes / 4)`` of
its name, description and JSON schema. There is no per-reply overhead.

Four bytes per token is about right for English prose and code in o200k_base,
and too high for most other text, so the estimate usually errs large.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from threadline._messages import ImagePart, Message
from threadline.counting._builtin import schema_json
from threadline.counting._framing import image_tokens
from threadline.counting._projection import DefaultReplayProjection
from threadline.counting._protocol import ModelTokenCounter
from threadline.tools._tools import Tool

if TYPE_CHECKING:
    from threadline.counting._protocol import ReplayProjection

__all__ = ["ApproximateCounter", "estimate_content_tokens", "estimate_message_tokens"]

MESSAGE_TOKENS = 4
"""The fixed part of an approximate message (and of a declared tool)."""

_DEFAULT_PROJECTION = DefaultReplayProjection()


def _utf8_size(text: str) -> int:
    # surrogatepass: a lone surrogate is sized, not an error (the driver refuses it).
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def estimate_content_tokens(text: str) -> int:
    """``ceil(utf8_bytes / 4)`` of ``text``: its estimated tokens, with no framing."""
    return math.ceil(_utf8_size(text) / 4)


def estimate_message_tokens(message: Message, projection: ReplayProjection | None = None) -> int:
    """``4 + ceil(utf8_bytes / 4)`` of ``message``'s text, plus fixed costs for images.

    ``projection`` picks the reasoning pieces to count (default:
    ``DefaultReplayProjection``).
    """
    size = 0
    images = 0
    content = message.content
    if isinstance(content, str):
        size += _utf8_size(content)
    else:
        for part in content:
            if isinstance(part, ImagePart):
                images += image_tokens(part)
            else:
                size += _utf8_size(part.text)
    if message.name:
        size += _utf8_size(message.name)
    if message.tool_call_id is not None:
        size += _utf8_size(message.tool_call_id)
    for call in message.tool_calls:
        size += _utf8_size(call.id) + _utf8_size(call.name) + _utf8_size(call.arguments)
    if message.reasoning is not None:
        pieces = (projection or _DEFAULT_PROJECTION).replayed_reasoning(message.reasoning)
        size += sum(map(_utf8_size, pieces))
    return MESSAGE_TOKENS + math.ceil(size / 4) + images


def estimate_tool_tokens(tool: Tool) -> int:
    """``4 + ceil(utf8_bytes / 4)`` of ``tool``'s name, description and JSON schema."""
    size = (
        _utf8_size(tool.name)
        + _utf8_size(tool.description)
        + _utf8_size(schema_json(tool.parameters))
    )
    return MESSAGE_TOKENS + math.ceil(size / 4)


class ApproximateCounter(ModelTokenCounter):
    """A tokenizer-free counter: ``4 + ceil(utf8_bytes / 4)`` per message.

    Useful where speed matters more than accuracy, or as the counter of a
    model whose tokenizer is unknown. ``projection`` picks the reasoning that
    is counted, as for the built-in counter.

    Example::

        ApproximateCounter().count([Message.user("hello world")])  # 4 + ceil(11 / 4) = 7
    """

    __slots__ = ("_projection",)

    def __init__(self, *, projection: ReplayProjection | None = None) -> None:
        self._projection = projection

    @property
    def projection(self) -> ReplayProjection | None:
        """The projection given, or ``None`` for the default one."""
        return self._projection

    def with_projection(self, projection: ReplayProjection) -> ApproximateCounter:
        """The same estimate, counting reasoning as ``projection`` replays it."""
        return ApproximateCounter(projection=projection)

    def for_projection(self, projection: ReplayProjection) -> ApproximateCounter:
        """Counting reasoning as ``projection`` replays it, unless given a projection of its own.

        ``resolve_token_counter`` passes the driver's replay projection here.
        """
        return self if self._projection is not None else self.with_projection(projection)

    def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        """The estimated prompt tokens of ``messages`` and ``tools``."""
        projection = self._projection
        total = sum(estimate_message_tokens(message, projection) for message in messages)
        return total + self.overhead_tokens(tools)

    def message_tokens(self, message: Message) -> int:
        """What ``message`` adds to a transcript's count."""
        return estimate_message_tokens(message, self._projection)

    def overhead_tokens(self, tools: Sequence[Tool] = ()) -> int:
        """The declared tools' estimated cost; nothing else."""
        return sum(map(estimate_tool_tokens, tools))

    def __repr__(self) -> str:
        return f"ApproximateCounter(projection={self._projection!r})"
