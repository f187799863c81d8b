"""The JSON schema ``@tool`` builds from a signature and a docstring."""

from __future__ import annotations

import enum
from typing import Annotated, Any, Literal, Optional

import attrs
import pytest

from threadline import InvalidRequestError, tool

# The docstring readers are private; they are tested directly on every style.
from threadline.tools._docstrings import parse_docstring


def properties_of(function: Any) -> dict[str, Any]:
    schema: dict[str, Any] = tool(function).json_schema()
    return schema["properties"]  # type: ignore[no-any-return]


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


class Priority(enum.IntEnum):
    LOW = 1
    HIGH = 2


@attrs.frozen
class Point:
    x: float
    y: float


@attrs.frozen
class Stop:
    """A stop on a trip.

    Attributes:
        city: Where to stop.
        nights: How long to stay.
    """

    city: str
    nights: int = 1
    tags: tuple[str, ...] = attrs.field(factory=tuple)
    _note: str = ""
    computed: int = attrs.field(init=False, default=0)


@attrs.frozen
class Trip:
    stops: list[Stop]
    start: Point | None = None


@attrs.frozen
class Node:
    children: list[Node]


def test_scalars_map_to_json_types() -> None:
    def f(text: str, count: int, ratio: float, flag: bool, anything: Any) -> None: ...

    assert tool(f).json_schema() == {
        "type": "object",
        "properties": {
            "text": {"type": "string"},
            "count": {"type": "integer"},
            "ratio": {"type": "number"},
            "flag": {"type": "boolean"},
            "anything": {},
        },
        "required": ["text", "count", "ratio", "flag", "anything"],
        "additionalProperties": False,
    }


def test_lists_tuples_and_dicts() -> None:
    def f(
        names: list[str],
        grid: list[list[int]],
        pair: tuple[float, ...],
        loose: list,  # type: ignore[type-arg]
        scores: dict[str, float],
        nested: dict[str, list[bool]],
    ) -> None: ...

    assert properties_of(f) == {
        "names": {"type": "array", "items": {"type": "string"}},
        "grid": {"type": "array", "items": {"type": "array", "items": {"type": "integer"}}},
        "pair": {"type": "array", "items": {"type": "number"}},
        "loose": {"type": "array"},
        "scores": {"type": "object", "additionalProperties": {"type": "number"}},
        "nested": {
            "type": "object",
            "additionalProperties": {"type": "array", "items": {"type": "boolean"}},
        },
    }


def test_optional_and_unions_become_any_of() -> None:
    def f(
        a: Optional[str],  # noqa: UP045 (the typing spelling is what is under test)
        b: int | None,
        c: int | str,
    ) -> None: ...

    assert properties_of(f) == {
        "a": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "b": {"anyOf": [{"type": "integer"}, {"type": "null"}]},
        "c": {"anyOf": [{"type": "integer"}, {"type": "string"}]},
    }


def test_literals_and_enums_list_their_values() -> None:
    def f(
        mode: Literal["fast", "slow"],
        level: Literal[1, 2, 3],
        mixed: Literal["auto", 0],
        unit: Unit,
        priority: Priority,
        maybe: Literal["x"] | None,
        member: Literal[Unit.CELSIUS],
    ) -> None: ...

    assert properties_of(f) == {
        "mode": {"type": "string", "enum": ["fast", "slow"]},
        "level": {"type": "integer", "enum": [1, 2, 3]},
        "mixed": {"enum": ["auto", 0]},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
        "priority": {"type": "integer", "enum": [1, 2]},
        "maybe": {"anyOf": [{"type": "string", "enum": ["x"]}, {"type": "null"}]},
        "member": {"type": "string", "enum": ["celsius"]},
    }


def test_attrs_classes_become_closed_objects_inline() -> None:
    def plan(trip: Trip) -> None: ...

    stop = {
        "type": "object",
        "description": "A stop on a trip.",
        "properties": {
            "city": {"type": "string", "description": "Where to stop."},
            "nights": {"type": "integer", "description": "How long to stay.", "default": 1},
            "tags": {"type": "array", "items": {"type": "string"}, "default": []},
            "note": {"type": "string", "default": ""},
        },
        "required": ["city"],
        "additionalProperties": False,
    }
    point = {
        "type": "object",
        "properties": {"x": {"type": "number"}, "y": {"type": "number"}},
        "required": ["x", "y"],
        "additionalProperties": False,
    }
    assert properties_of(plan) == {
        "trip": {
            "type": "object",
            "properties": {
                "stops": {"type": "array", "items": stop},
                "start": {"anyOf": [point, {"type": "null"}], "default": None},
            },
            "required": ["stops"],
            "additionalProperties": False,
        }
    }


def test_defaults_make_parameters_optional_and_are_shown() -> None:
    def f(
        city: str,
        unit: Unit = Unit.CELSIUS,
        days: int = 3,
        note: str | None = None,
        origin: Point = Point(0.0, 0.0),
        marker: object = object(),
    ) -> None: ...

    schema = tool(f).json_schema()
    assert schema["required"] == ["city"]
    assert schema["properties"]["unit"]["default"] == "celsius"
    assert schema["properties"]["days"]["default"] == 3
    assert schema["properties"]["note"]["default"] is None
    assert schema["properties"]["origin"]["default"] == {"x": 0.0, "y": 0.0}
    assert schema["properties"]["marker"] == {}


def test_a_function_without_parameters_takes_an_empty_object() -> None:
    def now() -> str:
        return "noon"

    assert tool(now).json_schema() == {
        "type": "object",
        "properties": {},
        "additionalProperties": False,
    }


def test_annotated_strings_describe_a_parameter() -> None:
    def f(city: Annotated[str, "The city's name."]) -> None: ...

    assert properties_of(f) == {"city": {"type": "string", "description": "The city's name."}}


def test_google_docstring_gives_descriptions() -> None:
    def get_weather(city: str, unit: Unit = Unit.CELSIUS, days: int = 1) -> str:
        """The weather forecast for a city.

        Covers up to a week.

        Args:
            city (str): The city's name,
                like "Lisbon".
            unit: The temperature unit.
            days: How many days ahead.

        Returns:
            The forecast as text.
        """
        return ""

    weather = tool(get_weather)
    assert weather.description == "The weather forecast for a city.\n\nCovers up to a week."
    assert weather.json_schema()["properties"] == {
        "city": {"type": "string", "description": 'The city\'s name, like "Lisbon".'},
        "unit": {
            "type": "string",
            "enum": ["celsius", "fahrenheit"],
            "description": "The temperature unit.",
            "default": "celsius",
        },
        "days": {"type": "integer", "description": "How many days ahead.", "default": 1},
    }


def test_rest_docstring_gives_descriptions() -> None:
    def search(query: str, limit: int = 10) -> list[str]:
        """Search the notes.

        :param query: Words to look for,
            all of them.
        :param int limit: At most this many hits.
        :returns: The matching titles.
        """
        return []

    search_tool = tool(search)
    assert search_tool.description == "Search the notes."
    assert search_tool.json_schema()["properties"] == {
        "query": {"type": "string", "description": "Words to look for, all of them."},
        "limit": {"type": "integer", "description": "At most this many hits.", "default": 10},
    }


def test_numpy_docstring_gives_descriptions() -> None:
    description, arguments = parse_docstring(
        """Add two numbers.

        Parameters
        ----------
        a, b : int
            The numbers.
        scale : float, optional
            A factor
            applied after.

        Returns
        -------
        int
            The sum.
        """
    )
    assert description == "Add two numbers."
    assert arguments == {
        "a": "The numbers.",
        "b": "The numbers.",
        "scale": "A factor applied after.",
    }


def test_docstring_sections_that_are_not_arguments_are_left_out() -> None:
    description, arguments = parse_docstring(
        """Do it.

        Raises:
            ValueError: when it cannot.
        """
    )
    assert (description, arguments) == ("Do it.", {})


def test_no_docstring_gives_an_empty_description() -> None:
    def bare(x: int) -> int:
        return x

    assert tool(bare).description == ""
    assert tool(bare).json_schema()["properties"] == {"x": {"type": "integer"}}


def test_description_and_name_can_be_given() -> None:
    @tool(name="lookup", description="Find a word.")
    def find(word: str) -> str:
        """Ignored."""
        return word

    assert (find.name, find.description) == ("lookup", "Find a word.")


@pytest.mark.parametrize(
    ("annotation", "complaint"),
    [
        (set[int], "cannot describe"),
        (dict[int, str], "keys are strings"),
        (tuple[int, str], "fixed-length tuples"),
        (Node, "recursive types"),
        (Literal[b"raw"], "not a JSON string"),
    ],
)
def test_types_without_json_schema_are_refused_naming_the_parameter(
    annotation: Any, complaint: str
) -> None:
    def f(value: Any) -> None: ...

    f.__annotations__ = {"value": annotation}
    with pytest.raises(InvalidRequestError, match=complaint) as caught:
        tool(f)
    assert "parameter 'value' of" in str(caught.value)


def test_unannotated_parameters_are_refused() -> None:
    def f(value):  # type: ignore[no-untyped-def]
        return value

    with pytest.raises(InvalidRequestError, match="annotate it with its type"):
        tool(f)


def test_star_args_are_refused() -> None:
    def f(*values: int) -> None: ...

    with pytest.raises(InvalidRequestError, match=r"\*args and \*\*kwargs"):
        tool(f)
