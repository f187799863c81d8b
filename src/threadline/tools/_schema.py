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
an attrs class, a dataclass             a closed object of its fields, described
a ``TypedDict``                         a closed object of its keys, described
``Annotated[X, "text"]``                X with ``"description": "text"``
======================================  ==============================================

Checking values against a schema is ``_check``'s job, building typed values
from checked ones the argument converter's.
"""

from __future__ import annotations

import dataclasses
import enum
import types
import typing
from collections.abc import Mapping, MutableMapping, MutableSequence, Sequence
from typing import Annotated, Any, Literal, Union

import attrs
import typing_extensions

from threadline._errors import InvalidRequestError
from threadline.serialization._json import json_kind, json_value
from threadline.tools._docstrings import parse_docstring

__all__ = [
    "choice_schema",
    "is_object_class",
    "object_schema",
    "schema_for",
    "type_hints",
    "with_default",
]

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
    "Literal[...], an Enum, an attrs class, a dataclass, a TypedDict, or a union of these "
    "(X | None)"
)
_WRAPPERS: frozenset[Any] = frozenset(
    {typing.Required, typing.NotRequired, typing_extensions.Required, typing_extensions.NotRequired}
)


@attrs.frozen
class _Field:
    """One field of a class described as an object: its JSON key, its hint, its default."""

    name: str
    key: str
    hint: Any
    default: Any  # attrs.NOTHING: required


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
    if is_object_class(hint):
        return _class_schema(hint, where, enclosing)
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


def is_object_class(hint: Any) -> bool:
    """Whether ``hint`` is a class described as a closed object: attrs, dataclass, TypedDict."""
    if not isinstance(hint, type):
        return False
    return attrs.has(hint) or dataclasses.is_dataclass(hint) or typing.is_typeddict(hint)


def _class_schema(cls: type, where: str, enclosing: tuple[type, ...]) -> dict[str, Any]:
    if cls in enclosing:
        raise InvalidRequestError(
            f"{where}: {cls.__qualname__} contains itself; recursive types are not supported"
        )
    description, field_docs = parse_docstring(_own_doc(cls))
    properties: dict[str, Any] = {}
    required: list[str] = []
    for field in _fields_of(cls, where):
        field_where = f"{where}, field {field.key!r} of {cls.__qualname__}"
        if field.hint is None or isinstance(field.hint, str):
            raise InvalidRequestError(f"{field_where}: annotate the field with its type")
        schema = _schema_for(field.hint, field_where, (*enclosing, cls))
        doc = field_docs.get(field.name) or field_docs.get(field.key)
        if doc:
            schema["description"] = doc
        if field.default is attrs.NOTHING:
            required.append(field.key)
        else:
            with_default(schema, field.default)
        properties[field.key] = schema
    schema = object_schema(properties, required)
    if description:
        schema["description"] = description
    return schema


def _fields_of(cls: type, where: str) -> list[_Field]:
    """The fields of an attrs class, a dataclass or a TypedDict, as the JSON object has them."""
    hints = _type_hints(cls, where)
    if attrs.has(cls):
        return [
            _Field(f.name, f.alias or f.name, hints.get(f.name, f.type), _attrs_default(f))
            for f in attrs.fields(cls)
            if f.init
        ]
    if dataclasses.is_dataclass(cls):
        return [
            _Field(f.name, f.name, hints.get(f.name, f.type), _dataclass_default(f))
            for f in dataclasses.fields(cls)
            if f.init
        ]
    required = cls.__required_keys__  # type: ignore[attr-defined]
    return [
        _Field(
            name,
            name,
            _unwrapped(hint),
            attrs.NOTHING if _required(hint, name, required) else _OPTIONAL,
        )
        for name, hint in hints.items()
    ]


def _required(hint: Any, name: str, required: frozenset[str]) -> bool:
    """Whether a TypedDict key is required: its ``Required``/``NotRequired`` wrapper says
    so where it has one (``__required_keys__`` misses them under postponed annotations
    before Python 3.13), else the class's totality."""
    origin = typing.get_origin(hint)
    if origin in (typing.NotRequired, typing_extensions.NotRequired):
        return False
    if origin in (typing.Required, typing_extensions.Required):
        return True
    return name in required


_OPTIONAL = object()
"""The default of a ``TypedDict`` key that may be left out: it has none to show."""


def _own_doc(cls: type) -> str | None:
    """The class's docstring, not the signature ``dataclass`` writes when it has none."""
    doc = cls.__doc__
    if dataclasses.is_dataclass(cls) and doc is not None and doc.startswith(f"{cls.__name__}("):
        return None
    return doc


def _unwrapped(hint: Any) -> Any:
    """A TypedDict key's hint without ``Required[...]`` / ``NotRequired[...]``."""
    while typing.get_origin(hint) in _WRAPPERS:
        hint = typing.get_args(hint)[0]
    return hint


def _attrs_default(field: attrs.Attribute[Any]) -> Any:
    default: Any = field.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        return attrs.NOTHING if default.takes_self else default.factory()
    return default


def _dataclass_default(field: dataclasses.Field[Any]) -> Any:
    if field.default is not dataclasses.MISSING:
        return field.default
    if field.default_factory is not dataclasses.MISSING:
        return field.default_factory()
    return attrs.NOTHING


def choice_schema(members: tuple[type, ...], *, tag: str, where: str) -> dict[str, Any]:
    """A tagged choice between classes: each member's object schema with a required
    ``tag`` property whose only value is the class's name, first.

    Raises:
        InvalidRequestError: a member is not an object class, two have one name, or
            one has a field named ``tag``.
    """
    branches: list[dict[str, Any]] = []
    names = [member.__name__ for member in members]
    if len(set(names)) != len(names):
        raise InvalidRequestError(f"{where}: two classes of the choice share a name ({names})")
    for member in members:
        schema = _schema_for(member, where, ())
        if tag in schema["properties"]:
            raise InvalidRequestError(
                f"{where}: {member.__qualname__} has a field {tag!r}, which a choice between "
                "classes uses to say which class the answer is"
            )
        schema["properties"] = {tag: _enum_schema([member.__name__], where), **schema["properties"]}
        schema["required"] = [tag, *schema.get("required", ())]
        branches.append(schema)
    return {"anyOf": branches}


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
