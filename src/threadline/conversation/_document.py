"""A conversation's saved document: its header's settings, and what a document restores.

A document's ``settings`` carries the budget knobs of the conversation's
:class:`RequestSettings`: ``max_context_tokens`` (``null``: unset) and
``output_reserve_tokens`` (left out: unset). Handlers, counters and sampling
are never saved; a loaded conversation takes them from its agent. Keys this
version does not know are kept as they are, so a newer document survives a
round trip.

It also carries the conversation's counting state: ``token_calibration``,
the calibration of each model (and tool set) the conversation ran with: a
positive ratio, or a ratio with its fit by class (``counting._calibration._saved``),
written when the agent's client has a
:class:`~threadline.counting.TokenCalibration`. A loaded conversation hands
it back to its client's calibration, which keeps the larger ratio.

And the kept window (``_window``), under the ``"window"`` key, as
``{"start": EVENT_INDEX, "head": [MESSAGE, ...]}``, left out while nothing
was cut. That mapping is the conversation's own business and a threadline
that does not know a key keeps it as it is, so the format stays version 1
and an older threadline still reads the document (and sends the whole window).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

import attrs

from threadline._errors import ConversationFormatError, InvalidRequestError
from threadline._messages import Message, Role
from threadline._sentinel import NotGiven
from threadline._settings import RequestSettings, SettingsChanges
from threadline.conversation._transcript import Transcript
from threadline.conversation._window import KeptWindow
from threadline.counting._calibration import (
    SavedEntry,
    SavedValueError,
    check_saved,
    merged,
)
from threadline.engine._agent import Agent
from threadline.serialization._converter import messages_from_value, messages_value
from threadline.serialization._documents import ConversationDocument, JsonValue
from threadline.serialization._json import member_path

__all__ = [
    "CALIBRATION_KEY",
    "WINDOW_KEY",
    "Restored",
    "header_settings",
    "restore",
    "restore_calibration",
    "saved_calibration",
    "saved_changes",
    "saved_settings",
    "saved_window",
    "window_value",
]

_SAVED = ("max_context_tokens", "output_reserve_tokens")
CALIBRATION_KEY = "token_calibration"
WINDOW_KEY = "window"


@attrs.frozen(kw_only=True)
class Restored:
    """What a document gives a conversation continuing it.

    ``changes`` are the saved budget knobs, applied over the agent's settings;
    ``extra`` the settings keys this version does not know (and the
    calibration), kept to be written back.
    """

    changes: SettingsChanges
    extra: dict[str, JsonValue]
    transcript: Transcript
    window: KeptWindow


def restore(document: ConversationDocument) -> Restored:
    """The settings changes, transcript and kept window ``document`` holds.

    Raises:
        ConversationFormatError: a setting of the wrong type, or a transcript
            whose tool units are broken (the path names it).
    """
    changes, extra = saved_changes(document)
    transcript = Transcript.from_document(document)
    window = saved_window(extra, transcript.messages_from(0))
    return Restored(changes=changes, extra=extra, transcript=transcript, window=window)


def restore_calibration(agent: Agent, extra: Mapping[str, JsonValue]) -> None:
    """Give the ratios a loaded document saved to ``agent``'s client's calibration, if any."""
    calibration = agent.client.calibration
    if calibration is not None:
        calibration.restore(saved_calibration(extra))


def header_settings(
    settings: RequestSettings, extra: Mapping[str, JsonValue], agent: Agent, window: KeptWindow
) -> dict[str, JsonValue]:
    """The ``settings`` of a conversation's document: its budget knobs, the keys this
    version does not know, what ``agent``'s client's calibration knows of its model,
    and the kept ``window``."""
    saved = saved_settings(settings, extra, _calibration_ratios(agent))
    kept = window_value(window)
    if kept is not None:
        saved[WINDOW_KEY] = kept
    return saved


def _calibration_ratios(agent: Agent) -> dict[str, SavedEntry]:
    calibration = agent.client.calibration
    model = agent.model
    if calibration is None or model is None:
        return {}
    return calibration.saved_of(model.name)


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
    saved_calibration(extra)  # refused here, with its path, rather than on the first turn
    return cast(SettingsChanges, changes), extra


def saved_calibration(extra: Mapping[str, JsonValue]) -> dict[str, SavedEntry]:
    """The calibration kept among a document's settings (empty when none): per key, a
    ratio or a ratio with its fit by class (see ``threadline.counting._calibration._saved``).

    Raises:
        ConversationFormatError: ``token_calibration`` is not a mapping of keys to
            ratios or fits a provider could have taught (the path names the field).
    """
    saved = extra.get(CALIBRATION_KEY)
    if saved is None:
        return {}
    path = f"$.settings.{CALIBRATION_KEY}"
    if not isinstance(saved, Mapping):
        raise ConversationFormatError(
            f"expected a mapping of model names to ratios, not {type(saved).__name__}", path=path
        )
    entries: dict[str, SavedEntry] = {}
    for model, value in saved.items():
        try:
            entries[model] = check_saved(value)
        except SavedValueError as exc:
            where = f"{path}{member_path(model)}{exc.field}"
            raise ConversationFormatError(str(exc), path=where) from None
    return entries


def saved_settings(
    settings: RequestSettings,
    extra: Mapping[str, JsonValue],
    calibration: Mapping[str, SavedEntry] | None = None,
) -> dict[str, JsonValue]:
    """The ``settings`` of a saved document; an unset reserve is left out.

    ``calibration`` (a model's name to its ratio) is merged into the ratios
    ``extra`` already holds, the larger ratio winning.
    """
    saved: dict[str, JsonValue] = dict(extra)
    if calibration:
        ratios = saved_calibration(extra)
        for model, entry in calibration.items():
            ratios[model] = merged(ratios.get(model), entry)
        saved[CALIBRATION_KEY] = cast(JsonValue, ratios)
    saved["max_context_tokens"] = settings.max_context_tokens
    reserve = settings.output_reserve_tokens
    if not isinstance(reserve, NotGiven):
        saved["output_reserve_tokens"] = reserve
    return saved


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
