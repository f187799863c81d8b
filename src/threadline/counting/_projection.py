"""``DefaultReplayProjection``: which parts of a message's reasoning are replayed.

A counter counts a message as its driver will send it, and reasoning is where
what is stored and what is sent differ most. ``Reasoning.text`` is for people
to read; ``Reasoning.provider_reasoning`` is the provider's replay state, JSON
that the driver sends back as it was received. The default projection says:

- the display ``text`` is never replayed, so it costs nothing, with or without
  replay state beside it; in particular a display copy of replayed thinking is
  not counted twice;
- replay state that is empty, blank or ``null`` costs nothing;
- in replay state, every string value costs its tokens (thinking plaintext,
  signatures, redacted ``data``, encrypted content, summary texts), while the
  envelope does not: object keys, numbers, booleans, ``null``, and the string
  values of the keys ``type``, ``id`` and ``status``;
- replay state that is not valid JSON is counted as its raw text. A driver
  refuses to send it, so the exact figure hardly matters; counting it keeps
  counting from failing and errs towards a bigger estimate.

For an Anthropic-style state such as::

    [{"type": "thinking", "thinking": "Paris is the capital.", "signature": "EqQB..."},
     {"type": "redacted_thinking", "data": "EmwKAhgB..."}]

the replayed pieces are the thinking text, the signature and the data.
"""

from __future__ import annotations

import json
from typing import Any, Final

import attrs

from threadline._messages import Reasoning, has_provider_reasoning

__all__ = ["NO_REPLAY", "DefaultReplayProjection", "NoReplay", "payload_strings"]

ENVELOPE_KEYS: Final = frozenset({"type", "id", "status"})
"""Keys whose string values are envelope metadata, not replayed content."""


@attrs.frozen
class DefaultReplayProjection:
    """The replay projection used when a driver does not supply its own.

    It has no state: all instances are equal, so counters bound to any of them
    share cached counts.

    Example::

        DefaultReplayProjection().replayed_reasoning(
            Reasoning(text="shown", provider_reasoning=b'[{"type": "thinking", "thinking": "t"}]')
        )  # -> ("t",)
    """

    def replayed_reasoning(self, reasoning: Reasoning) -> tuple[str, ...]:
        """The strings of ``reasoning.provider_reasoning`` that go back to the model."""
        raw = reasoning.provider_reasoning
        if not has_provider_reasoning(raw):
            return ()
        try:
            document = json.loads(raw)
        except (ValueError, RecursionError):
            return (raw.decode("utf-8", errors="replace"),)
        return tuple(payload_strings(document))


class NoReplay:
    """The replay projection of a driver that never sends reasoning back.

    Display text and replay state alike cost nothing on the next request.
    Drivers and the test doubles share this one instance (``NO_REPLAY``).
    """

    __slots__ = ()

    def replayed_reasoning(self, reasoning: Reasoning) -> tuple[str, ...]:
        return ()

    def __repr__(self) -> str:
        return "NoReplay()"


NO_REPLAY = NoReplay()


def payload_strings(document: Any) -> list[str]:
    """The strings of a parsed replay state that cost tokens, in document order:
    every string value but those of the envelope keys (:data:`ENVELOPE_KEYS`)."""
    # Depth first, in document order, with an explicit stack: the JSON can be
    # as deep as the parser allows, deeper than Python's own recursion.
    found: list[str] = []
    pending: list[Any] = [document]
    while pending:
        value = pending.pop()
        if isinstance(value, str):
            if value:
                found.append(value)
        elif isinstance(value, list):
            pending.extend(reversed(value))
        elif isinstance(value, dict):
            pending.extend(
                item
                for key, item in reversed(value.items())
                if not (key in ENVELOPE_KEYS and isinstance(item, str))
            )
    return found
