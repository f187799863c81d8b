"""Reasoning replay rules every driver shares.

``Reasoning.provider_reasoning`` is opaque replay state: JSON bytes stored as
the provider sent them. Before any driver sends a transcript it checks that
state (SPEC §2): malformed JSON is refused, and so is a stored
``{"type": "text", ...}`` block, which would reach the model as the assistant's
own words. A driver that never replays reasoning still checks, so a damaged
transcript fails the same way whichever provider it is sent to.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from threadline._errors import InvalidRequestError
from threadline._messages import Message, has_provider_reasoning

__all__ = ["check_provider_reasoning", "check_transcript_reasoning"]


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


def check_transcript_reasoning(messages: Sequence[Message]) -> None:
    """Apply :func:`check_provider_reasoning` to every message that carries reasoning.

    Raises:
        InvalidRequestError: naming the first message whose replay state is refused.
    """
    for index, message in enumerate(messages):
        reasoning = message.reasoning
        if reasoning is not None and reasoning.provider_reasoning:
            check_provider_reasoning(reasoning.provider_reasoning, index=index)
