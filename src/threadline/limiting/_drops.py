"""What a limiting step removed, kept raw until the ledger is read.

A step records each handler's removals as spans of the transcript it was
given (:class:`Drops`); the :class:`~threadline.limiting._ledger.DroppedUnit`
values are made from them only when someone reads ``LimitingRecord.dropped``.
"""

from __future__ import annotations

import bisect
import itertools
import operator
from collections.abc import Sequence

from threadline._messages import Message
from threadline.limiting._ledger import DroppedUnit, Phase
from threadline.limiting._units import unit_kind

__all__ = ["Drops", "starts_after", "units_dropped"]


class Drops:
    """What one handler removed, kept raw until the ledger is read.

    ``removed`` are ``(start, end)`` spans of the transcript the handler was
    given, ``sources`` where its messages came from in the step's input,
    ``notes`` the reasons the handler gave (``(first, end, reason)`` over the
    same positions, later ones winning).
    """

    __slots__ = ("default_reason", "name", "notes", "phase", "removed", "sources")

    def __init__(
        self,
        name: str,
        phase: Phase,
        removed: list[tuple[int, int]],
        sources: Sequence[int | None],
        notes: list[tuple[int, int, str]],
        default_reason: str,
    ) -> None:
        self.name = name
        self.phase = phase
        self.removed = removed
        self.sources = sources
        self.notes = notes
        self.default_reason = default_reason

    def units(self, original: Sequence[Message], starts: list[int]) -> list[DroppedUnit]:
        """The units of ``original`` (beginning at ``starts``) that lost a message here.

        A message a handler added has no unit in the input and is left out.
        Sources only grow along the transcript, so one walk over the units does it.
        """
        notes: dict[int, str] = {}
        for first, end, reason in self.notes:
            notes.update(zip(range(first, end), itertools.repeat(reason)))
        found: list[tuple[int, str | None]] = []  # (unit number, noted reason)
        k = 0
        for start, end in self.removed:
            for index in range(start, end):
                source = self.sources[index]
                if source is None:
                    continue
                while k + 1 < len(starts) and starts[k + 1] <= source:
                    k += 1
                note = notes.get(index)
                if found and found[-1][0] == k:
                    if found[-1][1] is None:
                        found[-1] = (k, note)
                else:
                    found.append((k, note))
        dropped: list[DroppedUnit] = []
        for k, note in found:
            start = starts[k]
            end = starts[k + 1] if k + 1 < len(starts) else len(original)
            unit = original[start:end]
            dropped.append(
                DroppedUnit(
                    handler=self.name,
                    phase=self.phase,
                    kind=unit_kind(unit[0]),
                    start=start,
                    end=end,
                    roles=tuple(m.role for m in unit),
                    reason=note or self.default_reason,
                )
            )
        return dropped


def units_dropped(
    drops: list[Drops], original: Sequence[Message], starts: list[int]
) -> list[DroppedUnit]:
    return [unit for run in drops for unit in run.units(original, starts)]


def starts_after(starts: list[int], removed: list[tuple[int, int]]) -> list[int]:
    """Where units start once the ``removed`` spans, whole units in order, are gone.

    The starts between two spans move back by what went before them: slices
    of ``starts``, found by bisection, with no walk over the messages.
    """
    if not removed:
        return starts
    kept: list[int] = []
    shift = at = 0
    for start, end in removed:
        before = bisect.bisect_left(starts, start, at)
        kept += (
            map(operator.sub, starts[at:before], itertools.repeat(shift))
            if shift
            else starts[at:before]
        )
        shift += end - start
        at = bisect.bisect_left(starts, end, before)
    kept += map(operator.sub, starts[at:], itertools.repeat(shift))
    return kept
