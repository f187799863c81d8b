"""Structured output: from a Python type to the schema a driver sends, and back to a value.

:func:`output_spec` describes ``output_type=T`` with the tools room's one
schema generator (``_schema``): an attrs class, a dataclass or a ``TypedDict``
is the answer's object itself; any other type (a primitive, a ``list[...]``,
a union) is wrapped as ``{"value": ...}``, since most providers want an object
at the root. A union of two or more object classes is a *tagged choice*: each
branch carries a ``"kind"`` naming its class, so the model says which class it
answers with and the value is built as exactly that class.

:meth:`OutputSpec.parse` turns the model's text into the value: JSON decoded,
checked against the schema (``_check``, with the path of each problem), built
by the argument converter (cattrs) that builds tool arguments. What fails
raises :class:`OutputProblem`, which the run loop turns into a repair round or
an ``OutputValidationError``.
"""

from __future__ import annotations

import functools
import json
import re
import typing
from collections.abc import Mapping
from typing import Any, Final

import attrs

from threadline._errors import InvalidRequestError
from threadline.serialization._json import json_equal
from threadline.tools._check import problems
from threadline.tools._schema import choice_schema, is_object_class, object_schema, schema_for
from threadline.tools._signature import argument_converter
from threadline.tools._tools import Tool

__all__ = [
    "CHOICE_TAG",
    "WRAPPER_KEY",
    "OutputProblem",
    "OutputSchema",
    "OutputSpec",
    "SchemaOutput",
    "output_spec",
    "strict_schema",
]

CHOICE_TAG: Final = "kind"
"""The property that says which class of a tagged choice an answer is."""
WRAPPER_KEY: Final = "value"
"""The one property of the object a non-object answer is wrapped in."""
_NAME_CHARACTERS = re.compile(r"[^a-zA-Z0-9_-]")
_FENCE = re.compile(r"^```[a-zA-Z]*\s*\n(?P<body>.*?)\n?```\s*$", re.DOTALL)
_NONE_TYPE = type(None)


class OutputProblem(Exception):
    """What is wrong with an answer: ``path`` (``"$.items[0]"``) and ``reason``."""

    def __init__(self, reason: str, path: str = "$") -> None:
        super().__init__(f"{path}: {reason}")
        self.reason = reason
        self.path = path


@attrs.frozen(kw_only=True)
class OutputSchema:
    """The JSON a structured answer must be, as a driver sends it to its provider.

    ``schema`` is always an object schema. ``strict_schema`` is the same under
    the rules of OpenAI's strict mode (every property required, optional ones
    nullable, every object closed, no ``default``), or ``None`` when the schema
    cannot follow them (a ``dict[str, X]``, an open object); a driver sends it
    where it asks for strict validation, else ``schema`` non-strictly.
    """

    name: str
    """A name for the schema (``^[a-zA-Z0-9_-]{1,64}$``): the type's."""
    schema: Mapping[str, Any]
    strict_schema: Mapping[str, Any] | None
    description: str = ""

    def instruction(self) -> str:
        """What the run adds to the system message when the driver cannot constrain
        the answer (``Driver.output_constraint`` is ``"prompt"``)."""
        return (
            "Answer with one JSON value and nothing else (no prose, no code fence). "
            f"It must match this JSON schema:\n{json.dumps(self.schema, ensure_ascii=False)}"
        )

    def counted_tool(self) -> Tool:
        """The schema as a tool declaration, so every counter prices it as it prices tools."""
        return Tool(name=self.name, description=self.description, parameters=self.schema)


@attrs.frozen(kw_only=True, eq=False)
class OutputSpec:
    """An ``output_type``: the schema drivers send, and how an answer becomes its value."""

    hint: Any
    schema: OutputSchema
    wrapped: bool
    """The answer is ``{"value": ...}``, not the value itself."""
    choices: Mapping[str, Any] = attrs.field(factory=dict)
    """For a tagged choice: each class by its tag."""

    def parse(self, text: str) -> Any:
        """The value ``text`` holds.

        Raises:
            OutputProblem: not JSON, not of the schema, or refused by the type
                (an attrs validator, a ``__post_init__``).
        """
        try:
            decoded = json.loads(_unfenced(text))
        except ValueError as exc:
            raise OutputProblem(f"the answer is not JSON ({exc})") from None
        decoded = without_optional_nulls(decoded, self.schema.schema)
        found = problems(decoded, self.schema.schema, noun="field")
        if found:
            where = found[0][0]
            raise OutputProblem("; ".join(s for _, s in found), self._path(where))
        value = decoded[WRAPPER_KEY] if self.wrapped else decoded
        return self._built(value)

    def _path(self, where: str) -> str:
        if self.wrapped and (where == WRAPPER_KEY or where.startswith(WRAPPER_KEY)):
            where = where[len(WRAPPER_KEY) :].lstrip(".")
        if not where:
            return "$"
        return f"$.{where}" if not where.startswith("[") else f"${where}"

    def _built(self, value: Any) -> Any:
        hint = self.hint
        if self.choices and isinstance(value, dict) and value.get(CHOICE_TAG) in self.choices:
            hint = self.choices[value[CHOICE_TAG]]
            value = {key: item for key, item in value.items() if key != CHOICE_TAG}
        try:
            return argument_converter().structure(value, hint)
        except Exception as exc:
            raise OutputProblem(f"{type(exc).__name__}: {exc}") from None


@attrs.frozen
class SchemaOutput:
    """An output type given as a JSON schema (the command line's ``--schema FILE``):
    the answer's value is the decoded JSON that passed it, built into nothing.

    ``text`` is the schema's JSON text, so the value is hashable as a type is.
    """

    name: str
    text: str


def output_spec(hint: Any) -> OutputSpec:
    """The spec of ``output_type=hint``, made once per type.

    Raises:
        InvalidRequestError: the type has no JSON schema (see ``_schema``).
    """
    try:
        return _cached_spec(hint)
    except TypeError:  # an unhashable hint (Annotated with a dict in it)
        return _spec(hint)


@functools.lru_cache(maxsize=256)
def _cached_spec(hint: Any) -> OutputSpec:
    return _spec(hint)


def _spec(hint: Any) -> OutputSpec:
    if isinstance(hint, SchemaOutput):
        return _schema_output_spec(hint)
    where = f"output_type {_type_name(hint)}"
    members = _class_members(hint)
    choices: dict[str, Any] = {}
    if members is not None:
        inner = choice_schema(members, tag=CHOICE_TAG, where=where)
        choices = {member.__name__: member for member in members}
        if _NONE_TYPE in typing.get_args(hint):
            inner = {"anyOf": [*inner["anyOf"], {"type": "null"}]}
    else:
        inner = schema_for(hint, where=where)
    wrapped = not is_object_class(hint)
    schema = object_schema({WRAPPER_KEY: inner}, [WRAPPER_KEY]) if wrapped else inner
    name = _NAME_CHARACTERS.sub("_", _type_name(hint))[:64] or "answer"
    description = str(schema.get("description", "")) if not wrapped else ""
    return OutputSpec(
        hint=hint,
        schema=OutputSchema(
            name=name, schema=schema, strict_schema=strict_schema(schema), description=description
        ),
        wrapped=wrapped,
        choices=choices,
    )


def _schema_output_spec(given: SchemaOutput) -> OutputSpec:
    try:
        inner = json.loads(given.text)
    except ValueError as exc:
        raise InvalidRequestError(f"the JSON schema {given.name!r} is not JSON ({exc})") from None
    if not isinstance(inner, dict):
        raise InvalidRequestError(f"the JSON schema {given.name!r} is not a JSON object")
    wrapped = inner.get("type") != "object"
    schema = object_schema({WRAPPER_KEY: inner}, [WRAPPER_KEY]) if wrapped else inner
    name = _NAME_CHARACTERS.sub("_", given.name)[:64] or "answer"
    output = OutputSchema(
        name=name,
        schema=schema,
        strict_schema=strict_schema(schema),
        description=str(inner.get("description", "")),
    )
    return OutputSpec(hint=Any, schema=output, wrapped=wrapped)


def _class_members(hint: Any) -> tuple[type, ...] | None:
    """The object classes of a union of two or more of them (``None`` may join them)."""
    if typing.get_origin(hint) not in (typing.Union, type(int | str)):
        return None
    members = tuple(arg for arg in typing.get_args(hint) if arg is not _NONE_TYPE)
    if len(members) < 2 or not all(is_object_class(member) for member in members):
        return None
    return members


def _type_name(hint: Any) -> str:
    if isinstance(hint, type):
        return hint.__name__
    return re.sub(r"\w+\.", "", repr(hint)).replace("typing.", "")


def _unfenced(text: str) -> str:
    # Models asked in the prompt often put their JSON in a Markdown code fence.
    stripped = text.strip()
    fenced = _FENCE.match(stripped)
    return fenced.group("body") if fenced else stripped


def without_optional_nulls(value: Any, schema: Mapping[str, Any]) -> Any:
    """``value`` without the ``null`` of each optional property whose schema takes no
    ``null``: what a strict-mode answer sends for a field it leaves at its default."""
    if isinstance(value, list) and isinstance(schema.get("items"), Mapping):
        return [without_optional_nulls(item, schema["items"]) for item in value]
    properties = schema.get("properties")
    if not isinstance(value, dict) or not isinstance(properties, Mapping):
        if isinstance(value, dict) and isinstance(schema.get("anyOf"), list):
            return _in_matching_branch(value, schema["anyOf"])
        return value
    required = set(schema.get("required", ()))
    kept: dict[str, Any] = {}
    for key, item in value.items():
        own = properties.get(key)
        if item is None and key not in required and own is not None and not _takes_null(own):
            continue
        kept[key] = without_optional_nulls(item, own) if isinstance(own, Mapping) else item
    return kept


def _in_matching_branch(value: dict[str, Any], branches: list[Any]) -> Any:
    for branch in branches:
        properties = branch.get("properties", {}) if isinstance(branch, Mapping) else {}
        tag = properties.get(CHOICE_TAG, {}).get("enum", [None])[0]
        if tag is not None and json_equal(value.get(CHOICE_TAG), tag):
            return without_optional_nulls(value, branch)
    return value


def _takes_null(schema: Mapping[str, Any]) -> bool:
    kinds = schema.get("type")
    if kinds == "null" or (isinstance(kinds, list) and "null" in kinds):
        return True
    branches = schema.get("anyOf")
    return isinstance(branches, list) and any(_takes_null(b) for b in branches)


def strict_schema(schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """``schema`` under OpenAI's strict rules, or ``None`` when it cannot follow them.

    Every object lists all its properties as required, an optional one made
    nullable; ``default`` is left out (strict mode refuses it).
    """
    out = {key: value for key, value in schema.items() if key != "default"}
    if "properties" in schema or schema.get("type") == "object":
        if schema.get("additionalProperties", True) is not False:
            return None
        required = set(schema.get("required", ()))
        properties: dict[str, Any] = {}
        for key, each in schema.get("properties", {}).items():
            strict = strict_schema(each)
            if strict is None:
                return None
            properties[key] = strict if key in required else _nullable(strict)
        out["properties"] = properties
        out["required"] = list(properties)
    if isinstance(schema.get("items"), Mapping):
        items = strict_schema(schema["items"])
        if items is None:
            return None
        out["items"] = items
    if isinstance(schema.get("anyOf"), list):
        branches = [strict_schema(branch) for branch in schema["anyOf"]]
        if any(branch is None for branch in branches):
            return None
        out["anyOf"] = branches
    return out


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    if _takes_null(schema):
        return schema
    return {"anyOf": [schema, {"type": "null"}]}
