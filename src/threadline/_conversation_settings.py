"""A conversation's own options: checked when set, kept in a saved document's settings.

``history_limit`` travels as a field of the document; ``max_context_tokens``
and ``output_reserve_tokens`` travel in its ``settings``. Keys this version
does not know are kept as they are, so a newer document survives a round trip.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from threadline._errors import ConversationFormatError, InvalidRequestError
from threadline._sentinel import NotGiven
from threadline.limiting._budget import is_int
from threadline.limiting._event import TokenLimitHandler
from threadline.serialization._documents import ConversationDocument, JsonValue

__all__ = [
    "check_handler",
    "check_history_limit",
    "check_max_context",
    "check_reserve",
    "settings_from",
    "settings_to",
]


def check_history_limit(value: Any) -> int:
    if not is_int(value) or value < 0:
        raise InvalidRequestError(f"history_limit must be an int of 0 or more, not {value!r}")
    limit: int = value
    return limit


def check_max_context(value: Any) -> int | None:
    if value is not None and (not is_int(value) or value <= 0):
        raise InvalidRequestError(f"max_context_tokens must be a positive int, not {value!r}")
    limit: int | None = value
    return limit


def check_reserve(value: Any) -> int | NotGiven:
    if not isinstance(value, NotGiven) and (not is_int(value) or value < 0):
        raise InvalidRequestError(
            f"output_reserve_tokens must be an int of 0 or more, not {value!r}"
        )
    reserve: int | NotGiven = value
    return reserve


def check_handler(name: str, value: Any) -> TokenLimitHandler | None:
    if value is not None and not callable(value):
        raise InvalidRequestError(f"{name} must be a callable, not {type(value).__name__}")
    handler: TokenLimitHandler | None = value
    return handler


def settings_from(document: ConversationDocument) -> dict[str, Any]:
    """Conversation options from a document's settings, refusing values of the wrong type."""
    settings = dict(document.settings)
    options: dict[str, Any] = {}
    checks: dict[str, Callable[[object], object]] = {
        "max_context_tokens": check_max_context,
        "output_reserve_tokens": check_reserve,
    }
    for key, check in checks.items():
        if key in settings:
            try:
                options[key] = check(settings.pop(key))
            except InvalidRequestError as exc:
                raise ConversationFormatError(str(exc), path=f"$.settings.{key}") from None
    options["extra"] = settings
    return options


def settings_to(
    max_context_tokens: int | None,
    output_reserve_tokens: int | NotGiven,
    extra: dict[str, JsonValue],
) -> dict[str, JsonValue]:
    """The ``settings`` of a saved document; an unset reserve is left out."""
    settings: dict[str, JsonValue] = dict(extra)
    settings["max_context_tokens"] = max_context_tokens
    if not isinstance(output_reserve_tokens, NotGiven):
        settings["output_reserve_tokens"] = output_reserve_tokens
    return settings
