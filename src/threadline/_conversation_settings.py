"""A conversation's settings as a saved document holds them.

A document's ``settings`` carries the budget knobs of the conversation's
:class:`RequestSettings`: ``max_context_tokens`` (``null``: unset) and
``output_reserve_tokens`` (left out: unset). Handlers, counters and sampling
are never saved; a loaded conversation takes them from its agent. Keys this
version does not know are kept as they are, so a newer document survives a
round trip.

It also carries the conversation's counting state: ``token_calibration``,
the calibration ratio of each model the conversation ran with (a model's
name to a positive number), written when the agent's client has a
:class:`~threadline.counting.TokenCalibration`. A loaded conversation hands
it back to its client's calibration, which keeps the larger ratio.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, cast

from threadline._errors import ConversationFormatError, InvalidRequestError
from threadline._sentinel import NotGiven
from threadline._settings import RequestSettings, SettingsChanges
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


def saved_calibration(extra: Mapping[str, JsonValue]) -> dict[str, float]:
    """The calibration ratios kept among a document's settings (empty when none).

    Raises:
        ConversationFormatError: ``token_calibration`` is not a mapping of model names
            to positive, finite numbers.
    """
    saved = extra.get(CALIBRATION_KEY)
    if saved is None:
        return {}
    path = f"$.settings.{CALIBRATION_KEY}"
    if not isinstance(saved, Mapping):
        raise ConversationFormatError(
            f"expected a mapping of model names to ratios, not {type(saved).__name__}", path=path
        )
    ratios: dict[str, float] = {}
    for model, ratio in saved.items():
        if isinstance(ratio, bool) or not isinstance(ratio, int | float):
            ratio = math.nan
        if not math.isfinite(ratio) or ratio <= 0:
            raise ConversationFormatError(
                f"a calibration ratio is a positive number, not {saved[model]!r}",
                path=f"{path}.{model}",
            )
        ratios[model] = float(ratio)
    return ratios


def saved_settings(
    settings: RequestSettings,
    extra: dict[str, JsonValue],
    calibration: Mapping[str, float] | None = None,
) -> dict[str, JsonValue]:
    """The ``settings`` of a saved document; an unset reserve is left out.

    ``calibration`` (a model's name to its ratio) is merged into the ratios
    ``extra`` already holds, the larger ratio winning.
    """
    saved: dict[str, JsonValue] = dict(extra)
    if calibration:
        ratios = saved_calibration(extra)
        for model, ratio in calibration.items():
            ratios[model] = max(ratio, ratios.get(model, ratio))
        saved[CALIBRATION_KEY] = dict(ratios)
    saved["max_context_tokens"] = settings.max_context_tokens
    reserve = settings.output_reserve_tokens
    if not isinstance(reserve, NotGiven):
        saved["output_reserve_tokens"] = reserve
    return saved
