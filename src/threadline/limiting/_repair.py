"""Repairing a history's interrupted tool calls, when a request asks for it.

A history from elsewhere can break a tool unit in two ways that say nothing
false about what happened: a process died while a tool ran, so the last call
has no result; or a framework kept a result whose call it did not keep. Such
a history is refused (:func:`~threadline.limiting._units.check_integrity`),
unless the request sets ``repair_interrupted_tool_calls``; then
:func:`repair_tool_units` mends it:

- a call without a result gets one, :data:`INTERRUPTED_RESULT`, after the
  results its exchange has (in call order);
- a result that answers no call of the exchange just before it (a call never
  made, one answered already, or one whose exchange a message closed before
  the result came) is dropped.

The repair is deterministic and idempotent (a repaired history is whole, so
repairing it again changes nothing), and it touches only the broken units:
every other message is kept as the very object it was, so a provider's cached
prefix holds up to the first repaired unit. A call id used twice is not
mended: the history is still refused, naming it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from threadline._errors import TranscriptIntegrityError
from threadline._messages import Message, Role, ToolCall
from threadline.limiting._ledger import ToolCallRepair
from threadline.limiting._units import check_integrity

__all__ = ["INTERRUPTED_RESULT", "repair_tool_units"]

INTERRUPTED_RESULT: Final = "error: the tool call was interrupted before it returned a result"
"""The result an interrupted call gets: read by the model, and sent as a failed tool
(threadline's ``error: ...`` results; Anthropic's ``is_error``)."""


def repair_tool_units(
    messages: Sequence[Message], *, offset: int = 0
) -> tuple[tuple[Message, ...], tuple[ToolCallRepair, ...]]:
    """``messages`` with interrupted calls answered and orphan results dropped, and what
    was repaired (``offset``: where ``messages`` stand in the transcript, for the
    record's indices). A whole history comes back as it is, with no record.
    """
    try:
        check_integrity(messages)
    except TranscriptIntegrityError:
        pass
    else:
        return tuple(messages), ()
    repaired: list[Message] = []
    repairs: list[ToolCallRepair] = []
    pending: dict[str, ToolCall] = {}  # the calls of the open exchange not answered yet
    caller = 0  # where the open exchange's assistant message stands in ``messages``
    for index, message in enumerate(messages):
        if message.role is Role.TOOL:
            call_id = message.tool_call_id or ""
            if pending.pop(call_id, None) is not None:
                repaired.append(message)
            else:
                repairs.append(ToolCallRepair(kind="orphan", index=offset + index, call_id=call_id))
            continue
        _answer(pending, offset + caller, repaired, repairs)
        repaired.append(message)
        if message.tool_calls:
            pending = {call.id: call for call in message.tool_calls}
            caller = index
    _answer(pending, offset + caller, repaired, repairs)
    return tuple(repaired), tuple(repairs)


def _answer(
    pending: dict[str, ToolCall],
    caller: int,
    repaired: list[Message],
    repairs: list[ToolCallRepair],
) -> None:
    """Close the open exchange: each call still pending gets the interrupted result."""
    for call in pending.values():
        repaired.append(Message.tool(call.id, INTERRUPTED_RESULT))
        repairs.append(
            ToolCallRepair(kind="interrupted", index=caller, call_id=call.id, tool=call.name)
        )
    pending.clear()
