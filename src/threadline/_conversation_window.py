"""Where a conversation's window starts between cache-stable cuts, and how it is saved.

Under the cache-stable policy (``threadline.limiting.cache_stable_units``) a
conversation does not send its whole transcript every turn: it sends what the
last cut left, a :class:`KeptWindow`, plus each new turn. The window's start
stays put, so every turn's prompt begins with the one before it and the
provider serves that prefix from its cache, until the budget is reached and
the handler cuts again. A message a handler put in front of the kept turns
(a summary) is part of the window too: the ``head``.

The kept window is conversation state, saved with the conversation: under
the ``"window"`` key of the document's ``settings``, as
``{"start": EVENT_INDEX, "head": [MESSAGE, ...]}``, left out while nothing
was cut. That mapping is the conversation's own business and a threadline
that does not know a key keeps it as it is, so the format stays version 1
and an older threadline still reads the document (and sends the whole window).
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

import attrs

from threadline._errors import ConversationFormatError
from threadline._messages import Message, Origin, Role
from threadline._result import RunResult
from threadline._settings import RequestSettings
from threadline.limiting._defaults import DEFAULT_CONVERSATION_HANDLER
from threadline.limiting._traits import traits_of
from threadline.serialization._converter import messages_from_value, messages_value
from threadline.serialization._documents import JsonValue

__all__ = [
    "CONVERSATION_PRE",
    "WINDOW_KEY",
    "KeptWindow",
    "SentWindow",
    "cache_key",
    "conversation_settings",
    "keeps_window",
    "saved_window",
    "window_after",
    "window_value",
]

WINDOW_KEY = "window"

CONVERSATION_PRE = DEFAULT_CONVERSATION_HANDLER


@attrs.frozen(kw_only=True)
class KeptWindow:
    """What the last cut left: the first event still sent, and messages standing before it.

    ``start`` indexes the conversation's events (0: nothing was cut); ``head``
    are messages a handler put in front of the kept events, such as a summary
    of what was cut, sent before them every turn.
    """

    start: int = 0
    head: tuple[Message, ...] = ()


@attrs.frozen(kw_only=True)
class SentWindow:
    """What a turn sent as history, as the very objects it sent.

    ``base`` is the event index of ``window[0]``; ``head`` are the kept head
    messages. The run hands the same objects back for what limiting kept, so
    the next window is found by identity, never by comparing texts.
    """

    kept: KeptWindow
    base: int
    window: tuple[Message, ...]

    @property
    def history(self) -> tuple[Message, ...]:
        """The history the turn's request is given: the head, then the window."""
        return (*self.kept.head, *self.window)


def cache_key(conversation_id: str) -> str:
    """The prompt-cache key a conversation's requests carry: stable for its id, and a
    digest of it, so an id that names a person never reaches the provider."""
    digest = hashlib.sha256(conversation_id.encode("utf-8")).hexdigest()
    return f"threadline-{digest[:32]}"


def conversation_settings(settings: RequestSettings) -> RequestSettings:
    """What a conversation's turn runs with: ``settings``, the cache-stable Pre
    handler filled in when they name no Pre handler."""
    if settings.pre_max_tokens_reached is not None:
        return settings
    return settings.evolve(pre_max_tokens_reached=CONVERSATION_PRE)


def keeps_window(settings: RequestSettings) -> bool:
    """Whether a conversation with these settings keeps its window between cuts:
    its Pre handler (the default one included) or its Post handler keeps a stable prefix."""
    settings = conversation_settings(settings)
    return any(
        traits_of(handler).keeps_stable_prefix
        for handler in (settings.pre_max_tokens_reached, settings.post_max_tokens_reached)
    )


def window_after(sent: SentWindow, result: RunResult, *, instructions: bool) -> KeptWindow:
    """Where the window stands after ``result``: the first kept message of the
    window sent, and the messages a handler left in front of it.

    ``instructions`` says the transcript opens with the agent's system
    message, which no handler drops. A start that a handler left inside a
    turn moves back to that turn's user message: the window may hold more
    than the cut left, never a reply without its question.
    """
    window = sent.window
    if not any(record.handlers for record in result.limiting):
        return sent.kept  # no handler ran: the window is as it was sent
    position: dict[int, int] = {}
    for index, message in enumerate(window):
        position.setdefault(id(message), index)  # one object twice: the earlier keeps more
    messages = result.messages[1:] if instructions else result.messages
    head: list[Message] = []
    offset = len(window)  # everything before this run's prompt is gone
    for message in messages:
        found = position.get(id(message))
        if found is not None:
            offset = found
            break
        if message.origin is Origin.TURN:
            break  # this run's prompt: pinned, so always there
        if message.origin is not Origin.INJECTION:  # injections are never kept
            head.append(message)
    while 0 < offset < len(window) and window[offset].role is not Role.USER:
        offset -= 1
    kept_head = tuple(head)
    if offset == 0 and _same(kept_head, sent.kept.head):
        return sent.kept  # no cut: the start stays where it was (history_limit moves on its own)
    return KeptWindow(start=sent.base + offset, head=kept_head)


def _same(a: Sequence[Message], b: Sequence[Message]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))


def window_value(window: KeptWindow) -> dict[str, JsonValue] | None:
    """The window as the document's ``settings`` keep it; ``None`` while nothing was cut."""
    if window == KeptWindow():
        return None
    head: Any = messages_value(window.head, f"$.settings.{WINDOW_KEY}.head")
    return {"start": window.start, "head": head}


def saved_window(extra: dict[str, JsonValue], events: Sequence[Message]) -> KeptWindow:
    """The kept window a document's settings hold (taken out of ``extra``), checked
    against the answered ``events`` it indexes.

    Raises:
        ConversationFormatError: a window that is not such a mapping, or whose
            start is not a user message of the transcript (the path names it).
    """
    value = extra.pop(WINDOW_KEY, None)
    if value is None:
        return KeptWindow()
    path = f"$.settings.{WINDOW_KEY}"
    if not isinstance(value, dict) or set(value) != {"start", "head"}:
        raise ConversationFormatError(
            'a kept window is {"start": EVENT_INDEX, "head": [MESSAGE, ...]}', path=path
        )
    start = value["start"]
    if isinstance(start, bool) or not isinstance(start, int) or not 0 <= start <= len(events):
        raise ConversationFormatError(
            f"the window's start must be an event index from 0 to {len(events)}, not {start!r}",
            path=f"{path}.start",
        )
    if start < len(events) and events[start].role is not Role.USER:
        raise ConversationFormatError(
            f"the window must start at a user message, not a {events[start].role.value} message",
            path=f"{path}.start",
        )
    head = messages_from_value(value["head"], f"{path}.head")
    return KeptWindow(start=start, head=head)
