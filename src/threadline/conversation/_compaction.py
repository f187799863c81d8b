"""Native compaction: the provider's own compaction of a conversation, as a transaction.

``Conversation.compact()`` asks the driver (``Driver.compact``) to compact
what the next turn would send, and commits the answer as one new event at
the end of the transcript, in one versioned write (``Conversation._rewrite``,
the write ``replace_events`` uses), or raises ``ConcurrentModificationError``
when another writer got in first. The answer is an assistant message with no
text whose replay state holds the provider's compaction block (a boundary of
the driver's replay rules): for that provider and model the window of every
later call opens there, so the turns before it are not sent; any other
provider is handed the whole history, without the state. Nothing is cut from
the transcript, so nothing is lost.

Like ``summarize_oldest``, a compaction that does not come back usable is a
no-op with a reported outcome (a :class:`~threadline.limiting.CompactionOutcome`):
a driver without native compaction (``"unsupported"``), a provider that
failed or refused (``"failed"``), an answer holding no compaction block
(``"empty"``), or nothing to compact. Cancelling the caller cancels it, with
nothing written.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import attrs

from threadline._messages import Message, Role
from threadline._models import Model
from threadline._provider import Driver, ProviderCall, ProviderResponse
from threadline._replay import label_of
from threadline.limiting._ledger import CompactionOutcome, CompactionStatus
from threadline.serialization._documents import ConversationEvent

__all__ = ["NATIVE_COMPACTION", "NativeCompaction", "native_compaction"]

logger = logging.getLogger("threadline.conversation")

NATIVE_COMPACTION = "native compaction"
"""The handler name a native compaction's outcome carries."""


@attrs.frozen(kw_only=True)
class NativeCompaction:
    """What a native compaction came to, and the event to commit (``None``: no-op)."""

    outcome: CompactionOutcome
    event: ConversationEvent | None = None


async def native_compaction(
    driver: Driver,
    model: Model,
    sent: Sequence[Message],
    *,
    turn_id: int,
    covered_tokens: int,
    cache_key: str | None = None,
) -> NativeCompaction:
    """Ask ``driver`` to compact ``sent`` (what the next turn would hand it) and check
    the answer; the event to commit is the answer's message as turn ``turn_id``.

    Never raises for the provider's failure: it is the outcome's ``"failed"``.
    """
    covered = sum(1 for message in sent if message.role is not Role.SYSTEM)

    def outcome(status: CompactionStatus, detail: str = "") -> NativeCompaction:
        if status != "applied":
            logger.warning(
                "native compaction did not happen (%s: %s); the conversation is left as it was",
                status,
                detail,
            )
        return NativeCompaction(
            outcome=CompactionOutcome(
                handler=NATIVE_COMPACTION,
                status=status,
                covered_messages=covered,
                covered_tokens=covered_tokens,
                detail=detail,
            )
        )

    if not covered:
        return outcome("empty", "nothing to compact: the conversation sends no messages yet")
    call = ProviderCall(model=model, messages=tuple(sent), cache_key=cache_key)
    try:
        response = await driver.compact(call)
    except Exception as exc:  # any failure of the provider is a no-op, reported
        return outcome("failed", f"{type(exc).__name__}: {exc}")
    if response is None:
        return outcome("unsupported", f"the {driver.name} driver has no native compaction")
    problem = _unusable(response, driver, model)
    if problem:
        return outcome("empty", problem)
    event = ConversationEvent(
        message=response.message,
        turn_id=turn_id,
        usage=response.usage,
        model=response.model or None,
        finish_reason=response.finish_reason,
    )
    return attrs.evolve(outcome("applied"), event=event)


def _unusable(response: ProviderResponse, driver: Driver, model: Model) -> str:
    """Why ``response`` cannot stand for the turns it compacts (``""``: it can)."""
    message = response.message
    if message.role is not Role.ASSISTANT or message.text or message.tool_calls:
        return "the driver answered with a message that is not a bare compaction"
    reasoning = message.reasoning
    raw = reasoning.provider_reasoning if reasoning is not None else b""
    if reasoning is None or not raw:
        return "the driver's answer holds no compaction state"
    if reasoning.provider != label_of(driver.name, model.name):
        return f"the compaction state is tagged {reasoning.provider!r}, not this driver and model"
    if not driver.replay_rules(model).opens_window(raw):
        return (
            "the driver's answer holds no compaction block with a summary "
            "(none its replay rules send, or an empty one)"
        )
    return ""
