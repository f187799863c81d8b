"""The typed events a streamed run yields, in the order they happen.

A round yields zero or one ``LimitApplied`` (when the transcript was over
budget), then ``TextDelta`` / ``ReasoningDelta`` as the reply arrives, then a
``ToolCallEvent`` per tool call and a ``ToolResultEvent`` per result, then
``RoundDone``. The run ends with one ``FinalResult`` carrying the
``RunResult`` that ``Request.run()`` would have returned.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, TypeAlias

import attrs

from threadline._messages import Message, ToolCall

if TYPE_CHECKING:
    from threadline._result import RoundRecord, RunResult
    from threadline.limiting._ledger import LimitingRecord

__all__ = [
    "FinalResult",
    "LimitApplied",
    "ReasoningDelta",
    "RoundDone",
    "StreamEvent",
    "TextDelta",
    "ToolCallEvent",
    "ToolResultEvent",
]


@attrs.frozen(kw_only=True)
class TextDelta:
    """A piece of the assistant's reply text."""

    text: str
    round: int


@attrs.frozen(kw_only=True)
class ReasoningDelta:
    """A piece of the assistant's display reasoning."""

    text: str
    round: int


@attrs.frozen(kw_only=True)
class ToolCallEvent:
    """The model called a tool; its result follows as a ``ToolResultEvent``."""

    call: ToolCall
    round: int


@attrs.frozen(kw_only=True)
class ToolResultEvent:
    """A tool finished. ``is_error`` when it raised or got bad arguments."""

    call: ToolCall
    message: Message
    is_error: bool
    round: int


@attrs.frozen(kw_only=True)
class LimitApplied:
    """The transcript was over budget and the limiting handlers ran.

    ``str(event)`` is the record's one-line summary (``LimitingRecord.summary``).
    """

    record: LimitingRecord
    round: int
    """The round of the run, from 1."""

    def __str__(self) -> str:
        return self.record.summary()


@attrs.frozen(kw_only=True)
class RoundDone:
    """One provider call and its tool executions are complete."""

    record: RoundRecord

    @property
    def round(self) -> int:
        return self.record.round


@attrs.frozen(kw_only=True)
class FinalResult:
    """The run is complete; ``output`` is the validated answer of a run with an
    ``output_type`` (its text otherwise)."""

    result: RunResult[Any]

    @property
    def output(self) -> Any:
        """``result.output``."""
        return self.result.output


StreamEvent: TypeAlias = (
    TextDelta
    | ReasoningDelta
    | ToolCallEvent
    | ToolResultEvent
    | LimitApplied
    | RoundDone
    | FinalResult
)
