"""The transcript as units: what limiting may drop, what it must keep, and whether it is whole.

A transcript is cut only at unit borders. A unit is one of:

- a system message;
- a user message;
- an assistant message without tool calls;
- a *tool exchange*: an assistant message with tool calls plus the ``tool``
  results that follow it, one per call.

Some units are **pinned**: always counted, never dropped.

- The first system message.
- The current prompt: the message at ``prompt_index`` (the user message this
  run answers). Left out, it is the last user message that is not an
  injection.
- The live tool exchange: the last tool exchange after the current prompt,
  when no assistant message follows it yet (the model has not seen its
  results). Earlier exchanges of the same run are complete: the model has
  answered them with its next message, so they are droppable, oldest first.
- Every unanswered injection: a message of origin ``INJECTION`` with no
  assistant message after it.

Everything else is droppable: older user and assistant messages, completed
tool exchanges, later system messages.

:func:`check_integrity` refuses a transcript that cannot be sent: a result
answering no call, a call with no result, a result separated from its call,
a call id used twice. A trailing assistant message whose results have not
been appended yet is refused too: the run loop appends every result before
the next send, so a transcript about to be sent never has a pending call.
"""

from __future__ import annotations

import bisect
import enum
from collections.abc import Iterator, Mapping, Sequence
from operator import attrgetter
from typing import NoReturn, overload

import attrs

from threadline._errors import InvalidRequestError, TranscriptIntegrityError
from threadline._messages import Message, Origin, Role, ToolCall

__all__ = [
    "PinReason",
    "Unit",
    "UnitKind",
    "Units",
    "check_integrity",
    "checked_unit_starts",
    "current_prompt_index",
    "listing",
    "match_messages",
    "one_run",
    "pinned_messages",
    "pinned_units",
    "spans_of",
    "split_units",
    "unit_kind",
    "unit_starts",
    "units_for",
]


class UnitKind(enum.StrEnum):
    """What a unit is made of."""

    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"
    """An assistant message without tool calls."""
    TOOL_EXCHANGE = "tool_exchange"
    """An assistant message with tool calls plus all their results."""


class PinReason(enum.StrEnum):
    """Why a unit may not be dropped."""

    FIRST_SYSTEM = "first system message"
    CURRENT_PROMPT = "current prompt"
    LIVE_TOOL_EXCHANGE = "live tool exchange"
    UNANSWERED_INJECTION = "unanswered injection"


@attrs.frozen(kw_only=True)
class Unit:
    """A run of messages that is kept or dropped as a whole: ``messages[start:end]``.

    ``reason`` says why a pinned unit is pinned, and is ``None`` for a
    droppable one.
    """

    kind: UnitKind
    start: int
    end: int
    reason: PinReason | None = None

    @property
    def pinned(self) -> bool:
        """True when the unit is always kept."""
        return self.reason is not None

    @property
    def indices(self) -> range:
        """The positions of the unit's messages in the transcript."""
        return range(self.start, self.end)

    def __len__(self) -> int:
        return self.end - self.start


def check_integrity(messages: Sequence[Message]) -> None:
    """Raise when the transcript's tool units are not whole.

    Checks, in transcript order, that every ``tool`` result directly follows
    the assistant message that made its call (possibly after that call's
    other results), that every call has exactly one result, and that no call
    id is used twice. A trailing call whose result is not there yet is
    refused too (see the module docstring).

    Raises:
        TranscriptIntegrityError: naming the first broken message (``index``)
            and what is wrong with it (``reason``).
    """
    checked_unit_starts(messages)


def checked_unit_starts(messages: Sequence[Message]) -> list[int]:
    """:func:`check_integrity` and :func:`unit_starts` in one walk over ``messages``.

    The walk expects each exchange's results right after it, in the order of its
    calls, which is how the run loop appends them: a result is then checked
    against the one call it must answer, and only the call ids go into a set.
    Anything else (results in another order, or a broken transcript) is walked
    again by :func:`_walked_unit_starts`, which tells the two apart and names
    what is broken.

    Raises:
        TranscriptIntegrityError: as :func:`check_integrity` does.
    """
    if _TOOL not in map(_role_of, messages) and not any(map(_calls_of, messages)):
        # No tool exchange (most long histories): whole, and each message is a unit of
        # its own, found in two C passes.
        return list(range(len(messages)))
    starts: list[int] = []
    add_start = starts.append
    seen: set[str] = set()
    due: tuple[ToolCall, ...] = ()  # the calls of the exchange being read
    answered = calls = 0  # how many of them have their result, of how many
    tool = _TOOL
    for index, message in enumerate(messages):
        if message.role is tool:
            if answered < calls and message.tool_call_id == due[answered].id:
                answered += 1
                continue
            return _walked_unit_starts(messages)
        if answered != calls:
            return _walked_unit_starts(messages)
        add_start(index)
        if message.tool_calls:
            due = message.tool_calls
            answered, calls = 0, len(due)
            for call in due:
                if call.id in seen:
                    return _walked_unit_starts(messages)
                seen.add(call.id)
    if answered != calls:
        return _walked_unit_starts(messages)
    return starts


def _walked_unit_starts(messages: Sequence[Message]) -> list[int]:
    """:func:`checked_unit_starts` for any transcript: results in any order after
    their exchange, each call answered once, and the first fault named."""
    starts: list[int] = []
    add_start = starts.append
    calls_at: dict[str, int] = {}  # call id -> index of the assistant message that made it
    open_calls: dict[str, str] = {}  # call id -> tool name, for the exchange being read
    exchange_start = -1
    tool = _TOOL
    for index, message in enumerate(messages):
        if message.role is tool:
            call_id = message.tool_call_id or ""
            if call_id not in open_calls:
                _raise_misplaced_result(call_id, index, calls_at, exchange_start)
            del open_calls[call_id]
            continue
        add_start(index)
        if open_calls:
            _raise_missing_results(messages, exchange_start, open_calls)
        if message.tool_calls:
            exchange_start = index
            for call in message.tool_calls:
                if call.id in calls_at:
                    raise TranscriptIntegrityError(
                        f"tool call id {call.id!r} is used twice "
                        f"(first by message {calls_at[call.id]})",
                        index=index,
                    )
                calls_at[call.id] = index
                open_calls[call.id] = call.name
    if open_calls:
        _raise_missing_results(messages, exchange_start, open_calls)
    return starts


def _raise_misplaced_result(
    call_id: str, index: int, calls_at: Mapping[str, int], exchange_start: int
) -> NoReturn:
    if call_id not in calls_at:
        raise TranscriptIntegrityError(
            f"tool result for call {call_id!r} answers no call before it", index=index
        )
    made_by = calls_at[call_id]
    if made_by == exchange_start:
        raise TranscriptIntegrityError(
            f"tool call {call_id!r} of message {made_by} is answered twice", index=index
        )
    raise TranscriptIntegrityError(
        f"tool result for call {call_id!r} is separated from its call in message {made_by}",
        index=index,
    )


def _raise_missing_results(
    messages: Sequence[Message], exchange_start: int, open_calls: Mapping[str, str]
) -> NoReturn:
    call_id, name = next(iter(open_calls.items()))
    later = next(
        (
            i
            for i in range(exchange_start + 1, len(messages))
            if messages[i].role is Role.TOOL and messages[i].tool_call_id == call_id
        ),
        None,
    )
    if later is None:
        reason = f"tool call {call_id!r} ({name}) has no result"
    else:
        reason = (
            f"tool call {call_id!r} ({name}) has its result at message {later}, separated from it"
        )
    raise TranscriptIntegrityError(reason, index=exchange_start)


def pinned_messages(
    messages: Sequence[Message], *, prompt_index: int | None = None
) -> dict[int, PinReason]:
    """Which messages are pinned, and why: ``{index: reason}``.

    ``prompt_index`` is the position of the current prompt; ``None`` takes
    the last user message that is not an injection. A pinned message pins the
    whole unit it belongs to (see :func:`units_for`).

    Raises:
        InvalidRequestError: ``prompt_index`` is outside the transcript.
    """
    pinned: dict[int, PinReason] = {}
    prompt_index = current_prompt_index(messages, prompt_index)

    # An injected system message is context, not the instructions: it is
    # pinned only while unanswered (below), never as "the first system message".
    for index, message in enumerate(messages):
        if message.role is _SYSTEM and message.origin is not _INJECTION:
            pinned[index] = PinReason.FIRST_SYSTEM
            break
    if prompt_index is not None:
        pinned.setdefault(prompt_index, PinReason.CURRENT_PROMPT)

    # Read backwards up to the last assistant message: whatever sits after it
    # is unanswered; if that assistant message made calls, its exchange is live.
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.role is _ASSISTANT:
            after_prompt = prompt_index is None or index > prompt_index
            if message.tool_calls and after_prompt:
                pinned.setdefault(index, PinReason.LIVE_TOOL_EXCHANGE)
            break
        if message.origin is _INJECTION:
            pinned.setdefault(index, PinReason.UNANSWERED_INJECTION)
    return pinned


# Read for every step: a module global is found quicker than an enum's member,
# which matters when the step runs with cold caches, as after an HTTP round trip.
_SYSTEM, _USER, _ASSISTANT, _TOOL = Role.SYSTEM, Role.USER, Role.ASSISTANT, Role.TOOL
_role_of = attrgetter("role")
_calls_of = attrgetter("tool_calls")
_INJECTION = Origin.INJECTION


def current_prompt_index(
    messages: Sequence[Message], prompt_index: int | None = None
) -> int | None:
    """The position of the current prompt: ``prompt_index`` checked, or the inferred one.

    ``None`` takes the last user message that is not an injection (``None``
    when there is none).

    Raises:
        InvalidRequestError: ``prompt_index`` is outside the transcript.
    """
    if prompt_index is not None:
        if isinstance(prompt_index, bool) or not 0 <= prompt_index < len(messages):
            raise InvalidRequestError(
                f"prompt_index {prompt_index!r} is outside a transcript of {len(messages)} messages"
            )
        return prompt_index
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.role is _USER and message.origin is not _INJECTION:
            return index
    return None


def unit_starts(messages: Sequence[Message], *, checked: bool = False) -> list[int]:
    """Where each unit begins, in order: the compact form of :func:`units_for`.

    Unit ``k`` is ``messages[starts[k]:starts[k + 1]]`` (the last one runs to
    the end). ``tool`` results belong to the exchange before them; one with
    no exchange before it begins a unit of its own. ``checked`` says the
    transcript passed :func:`check_integrity`: every result then follows its
    exchange, so units begin at exactly the other messages (a quicker pass).
    """
    tool = Role.TOOL
    if checked:
        return [index for index, message in enumerate(messages) if message.role is not tool]
    starts: list[int] = []
    in_exchange = False
    for index, message in enumerate(messages):
        if message.role is tool:
            if in_exchange:
                continue
            in_exchange = True
        else:
            in_exchange = bool(message.tool_calls)
        starts.append(index)
    return starts


def pinned_units(starts: Sequence[int], pinned: Mapping[int, PinReason]) -> dict[int, PinReason]:
    """Which units are pinned, by unit number: a unit takes its first pinned message's reason."""
    units: dict[int, PinReason] = {}
    for index in sorted(pinned):
        units.setdefault(bisect.bisect_right(starts, index) - 1, pinned[index])
    return units


def units_for(
    messages: Sequence[Message],
    pinned: Mapping[int, PinReason],
    *,
    starts: Sequence[int] | None = None,
) -> list[Unit]:
    """Split ``messages`` into units, pinning each unit that holds a message in ``pinned``.

    The lower-level form of :func:`split_units` for callers that already know
    what is pinned (the limiting engine carries that across handlers). It
    does not check integrity; a ``tool`` message with no exchange before it
    forms a unit of its own. ``starts`` is :func:`unit_starts` of
    ``messages``, when the caller has it already.
    """
    if starts is None:
        starts = unit_starts(messages)
    return list(listing(messages, list(starts), pinned))


def listing(
    messages: Sequence[Message],
    starts: list[int],
    pinned: Mapping[int, PinReason],
    *,
    keep: bool | None = None,
) -> Units:
    """The :class:`Units` of ``messages`` that begin at ``starts``, pinned as ``pinned`` says.

    ``keep`` ``None`` lists them all, ``True`` the pinned ones, ``False`` the
    droppable ones.
    """
    by_unit = pinned_units(starts, pinned)
    reasons = {starts[k]: reason for k, reason in by_unit.items()}
    chosen = sorted(by_unit)
    if keep:  # a few: no column of ends for the whole transcript
        bounds = [*starts, len(messages)]
        return _listed(
            messages, [starts[k] for k in chosen], [bounds[k + 1] for k in chosen], reasons
        )
    ends = [*starts[1:], len(messages)] if starts else []
    if keep is None:
        return _listed(messages, starts, ends, reasons)
    # The droppable ones: everything between the pinned units, a slice at a time.
    kept_starts: list[int] = []
    kept_ends: list[int] = []
    after = 0
    for k in [*chosen, len(starts)]:
        kept_starts += starts[after:k]
        kept_ends += ends[after:k]
        after = k + 1
    return _listed(messages, kept_starts, kept_ends, {})


def _listed(
    messages: Sequence[Message],
    starts: list[int],
    ends: list[int],
    reasons: Mapping[int, PinReason],
) -> Units:
    """A :class:`Units` of units read off a transcript, each holding at least one message."""
    units = Units(messages, starts, ends, reasons)
    units._listed = True
    return units


class Units(Sequence[Unit]):
    """Units of a transcript, in order: a read-only sequence of :class:`Unit`.

    What :meth:`~threadline.limiting.TokenLimitEvent.units` returns (you do
    not build one yourself). Index it, slice it (a slice is a ``Units`` too),
    iterate it. A unit is made when it is read, so listing the units of a
    long transcript costs little until they are looked at, and
    :meth:`~threadline.limiting.TokenLimitEvent.drop_units` takes a slice as
    it is, without reading its units one by one.
    """

    __slots__ = ("_ends", "_listed", "_made", "_messages", "_reasons", "_starts")

    def __init__(
        self,
        messages: Sequence[Message],
        starts: list[int],
        ends: list[int],
        reasons: Mapping[int, PinReason],
    ) -> None:
        self._messages = messages  # never changed while the listing lives
        self._starts = starts
        self._ends = ends
        self._reasons = reasons  # by the position where a pinned unit starts
        self._made: list[Unit] | None = None
        # Made by listing a transcript (or a slice of such), so no unit is empty:
        # then units whose ends meet the next ones' starts are one run of messages.
        self._listed = False

    def __len__(self) -> int:
        return len(self._starts)

    @overload
    def __getitem__(self, index: int) -> Unit: ...

    @overload
    def __getitem__(self, index: slice) -> Units: ...

    def __getitem__(self, index: int | slice) -> Unit | Units:
        if isinstance(index, slice):
            part = Units(self._messages, self._starts[index], self._ends[index], self._reasons)
            part._listed = self._listed
            return part
        if self._made is not None:
            return self._made[index]
        start = self._starts[index]
        return Unit(
            kind=unit_kind(self._messages[start]),
            start=start,
            end=self._ends[index],
            reason=self._reasons.get(start),
        )

    def __iter__(self) -> Iterator[Unit]:
        return iter(self._all())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Units | list | tuple):
            return self._all() == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"Units({self._all()!r})"

    def _all(self) -> list[Unit]:
        if self._made is None:
            self._made = [self[k] for k in range(len(self._starts))]
        return self._made


# (role, whether it makes no tool call) of a unit's first message -> the unit's kind
_UNIT_KINDS = {
    (Role.SYSTEM, True): UnitKind.SYSTEM,
    (Role.SYSTEM, False): UnitKind.SYSTEM,
    (Role.USER, True): UnitKind.USER,
    (Role.USER, False): UnitKind.USER,
    (Role.ASSISTANT, True): UnitKind.ASSISTANT,
    (Role.ASSISTANT, False): UnitKind.TOOL_EXCHANGE,
    (Role.TOOL, True): UnitKind.TOOL_EXCHANGE,  # a stray result, in an unchecked transcript
    (Role.TOOL, False): UnitKind.TOOL_EXCHANGE,
}


def unit_kind(first: Message) -> UnitKind:
    """The kind of the unit that ``first`` begins."""
    return _UNIT_KINDS[first.role, not first.tool_calls]


def spans_of(units: Units) -> tuple[list[int], list[int]]:
    """The starts and ends of a :class:`Units`, without making its units."""
    return units._starts, units._ends


def one_run(units: Units) -> tuple[int, int] | None:
    """``(start, end)`` when ``units`` were listed off a transcript and follow one
    another without a gap, oldest first (what a slice of a listing usually is)."""
    starts, ends = units._starts, units._ends
    # Each unit holds a message, so ends meeting the next starts make the starts
    # ascend too; ends were built from the starts, so this compares identities.
    if units._listed and starts and ends[:-1] == starts[1:]:
        return starts[0], ends[-1]
    return None


def match_messages(before: Sequence[Message], after: Sequence[Message]) -> list[int | None]:
    """For each message of ``after``, its index in ``before``, or ``None`` when it is new.

    The matches keep their order: they form a subsequence of ``before``.
    When ``after`` is made of ``before``'s own message objects in order (a
    handler that only removed messages), those are the matches. Otherwise
    messages are matched by value, since an equal message is sent the same:
    from the end, each to the newest equal message still available, which
    matches as much of ``after`` as any in-order matching could and counts a
    dropped duplicate as the older copy.
    """
    by_identity = _match_identity(before, after)
    if by_identity is not None:
        return by_identity
    positions: dict[Message, list[int]] = {}
    for index, message in enumerate(before):
        positions.setdefault(message, []).append(index)
    sources: list[int | None] = [None] * len(after)
    bound = len(before)
    for at in range(len(after) - 1, -1, -1):
        source = _last_below(positions.get(after[at]), bound)
        if source is not None:
            sources[at] = bound = source
    return sources


def _match_identity(before: Sequence[Message], after: Sequence[Message]) -> list[int | None] | None:
    # Two pointers from the end: linear, and no message is hashed.
    sources: list[int | None] = [None] * len(after)
    source = len(before) - 1
    for at in range(len(after) - 1, -1, -1):
        message = after[at]
        while source >= 0 and before[source] is not message:
            source -= 1
        if source < 0:
            return None
        sources[at] = source
        source -= 1
    return sources


def _last_below(indices: list[int] | None, bound: int) -> int | None:
    if not indices:
        return None
    position = bisect.bisect_left(indices, bound)
    return indices[position - 1] if position else None


def split_units(messages: Sequence[Message], *, prompt_index: int | None = None) -> list[Unit]:
    """The transcript's units in order, each marked pinned or droppable.

    ``prompt_index`` is the position of the current prompt (the run loop
    passes it); ``None`` takes the last user message that is not an
    injection. The units cover the transcript exactly, in order.

    Raises:
        TranscriptIntegrityError: the transcript's tool units are broken.
        InvalidRequestError: ``prompt_index`` is outside the transcript.

    Example::

        >>> units = split_units([Message.system("Be terse."), Message.user("Hi")])
        >>> [(u.kind.value, u.pinned) for u in units]
        [('system', True), ('user', True)]
    """
    check_integrity(messages)
    pinned = pinned_messages(messages, prompt_index=prompt_index)
    return units_for(messages, pinned, starts=unit_starts(messages, checked=True))
