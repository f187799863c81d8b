"""A conversation's settings as a saved document holds them.

A document's ``settings`` carries the budget knobs of the conversation's
:class:`RequestSettings`: ``max_context_tokens`` (``null``: unset) and
``output_reserve_tokens`` (left out: unset). Handlers, counters and sampling
are never saved; a loaded conversation takes them from its agent. Keys this
version does not know are kept as they are, so a newer document survives a
round trip.
"""

from __future__ import annotations

from typing import Any, cast

from threadline._errors import ConversationFormatError, InvalidRequestError
from threadline._sentinel import NotGiven
from threadline._settings import RequestSettings, SettingsChanges
from threadline.serialization._documents import ConversationDocument, JsonValue

__all__ = ["saved_changes", "saved_settings"]

_SAVED = ("max_context_tokens", "output_reserve_tokens")


def saved_changes(document: ConversationDocument) -> tuple[SettingsChanges, dict[str, JsonValue]]:
    """What ``document`` changes in its agent's settings, and the keys this version does not
    know. An unset saved value changes nothing: the agent's holds.

    Raises:
        ConversationFormatError: a saved value of the wrong type or sign (the path names it).
    """
    extra = dict(document.settings)
    changes: dict[str, Any] = {}
    for key in _SAVED:
        if key not in extra:
            continue
        value = extra.pop(key)
        if value is None and key == "max_context_tokens":
            continue
        change: dict[str, Any] = {key: value}
        try:
            RequestSettings(**change)
        except InvalidRequestError as exc:
            raise ConversationFormatError(str(exc), path=f"$.settings.{key}") from None
        changes[key] = value
    return cast(SettingsChanges, changes), extra


def saved_settings(settings: RequestSettings, extra: dict[str, JsonValue]) -> dict[str, JsonValue]:
    """The ``settings`` of a saved document; an unset reserve is left out."""
    saved: dict[str, JsonValue] = dict(extra)
    saved["max_context_tokens"] = settings.max_context_tokens
    reserve = settings.output_reserve_tokens
    if not isinstance(reserve, NotGiven):
        saved["output_reserve_tokens"] = reserve
    return saved
