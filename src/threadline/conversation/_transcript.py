"""A conversation's answered transcript, indexed so each turn costs what its window costs.

:class:`Transcript` holds the events in order with the positions of the user
events (the safe places to cut), the turns and the running usage. Appending a
turn touches only the new events; the window start is a bisection.
"""

from __future__ import annotations

import bisect
import itertools
from array import array
from collections.abc import Iterable, Iterator, Sequence
from operator import attrgetter
from typing import Any, TypeVar, overload

import attrs

from threadline._errors import (
    ConversationFormatError,
    InvalidRequestError,
    OutputValidationError,
    TranscriptIntegrityError,
)
from threadline._messages import Message, Origin, Role, Usage
from threadline._provider import ProviderResponse
from threadline._result import RunResult
from threadline.conversation._packed_events import PackedEvents
from threadline.limiting._incremental import CheckedHistory, HistorySpan, HistoryTally
from threadline.limiting._prefix import SentPrompt
from threadline.limiting._units import check_integrity
from threadline.serialization._documents import (
    ConversationDocument,
    ConversationEvent,
    check_turn_order,
)
from threadline.tools._output import OutputProblem, output_spec

__all__ = [
    "KeptPrompt",
    "Transcript",
    "Turn",
    "checked_replacement",
    "sum_usage",
    "turn_events",
]

_turn_id_of = attrgetter("turn_id")
_Value = TypeVar("_Value")


@attrs.frozen(kw_only=True)
class Turn:
    """One completed turn: a submitted prompt and everything its run added.

    ``id`` is the turn id its events carry; ``events`` are its messages with
    their usage, in order.
    """

    id: int
    events: tuple[ConversationEvent, ...]

    @property
    def messages(self) -> tuple[Message, ...]:
        """The turn's messages."""
        return tuple(event.message for event in self.events)

    @property
    def prompt(self) -> Message | None:
        """The turn's first user message (``None`` for a turn without one)."""
        return next((e.message for e in self.events if e.message.role is Role.USER), None)

    @property
    def text(self) -> str:
        """The text of the turn's last assistant message (``""`` when there is none)."""
        for event in reversed(self.events):
            if event.message.role is Role.ASSISTANT:
                return event.message.text
        return ""

    @property
    def usage(self) -> Usage:
        """What the turn's provider calls reported, summed."""
        return sum_usage(self.events)

    @overload
    def output(self, output_type: type[_Value]) -> _Value: ...
    @overload
    def output(self, output_type: Any) -> Any: ...

    def output(self, output_type: Any) -> Any:
        """The turn's answer rebuilt as a value of ``output_type`` from its saved text.

        A conversation saves each answer's raw text; the value is made again, and
        checked again, only when asked.

        Raises:
            InvalidRequestError: the type has no JSON schema.
            OutputValidationError: the saved text is not a valid value of it.
        """
        text = self.text
        try:
            return output_spec(output_type).parse(text)
        except OutputProblem as problem:
            raise OutputValidationError(problem.reason, text=text, path=problem.path) from None


def sum_usage(events: Iterable[ConversationEvent]) -> Usage:
    """The usage of ``events``, summed (events without usage add nothing)."""
    total = Usage()
    for event in events:
        if event.usage is not None:
            total = total + event.usage
    return total


def _response_of(events: Sequence[ConversationEvent]) -> ProviderResponse | None:
    # Rebuilt from the last assistant event; what the provider did not report stays empty.
    for event in reversed(events):
        if event.message.role is Role.ASSISTANT:
            return ProviderResponse(
                message=event.message,
                finish_reason=event.finish_reason or "stop",
                usage=event.usage or Usage(),
                model=event.model or "",
            )
    return None


def turn_events(turn_id: int, result: RunResult) -> list[ConversationEvent]:
    """The events of a completed run: its own messages, each reply with its round's usage."""
    rounds = iter(result.rounds)
    model = result.response.model or None
    events: list[ConversationEvent] = []
    for message in result.new_messages():
        if message.role is Role.ASSISTANT:
            record = next(rounds, None)
            events.append(
                ConversationEvent(
                    message=message,
                    turn_id=turn_id,
                    usage=record.usage if record is not None else None,
                    model=model,
                    finish_reason=record.finish_reason if record is not None else None,
                )
            )
        else:
            events.append(ConversationEvent(message=message, turn_id=turn_id))
    return events


def checked_replacement(events: Iterable[ConversationEvent]) -> tuple[ConversationEvent, ...]:
    """``events`` as a transcript to install, or a clear refusal.

    Raises:
        InvalidRequestError: an item that is not an answered ``ConversationEvent``,
            a first event that is not a user message, a broken tool unit, or a
            turn id that goes back.
    """
    replacement = tuple(events)
    for index, event in enumerate(replacement):
        if not isinstance(event, ConversationEvent):
            raise InvalidRequestError(
                f"event {index} is a {type(event).__name__}, not a ConversationEvent"
            )
        if event.pending:
            raise InvalidRequestError(
                f"event {index} is pending; only answered events can be installed"
            )
    if replacement and replacement[0].message.role is not Role.USER:
        raise InvalidRequestError(
            f"the transcript must start with a user event, not a "
            f"{replacement[0].message.role.value} message; cut at an index from "
            "user_event_indices()"
        )
    try:
        check_integrity([event.message for event in replacement])
    except TranscriptIntegrityError as exc:
        raise InvalidRequestError(
            f"these events would break a tool unit: event {exc.index}: {exc.reason}"
        ) from None
    check_turn_order(replacement)  # else the conversation could be saved but never loaded
    return replacement


class SeedWindow(Sequence[Message]):
    """Messages ``start`` to ``stop`` of a transcript's list of them, as they stand now
    and always will: the list is only ever appended to (a rewrite makes a new
    transcript). A turn sends its history as one, so the history is not copied
    into a tuple of its own before the plan builds the call's transcript from it.
    """

    __slots__ = ("_messages", "_start", "_stop")

    def __init__(self, messages: list[Message], start: int, stop: int) -> None:
        self._messages, self._start, self._stop = messages, start, stop

    def __len__(self) -> int:
        return self._stop - self._start

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Message, ...]: ...

    def __getitem__(self, index: int | slice) -> Message | tuple[Message, ...]:
        where = range(self._start, self._stop)[index]  # IndexError as a tuple's
        if isinstance(where, range):
            return tuple(map(self._messages.__getitem__, where))
        return self._messages[where]

    def __iter__(self) -> Iterator[Message]:
        # In C: a tuple made from the window (the call's transcript) costs a pass
        # over it. islice steps over every message before the start, so a window
        # that starts later is sliced out (a copy of the window only).
        if not self._start:
            return itertools.islice(self._messages, self._stop)
        return iter(self._messages[self._start : self._stop])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SeedWindow | tuple | list):
            return len(self) == len(other) and tuple(self) == tuple(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # compared by content, as a list is

    def __repr__(self) -> str:
        return f"SeedWindow({tuple(self)!r})"


class KeptPrompt(Sequence[Message]):
    """The last turn's last prompt as a conversation keeps it until the next turn, which
    compares its own prompt with it (``RoundRecord.cache``): when it was sent from the
    transcript's checked history, the transcript holds every message of it but the
    system message in front, so it is kept as a window onto the transcript (the
    history, then the turn's own messages as their seed copies), with the tools and
    the response id, in one object: not a copy of every reference, nor the turn's
    originals. As a sequence, it is the messages; :meth:`sent` is the prompt again.
    """

    __slots__ = (
        "_length",
        "_messages",
        "_response_id",
        "_start",
        "_stop",
        "_system",
        "_token",
        "_tools",
    )

    def __init__(
        self, prompt: SentPrompt, system: Message | None, messages: list[Message], token: object
    ) -> None:
        span = prompt.history
        assert span is not None
        self._system, self._messages, self._token = system, messages, token
        self._start = span.source[1]
        self._length = span.length
        self._stop = self._start + len(prompt.messages) - span.offset
        self._tools, self._response_id = prompt.tools, prompt.response_id

    def sent(self) -> SentPrompt:
        """The prompt as the run sent it (its messages this very window)."""
        return SentPrompt(
            messages=self,
            tools=self._tools,
            response_id=self._response_id,
            history=HistorySpan(
                source=(self._token, self._start),
                offset=0 if self._system is None else 1,
                length=self._length,
            ),
        )

    def __len__(self) -> int:
        return (self._system is not None) + self._stop - self._start

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Message, ...]: ...

    def __getitem__(self, index: int | slice) -> Message | tuple[Message, ...]:
        if isinstance(index, slice):
            return tuple(self)[index]
        where = range(len(self))[index]  # IndexError as a tuple's
        system = self._system
        if system is not None:
            if not where:
                return system
            where -= 1
        return self._messages[self._start + where]

    def __iter__(self) -> Iterator[Message]:
        window = self._messages[self._start : self._stop]
        return iter(window) if self._system is None else itertools.chain((self._system,), window)

    def __repr__(self) -> str:
        return f"KeptPrompt({tuple(self)!r})"


class Transcript:
    """Answered events plus what is derived from them, kept up to date incrementally.

    The events are not kept as objects: a conversation of hours would hold
    one ``ConversationEvent`` (and a ``Usage``) per message beside the message
    itself. Each message is kept once, as turns send it back (origin
    ``seed``), with its own origin in one byte; turn ids are kept per turn and
    what a provider reported (usage, model, finish reason) per reply, in
    arrays. :attr:`events` rebuilds equal events when asked for.

    ``pending`` are prompts a crashed process submitted and never saw
    answered: kept beside the transcript, never part of a window.
    """

    __slots__ = (
        "_call_ids",
        "_messages",
        "_packed",
        "_reasoned",
        "_seeded",
        "_system_events",
        "_tally",
        "_token",
        "_turn_count",
        "_user_indices",
        "_view",
        "last_response",
        "next_turn_id",
        "pending",
        "total_usage",
    )

    def __init__(
        self,
        events: Sequence[ConversationEvent] = (),
        *,
        pending: Sequence[ConversationEvent] = (),
        next_turn_id: int = 0,
        total_usage: Usage | None = None,
    ) -> None:
        # Each message as a turn sends it back (origin seed): a turn never copies
        # the history it sends. Those whose own origin is seed too are listed.
        self._messages: list[Message] = []
        self._seeded: set[int] | None = None
        self._packed = PackedEvents()
        self._turn_count = 0
        self._system_events = 0
        self._call_ids: set[str] | None = None
        # Where the user messages are (the safe places to cut), and those carrying
        # reasoning: replay checks look only there.
        self._user_indices = array("I")
        self._reasoned: array[int] | None = None
        self._view: tuple[ConversationEvent, ...] | None = None
        # Names this transcript in the histories it vouches for (CheckedHistory.source):
        # its messages are only ever appended, so two windows of it from one event
        # start alike. Not the transcript itself, which a sent prompt would keep alive.
        self._token = object()
        self._tally = HistoryTally()
        self.pending: tuple[ConversationEvent, ...] = tuple(pending)
        self.next_turn_id = next_turn_id
        self._add(events)
        self.total_usage = sum_usage(events) if total_usage is None else total_usage
        self.last_response = _response_of(events)

    @classmethod
    def from_document(cls, document: ConversationDocument) -> Transcript:
        """The transcript a saved document holds, pending events set apart.

        Raises:
            ConversationFormatError: the answered events break a tool unit or
                do not start with a user message (the path names the event).
        """
        answered: list[ConversationEvent] = []
        where: list[int] = []
        pending: list[ConversationEvent] = []
        for index, event in enumerate(document.events):
            if event.pending:
                pending.append(event)
            else:
                answered.append(event)
                where.append(index)
        if answered and answered[0].message.role is not Role.USER:
            # What replace_events refuses, a document may not bring in either:
            # the next request would open with an answer to nothing.
            raise ConversationFormatError(
                f"a conversation's transcript starts with a user message, not a "
                f"{answered[0].message.role.value} message",
                path=f"$.events[{where[0]}].message.role",
            )
        try:
            check_integrity([event.message for event in answered])
        except TranscriptIntegrityError as exc:
            raise ConversationFormatError(
                exc.reason, path=f"$.events[{where[exc.index]}]"
            ) from None
        return cls(
            answered,
            pending=pending,
            next_turn_id=document.next_turn_id,
            total_usage=document.total_usage,
        )

    @property
    def events(self) -> tuple[ConversationEvent, ...]:
        """The events, rebuilt once after each change (equal to those that were added)."""
        if self._view is None:
            self._view = tuple(self._rebuilt())
        return self._view

    @property
    def turns(self) -> tuple[Turn, ...]:
        return tuple(
            Turn(id=turn_id, events=tuple(events))
            for turn_id, events in itertools.groupby(self.events, key=_turn_id_of)
        )

    def turn_count(self) -> int:
        return self._turn_count

    def __len__(self) -> int:
        return len(self._messages)

    def user_indices(self) -> list[int]:
        return self._user_indices.tolist()

    def append_turn(
        self, events: Sequence[ConversationEvent], response: ProviderResponse, usage: Usage
    ) -> None:
        """Add a completed turn; costs what its own events cost."""
        self._add(events)
        self.next_turn_id = max(self.next_turn_id, events[0].turn_id + 1)
        self.total_usage = self.total_usage + usage
        self.last_response = response

    def _add(self, events: Iterable[ConversationEvent]) -> None:
        self._view = None
        packed = self._packed
        for index, event in enumerate(events, len(self._messages)):
            message = event.message
            self._messages.append(message.with_origin(Origin.SEED))
            if message.origin is Origin.SEED:
                if self._seeded is None:
                    self._seeded = set()
                self._seeded.add(index)
            if index == 0 or event.turn_id != packed.last_turn:
                self._turn_count += 1
            packed.append(event)
            role = message.role
            if role is Role.USER:
                self._user_indices.append(index)
            elif role is Role.SYSTEM:
                self._system_events += 1
            if message.tool_calls:
                if self._call_ids is None:
                    self._call_ids = set()
                self._call_ids.update(call.id for call in message.tool_calls)
            if message.reasoning is not None:
                if self._reasoned is None:
                    self._reasoned = array("I")
                self._reasoned.append(index)

    def _own(self, index: int, message: Message) -> Message:
        """The message of event ``index`` with its own origin."""
        seeded = self._seeded
        return message if seeded and index in seeded else message.with_origin(Origin.TURN)

    def _rebuilt(self) -> Iterator[ConversationEvent]:
        """The events as they were added: each message with its own origin again."""
        for index, (message, (turn_id, usage, model, finish)) in enumerate(
            zip(self._messages, self._packed, strict=True)
        ):
            yield ConversationEvent(
                message=self._own(index, message),
                turn_id=turn_id,
                usage=usage,
                model=model,
                finish_reason=finish,
            )

    def window_start(self, history_limit: int) -> int:
        """Where the window of ``history_limit`` messages starts (0 sends everything).

        The latest user event that leaves at least ``history_limit`` messages
        from it to the end: the window is never smaller than the limit and
        never opens inside a turn or a tool exchange.
        """
        total = len(self._messages)
        if history_limit == 0 or history_limit >= total:
            return 0
        position = bisect.bisect_right(self._user_indices, total - history_limit) - 1
        return self._user_indices[position] if position >= 0 else 0

    def window(self, history_limit: int) -> list[Message]:
        """The messages of the window of ``history_limit`` messages."""
        return self.messages_from(self.window_start(history_limit))

    def messages_from(self, start: int) -> list[Message]:
        """The messages of the events from index ``start`` on, each with its own origin."""
        messages = self._messages[start:]  # a slice: islice would step over every earlier one
        return [self._own(index, message) for index, message in enumerate(messages, start)]

    def seed_from(self, start: int) -> SeedWindow:
        """The messages from event ``start`` on as a turn sends them: origin ``seed``,
        the very objects kept, so sending the history again copies no message (nor
        the list of them: a window onto it, which only ever grows at its end)."""
        return SeedWindow(self._messages, start, len(self._messages))

    def checked(
        self, head: Sequence[Message], window: Sequence[Message], start: int
    ) -> CheckedHistory | None:
        """The transcript's word for ``(*head, *window)``, a window of its seed messages
        from event ``start`` on after ``head``: whole, since every turn was checked as it
        joined, and free of system messages. ``None`` when it cannot say so: a system
        event (which ``replace_events`` allows), or a head with a system message, tool
        calls or another origin than seed.
        """
        if self._system_events or any(
            m.role is Role.SYSTEM or m.tool_calls or m.origin is not Origin.SEED for m in head
        ):
            return None
        messages = window if not head else (*head, *window)
        reasoned = self._reasoned or ()
        shift = len(head) - start
        first = bisect.bisect_left(reasoned, start)
        # The window is all the messages from ``start`` on (seed_from): one source,
        # unless a head stands before it.
        whole = not head and len(window) == len(self._messages) - start
        return CheckedHistory(
            messages=messages,
            call_ids=self._call_ids or (),
            source=(self._token, start) if whole else None,
            tally=self._tally,
            reasoned=(
                *(i for i, m in enumerate(head) if m.reasoning is not None),
                *(i + shift for i in reasoned[first:]),
            ),
        )

    def kept_prompt(self, prompt: SentPrompt | None) -> KeptPrompt | SentPrompt | None:
        """``prompt`` (the last round's) as a :class:`KeptPrompt` onto this transcript,
        once the turn that sent it has joined it; ``prompt`` itself when it holds
        anything else (a cut, an edit, another transcript's history), or when the
        turn's messages are not the ones here after the history.
        """
        span = None if prompt is None else prompt.history
        if prompt is None or span is None or span.source[0] is not self._token:
            return prompt
        sent, messages = prompt.messages, self._messages
        start, offset, length = span.source[1], span.offset, span.length
        if offset > 1 or start + len(sent) - offset > len(messages) or offset + length > len(sent):
            return prompt
        if offset and sent[0].role is not Role.SYSTEM:
            return prompt
        if length and (
            sent[offset] is not messages[start]
            or sent[offset + length - 1] is not messages[start + length - 1]
        ):
            return prompt
        # After the history, the turn's own messages: here as their seed copies.
        shift = start - offset
        for at in range(offset + length, len(sent)):
            if sent[at].with_origin(Origin.SEED) is not messages[at + shift]:
                return prompt
        return KeptPrompt(prompt, sent[0] if offset else None, messages, self._token)
