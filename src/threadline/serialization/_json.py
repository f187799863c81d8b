"""JSON helpers every room shares: what a JSON value is, how to name one, how to make one.

- :data:`JsonValue`, :func:`json_value_problem` and :func:`copy_json`: values
  JSON holds exactly (a saved document's settings);
- :func:`json_kind`, :func:`json_equal`: JSON's view of a decoded value (a
  boolean is never a number);
- :func:`describe`, :func:`short_json`, :func:`member_path`, :func:`path_to`: how
  an error message names a value it refuses and where it sits;
- :func:`json_default`, :func:`json_value`: Python values (Enum members,
  attrs and dataclass instances, dates) as JSON, for what a tool returns and
  the defaults its schema shows.

Turning JSON into typed values is the cattrs converters' job
(``threadline.serialization._hooks``), not this module's.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import json
import math
import pathlib
import re
import uuid
from collections.abc import Mapping
from typing import Any, TypeAlias

import attrs

__all__ = [
    "JsonValue",
    "copy_json",
    "describe",
    "json_default",
    "json_equal",
    "json_kind",
    "json_value",
    "json_value_problem",
    "member_path",
    "path_to",
    "short_json",
]

JsonValue: TypeAlias = "bool | int | float | str | list[JsonValue] | dict[str, JsonValue] | None"
"""A value JSON can hold exactly: finite floats, string keys, lists not tuples."""

# --- what a JSON value is ----------------------------------------------------------


def json_value_problem(value: object) -> tuple[str, str] | None:
    """Where and why ``value`` is not a :data:`JsonValue`, or ``None`` when it is.

    The place is a JSONPath suffix relative to ``value`` (``""``, ``.a[2]``).
    """
    if value is None or isinstance(value, bool | int | str):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else ("", f"{value!r} is not a JSON number")
    if isinstance(value, list):
        for index, item in enumerate(value):
            problem = json_value_problem(item)
            if problem is not None:
                return f"[{index}]{problem[0]}", problem[1]
        return None
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return "", f"the key {key!r} is not a string"
            problem = json_value_problem(item)
            if problem is not None:
                return f"{member_path(key)}{problem[0]}", problem[1]
        return None
    return "", f"a {type(value).__name__} is not a JSON value"


def copy_json(value: Any) -> Any:
    """A deep copy of lists and dicts in ``value``; anything else is shared."""
    if isinstance(value, list):
        return [copy_json(item) for item in value]
    if isinstance(value, dict):
        return {key: copy_json(item) for key, item in value.items()}
    return value


def json_kind(value: object) -> str:
    """The JSON Schema type name of a decoded value: ``"integer"``, ``"array"``..."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    return "object"


def json_equal(left: object, right: object) -> bool:
    """Equal as JSON values are: like ``==``, except that a boolean is never a number."""
    # In Python True == 1 and 1 == 1.0; in JSON a boolean is never a number.
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left is right
    return bool(left == right)


# --- how an error message names a value ----------------------------------------------

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")

KIND_WORDS: Mapping[str, str] = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
    "null": "null",
    "array": "an array",
    "object": "an object",
}
"""A JSON Schema type name as an error message says it: ``"integer"`` is ``an integer``."""


def member_path(key: str) -> str:
    """The JSONPath step to ``key``: ``.name``, or ``["odd key"]`` when it is not a name."""
    if _IDENTIFIER.match(key):
        return f".{key}"
    escaped = key.replace("\\", "\\\\").replace('"', '\\"')
    return f'["{escaped}"]'


def path_to(value: object, target: object) -> str | None:
    """The JSONPath suffix (``""``, ``.a[2]``) of the first place in decoded JSON ``value``
    that holds ``target`` itself (by identity), or ``None`` when none does.

    Walked without recursion: a document nested as deeply as a parser allows still
    gets its path.
    """
    pending: list[tuple[object, str]] = [(value, "")]
    while pending:
        item, path = pending.pop()
        if item is target:
            return path
        if isinstance(item, dict):
            children = [(child, path + member_path(key)) for key, child in item.items()]
        elif isinstance(item, list):
            children = [(child, f"{path}[{index}]") for index, child in enumerate(item)]
        else:
            continue
        pending.extend(reversed(children))  # the first child is looked at first
    return None


def short_json(value: object) -> str:
    """``value`` as JSON text, cut to 60 characters (what no JSON holds shows its repr)."""
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= 60 else text[:57] + "..."


def describe(value: object, *, as_json: bool = False) -> str:
    """How an error message names a value it refuses.

    ``null``, ``true`` and ``false`` name themselves. Any other value is named
    for a person reading about a saved document: ``the number 5``, ``the
    string 'hi'`` (cut after 40 characters), ``an array``, ``an object``, ``a
    set``. With ``as_json``, for a model reading about the arguments it sent,
    it is its JSON type and the value as JSON: ``an integer (7)``, ``a string
    ("two")``, ``an array ([1, 2])``.
    """
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    if as_json:
        return f"{KIND_WORDS[json_kind(value)]} ({short_json(value)})"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"the string {shown!r}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


# --- Python values as JSON -------------------------------------------------------------


def json_default(value: Any) -> Any:
    """``json.dumps`` ``default=``: Enum, attrs, dataclass, dates and a few more.

    Raises:
        TypeError: a value with no obvious JSON form.
    """
    if isinstance(value, enum.Enum):
        return value.value
    if attrs.has(type(value)):
        return {field.alias: getattr(value, field.name) for field in attrs.fields(type(value))}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {field.name: getattr(value, field.name) for field in dataclasses.fields(value)}
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID | decimal.Decimal | pathlib.PurePath):
        return str(value)
    if isinstance(value, Mapping):
        return dict(value)
    if isinstance(value, set | frozenset):
        return list(value)
    raise TypeError(f"a value of type {type(value).__qualname__} has no JSON form")


def json_value(value: Any) -> Any:
    """``value`` as plain JSON data, or ``attrs.NOTHING`` when it has no JSON form."""
    try:
        return json.loads(json.dumps(value, default=json_default))
    except (TypeError, ValueError):
        return attrs.NOTHING
