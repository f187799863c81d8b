"""Tool calls in the Chat Completions shape, which llama-cpp-python's chat formats share."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from threadline._messages import ToolCall

__all__ = ["tool_call_dicts"]


def tool_call_dicts(calls: Iterable[ToolCall]) -> list[dict[str, Any]]:
    """``calls`` as ``{"id", "type": "function", "function": {"name", "arguments"}}`` objects."""
    return [
        {
            "id": call.id,
            "type": "function",
            "function": {"name": call.name, "arguments": call.arguments},
        }
        for call in calls
    ]
