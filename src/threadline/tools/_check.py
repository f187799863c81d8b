"""Checking decoded tool arguments against the tool's JSON schema.

:func:`check` says what is wrong with the arguments a model sent, in words the
model can act on (``argument 'days' must be an integer, got a string
("two")``). It works on the schema alone, so a hand-written schema is checked
as a generated one is. Building typed values from arguments that pass is the
argument converter's job (``threadline.serialization._hooks``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from threadline.serialization._json import KIND_WORDS, describe, json_equal, json_kind, short_json

__all__ = ["Problem", "check", "problems"]


Problem = tuple[str, str]
"""Where a problem sits (``"items[2].price"``, ``""`` for the whole value) and what it is."""


def check(value: Any, schema: Mapping[str, Any], path: str = "") -> list[str]:
    """What is wrong with ``value`` under ``schema``; empty when nothing is.

    Checks ``type``, ``enum``, ``const``, ``anyOf``/``oneOf``, ``properties``,
    ``required``, ``additionalProperties`` and ``items``; other keywords are
    not enforced. ``path`` is where ``value`` sits in the arguments (``""`` for
    the arguments object itself).
    """
    return [sentence for _, sentence in problems(value, schema, path)]


def problems(
    value: Any, schema: Mapping[str, Any], path: str = "", *, noun: str = "argument"
) -> list[Problem]:
    """:func:`check`'s findings with where each sits; ``noun`` names a part of the
    value in the sentences (``"argument"`` for a tool's, ``"field"`` for an answer's)."""
    branches = schema.get("anyOf", schema.get("oneOf"))
    if isinstance(branches, Sequence) and branches:
        return _check_any_of(value, branches, path, noun)
    subject = _subject(path, noun)
    if "const" in schema and not json_equal(value, schema["const"]):
        return [(path, f"{subject} must be {short_json(schema['const'])}, got {short_json(value)}")]
    choices = schema.get("enum")
    if isinstance(choices, Sequence) and not any(json_equal(value, c) for c in choices):
        listed = ", ".join(short_json(choice) for choice in choices)
        return [(path, f"{subject} must be one of {listed}, got {short_json(value)}")]
    expected = schema.get("type")
    if expected is not None:
        kinds = [expected] if isinstance(expected, str) else list(expected)
        if not any(_has_type(value, kind) for kind in kinds):
            wanted = " or ".join(KIND_WORDS.get(kind, kind) for kind in kinds)
            return [(path, f"{subject} must be {wanted}, got {describe(value, as_json=True)}")]
    if isinstance(value, dict):
        return _check_object(value, schema, path, noun)
    items = schema.get("items")
    if isinstance(value, list) and isinstance(items, Mapping):
        found: list[Problem] = []
        for index, item in enumerate(value):
            found.extend(problems(item, items, f"{path}[{index}]", noun=noun))
        return found
    return []


def _check_any_of(value: Any, branches: Sequence[Any], path: str, noun: str) -> list[Problem]:
    failures = [problems(value, branch, path, noun=noun) for branch in branches]
    if any(not found for found in failures):
        return []
    # When the value has the right JSON type for exactly one branch, that
    # branch's own complaint is the useful one; among objects, the branch whose
    # constants (a choice's tag) the value matches.
    fitting = [
        found for branch, found in zip(branches, failures, strict=True) if _type_fits(value, branch)
    ]
    if len(fitting) > 1:
        tagged = [
            found
            for branch, found in zip(branches, failures, strict=True)
            if _type_fits(value, branch) and _tags_match(value, branch)
        ]
        fitting = tagged or fitting
    if len(fitting) == 1:
        return fitting[0]
    wanted = " or ".join(_describe_schema(branch) for branch in branches)
    return [(path, f"{_subject(path, noun)} must be {wanted}, got {describe(value, as_json=True)}")]


def _tags_match(value: Any, branch: Mapping[str, Any]) -> bool:
    """Whether every single-choice property of ``branch`` is present in ``value`` with
    its one value (the tag of a choice between classes)."""
    properties = branch.get("properties")
    if not isinstance(value, dict) or not isinstance(properties, Mapping):
        return False
    tags = {
        key: schema["enum"][0]
        for key, schema in properties.items()
        if isinstance(schema, Mapping) and len(schema.get("enum", ())) == 1
    }
    return bool(tags) and all(key in value and json_equal(value[key], v) for key, v in tags.items())


def _check_object(
    value: dict[str, Any], schema: Mapping[str, Any], path: str, noun: str
) -> list[Problem]:
    properties = schema.get("properties")
    properties = properties if isinstance(properties, Mapping) else {}
    found: list[Problem] = [
        (_join(path, name), f"{_subject(_join(path, name), noun)} is required")
        for name in schema.get("required", ())
        if name not in value
    ]
    extra = schema.get("additionalProperties", True)
    for key, item in value.items():
        where = _join(path, key)
        if key in properties:
            found.extend(problems(item, properties[key], where, noun=noun))
        elif extra is False:
            allowed = ", ".join(properties) if properties else "none"
            found.append((where, f"unexpected {noun} {where!r} (allowed: {allowed})"))
        elif isinstance(extra, Mapping):
            found.extend(problems(item, extra, where, noun=noun))
    return found


def _subject(path: str, noun: str) -> str:
    if path:
        return f"{noun} {path!r}"
    return "the arguments" if noun == "argument" else "the answer"


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
    if kind in KIND_WORDS:
        return json_kind(value) == kind
    return True  # a type name JSON Schema does not define: not ours to refuse


def _type_fits(value: Any, schema: Any) -> bool:
    if not isinstance(schema, Mapping) or "type" not in schema:
        return False
    kinds = schema["type"]
    kinds = [kinds] if isinstance(kinds, str) else kinds
    return any(_has_type(value, kind) for kind in kinds)


def _describe_schema(schema: Any) -> str:
    if not isinstance(schema, Mapping):
        return "a value"
    if "enum" in schema:
        return "one of " + ", ".join(short_json(choice) for choice in schema["enum"])
    kinds = schema.get("type")
    if kinds is None:
        return "a value"
    kinds = [kinds] if isinstance(kinds, str) else kinds
    return " or ".join(KIND_WORDS.get(kind, kind) for kind in kinds)
