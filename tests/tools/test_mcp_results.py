"""What an MCP tool's result becomes (no server needed): MCP's result JSON to a
``ToolResult``, following the protocol's content blocks."""

from __future__ import annotations

import json

import pytest

from threadline import ImagePart, TextPart
from threadline.tools._mcp._convert import result_of, tool_of

pytestmark = pytest.mark.anyio


def test_text_blocks_are_joined() -> None:
    wire = {"content": [{"type": "text", "text": "one"}, {"type": "text", "text": "two"}]}
    assert result_of(wire).content == "one\ntwo"


def test_structured_content_is_kept_as_json_and_its_text_copy_not_sent_twice() -> None:
    structured = {"city": "Porto", "celsius": 21}
    wire = {
        "content": [{"type": "text", "text": json.dumps(structured, indent=2)}],
        "structuredContent": structured,
    }
    result = result_of(wire)
    assert json.loads(result.content) == structured
    assert result.content.count("Porto") == 1


def test_a_plain_value_fastmcp_wrapped_is_sent_once() -> None:
    wire = {"content": [{"type": "text", "text": "5"}], "structuredContent": {"result": "5"}}
    assert result_of(wire).content == '{"result": "5"}'


def test_text_beside_structured_content_that_says_more_is_kept() -> None:
    wire = {"content": [{"type": "text", "text": "a note"}], "structuredContent": {"n": 1}}
    assert result_of(wire).content == '{"n": 1}\na note'


def test_an_image_becomes_an_image_part_beside_the_text() -> None:
    wire = {
        "content": [
            {"type": "text", "text": "the chart:"},
            {"type": "image", "data": "AAAA", "mimeType": "image/png"},
        ]
    }
    assert result_of(wire).content == (
        TextPart(text="the chart:"),
        ImagePart(url="data:image/png;base64,AAAA"),
    )


def test_links_and_resources_become_text_and_what_cannot_be_text_is_said() -> None:
    wire = {
        "content": [
            {"type": "resource_link", "name": "r", "uri": "file:///r.txt", "mimeType": "text/x"},
            {"type": "resource", "resource": {"uri": "file:///a", "text": "inline text"}},
            {"type": "resource", "resource": {"uri": "file:///b", "blob": "AAAA"}},
            {"type": "audio", "data": "AAAA", "mimeType": "audio/wav"},
        ]
    }
    lines = result_of(wire).content.split("\n")
    assert lines[0] == "[resource r at file:///r.txt (text/x)]"
    assert lines[1] == "inline text"
    assert lines[2] == "[binary resource at file:///b left out]"
    assert lines[3] == "[the tool returned audio (audio/wav), which is left out]"


def test_is_error_makes_an_error_result() -> None:
    wire = {"content": [{"type": "text", "text": "no such city"}], "isError": True}
    result = result_of(wire)
    assert result.is_error
    assert result.content == "no such city"


async def _noop(**arguments: object) -> None:
    return None


def test_a_listed_tool_keeps_its_input_schema_as_it_is() -> None:
    schema = {
        "type": "object",
        "properties": {"q": {"type": "string", "minLength": 2, "$comment": "kept"}},
        "required": ["q"],
        "additionalProperties": False,
    }
    made = tool_of(
        {"name": "search", "description": "Search.", "inputSchema": schema},
        _noop,
        timeout=3.0,
        max_result_tokens="budget",
    )
    assert made.json_schema() == schema
    assert made.description == "Search."
    assert made.timeout == 3.0
    assert made.max_result_tokens == "budget"


def test_a_name_providers_refuse_is_offered_with_underscores() -> None:
    made = tool_of(
        {"name": "files.read/v2", "inputSchema": {"type": "object"}},
        _noop,
        timeout=None,
        max_result_tokens=None,
    )
    assert made.name == "files_read_v2"
