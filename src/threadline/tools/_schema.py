"""JSON schema for tool arguments: built from type hints, checked against values.

Three jobs, all on the subset of JSON Schema that tool calling uses:

- ``schema_for`` turns a type hint into a schema (inline, no ``$ref``: not
  every provider resolves references);
- ``check`` lists what is wrong with a decoded JSON value, in words a model
  can act on;
- ``convert`` builds the Python value a typed parameter expects (Enum
  members, attrs instances, tuples) from a value that passed ``check``.

``parse_docstring`` reads the descriptions that go into a schema from Google,
reST and NumPy style docstrings.
"""

from __future__ import annotations

import dataclasses
import datetime
import decimal
import enum
import inspect
import json
import math
import pathlib
import re
import types
import typing
import uuid
from collections.abc import Iterable, Mapping, MutableMapping, MutableSequence, Sequence
from typing import Annotated, Any, Literal, Union

import attrs

from threadline._errors import InvalidRequestError

__all__ = [
    "check",
    "convert",
    "json_default",
    "json_value",
    "parse_docstring",
    "schema_for",
]

_NONE_TYPE = type(None)
_SEQUENCE_ORIGINS: frozenset[Any] = frozenset({list, tuple, Sequence, MutableSequence})
_MAPPING_ORIGINS: frozenset[Any] = frozenset({dict, Mapping, MutableMapping})
_UNION_ORIGINS: frozenset[Any] = frozenset({Union, types.UnionType})
_SUPPORTED = (
    "str, int, float, bool, None, Any, list[X], tuple[X, ...], dict[str, X], "
    "Literal[...], an Enum, an attrs class, or a union of these (X | None)"
)

# ---------------------------------------------------------------------------
# Type hint -> schema


def schema_for(hint: Any, *, where: str) -> dict[str, Any]:
    """The JSON schema of values of type ``hint``.

    ``where`` names the place of the hint (``"parameter 'city' of get_weather"``)
    for the error message.

    Raises:
        InvalidRequestError: the type has no JSON form threadline supports.
    """
    return _schema_for(hint, where, ())


def _schema_for(hint: Any, where: str, enclosing: tuple[type, ...]) -> dict[str, Any]:
    if hint is Any or hint is object:
        return {}
    if hint is None or hint is _NONE_TYPE:
        return {"type": "null"}
    for python_type, json_type in ((bool, "boolean"), (str, "string"), (int, "integer")):
        if hint is python_type:
            return {"type": json_type}
    if hint is float:
        return {"type": "number"}
    if hint is list or hint is tuple:
        return {"type": "array"}
    if hint is dict:
        return {"type": "object"}

    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is Annotated:
        schema = _schema_for(args[0], where, enclosing)
        description = _annotated_description(hint)
        if description is not None:
            schema["description"] = description
        return schema
    if origin is Literal:
        return _enum_schema([_literal_json(value, where) for value in args], where)
    if origin in _UNION_ORIGINS:
        return {"anyOf": [_schema_for(member, where, enclosing) for member in args]}
    if origin in _SEQUENCE_ORIGINS:
        item = _sequence_item(hint, where)
        return {"type": "array", "items": _schema_for(item, where, enclosing)}
    if origin in _MAPPING_ORIGINS:
        key, value = args
        if key is not str:
            raise InvalidRequestError(f"{where}: JSON object keys are strings; use dict[str, ...]")
        return {"type": "object", "additionalProperties": _schema_for(value, where, enclosing)}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum_schema([_json_scalar(member.value, where) for member in hint], where)
    if isinstance(hint, type) and attrs.has(hint):
        return _attrs_schema(hint, where, enclosing)
    raise InvalidRequestError(f"{where}: cannot describe {hint!r} in JSON schema; use {_SUPPORTED}")


def _annotated_description(hint: Any) -> str | None:
    """The first plain string in ``Annotated[X, ...]`` metadata: the description."""
    return next((meta for meta in hint.__metadata__ if isinstance(meta, str)), None)


def _sequence_item(hint: Any, where: str) -> Any:
    args = typing.get_args(hint)
    if typing.get_origin(hint) is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return args[0]
        raise InvalidRequestError(
            f"{where}: fixed-length tuples have no portable JSON schema; use tuple[X, ...]"
        )
    return args[0] if args else Any


def _literal_json(value: Any, where: str) -> Any:
    return _json_scalar(value.value if isinstance(value, enum.Enum) else value, where)


def _json_scalar(value: Any, where: str) -> Any:
    if value is None or isinstance(value, str | int | float):
        return value
    raise InvalidRequestError(
        f"{where}: the choice {value!r} is not a JSON string, number, boolean or null"
    )


def _json_type(value: Any) -> str:
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


def _enum_schema(values: list[Any], where: str) -> dict[str, Any]:
    if not values:
        raise InvalidRequestError(f"{where}: an enumeration needs at least one choice")
    kinds = {_json_type(value) for value in values}
    if kinds == {"integer", "number"}:
        kinds = {"number"}
    if len(kinds) == 1:
        return {"type": kinds.pop(), "enum": values}
    return {"enum": values}


def _attrs_schema(cls: type, where: str, enclosing: tuple[type, ...]) -> dict[str, Any]:
    if cls in enclosing:
        raise InvalidRequestError(
            f"{where}: {cls.__qualname__} contains itself; recursive types are not supported"
        )
    hints = _type_hints(cls, where)
    description, field_docs = parse_docstring(cls.__doc__)
    properties: dict[str, Any] = {}
    required: list[str] = []
    for field in attrs.fields(cls):
        if not field.init:
            continue
        hint = hints.get(field.name, field.type)
        field_where = f"{where}, field {field.alias!r} of {cls.__qualname__}"
        if hint is None or isinstance(hint, str):
            raise InvalidRequestError(f"{field_where}: annotate the field with its type")
        schema = _schema_for(hint, field_where, (*enclosing, cls))
        doc = field_docs.get(field.name) or field_docs.get(field.alias)
        if doc:
            schema["description"] = doc
        if field.default is attrs.NOTHING:
            required.append(field.alias)
        else:
            default = field.default
            if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
                default = attrs.NOTHING if default.takes_self else default.factory()
            represented = json_value(default)
            if represented is not attrs.NOTHING:
                schema["default"] = represented
        properties[field.alias] = schema
    schema = object_schema(properties, required)
    if description:
        schema["description"] = description
    return schema


def object_schema(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    """A closed object schema: these properties, these required, nothing else."""
    schema: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        schema["required"] = required
    schema["additionalProperties"] = False
    return schema


def _type_hints(owner: Any, where: str) -> dict[str, Any]:
    try:
        return typing.get_type_hints(owner, include_extras=True)
    except NameError as exc:
        raise InvalidRequestError(
            f"{where}: cannot resolve the annotations ({exc}); define the types they name "
            "at module level"
        ) from None


def type_hints(owner: Any, *, where: str) -> dict[str, Any]:
    """``typing.get_type_hints`` with extras, or ``{}`` for objects it cannot read.

    Raises:
        InvalidRequestError: an annotation names something that does not exist.
    """
    try:
        return _type_hints(owner, where)
    except TypeError:
        return {}


# ---------------------------------------------------------------------------
# Python values -> JSON


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


# ---------------------------------------------------------------------------
# Checking decoded JSON against a schema

_TYPE_WORDS = {
    "string": "a string",
    "integer": "an integer",
    "number": "a number",
    "boolean": "a boolean",
    "null": "null",
    "array": "an array",
    "object": "an object",
}


def check(value: Any, schema: Mapping[str, Any], path: str = "") -> list[str]:
    """What is wrong with ``value`` under ``schema``; empty when nothing is.

    Checks ``type``, ``enum``, ``const``, ``anyOf``/``oneOf``, ``properties``,
    ``required``, ``additionalProperties`` and ``items``; other keywords are
    not enforced. ``path`` is where ``value`` sits in the arguments (``""`` for
    the arguments object itself).
    """
    branches = schema.get("anyOf", schema.get("oneOf"))
    if isinstance(branches, Sequence) and branches:
        return _check_any_of(value, branches, path)
    if "const" in schema and not _json_equal(value, schema["const"]):
        return [f"{_subject(path)} must be {_dump(schema['const'])}, got {_dump(value)}"]
    choices = schema.get("enum")
    if isinstance(choices, Sequence) and not any(_json_equal(value, c) for c in choices):
        listed = ", ".join(_dump(choice) for choice in choices)
        return [f"{_subject(path)} must be one of {listed}, got {_dump(value)}"]
    expected = schema.get("type")
    if expected is not None:
        kinds = [expected] if isinstance(expected, str) else list(expected)
        if not any(_has_type(value, kind) for kind in kinds):
            wanted = " or ".join(_TYPE_WORDS.get(kind, kind) for kind in kinds)
            return [f"{_subject(path)} must be {wanted}, got {_describe(value)}"]
    if isinstance(value, dict):
        return _check_object(value, schema, path)
    items = schema.get("items")
    if isinstance(value, list) and isinstance(items, Mapping):
        errors: list[str] = []
        for index, item in enumerate(value):
            errors.extend(check(item, items, f"{path}[{index}]"))
        return errors
    return []


def _check_any_of(value: Any, branches: Sequence[Any], path: str) -> list[str]:
    failures = [check(value, branch, path) for branch in branches]
    if any(not errors for errors in failures):
        return []
    # When the value has the right JSON type for exactly one branch, that
    # branch's own complaint is the useful one.
    fitting = [
        errors
        for branch, errors in zip(branches, failures, strict=True)
        if _type_fits(value, branch)
    ]
    if len(fitting) == 1:
        return fitting[0]
    wanted = " or ".join(_describe_schema(branch) for branch in branches)
    return [f"{_subject(path)} must be {wanted}, got {_describe(value)}"]


def _check_object(value: dict[str, Any], schema: Mapping[str, Any], path: str) -> list[str]:
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    errors = [
        f"{_subject(_join(path, name))} is required"
        for name in schema.get("required", ())
        if name not in value
    ]
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        if key in properties:
            errors.extend(check(item, properties[key], _join(path, key)))
        elif extra is False:
            allowed = ", ".join(properties) if properties else "none"
            errors.append(f"unexpected argument {_join(path, key)!r} (allowed: {allowed})")
        elif isinstance(extra, Mapping):
            errors.extend(check(item, extra, _join(path, key)))
    return errors


def _subject(path: str) -> str:
    return f"argument {path!r}" if path else "the arguments"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _has_type(value: Any, kind: str) -> bool:
    if kind == "integer":
        return (isinstance(value, int) and not isinstance(value, bool)) or (
            isinstance(value, float) and math.isfinite(value) and value.is_integer()
        )
    if kind == "number":
        return (
            isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
        )
    if kind == "boolean":
        return isinstance(value, bool)
    if kind in _TYPE_WORDS:
        return _json_type(value) == kind
    return True  # a type name JSON Schema does not define: not ours to refuse


def _type_fits(value: Any, schema: Any) -> bool:
    if not isinstance(schema, Mapping) or "type" not in schema:
        return False
    kinds = schema["type"]
    kinds = [kinds] if isinstance(kinds, str) else kinds
    return any(_has_type(value, kind) for kind in kinds)


def _json_equal(left: Any, right: Any) -> bool:
    # In Python True == 1 and 1 == 1.0; in JSON a boolean is never a number.
    if isinstance(left, bool) or isinstance(right, bool):
        return isinstance(left, bool) and isinstance(right, bool) and left is right
    return bool(left == right)


def _dump(value: Any) -> str:
    text = json.dumps(value, ensure_ascii=False, default=repr)
    return text if len(text) <= 60 else text[:57] + "..."


def _describe(value: Any) -> str:
    kind = _json_type(value)
    if kind in ("null", "boolean"):
        return _dump(value)
    return f"{_TYPE_WORDS[kind]} ({_dump(value)})"


def _describe_schema(schema: Any) -> str:
    if not isinstance(schema, Mapping):
        return "a value"
    if "enum" in schema:
        return "one of " + ", ".join(_dump(choice) for choice in schema["enum"])
    kinds = schema.get("type")
    if kinds is None:
        return "a value"
    kinds = [kinds] if isinstance(kinds, str) else kinds
    return " or ".join(_TYPE_WORDS.get(kind, kind) for kind in kinds)


# ---------------------------------------------------------------------------
# Checked JSON -> the Python values a signature asks for


def convert(value: Any, hint: Any) -> Any:
    """Build the value of type ``hint`` from JSON data that passed ``check``.

    Enum values become members, objects become attrs instances, arrays become
    tuples where a tuple is asked for, and whole floats become ints.
    """
    if hint is Any or hint is object:
        return value
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if hint is int and isinstance(value, float):
        return int(value)
    if hint is tuple and isinstance(value, list):
        return tuple(value)
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is Annotated:
        return convert(value, args[0])
    if origin is Literal:
        return next((c for c in args if _json_equal(_literal_json(c, ""), value)), value)
    if origin in _UNION_ORIGINS:
        return _convert_union(value, args)
    if origin in _SEQUENCE_ORIGINS and isinstance(value, list):
        item = _sequence_item(hint, "")
        items = [convert(element, item) for element in value]
        return tuple(items) if origin is tuple else items
    if origin in _MAPPING_ORIGINS and isinstance(value, dict):
        return {key: convert(item, args[1]) for key, item in value.items()}
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return hint(value)
    if isinstance(hint, type) and attrs.has(hint) and isinstance(value, dict):
        return _convert_attrs(value, hint)
    return value


def _convert_union(value: Any, members: Iterable[Any]) -> Any:
    for member in members:
        if member is None or member is _NONE_TYPE:
            if value is None:
                return None
            continue
        if not check(value, schema_for(member, where="")):
            return convert(value, member)
    return value


def _convert_attrs(value: dict[str, Any], cls: type) -> Any:
    hints = type_hints(cls, where=cls.__qualname__)
    arguments = {
        field.alias: convert(value[field.alias], hints.get(field.name, field.type))
        for field in attrs.fields(cls)
        if field.init and field.alias in value
    }
    return cls(**arguments)


# ---------------------------------------------------------------------------
# Docstrings

_GOOGLE_SECTION = re.compile(r"^(\s*)([A-Z][A-Za-z ]*):\s*$")
_GOOGLE_PARAMETER_SECTIONS = frozenset(
    {
        "Args",
        "Arguments",
        "Attributes",
        "Keyword Args",
        "Keyword Arguments",
        "Other Parameters",
        "Parameters",
        "Params",
    }
)
_GOOGLE_ENTRY = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_REST_FIELD = re.compile(r"^:(\w+)(?:\s+([^:]*?))?\s*:\s*(.*)$")
_REST_PARAMETER_FIELDS = frozenset(
    {"param", "parameter", "arg", "argument", "key", "keyword", "var", "ivar", "cvar"}
)
_NUMPY_RULE = re.compile(r"^\s*-{3,}\s*$")
_NUMPY_ENTRY = re.compile(r"^([\w, *]+?)\s*(?::.*)?$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a docstring into its description and per-argument descriptions.

    Reads Google (``Args:``), reST (``:param name:``) and NumPy
    (``Parameters`` over a dashed rule) sections. The description is the text
    before the first section.
    """
    lines = inspect.cleandoc(doc).splitlines() if doc else []
    description: list[str] = []
    arguments: dict[str, str] = {}
    index = 0
    while index < len(lines) and not _starts_section(lines, index):
        description.append(lines[index])
        index += 1
    while index < len(lines):
        line = lines[index]
        if index + 1 < len(lines) and _NUMPY_RULE.match(lines[index + 1]):
            index = _read_numpy(lines, index, arguments)
        elif line.lstrip().startswith(":"):
            index = _read_rest(lines, index, arguments)
        elif match := _GOOGLE_SECTION.match(line):
            index = _read_google(lines, index, len(match[1]), match[2], arguments)
        else:
            index += 1
    return "\n".join(description).strip(), arguments


def _starts_section(lines: list[str], index: int) -> bool:
    line = lines[index]
    if line.startswith(":") and _REST_FIELD.match(line):
        return True
    if index + 1 < len(lines) and line.strip() and _NUMPY_RULE.match(lines[index + 1]):
        return True
    match = _GOOGLE_SECTION.match(line)
    return match is not None and not match[1]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _collapse(parts: list[str]) -> str:
    return " ".join(" ".join(parts).split())


def _read_google(
    lines: list[str], index: int, header_indent: int, title: str, out: dict[str, str]
) -> int:
    collect = title in _GOOGLE_PARAMETER_SECTIONS
    index += 1
    entry_indent: int | None = None
    name: str | None = None
    text: list[str] = []
    while index < len(lines):
        line = lines[index]
        if line.strip():
            indent = _indent(line)
            if indent <= header_indent:
                break
            entry_indent = indent if entry_indent is None else entry_indent
            match = _GOOGLE_ENTRY.match(line.strip()) if indent == entry_indent else None
            if match:
                if collect and name:
                    out[name] = _collapse(text)
                name, text = match[1], [match[2]]
            elif name:
                text.append(line.strip())
        index += 1
    if collect and name:
        out[name] = _collapse(text)
    return index


def _read_rest(lines: list[str], index: int, out: dict[str, str]) -> int:
    match = _REST_FIELD.match(lines[index].strip())
    index += 1
    text = [match[3]] if match else []
    while index < len(lines) and lines[index].strip() and not lines[index].lstrip().startswith(":"):
        text.append(lines[index].strip())
        index += 1
    if match and match[1] in _REST_PARAMETER_FIELDS and match[2]:
        out[match[2].split()[-1]] = _collapse(text)
    return index


def _read_numpy(lines: list[str], index: int, out: dict[str, str]) -> int:
    collect = lines[index].strip() in {"Parameters", "Other Parameters", "Attributes"}
    base = _indent(lines[index])
    index += 2
    names: list[str] = []
    text: list[str] = []

    def flush() -> None:
        for name in names:
            out[name] = _collapse(text)

    while index < len(lines):
        line = lines[index]
        if index + 1 < len(lines) and _NUMPY_RULE.match(lines[index + 1]):
            break
        if line.strip():
            if _indent(line) <= base:
                if collect:
                    flush()
                match = _NUMPY_ENTRY.match(line.strip())
                names = [n.strip(" *") for n in match[1].split(",")] if match else []
                text = []
            else:
                text.append(line.strip())
        index += 1
    if collect:
        flush()
    return index
