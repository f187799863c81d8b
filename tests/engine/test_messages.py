"""The message model: constructors, validation, tool call arguments, reasoning, usage."""

from __future__ import annotations

import attrs
import pytest

from threadline import (
    ImagePart,
    InvalidRequestError,
    Message,
    Origin,
    Reasoning,
    Role,
    TextPart,
    ThreadlineError,
    ToolCall,
    Usage,
)
from threadline._messages import has_provider_reasoning
from threadline.tools import ToolArgumentsError

# --- constructors -------------------------------------------------------------


def test_constructors_set_the_role_and_default_to_seed_origin() -> None:
    messages = [
        Message.system("be terse"),
        Message.user("hi"),
        Message.assistant("hello"),
        Message.tool("call_1", "42"),
    ]

    assert [m.role for m in messages] == [Role.SYSTEM, Role.USER, Role.ASSISTANT, Role.TOOL]
    assert {m.origin for m in messages} == {Origin.SEED}
    assert messages[3].tool_call_id == "call_1"


def test_user_content_parts_are_kept_as_a_tuple() -> None:
    parts = [TextPart(text="look: "), ImagePart(url="https://x/a.png", detail="high")]

    message = Message.user(parts)

    assert message.content == tuple(parts)
    assert message.text == "look: "


def test_assistant_tool_calls_are_kept_as_a_tuple() -> None:
    call = ToolCall(id="c1", name="add", arguments='{"a": 1}')

    message = Message.assistant(tool_calls=[call])

    assert message.tool_calls == (call,)
    assert message.content == ""


def test_roles_and_origins_are_accepted_as_their_string_values() -> None:
    message = Message(role="user", content="x", origin="turn")  # type: ignore[arg-type]

    assert message.role is Role.USER
    assert message.origin is Origin.TURN


def test_with_origin_returns_the_same_message_when_nothing_changes() -> None:
    message = Message.user("x")

    assert message.with_origin(Origin.SEED) is message
    assert message.with_origin(Origin.TURN) == attrs.evolve(message, origin=Origin.TURN)


# --- validation ---------------------------------------------------------------


@pytest.mark.parametrize(
    ("build", "fragment"),
    [
        (
            lambda: Message(role=Role.USER, tool_calls=(ToolCall(id="c", name="f"),)),
            "only assistant messages carry tool calls",
        ),
        (lambda: Message(role=Role.TOOL, content="x"), "needs the tool_call_id"),
        (lambda: Message(role=Role.TOOL, content="x", tool_call_id=""), "needs the tool_call_id"),
        (
            lambda: Message(role=Role.USER, tool_call_id="c"),
            "only tool messages carry a tool_call_id",
        ),
        (
            lambda: Message(role=Role.USER, reasoning=Reasoning(text="hm")),
            "only assistant messages carry reasoning",
        ),
        (lambda: Message.user(["plain string part"]), "content part 0 is a str"),  # type: ignore[list-item]
        (lambda: Message.assistant(tool_calls=[{"id": "c"}]), "tool call 0 is a dict"),  # type: ignore[list-item]
    ],
)
def test_a_field_that_does_not_fit_the_role_is_refused(build: object, fragment: str) -> None:
    with pytest.raises(InvalidRequestError, match=fragment) as caught:
        build()  # type: ignore[operator]

    assert isinstance(caught.value, ThreadlineError)
    assert isinstance(caught.value, ValueError)


def test_an_unknown_role_is_refused() -> None:
    with pytest.raises(ValueError, match="narrator"):
        Message(role="narrator")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "build",
    [
        lambda: Message.user("x", name=3),
        lambda: Message.tool(7, "x"),
        lambda: Message(role=Role.ASSISTANT, reasoning="thinking"),
        lambda: ImagePart(url="https://x", detail=1),
        lambda: Reasoning(text=None),
        lambda: Reasoning(provider=b"anthropic"),
        lambda: Reasoning(provider_reasoning=12),
        lambda: Usage(input_tokens="3"),
        lambda: Usage(input_tokens=True),  # a bool is an int, but no token count
        lambda: Usage(reasoning_tokens=False),
        lambda: TextPart(text=b"x"),
        lambda: ToolCall(id="c", name="f", arguments={"a": 1}),
    ],
)
def test_a_field_of_the_wrong_type_is_refused(build: object) -> None:
    # Otherwise a message would save fine and never load again.
    with pytest.raises(TypeError):
        build()  # type: ignore[operator]


# --- tool calls -----------------------------------------------------------------


def test_parsed_decodes_the_arguments() -> None:
    call = ToolCall(id="c1", name="add", arguments='{"a": 1, "b": [2, 3]}')

    assert call.parsed() == {"a": 1, "b": [2, 3]}


def test_parsed_reads_blank_arguments_as_no_arguments() -> None:
    assert ToolCall(id="c1", name="now", arguments="  ").parsed() == {}


def test_parsed_names_the_call_and_the_problem_when_arguments_are_not_json() -> None:
    call = ToolCall(id="call_7", name="search", arguments='{"q": "lyon"')

    with pytest.raises(ToolArgumentsError) as caught:
        call.parsed()

    text = str(caught.value)
    assert "'call_7'" in text
    assert "'search'" in text
    assert "not valid JSON" in text
    assert caught.value.__cause__ is None


def test_arguments_are_kept_exactly_as_sent() -> None:
    raw = '{ "a" :1 }\n'

    assert ToolCall(id="c", name="f", arguments=raw).arguments == raw


# --- reasoning ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b"", False),
        (b"   ", False),
        (b"\n\t ", False),
        (b"null", False),
        (b"  null\n", False),
        (b'{"type": "thinking"}', True),
        (b"[]", True),
        (b'"null"', True),
        (b"nullx", True),
    ],
)
def test_has_provider_reasoning_applies_the_empty_blank_or_null_rule(
    raw: bytes, expected: bool
) -> None:
    assert Reasoning(provider_reasoning=raw).has_provider_reasoning() is expected
    assert has_provider_reasoning(raw) is expected


def test_provider_reasoning_is_kept_byte_for_byte() -> None:
    raw = b'[ {"signature":"abc=="} ,\r\n{}]  '

    assert Reasoning(provider_reasoning=raw).provider_reasoning == raw


def test_provider_reasoning_given_as_text_is_stored_as_utf8_bytes() -> None:
    reasoning = Reasoning(provider_reasoning='{"t": "é"}')

    assert reasoning.provider_reasoning == '{"t": "é"}'.encode()


def test_provider_reasoning_none_means_none() -> None:
    reasoning = Reasoning(provider_reasoning=None)  # type: ignore[arg-type]

    assert reasoning.provider_reasoning == b""
    assert not reasoning.has_provider_reasoning()


# --- usage -------------------------------------------------------------------------------


def test_usage_adds_field_by_field() -> None:
    first = Usage(input_tokens=10, output_tokens=2, cached_input_tokens=4, reasoning_tokens=1)
    second = Usage(input_tokens=5, output_tokens=3, cached_input_tokens=0, reasoning_tokens=7)

    assert first + second == Usage(
        input_tokens=15, output_tokens=5, cached_input_tokens=4, reasoning_tokens=8
    )
    assert (first + second).total_tokens == 20


def test_usage_sums_start_from_an_empty_usage() -> None:
    usages = [Usage(input_tokens=1), Usage(output_tokens=2)]

    assert sum(usages, Usage()) == Usage(input_tokens=1, output_tokens=2)


def test_usage_does_not_add_to_other_types() -> None:
    with pytest.raises(TypeError):
        Usage() + 1  # type: ignore[operator]


# --- values ---------------------------------------------------------------------------------


def test_equal_messages_hash_alike_and_can_key_a_dict() -> None:
    first = Message.assistant(
        "x",
        tool_calls=[ToolCall(id="c", name="f")],
        reasoning=Reasoning(text="t", provider_reasoning=b"{}"),
    )
    second = Message.assistant(
        "x",
        tool_calls=(ToolCall(id="c", name="f"),),
        reasoning=Reasoning(text="t", provider_reasoning="{}"),
    )

    assert first == second
    assert hash(first) == hash(second)
    assert {first: 1}[second] == 1
    assert hash(Usage(input_tokens=1)) == hash(Usage(input_tokens=1))


@pytest.mark.parametrize(
    ("value", "field"),
    [
        (Message.user("x"), "content"),
        (ToolCall(id="c", name="f"), "arguments"),
        (Reasoning(), "text"),
        (Usage(), "input_tokens"),
        (TextPart(text="x"), "text"),
    ],
)
def test_values_are_frozen(value: object, field: str) -> None:
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        setattr(value, field, "changed")


def test_values_are_keyword_only() -> None:
    with pytest.raises(TypeError):
        ToolCall("c", "f")  # type: ignore[misc]


# --- constructor arguments of the wrong kind ------------------------------------------


@pytest.mark.parametrize(
    ("build", "fragment"),
    [
        (lambda: Message.user(123), "content must be a str or a sequence of"),
        (lambda: Message.user(b"hi"), "content must be a str or a sequence of"),
        (lambda: Message.user({"text": "hi"}), "content must be a str or a sequence of"),
        (lambda: Message.system(None), "content must be a str or a sequence of"),
        (lambda: Message.assistant(4.5), "content must be a str or a sequence of"),
        (lambda: Message.tool("call_1", 7), "content must be a str or a sequence of"),
        (lambda: Message(role=Role.USER, content=3), "content must be a str or a sequence of"),
        (lambda: Message.assistant(tool_calls=5), "tool_calls must be a sequence of ToolCall"),
        (lambda: Message.assistant(tool_calls="c1"), "tool_calls must be a sequence of ToolCall"),
        (lambda: Message(role="narrator"), "role must be one of system, user, assistant, tool"),
        (
            lambda: Message.user("x", origin="elsewhere"),
            "origin must be one of seed, turn, injection",
        ),
    ],
)
def test_a_constructor_argument_of_the_wrong_kind_is_refused_by_name(
    build: object, fragment: str
) -> None:
    with pytest.raises(InvalidRequestError, match=fragment):
        build()  # type: ignore[operator]


def test_arguments_nested_too_deeply_are_a_tool_arguments_error() -> None:
    call = ToolCall(id="c", name="f", arguments="[" * 100_000 + "]" * 100_000)
    with pytest.raises(ToolArgumentsError, match="nested too deeply"):
        call.parsed()


def test_with_origin_copies_a_message_once_while_the_copy_is_in_use() -> None:
    message = Message.assistant("Hello Ada.", origin=Origin.TURN)
    seed = message.with_origin(Origin.SEED)
    assert seed == attrs.evolve(message, origin=Origin.SEED)
    assert hash(seed) == hash(attrs.evolve(message, origin=Origin.SEED))
    assert message.with_origin(Origin.SEED) is seed
    assert seed.with_origin(Origin.TURN) == message
