"""The cattrs converters: how each type becomes JSON and JSON becomes each type.

:func:`make_document_converter` builds the converter of saved documents
(messages, saved conversations): nothing is coerced (``"3"`` is not ``3``),
unknown fields are refused, and every refusal is an :class:`Invalid` or a
cattrs error that ``_converter`` turns into a ``ConversationFormatError`` with
its path.

Each type's hooks are registered by a small function of its own. A generated
hook captures the hooks of its fields when it is made, so the leaves are
registered before the classes that hold them.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from typing import Any, NoReturn

import attrs
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
from threadline.serialization._documents import ConversationDocument, ConversationEvent, MessageList
from threadline.serialization._json import describe, member_path

__all__ = [
    "Invalid",
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


def _structure_object(converter: JsonConverter, cls: type[Any], **fields: Any) -> None:
    generated = make_dict_structure_fn(cls, converter, **fields)

    def structure(value: Any, type_: Any) -> Any:
        _expect_object(value)
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


def _register_documents(converter: JsonConverter) -> None:
    _structure_object(converter, MessageList)
    _structure_object(converter, ConversationEvent)
    _unstructure_object(converter, ConversationEvent, omit_defaults=True)
    timestamp = override(struct_hook=_structure_timestamp, unstruct_hook=_unstructure_timestamp)
    _structure_object(
        converter,
        ConversationDocument,
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
