"""Dataclass and TypedDict parameters: described like attrs classes, built as their type."""

from __future__ import annotations

import dataclasses
import json
from typing import NotRequired, TypedDict

import pytest

from threadline import ToolCall, tool

pytestmark = pytest.mark.anyio


@dataclasses.dataclass(frozen=True)
class Window:
    """A span of dates.

    Attributes:
        start: The first day, ISO format.
        days: How many days.
    """

    start: str
    days: int = 1


class Filters(TypedDict):
    """What to keep.

    Attributes:
        city: Only this city.
    """

    city: str
    min_stars: NotRequired[int]


@tool
def search(window: Window, filters: Filters) -> str:
    """Search hotels."""
    return json.dumps({"window": dataclasses.asdict(window), "filters": filters})


def test_a_dataclass_and_a_typed_dict_become_closed_objects_with_their_docs() -> None:
    properties = search.parameters["properties"]
    assert properties["window"] == {
        "type": "object",
        "properties": {
            "start": {"type": "string", "description": "The first day, ISO format."},
            "days": {"type": "integer", "description": "How many days.", "default": 1},
        },
        "required": ["start"],
        "additionalProperties": False,
        "description": "A span of dates.",
    }
    assert properties["filters"]["required"] == ["city"]
    assert properties["filters"]["properties"]["city"]["description"] == "Only this city."
    assert "default" not in properties["filters"]["properties"]["min_stars"]


async def test_the_arguments_are_built_as_the_dataclass_and_the_dict() -> None:
    arguments = {"window": {"start": "2026-01-02"}, "filters": {"city": "Porto"}}
    call = ToolCall(id="c1", name="search", arguments=json.dumps(arguments))
    outcome = await search.invoke(call)
    assert json.loads(outcome.text) == {
        "window": {"start": "2026-01-02", "days": 1},
        "filters": {"city": "Porto"},
    }


async def test_a_missing_typed_dict_key_is_refused_before_the_function_runs() -> None:
    call = ToolCall(id="c1", name="search", arguments='{"window": {"start": "x"}, "filters": {}}')
    outcome = await search.invoke(call)
    assert outcome.is_error
    assert "argument 'filters.city' is required" in outcome.text
