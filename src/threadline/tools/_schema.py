"""JSON schema for tool arguments, built from type hints.

``schema_for`` turns a type hint into the schema a provider shows the model:
inline, no ``$ref`` (not every provider resolves references), and only the
subset of JSON Schema that tool calling uses. The hints it knows:

======================================  ==============================================
hint                                    schema
======================================  ==============================================
``Any``, ``object``                     ``{}``
``None``                                ``{"type": "null"}``
``bool``, ``str``, ``int``, ``float``   ``{"type": "boolean"}``, ``"string"``, ...
``list``, ``tuple``, ``dict``           ``{"type": "array"}``, ``{"type": "object"}``
``list[X]``, ``tuple[X, ...]``          ``{"type": "array", "items": X}``
``dict[str, X]``                        ``{"type": "object", "additionalProperties": X}``
``Literal[...]``, an ``Enum``           ``{"type": ..., "enum": [values]}``
``X | Y``                               ``{"anyOf": [X, Y]}``
an attrs class                          a closed object of its fields, described
``Annotated[X, "text"]``                X with ``"description": "text"``
======================================  ==============================================

Checking values against a schema is ``_check``'s job, building typed values
from checked ones the argument converter's.
"""

from __future__ import annotations

import enum
import types
import typing
from collections.abc import Mapping, MutableMapping, MutableSequence, Sequence
from typing import Annotated, Any, Literal, Union

import attrs

from threadline._errors import InvalidRequestError
from threadline.serialization._json import json_kind, json_value
from threadline.tools._docstrings import parse_docstring

__all__ = ["object_schema", "schema_for", "type_hints", "with_default"]

_NONE_TYPE = type(None)
_PLAIN: tuple[tuple[Any, dict[str, Any]], ...] = (
    (Any, {}),
    (object, {}),
    (None, {"type": "null"}),
    (_NONE_TYPE, {"type": "null"}),
    (bool, {"type": "boolean"}),
    (str, {"type": "string"}),
    (int, {"type": "integer"}),
    (float, {"type": "number"}),
    (list, {"type": "array"}),
    (tuple, {"type": "array"}),
    (dict, {"type": "object"}),
)
_SEQUENCES: frozenset[Any] = frozenset({list, tuple, Sequence, MutableSequence})
_MAPPINGS: frozenset[Any] = frozenset({dict, Mapping, MutableMapping})
_UNIONS: frozenset[Any] = frozenset({Union, types.UnionType})
_SUPPORTED = (
    "str, int, float, bool, None, Any, list[X], tuple[X, ...], dict[str, X], "
    "Literal[...], an Enum, an attrs class, or a union of these (X | None)"
)


def schema_for(hint: Any, *, where: str) -> dict[str, Any]:
    """The JSON schema of values of type ``hint``.

    ``where`` names the place of the hint (``"parameter 'city' of get_weather"``)
    for the error message.

    Raises:
        InvalidRequestError: the type has no JSON form threadline supports.
    """
    return _schema_for(hint, where, ())


def _schema_for(hint: Any, where: str, enclosing: tuple[type, ...]) -> dict[str, Any]:
    # By identity: an Annotated hint with a dict in it cannot be hashed.
    for plain, schema in _PLAIN:
        if hint is plain:
            return dict(schema)
    origin = typing.get_origin(hint)
    if origin is not None:
        return _generic_schema(hint, origin, where, enclosing)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return _enum_schema([_json_scalar(member.value, where) for member in hint], where)
    if isinstance(hint, type) and attrs.has(hint):
        return _attrs_schema(hint, where, enclosing)
    raise InvalidRequestError(f"{where}: cannot describe {hint!r} in JSON schema; use {_SUPPORTED}")


def _generic_schema(
    hint: Any, origin: Any, where: str, enclosing: tuple[type, ...]
) -> dict[str, Any]:
    args = typing.get_args(hint)
    if origin is Annotated:
        schema = _schema_for(args[0], where, enclosing)
        description = _annotated_description(hint)
        if description is not None:
            schema["description"] = description
        return schema
    if origin is Literal:
        return _enum_schema([_literal_json(value, where) for value in args], where)
    if origin in _UNIONS:
        return {"anyOf": [_schema_for(member, where, enclosing) for member in args]}
    if origin in _SEQUENCES:
        item = _sequence_item(hint, where)
        return {"type": "array", "items": _schema_for(item, where, enclosing)}
    if origin in _MAPPINGS:
        key, value = args
        if key is not str:
            raise InvalidRequestError(f"{where}: JSON object keys are strings; use dict[str, ...]")
        return {"type": "object", "additionalProperties": _schema_for(value, where, enclosing)}
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


def _enum_schema(values: list[Any], where: str) -> dict[str, Any]:
    if not values:
        raise InvalidRequestError(f"{where}: an enumeration needs at least one choice")
    kinds = {json_kind(value) for value in values}
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
            with_default(schema, _field_default(field))
        properties[field.alias] = schema
    schema = object_schema(properties, required)
    if description:
        schema["description"] = description
    return schema


def _field_default(field: attrs.Attribute[Any]) -> Any:
    default: Any = field.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        return attrs.NOTHING if default.takes_self else default.factory()
    return default


def with_default(schema: dict[str, Any], default: Any) -> None:
    """Show ``default`` in ``schema`` when it has a JSON form (``attrs.NOTHING`` has none)."""
    represented = json_value(default)
    if represented is not attrs.NOTHING:
        schema["default"] = represented


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
