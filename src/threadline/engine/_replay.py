"""Reasoning replay, applied by the run loop to every driver's calls.

``Reasoning.provider_reasoning`` is opaque replay state: JSON bytes stored as
the provider sent them. Before a call is handed to any driver (SPEC §2) the
run loop checks that state: malformed JSON is refused, and so is a stored
``{"type": "text", ...}`` block, which would reach the model as the
assistant's own words. A damaged transcript fails the same way whichever
driver it is sent to, the test double included.

Then the driver's :class:`~threadline._replay.ReplayRules` decide what each
call is handed (:class:`ReplayGuard`): state another provider or model made
(or no one named) is left out, always, and the round's record says so
(``RoundRecord.reasoning_dropped``); state outside the rules' scope (an
earlier turn's, for a driver that replays only the open tool-use cycle) is
left out silently; what is sent passes the rules' allow-list. When the
latest state sent holds a boundary block (``ReplayRules.boundary``: OpenAI
Responses' compaction items, Anthropic's compaction blocks), the messages
before it are not handed over (system messages apart): that block carries
them. Limiting counts
the transcript as it is handed over, so the estimate, the exact count and the
ledger count exactly what is sent. The transcript itself keeps everything:
only what is sent loses it.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from itertools import compress
from operator import attrgetter
from typing import TYPE_CHECKING

import attrs

from threadline._messages import Message, Role
from threadline._replay import (
    ANY_REPLAY,
    Replay,
    ReplayRules,
    check_provider_reasoning,
    cycle_of,
    label_of,
    reaches,
    replay_of,
)
from threadline.limiting._ledger import DroppedReasoning, LimitingOutcome

if TYPE_CHECKING:
    from threadline._models import Model
    from threadline._provider import Driver
    from threadline.limiting._incremental import CheckedHistory

__all__ = [
    "Prepared",
    "ReplayGuard",
    "check_transcript_reasoning",
    "reasoned_indices",
    "sent_form",
]

_REASONING = attrgetter("reasoning")


def reasoned_indices(
    messages: Sequence[Message], history: CheckedHistory | None = None
) -> Iterable[int]:
    """The indices, ascending, of the messages of ``messages`` that may carry reasoning.

    ``history``, a conversation's word for ``messages[offset:offset + len]``,
    says where its reasoning is: only the messages around it are looked at, so
    a turn costs its new messages. Without it every message is looked at, in C.
    """
    start = history.offset if history is not None else 0
    end = start + len(history.messages) if history is not None else 0
    if history is None or history.reasoned is None or not _stands_at(messages, history):
        return compress(range(len(messages)), map(_REASONING, messages))
    return (
        *compress(range(start), map(_REASONING, messages[:start])),
        *(start + index for index in history.reasoned),
        *compress(range(end, len(messages)), map(_REASONING, messages[end:])),
    )


def _stands_at(messages: Sequence[Message], history: CheckedHistory) -> bool:
    """Whether ``history`` is still where it says in ``messages`` (its ends, by identity)."""
    vouched, start = history.messages, history.offset
    end = start + len(vouched)
    if len(messages) < end:
        return False
    return not vouched or (messages[start] is vouched[0] and messages[end - 1] is vouched[-1])


def check_transcript_reasoning(
    messages: Sequence[Message], history: CheckedHistory | None = None
) -> None:
    """Apply :func:`check_provider_reasoning` to every message that carries reasoning
    (``history``: see :func:`reasoned_indices`).

    Raises:
        InvalidRequestError: naming the first message whose replay state is refused.
    """
    for index in reasoned_indices(messages, history):
        reasoning = messages[index].reasoning
        if reasoning is not None and reasoning.provider_reasoning:
            check_provider_reasoning(reasoning.provider_reasoning, index=index)


@attrs.frozen
class Prepared:
    """One call's transcript as its driver is handed it.

    ``messages`` are the messages given, each with only the replay state the
    rules send (a message that loses some is a copy); ``history`` is the
    history a conversation vouches for, standing in ``messages`` as it stood
    in what was given; ``dropped`` the state left out because another provider
    or model made it.
    """

    messages: tuple[Message, ...]
    history: CheckedHistory | None
    dropped: tuple[DroppedReasoning, ...]
    window: int = 0
    """Where the sent window opens in the messages given (see
    :func:`~threadline._replay.window_start`); 0 when nothing is cut."""
    cut: int = 0
    """How many messages before ``window`` are not handed over (system ones are)."""

    def position(self, index: int | None) -> int | None:
        """Where the message given at ``index`` stands in :attr:`messages`: ``None``
        when it is before the window and not a system message (or ``index`` is ``None``)."""
        if index is None or not self.cut:
            return index
        if index >= self.window:
            return index - self.cut
        return None


class ReplayGuard:
    """Checks and filters the messages of one run's calls for one driver and model.

    ``rules`` are the driver's (``Driver.replay_rules``). Each message object is
    looked at once per run and place (messages are immutable; the open tool-use
    cycle closes as a run goes on), so a long transcript costs its new messages
    per round, not all of them.
    """

    def __init__(self, label: str, rules: ReplayRules = ANY_REPLAY) -> None:
        self.label = label
        self.rules = rules
        # (id, in scope) -> (the message, what is handed over for it, what became of its
        # state); holding the message keeps its id unique.
        self._seen: dict[tuple[int, bool], tuple[Message, Message, Replay, bool]] = {}
        # id of a copy made here -> the message it stands for (the copy is held in _seen).
        self._originals: dict[int, Message] = {}

    def prepare(
        self, messages: Sequence[Message], history: CheckedHistory | None = None
    ) -> Prepared:
        """What the driver is handed of ``messages`` (``history``: see
        :func:`reasoned_indices`).

        Raises:
            InvalidRequestError: a message's replay state is malformed (see
                :func:`check_provider_reasoning`), or would be sent and the rules
                refuse it.
        """
        rules = self.rules
        cycle = cycle_of(rules, messages)
        sent: list[Message] | None = None  # copied only when something is left out
        dropped: list[DroppedReasoning] = []
        window = 0
        for index in reasoned_indices(messages, history):
            message = messages[index]
            reasoning = message.reasoning
            raw = reasoning.provider_reasoning if reasoning is not None else b""
            scoped = reaches(rules, cycle, index, raw)
            entry = self._seen.get((id(message), scoped))
            if entry is None:
                entry = (message, *self._handed(message, index, scoped))
                self._seen[id(message), scoped] = entry
            _, handed, verdict, opens = entry
            if opens:
                window = index
            if verdict is Replay.FOREIGN:
                reasoning = message.reasoning
                assert reasoning is not None
                dropped.append(
                    DroppedReasoning(index=index, provider=reasoning.provider, sent_to=self.label)
                )
            if handed is not message:
                if sent is None:
                    sent = list(messages)
                sent[index] = handed
        if window:
            return _from_window(sent or messages, history, tuple(dropped), window)
        if sent is None:
            return Prepared(messages=tuple(messages), history=history, dropped=())
        if history is not None:
            start = history.offset
            history = attrs.evolve(
                history, messages=tuple(sent[start : start + len(history.messages)]), source=None
            )
        return Prepared(messages=tuple(sent), history=history, dropped=tuple(dropped))

    def originals(
        self, outcome: LimitingOutcome, given: tuple[Message, ...]
    ) -> tuple[Message, ...]:
        """The messages of ``outcome`` (a limiting step over what :meth:`prepare` made of
        ``given``) as the transcript holds them: each copy made here back to its original."""
        messages, sources = outcome.messages, outcome.sources
        if not self._originals:
            return messages
        if isinstance(sources, range) and len(sources) == len(given):
            return given  # nothing was dropped or added
        found = self._originals.get
        return tuple(map(found, map(id, messages), messages))

    def _handed(self, message: Message, index: int, scoped: bool) -> tuple[Message, Replay, bool]:
        """What is handed over for ``message``, what became of its state, and whether
        that state opens the sent window."""
        reasoning = message.reasoning
        if reasoning is None or not reasoning.provider_reasoning:
            return message, Replay.NONE, False
        verdict = replay_of(
            reasoning, index=index, label=self.label, rules=self.rules, in_scope=scoped
        )
        if verdict is Replay.SENT:
            # What is sent was checked by the rules themselves.
            return message, verdict, self.rules.opens_window(reasoning.provider_reasoning)
        if verdict is Replay.NONE:
            return message, verdict, False
        check_provider_reasoning(reasoning.provider_reasoning, index=index)
        # The display text and who made it stay; only the replay state goes.
        stripped = attrs.evolve(message, reasoning=attrs.evolve(reasoning, provider_reasoning=b""))
        self._originals[id(stripped)] = message
        return stripped, verdict, False


def _from_window(
    messages: Sequence[Message],
    history: CheckedHistory | None,
    dropped: tuple[DroppedReasoning, ...],
    window: int,
) -> Prepared:
    """``messages`` from ``window`` on, the system messages before it kept in front;
    ``history`` cut to match (``None`` when the window opens past its end)."""
    system = tuple(message for message in messages[:window] if message.role is Role.SYSTEM)
    cut = window - len(system)
    dropped = tuple(
        attrs.evolve(note, index=note.index - cut) for note in dropped if note.index >= window
    )
    if history is not None:
        start, end = history.offset, history.offset + len(history.messages)
        if not start <= window < end:
            history = None
        else:
            skipped = window - start
            reasoned = history.reasoned
            history = attrs.evolve(
                history,
                messages=tuple(messages[window:end]),
                offset=len(system),
                source=None,  # no longer the transcript's messages from its start
                reasoned=None
                if reasoned is None
                else tuple(index - skipped for index in reasoned if index >= skipped),
            )
    sent = (*system, *messages[window:])
    return Prepared(messages=sent, history=history, dropped=dropped, window=window, cut=cut)


def sent_form(messages: Sequence[Message], driver: Driver, model: Model) -> tuple[Message, ...]:
    """``messages`` as a call to ``driver`` and ``model`` would hand them over: what
    counting them as sent counts (one-off, for the helpers that count outside a run).

    Raises:
        InvalidRequestError: as :meth:`ReplayGuard.prepare`.
    """
    guard = ReplayGuard(label_of(driver.name, model.name), driver.replay_rules(model))
    return guard.prepare(messages).messages
