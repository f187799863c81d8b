"""Reasoning replay rules, applied by the run loop to every driver's calls.

``Reasoning.provider_reasoning`` is opaque replay state: JSON bytes stored as
the provider sent them. Before a call is handed to any driver (SPEC §2) the
run loop checks that state: malformed JSON is refused, and so is a stored
``{"type": "text", ...}`` block, which would reach the model as the
assistant's own words. A damaged transcript fails the same way whichever
driver it is sent to, the test double included.

``Reasoning.provider`` names who produced the state (``"<driver>:<model>"``,
as drivers write it). Replay state is only meaningful to the provider and
model that made it (a signature is checked against the model), so reasoning
from anyone else, or from no one named, is left out of the call, always, and
the round's record says so (``RoundRecord.reasoning_dropped``). The
transcript itself keeps it: only what is sent loses it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from itertools import compress
from operator import attrgetter
from typing import TYPE_CHECKING

import attrs

from threadline._errors import InvalidRequestError
from threadline._messages import Message, has_provider_reasoning
from threadline.limiting._ledger import DroppedReasoning

if TYPE_CHECKING:
    from threadline.limiting._incremental import CheckedHistory

__all__ = [
    "ReplayGuard",
    "check_provider_reasoning",
    "check_transcript_reasoning",
    "label_of",
    "reasoned_indices",
]

_REASONING = attrgetter("reasoning")


def label_of(driver_name: str, model_name: str) -> str:
    """What a driver writes into ``Reasoning.provider`` for replies of ``model_name``."""
    return f"{driver_name}:{model_name}"


def _is_text_block(value: object) -> bool:
    return isinstance(value, dict) and value.get("type") == "text"


def check_provider_reasoning(raw: bytes, *, index: int) -> None:
    """Refuse replay state that cannot be sent safely.

    ``index`` is the message's position in the transcript, for the message.

    Raises:
        InvalidRequestError: ``raw`` is not JSON, or it is (or holds, at its
            top level) a ``{"type": "text"}`` block.
    """
    if not has_provider_reasoning(raw):
        return
    try:
        state = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        reason = exc.msg if isinstance(exc, json.JSONDecodeError) else str(exc)
        raise InvalidRequestError(
            f"message {index}: its reasoning's provider_reasoning is not valid JSON ({reason}); "
            "it must be the provider's replay state exactly as the provider sent it"
        ) from None
    blocks = state if isinstance(state, list) else [state]
    if any(_is_text_block(block) for block in blocks):
        raise InvalidRequestError(
            f'message {index}: its reasoning\'s provider_reasoning holds a {{"type": "text"}} '
            "block, which the model would read as the assistant's own words; keep display "
            "text in Reasoning.text"
        )


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


class ReplayGuard:
    """Checks and filters the messages of one run's calls for one driver and model.

    Each message object is looked at once per run (messages are immutable),
    so a long transcript costs its new messages per round, not all of them.
    """

    def __init__(self, label: str) -> None:
        self.label = label
        # id -> (the message, what is sent for it); holding the message keeps its id unique.
        self._seen: dict[int, tuple[Message, Message]] = {}

    def prepare(
        self, messages: Sequence[Message], history: CheckedHistory | None = None
    ) -> tuple[tuple[Message, ...], tuple[DroppedReasoning, ...]]:
        """The messages to send, and the reasoning left out of them (``history``: see
        :func:`reasoned_indices`).

        Raises:
            InvalidRequestError: a message's replay state is malformed (see
                :func:`check_provider_reasoning`).
        """
        sent: list[Message] | None = None  # copied only when something is left out
        dropped: list[DroppedReasoning] = []
        for index in reasoned_indices(messages, history):
            message = messages[index]
            entry = self._seen.get(id(message))
            if entry is None:
                entry = (message, self._replayable(message, index))
                self._seen[id(message)] = entry
            replayed = entry[1]
            if replayed is not message:
                reasoning = message.reasoning
                assert reasoning is not None
                dropped.append(
                    DroppedReasoning(index=index, provider=reasoning.provider, sent_to=self.label)
                )
                if sent is None:
                    sent = list(messages)
                sent[index] = replayed
        return tuple(messages if sent is None else sent), tuple(dropped)

    def _replayable(self, message: Message, index: int) -> Message:
        reasoning = message.reasoning
        if reasoning is None or not reasoning.provider_reasoning:
            return message
        check_provider_reasoning(reasoning.provider_reasoning, index=index)
        if not reasoning.has_provider_reasoning() or reasoning.provider == self.label:
            return message
        # The display text and who made it stay; only the replay state goes.
        return attrs.evolve(message, reasoning=attrs.evolve(reasoning, provider_reasoning=b""))
