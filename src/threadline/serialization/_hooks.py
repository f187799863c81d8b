"""The cattrs converters: how each type becomes JSON and JSON becomes each type.

threadline has one structuring engine, cattrs, configured for its two jobs:

- :func:`make_document_converter`, for saved documents (messages, saved
  conversations): nothing is coerced (``"3"`` is not ``3``), unknown fields
  are refused, and every refusal is an :class:`Invalid` or a cattrs error
  that ``_converter`` turns into a ``ConversationFormatError`` with its path;
- :func:`make_argument_converter`, for tool arguments: it builds the values
  a tool function's parameters ask for from decoded JSON that already fits
  the tool's schema.

Each type's hooks are registered by a small function of its own. A generated
hook captures the hooks of its fields when it is made, so the leaves are
registered before the classes that hold them.
"""

from __future__ import annotations

import enum
import json
import types
import typing
from collections.abc import Callable, Mapping, MutableMapping, MutableSequence, Sequence
from datetime import datetime
from typing import Annotated, Any, Literal, NoReturn, Union

import attrs
from cattrs import Converter
from cattrs.cols import homogenous_tuple_structure_factory, is_sequence
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override
from cattrs.preconf.json import JsonConverter, make_converter

from threadline._messages import (
    ContentPart,
    ImagePart,
    Message,
    Origin,
    Reasoning,
    Role,
    TextPart,
    ToolCall,
    Usage,
    has_provider_reasoning,
)
from threadline.serialization._documents import (
    ConversationDocument,
    ConversationEvent,
    MessageList,
    id_problem,
)
from threadline.serialization._json import describe, json_equal, member_path

__all__ = [
    "Invalid",
    "make_argument_converter",
    "make_document_converter",
    "provider_reasoning_problem",
    "refuse_constant",
]

Hook = Callable[[Any, Any], Any]


class Invalid(Exception):
    """A problem found while structuring, ``suffix`` the path below the value checked."""

    def __init__(self, reason: str, suffix: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.suffix = suffix


def refuse_constant(name: str) -> NoReturn:
    """``json.loads`` ``parse_constant=``: ``NaN`` and ``Infinity`` are not JSON."""
    raise Invalid(f"{name} is not a JSON number")


def provider_reasoning_problem(text: str) -> str | None:
    """Why ``text`` cannot be stored as provider reasoning, or ``None`` when it can."""
    if not has_provider_reasoning(text.encode("utf-8", "surrogatepass")):
        return None
    try:
        json.loads(text, parse_constant=refuse_constant)
    except json.JSONDecodeError as exc:
        return f"is not valid JSON ({exc.msg} at position {exc.pos})"
    except Invalid as exc:
        return f"is not valid JSON ({exc.reason})"
    return None


# --- saved documents ---------------------------------------------------------------


def make_document_converter() -> JsonConverter:
    """The converter of saved documents, strict both ways (see ``_converter``'s format)."""
    converter = make_converter(detailed_validation=True, forbid_extra_keys=True)
    _register_scalars(converter)
    _register_role_and_origin(converter)
    _register_arrays(converter)
    _register_leaves(converter)
    _register_reasoning(converter)
    _register_message(converter)
    _register_documents(converter)
    return converter


def _expect_object(value: Any, what: str = "an object") -> None:
    if type(value) is not dict:
        raise Invalid(f"expected {what}, not {describe(value)}")


def _structure_object(
    converter: JsonConverter, cls: type[Any], *, all_required: bool = False, **fields: Any
) -> None:
    """Register how ``cls`` is read; ``all_required``: a field left out is refused, its
    default notwithstanding (the fields a document always writes)."""
    generated = make_dict_structure_fn(cls, converter, **fields)
    required = [field.name for field in attrs.fields(cls)] if all_required else []

    def structure(value: Any, type_: Any) -> Any:
        _expect_object(value)
        missing = [name for name in required if name not in value]
        if missing:
            also = f" (and {', '.join(missing[1:])})" if missing[1:] else ""
            raise Invalid(f"a required field is missing{also}", member_path(missing[0]))
        return generated(value, type_)

    converter.register_structure_hook(cls, structure)


def _unstructure_object(
    converter: JsonConverter, cls: type[Any], *, omit_defaults: bool, **fields: Any
) -> None:
    generated = make_dict_unstructure_fn(
        cls, converter, _cattrs_omit_if_default=omit_defaults, **fields
    )
    order = [field.name for field in attrs.fields(cls)]

    def unstructure(value: Any) -> dict[str, Any]:
        # cattrs puts the always-written fields first; keep the class's order instead.
        written = generated(value)
        return {name: written[name] for name in order if name in written}

    converter.register_unstructure_hook(cls, unstructure)


def _strict(kind: type[Any], expected: str) -> Hook:
    # cattrs would call str(5) or int("5"); a saved document gets no such help.
    def structure(value: Any, _: Any) -> Any:
        if type(value) is kind:
            return value
        raise Invalid(f"expected {expected}, not {describe(value)}")

    return structure


def _structure_optional_str(value: Any, _: Any) -> str | None:
    if value is None or type(value) is str:
        return value
    raise Invalid(f"expected a string or null, not {describe(value)}")


def _register_scalars(converter: JsonConverter) -> None:
    for kind, expected in ((str, "a string"), (int, "an integer"), (bool, "true or false")):
        converter.register_structure_hook(kind, _strict(kind, expected))
    converter.register_structure_hook(str | None, _structure_optional_str)


_ROLES = ", ".join(role.value for role in Role)
_SAVED_ORIGINS = (Origin.SEED, Origin.TURN)


def _structure_role(value: Any, _: Any) -> Role:
    if type(value) is str and value in Role._value2member_map_:
        return Role(value)
    raise Invalid(f"expected a role ({_ROLES}), not {describe(value)}")


def _structure_origin(value: Any, _: Any) -> Origin:
    if value == Origin.INJECTION.value:
        raise Invalid("injected messages are never persisted; 'injection' is not a saved origin")
    if type(value) is str and value in _SAVED_ORIGINS:
        return Origin(value)
    raise Invalid(f"expected an origin (seed, turn), not {describe(value)}")


def _register_role_and_origin(converter: JsonConverter) -> None:
    converter.register_structure_hook(Role, _structure_role)
    converter.register_structure_hook(Origin, _structure_origin)
    converter.register_unstructure_hook(Role, lambda role: role.value)
    converter.register_unstructure_hook(Origin, lambda origin: origin.value)


def _register_arrays(converter: JsonConverter) -> None:
    def strict_tuple_factory(kind: Any, conv: Any) -> Hook:
        items = homogenous_tuple_structure_factory(kind, conv)

        def structure(value: Any, type_: Any) -> Any:
            if type(value) is not list:
                raise Invalid(f"expected an array, not {describe(value)}")
            return items(value, type_)

        return structure

    converter.register_structure_hook_factory(is_sequence, strict_tuple_factory)


def _register_leaves(converter: JsonConverter) -> None:
    for cls in (TextPart, ImagePart, ToolCall, Usage):
        _structure_object(converter, cls)
    _unstructure_object(converter, TextPart, omit_defaults=True)
    _unstructure_object(converter, ImagePart, omit_defaults=True)
    _unstructure_object(converter, ToolCall, omit_defaults=False)
    _unstructure_object(converter, Usage, omit_defaults=False)


def _structure_provider_reasoning(value: Any, _: Any) -> bytes:
    if type(value) is not str:
        raise Invalid(f"expected the provider's JSON as a string, not {describe(value)}")
    problem = provider_reasoning_problem(value)
    if problem is not None:
        raise Invalid(f"provider_reasoning {problem}")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise Invalid("provider_reasoning holds a lone surrogate, not UTF-8 text") from None


def _unstructure_provider_reasoning(value: bytes) -> str:
    # Checked to be UTF-8 JSON by _check_persistable before any dump.
    return value.decode("utf-8")


def _register_reasoning(converter: JsonConverter) -> None:
    reasoning_bytes = override(
        struct_hook=_structure_provider_reasoning, unstruct_hook=_unstructure_provider_reasoning
    )
    _structure_object(converter, Reasoning, provider_reasoning=reasoning_bytes)
    _unstructure_object(
        converter, Reasoning, omit_defaults=True, provider_reasoning=reasoning_bytes
    )


_PART_TAGS: dict[str, type[TextPart] | type[ImagePart]] = {"text": TextPart, "image": ImagePart}


def _register_message(converter: JsonConverter) -> None:
    def structure_part(value: Any, _: Any) -> ContentPart:
        _expect_object(value, "a content part object")
        tag = value.get("type")
        if tag not in _PART_TAGS:
            reason = f"expected a part type (text, image), not {describe(tag)}"
            raise Invalid("a content part needs a type" if tag is None else reason, ".type")
        fields = {key: item for key, item in value.items() if key != "type"}
        part: ContentPart = converter.structure(fields, _PART_TAGS[tag])
        return part

    def unstructure_part(part: ContentPart) -> dict[str, Any]:
        tag = "text" if isinstance(part, TextPart) else "image"
        return {"type": tag, **converter.unstructure(part, type(part))}

    def structure_content(value: Any, _: Any) -> str | tuple[ContentPart, ...]:
        if type(value) is str:
            return value
        if type(value) is not list:
            raise Invalid(f"expected a string or an array of parts, not {describe(value)}")
        parts: tuple[ContentPart, ...] = converter.structure(value, tuple[ContentPart, ...])
        return parts

    def unstructure_content(value: str | tuple[ContentPart, ...]) -> Any:
        if isinstance(value, str):
            return value
        return [unstructure_part(part) for part in value]

    converter.register_structure_hook(ContentPart, structure_part)
    content = override(
        omit_if_default=False, struct_hook=structure_content, unstruct_hook=unstructure_content
    )
    always = override(omit_if_default=False)
    _structure_object(converter, Message, content=content)
    _unstructure_object(
        converter, Message, omit_defaults=True, role=always, content=content, origin=always
    )


def _structure_timestamp(value: Any, _: Any) -> datetime | None:
    if value is None:
        return None
    if type(value) is not str:
        raise Invalid(f"expected an ISO 8601 time or null, not {describe(value)}")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise Invalid(f"expected an ISO 8601 time, not {describe(value)}") from None
    if moment.utcoffset() is None:
        raise Invalid(f"the time {value!r} has no UTC offset")
    return moment


def _unstructure_timestamp(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _structure_settings(value: Any, _: Any) -> dict[str, Any]:
    if type(value) is not dict:
        raise Invalid(f"expected an object, not {describe(value)}")
    # Parsed JSON without NaN is a JsonValue already; nothing else to check.
    return value


def _structure_metadata(value: Any, _: Any) -> dict[str, str]:
    if type(value) is not dict:
        raise Invalid(f"expected an object, not {describe(value)}")
    for key, item in value.items():
        if type(item) is not str:
            raise Invalid(f"expected a string, not {describe(item)}", member_path(key))
    return value


def _structure_id(value: Any, _: Any) -> str:
    if type(value) is not str:
        raise Invalid(f"expected a string, not {describe(value)}")
    problem = id_problem(value)
    if problem is not None:
        raise Invalid(problem)
    return value  # an empty one is the document's to refuse


def _register_documents(converter: JsonConverter) -> None:
    _structure_object(converter, MessageList)
    _structure_object(converter, ConversationEvent)
    _unstructure_object(converter, ConversationEvent, omit_defaults=True)
    timestamp = override(struct_hook=_structure_timestamp, unstruct_hook=_unstructure_timestamp)
    _structure_object(
        converter,
        ConversationDocument,
        # Written whole since version 1: a field read as its default would load
        # another conversation (no events beside their usage, turn ids anew).
        all_required=True,
        id=override(struct_hook=_structure_id),
        settings=override(struct_hook=_structure_settings),
        metadata=override(struct_hook=_structure_metadata),
        created_at=timestamp,
        updated_at=timestamp,
    )
    _unstructure_object(
        converter,
        ConversationDocument,
        omit_defaults=False,
        created_at=timestamp,
        updated_at=timestamp,
    )


# --- tool arguments ----------------------------------------------------------------

FitTest = Callable[[Any], Callable[[Any], bool]]
"""Given a type hint, the test whether a decoded JSON value fits that hint's schema."""

_NONE_TYPE = type(None)
_SEQUENCES: frozenset[Any] = frozenset({list, tuple, Sequence, MutableSequence})
_MAPPINGS: frozenset[Any] = frozenset({dict, Mapping, MutableMapping})
_UNIONS: frozenset[Any] = frozenset({Union, types.UnionType})


def make_argument_converter(fits: FitTest) -> Converter:
    """The converter that builds what a tool function's parameters ask for.

    It structures decoded JSON arguments that already fit the tool's schema,
    and checks nothing itself: Enum values become members, objects attrs
    instances (keyed by their fields' aliases), arrays tuples where a tuple
    is asked for and lists otherwise, whole floats ints and ints floats where
    the hint asks for them; ``Any`` and plain values are passed as they are.
    A union takes its first member whose schema the value fits, as
    ``fits(member)`` tells. What an attrs class raises on its values comes
    out as it is.
    """
    converter = _ArgumentConverter(detailed_validation=False)
    _register_plain_arguments(converter)
    _register_containers(converter)
    _register_choices(converter)
    _register_unions(converter, fits)
    _register_attrs_arguments(converter)
    _register_typed_dicts(converter)
    return converter


def _origin(hint: Any) -> Any:
    return typing.get_origin(hint)


def _as_it_is(value: Any, _: Any) -> Any:
    return value


# cattrs keeps one hook for hints that compare equal, and typing compares
# int | float equal to float | int (and Literal[1, 2] to Literal[2, 1]). So the
# hooks below read the hint they are called with, whose order is the one the
# function's author wrote: the first union member that fits wins.


def _register_plain_arguments(converter: Converter) -> None:
    # str, int, float, bool and their Enum subclasses are cattrs' own: it calls
    # the class, so 2.0 becomes 2 for an int and 2 becomes 2.0 for a float.
    bare = (object, list, dict, None, _NONE_TYPE)
    converter.register_structure_hook_func(lambda hint: hint in bare, _as_it_is)
    converter.register_structure_hook_func(
        lambda hint: hint is tuple, lambda value, _: tuple(value)
    )


def _register_containers(converter: Converter) -> None:
    def sequence(value: Any, hint: Any) -> Any:
        make = tuple if _origin(hint) is tuple else list
        args = typing.get_args(hint)
        if not args:
            return make(value)
        item = converter.get_structure_hook(args[0])
        return make(item(element, args[0]) for element in value)

    def mapping(value: Any, hint: Any) -> Any:
        item_hint = typing.get_args(hint)[1]
        item = converter.get_structure_hook(item_hint)
        return {key: item(each, item_hint) for key, each in value.items()}

    converter.register_structure_hook_func(lambda hint: _origin(hint) in _SEQUENCES, sequence)
    converter.register_structure_hook_func(lambda hint: _origin(hint) in _MAPPINGS, mapping)


def _register_choices(converter: Converter) -> None:
    def literal(value: Any, hint: Any) -> Any:
        # 2.0 is the choice 2, and "celsius" the choice Unit.CELSIUS.
        choices = typing.get_args(hint)
        return next((c for c in choices if json_equal(_choice_json(c), value)), value)

    converter.register_structure_hook_func(lambda hint: _origin(hint) is Literal, literal)
    converter.register_structure_hook_func(
        lambda hint: isinstance(hint, type) and issubclass(hint, enum.Enum),
        lambda value, hint: hint(value),
    )


def _choice_json(choice: Any) -> Any:
    return choice.value if isinstance(choice, enum.Enum) else choice


def _register_unions(converter: Converter, fits: FitTest) -> None:
    def union(first_seen: Any) -> Hook:
        # Each member's test is made once, for every union equal to this one.
        tests = [(member, _member_test(member, fits)) for member in typing.get_args(first_seen)]

        def structure(value: Any, hint: Any) -> Any:
            for member in typing.get_args(hint):
                fits_member = next(test for known, test in tests if known == member)
                if fits_member(value):
                    return value if fits_member is _is_none else converter.structure(value, member)
            return value

        return structure

    converter.register_structure_hook_factory(lambda hint: _origin(hint) in _UNIONS, union)


def _member_test(member: Any, fits: FitTest) -> Callable[[Any], bool]:
    if member is None or member is _NONE_TYPE:
        return _is_none
    return fits(member)


def _is_none(value: Any) -> bool:
    return value is None


def _register_attrs_arguments(converter: Converter) -> None:
    def attrs_class(cls: type[Any]) -> Hook:
        attrs.resolve_types(cls)
        # A field's Annotated metadata is left out as a parameter's is.
        plain = {field.name: _without_annotations(field.type) for field in attrs.fields(cls)}
        overrides: dict[str, Any] = {
            field.name: override(struct_hook=_structure_as(converter, plain[field.name]))
            for field in attrs.fields(cls)
            if plain[field.name] is not field.type
        }
        return make_dict_structure_fn(cls, converter, _cattrs_use_alias=True, **overrides)

    converter.register_structure_hook_factory(
        lambda hint: isinstance(hint, type) and attrs.has(hint), attrs_class
    )


def _register_typed_dicts(converter: Converter) -> None:
    # Each key present is built by its hint; which keys must be there the schema
    # checked already (cattrs' own hook reads __required_keys__, which postponed
    # annotations get wrong before Python 3.13).
    def typed_dict(value: Any, hint: Any) -> Any:
        hints = typing.get_type_hints(hint)
        return {
            key: converter.structure(item, hints[key]) if key in hints else item
            for key, item in value.items()
        }

    converter.register_structure_hook_func(typing.is_typeddict, typed_dict)


def _structure_as(converter: Converter, hint: Any) -> Hook:
    return lambda value, _: converter.structure(value, hint)


def _without_annotations(hint: Any) -> Any:
    """``hint`` with every ``Annotated[X, ...]`` in it replaced by its ``X``.

    The metadata says nothing about how to build a value, and it may not be
    hashable (``Annotated[int, {"minimum": 0}]``), while cattrs finds its hooks
    through a cache keyed by the hint.
    """
    origin = _origin(hint)
    if origin is Annotated:
        return _without_annotations(typing.get_args(hint)[0])
    args = typing.get_args(hint)
    if not args or origin is Literal:
        return hint
    plain = tuple(_without_annotations(arg) for arg in args)
    if all(new is old for new, old in zip(plain, args, strict=True)):
        return hint
    if origin in _UNIONS:
        return Union[plain]  # noqa: UP007 (X | Y cannot take a tuple of members)
    return origin[plain]


class _ArgumentConverter(Converter):
    """A cattrs converter that reads every hint without its ``Annotated`` metadata."""

    def structure(self, obj: Any, cl: Any) -> Any:
        return super().structure(obj, _without_annotations(cl))
