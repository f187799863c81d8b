"""A conversation's settings as a saved document holds them.

A document's ``settings`` carries the budget knobs of the conversation's
:class:`RequestSettings`: ``max_context_tokens`` (``null``: unset) and
``output_reserve_tokens`` (left out: unset). Handlers, counters and sampling
are never saved; a loaded conversation takes them from its agent. Keys this
version does not know are kept as they are, so a newer document survives a
round trip.

It also carries the conversation's counting state: ``token_calibration``,
the calibration of each model (and tool set) the conversation ran with: a
positive ratio, or a ratio with its fit by class (``counting._saved``),
written when the agent's client has a
:class:`~threadline.counting.TokenCalibration`. A loaded conversation hands
it back to its client's calibration, which keeps the larger ratio.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, cast

from threadline._errors import ConversationFormatError, InvalidRequestError
from threadline._sentinel import NotGiven
from threadline._settings import RequestSettings, SettingsChanges
from threadline.counting._calibration._saved import SavedEntry, check_saved, merged
from threadline.serialization._documents import ConversationDocument, JsonValue

__all__ = ["CALIBRATION_KEY", "saved_calibration", "saved_changes", "saved_settings"]

_SAVED = ("max_context_tokens", "output_reserve_tokens")
CALIBRATION_KEY = "token_calibration"


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
            positive, finite ratios or fits.
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
        except ValueError as exc:
            raise ConversationFormatError(str(exc), path=f"{path}.{model}") from None
    return entries


def saved_settings(
    settings: RequestSettings,
    extra: dict[str, JsonValue],
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
