"""The ``Tool`` value: names providers accept, a schema nobody can change, ``@tool`` forms."""

from __future__ import annotations

import copy
import functools
import json
import pickle
from typing import Any

import attrs
import pytest

from threadline import InvalidRequestError, Message, Origin, Tool, ToolCall, ToolResult, tool
from threadline.tools import Toolset


def greet(name: str) -> str:
    """Say hello."""
    return f"hello {name}"


@pytest.mark.parametrize("name", ["a", "get_weather", "search-v2", "X" * 64, "0_-"])
def test_names_providers_accept_are_kept(name: str) -> None:
    assert Tool(name=name).name == name


@pytest.mark.parametrize("name", ["", "get weather", "tools.search", "é", "x" * 65, "<lambda>"])
def test_names_providers_refuse_raise_a_clear_error(name: str) -> None:
    with pytest.raises(InvalidRequestError, match=r"1 to 64 characters, each a letter, a digit"):
        Tool(name=name)


def test_a_lambda_needs_a_name() -> None:
    with pytest.raises(InvalidRequestError, match=r"'<lambda>' is not allowed.*pass name="):
        tool(lambda: None)
    assert tool(lambda: None, name="noop").name == "noop"


def test_decorator_bare_and_with_arguments_keeps_the_function() -> None:
    bare = tool(greet)

    @tool()
    def empty_parens() -> None: ...

    @tool(name="hello")
    def named(name: str) -> str:
        return name

    assert isinstance(bare, Tool)
    assert bare.function is greet
    assert (bare.name, bare.description) == ("greet", "Say hello.")
    assert empty_parens.name == "empty_parens"
    assert named.name == "hello"


def test_a_tool_is_still_callable_as_its_function() -> None:
    assert tool(greet)("Ada") == "hello Ada"


def test_decorating_a_tool_again_renames_it() -> None:
    renamed = tool(name="welcome")(tool(greet))
    assert (renamed.name, renamed.function, renamed.description) == (
        "welcome",
        greet,
        "Say hello.",
    )


def test_partial_takes_its_docstring_and_remaining_parameters() -> None:
    def scale(value: float, factor: float) -> float:
        """Multiply.

        Args:
            value: The number.
            factor: By how much.
        """
        return value * factor

    double = tool(functools.partial(scale, factor=2.0), name="double")
    assert double.description == "Multiply."
    assert double.json_schema()["required"] == ["value"]


def test_parameters_are_read_only() -> None:
    greeting = tool(greet)
    with pytest.raises(TypeError, match="read-only"):
        greeting.parameters["properties"]["name"]["type"] = "integer"
    with pytest.raises(TypeError, match="read-only"):
        greeting.parameters["required"].append("other")
    assert greeting.parameters["properties"] == {"name": {"type": "string"}}


def test_parameters_stay_plain_json_data() -> None:
    greeting = tool(greet)
    expected = {
        "type": "object",
        "properties": {"name": {"type": "string"}},
        "required": ["name"],
        "additionalProperties": False,
    }
    assert greeting.parameters == expected
    assert json.loads(json.dumps(greeting.parameters)) == expected
    assert pickle.loads(pickle.dumps(greeting.parameters)) == expected
    assert copy.deepcopy(greeting.parameters) == expected


def test_json_schema_is_a_mutable_copy() -> None:
    greeting = tool(greet)
    schema = greeting.json_schema()
    schema["properties"]["name"]["type"] = "integer"
    schema["required"].append("other")
    assert greeting.parameters["properties"]["name"] == {"type": "string"}
    assert type(schema) is dict
    assert type(schema["required"]) is list


def test_hand_written_parameters_are_frozen_on_the_way_in() -> None:
    schema: dict[str, Any] = {"type": "object", "properties": {"q": {"type": "string"}}}
    search = Tool(name="search", parameters=schema)
    schema["properties"]["q"]["type"] = "integer"
    assert search.parameters["properties"]["q"] == {"type": "string"}


@pytest.mark.parametrize(
    ("parameters", "complaint"),
    [
        ({"type": "string"}, "must be an object schema"),
        ({"properties": {}}, "must be an object schema"),
        ({"type": "object", "default": object()}, "must be plain JSON"),
        (["type", "object"], "must be a JSON schema mapping"),
    ],
)
def test_parameters_that_are_not_an_object_schema_are_refused(
    parameters: Any, complaint: str
) -> None:
    with pytest.raises(InvalidRequestError, match=complaint):
        Tool(name="broken", parameters=parameters)


def test_parameters_that_contain_themselves_are_refused() -> None:
    # The counter serializes a tool's schema without looking for cycles: none gets in.
    cyclic: dict[str, Any] = {"type": "object", "properties": {}}
    cyclic["properties"]["again"] = cyclic
    with pytest.raises(InvalidRequestError, match="must be plain JSON"):
        Tool(name="loop", parameters=cyclic)


def test_a_tool_without_function_is_declared_only() -> None:
    declared = Tool(name="ask_user")
    assert declared.function is None
    assert declared.parameters == {"type": "object", "properties": {}}
    with pytest.raises(InvalidRequestError, match="has no function"):
        declared()


def test_evolve_keeps_validation() -> None:
    with pytest.raises(InvalidRequestError):
        attrs.evolve(tool(greet), name="not ok")


def test_tool_result_takes_one_string_or_message_as_inject() -> None:
    assert ToolResult("ok", inject="look at this").inject == (
        Message.user("look at this", origin=Origin.INJECTION),
    )
    assert ToolResult("ok", inject=Message.user("again")).inject == (
        Message.user("again", origin=Origin.INJECTION),
    )
    assert ToolResult("ok").inject == ()


@pytest.mark.parametrize(
    ("item", "complaint"),
    [
        (Message.tool("call_1", "x"), "is a tool exchange"),
        (
            Message.assistant(tool_calls=[ToolCall(id="c", name="greet")]),
            "is a tool exchange",
        ),
        (42, "has type int; use a str or a Message"),
    ],
)
def test_tool_result_refuses_injections_that_break_the_transcript(
    item: Any, complaint: str
) -> None:
    with pytest.raises(InvalidRequestError, match=complaint):
        ToolResult("ok", inject=[item])


def test_toolset_makes_functions_tools_and_refuses_duplicate_names() -> None:
    tools = Toolset([greet, tool(greet, name="hello")])
    assert tools.names == ("greet", "hello")
    assert len(tools) == 2
    assert "hello" in tools
    assert tools["greet"].function is greet
    assert tools.get("missing") is None
    assert [each.name for each in tools] == ["greet", "hello"]
    with pytest.raises(InvalidRequestError, match="tool name 'greet' appears twice"):
        Toolset([greet, tool(greet)])
