"""Properties of an output type's round trip: any value of the type, written as JSON as a
provider may write it (strict mode's nulls for optional fields included), is read back as
that very value."""

from __future__ import annotations

import json
from typing import Any

import attrs
from hypothesis import given
from hypothesis import strategies as st

from threadline.tools._output import output_spec
from threadline.tools._signature import argument_converter


@attrs.frozen
class Line:
    name: str
    quantity: int = 1
    note: str | None = None


@attrs.frozen
class Basket:
    owner: str
    lines: list[Line]
    express: bool = False


@attrs.frozen
class Refund:
    reason: str


TEXT = st.text(max_size=12)
LINES = st.builds(Line, name=TEXT, quantity=st.integers(-5, 50), note=st.none() | TEXT)
BASKETS = st.builds(Basket, owner=TEXT, lines=st.lists(LINES, max_size=4), express=st.booleans())


_DEFAULTS = {"quantity": 1, "express": False, "note": None}


def _as_strict(value: Any, nulls: bool) -> Any:
    """``value`` as a strict-mode answer writes it: a field at its default as null."""
    if isinstance(value, dict):
        return {
            key: None
            if nulls
            and key in _DEFAULTS
            and type(item) is type(_DEFAULTS[key])
            and item == _DEFAULTS[key]
            else _as_strict(item, nulls)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_as_strict(item, nulls) for item in value]
    return value


@given(BASKETS, st.booleans())
def test_any_basket_written_as_json_reads_back_as_itself(basket: Basket, nulls: bool) -> None:
    written = _as_strict(argument_converter().unstructure(basket), nulls)
    assert output_spec(Basket).parse(json.dumps(written)) == basket


@given(st.one_of(BASKETS, st.builds(Refund, reason=TEXT)))
def test_any_branch_of_a_tagged_choice_reads_back_as_its_class(value: Basket | Refund) -> None:
    body = {"kind": type(value).__name__, **argument_converter().unstructure(value)}
    assert output_spec(Basket | Refund).parse(json.dumps({"value": body})) == value


@given(st.lists(st.integers() | st.none(), max_size=6))
def test_any_list_of_optional_ints_reads_back(values: list[int | None]) -> None:
    assert output_spec(list[int | None]).parse(json.dumps({"value": values})) == values


def test_the_strict_schema_requires_every_field_and_takes_null_where_one_is_optional() -> None:
    strict = output_spec(Basket).schema.strict_schema
    assert strict is not None
    assert strict["required"] == ["owner", "lines", "express"]
    assert {"type": "null"} in strict["properties"]["express"]["anyOf"]
    line = strict["properties"]["lines"]["items"]
    assert line["required"] == ["name", "quantity", "note"]
    assert "default" not in json.dumps(strict)
