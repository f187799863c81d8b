"""Units, pinned messages and the integrity check (SPEC §3)."""

from __future__ import annotations

import pytest

from threadline import InvalidRequestError, Message, Origin, ToolCall
from threadline.limiting import (
    PinReason,
    TranscriptIntegrityError,
    Unit,
    UnitKind,
    check_integrity,
    split_units,
)

# The pinning rules and the unchecked split are private helpers of the units room.
from threadline.limiting._units import current_prompt_index, pinned_messages, units_for


def call(call_id: str, name: str = "lookup") -> ToolCall:
    return ToolCall(id=call_id, name=name, arguments="{}")


def exchange(*call_ids: str) -> list[Message]:
    return [
        Message.assistant("", tool_calls=[call(i) for i in call_ids]),
        *(Message.tool(i, f"result of {i}") for i in call_ids),
    ]


def shape(units: list[Unit]) -> list[tuple[str, int, int, str | None]]:
    return [(u.kind.value, u.start, u.end, u.reason.value if u.reason else None) for u in units]


# -- splitting -------------------------------------------------------------------------


def test_each_message_kind_forms_its_unit_and_a_tool_exchange_holds_its_results() -> None:
    messages = [
        Message.system("rules"),
        Message.user("hi"),
        Message.assistant("hello"),
        Message.user("weather?"),
        *exchange("a", "b"),
        Message.assistant("sunny"),
        Message.user("thanks"),
    ]
    assert shape(split_units(messages)) == [
        ("system", 0, 1, "first system message"),
        ("user", 1, 2, None),
        ("assistant", 2, 3, None),
        ("user", 3, 4, None),
        ("tool_exchange", 4, 7, None),
        ("assistant", 7, 8, None),
        ("user", 8, 9, "current prompt"),
    ]


def test_units_cover_the_transcript_exactly_in_order() -> None:
    messages = [Message.user("q"), *exchange("x"), Message.assistant("a"), Message.user("p")]
    units = split_units(messages)
    covered = [i for u in units for i in u.indices]
    assert covered == list(range(len(messages)))
    assert sum(len(u) for u in units) == len(messages)


def test_an_empty_transcript_has_no_units() -> None:
    assert split_units([]) == []


def test_only_the_first_system_message_is_pinned_later_ones_are_droppable() -> None:
    messages = [
        Message.system("first"),
        Message.user("q"),
        Message.assistant("a"),
        Message.system("later"),
        Message.user("p"),
    ]
    units = split_units(messages)
    assert [(u.kind, u.pinned) for u in units] == [
        (UnitKind.SYSTEM, True),
        (UnitKind.USER, False),
        (UnitKind.ASSISTANT, False),
        (UnitKind.SYSTEM, False),
        (UnitKind.USER, True),
    ]


def test_the_first_system_message_is_pinned_even_when_it_is_not_first() -> None:
    messages = [Message.user("q"), Message.system("rules"), Message.user("p")]
    assert pinned_messages(messages) == {1: PinReason.FIRST_SYSTEM, 2: PinReason.CURRENT_PROMPT}


# -- the current prompt ----------------------------------------------------------------


def test_an_explicit_prompt_index_pins_that_message() -> None:
    messages = [Message.user("old"), Message.assistant("a"), Message.user("p"), Message.user("x")]
    assert pinned_messages(messages, prompt_index=2) == {2: PinReason.CURRENT_PROMPT}


def test_without_prompt_index_the_last_user_message_that_is_not_an_injection_is_the_prompt() -> (
    None
):
    messages = [
        Message.user("old"),
        Message.assistant("a"),
        Message.user("the prompt", origin=Origin.TURN),
        Message.user("remember: be brief", origin=Origin.INJECTION),
    ]
    assert current_prompt_index(messages) == 2
    assert pinned_messages(messages) == {
        2: PinReason.CURRENT_PROMPT,
        3: PinReason.UNANSWERED_INJECTION,
    }


def test_a_transcript_without_user_messages_has_no_prompt() -> None:
    assert current_prompt_index([Message.system("s"), Message.assistant("a")]) is None


@pytest.mark.parametrize("bad", [-1, 3, True])
def test_a_prompt_index_outside_the_transcript_is_refused(bad: int) -> None:
    messages = [Message.user("a"), Message.assistant("b"), Message.user("c")]
    with pytest.raises(InvalidRequestError, match="prompt_index"):
        split_units(messages, prompt_index=bad)


# -- the live tool exchange ------------------------------------------------------------


def test_the_last_exchange_of_the_run_is_live_and_earlier_ones_are_droppable() -> None:
    messages = [
        Message.user("p", origin=Origin.TURN),
        *exchange("first"),
        *exchange("second"),
    ]
    units = split_units(messages, prompt_index=0)
    assert shape(units) == [
        ("user", 0, 1, "current prompt"),
        ("tool_exchange", 1, 3, None),
        ("tool_exchange", 3, 5, "live tool exchange"),
    ]


def test_an_exchange_the_model_has_answered_is_not_live() -> None:
    messages = [Message.user("p"), *exchange("a"), Message.assistant("done")]
    assert [u.pinned for u in split_units(messages)] == [True, False, False]


def test_an_unanswered_exchange_before_the_prompt_is_seed_history_not_live() -> None:
    messages = [Message.user("old"), *exchange("a"), Message.user("p")]
    units = split_units(messages)
    assert shape(units)[1] == ("tool_exchange", 1, 3, None)


# -- injections ------------------------------------------------------------------------


def test_an_injection_is_pinned_until_an_assistant_message_follows_it() -> None:
    injected = Message.system("the user is on mobile", origin=Origin.INJECTION)
    answered = [
        Message.user("p"),
        injected,
        *exchange("a"),
        Message.user("more", origin=Origin.INJECTION),
    ]
    # The injected system message is context, not the instructions: answered,
    # it is droppable, even with no other system message before it.
    assert pinned_messages(answered, prompt_index=0) == {
        0: PinReason.CURRENT_PROMPT,
        2: PinReason.LIVE_TOOL_EXCHANGE,
        4: PinReason.UNANSWERED_INJECTION,
    }
    # A later system message that is an answered injection: only "first system" pins it.
    later = [Message.system("rules"), Message.user("p"), injected, Message.assistant("ok")]
    assert 2 not in pinned_messages(later)


def test_an_injected_tool_result_pins_its_whole_exchange() -> None:
    messages = [
        Message.user("p"),
        Message.assistant("", tool_calls=[call("a")]),
        Message.tool("a", "extra context", origin=Origin.INJECTION),
        Message.assistant("", tool_calls=[call("b")]),
        Message.tool("b", "r"),
    ]
    units = units_for(messages, {2: PinReason.UNANSWERED_INJECTION})
    assert shape(units)[1] == ("tool_exchange", 1, 3, "unanswered injection")


# -- integrity -------------------------------------------------------------------------


def broken_at(messages: list[Message]) -> TranscriptIntegrityError:
    with pytest.raises(TranscriptIntegrityError) as info:
        check_integrity(messages)
    return info.value


def test_a_whole_transcript_passes() -> None:
    check_integrity(
        [Message.system("s"), Message.user("q"), *exchange("a", "b"), Message.user("p")]
    )


def test_results_may_come_in_any_order_within_their_exchange() -> None:
    check_integrity(
        [
            Message.assistant("", tool_calls=[call("a"), call("b")]),
            Message.tool("b", "2"),
            Message.tool("a", "1"),
        ]
    )


def test_a_result_whose_call_is_gone_is_named() -> None:
    error = broken_at([Message.user("q"), Message.tool("gone", "r"), Message.assistant("a")])
    assert error.index == 1
    assert "answers no call" in error.reason
    assert "'gone'" in error.reason


def test_a_call_whose_result_is_gone_is_named_at_its_assistant_message() -> None:
    messages = [
        Message.user("q"),
        Message.assistant("", tool_calls=[call("a"), call("b", name="search")]),
        Message.tool("a", "r"),
        Message.user("p"),
    ]
    error = broken_at(messages)
    assert error.index == 1
    assert error.reason == "tool call 'b' (search) has no result"


def test_a_result_separated_from_its_call_is_named() -> None:
    messages = [
        Message.assistant("", tool_calls=[call("a"), call("b")]),
        Message.tool("a", "r"),
        Message.user("interloper"),
        Message.tool("b", "r"),
    ]
    error = broken_at(messages)
    assert error.index == 0
    assert "separated" in error.reason
    assert "message 3" in error.reason


def test_a_result_after_a_later_exchange_is_separated_from_its_call() -> None:
    messages = [
        Message.assistant("", tool_calls=[call("a")]),
        Message.assistant("", tool_calls=[call("b")]),
        Message.tool("b", "r"),
        Message.tool("a", "r"),
    ]
    error = broken_at(messages)
    assert error.index == 0
    assert "separated" in error.reason


def test_a_result_of_an_already_answered_exchange_is_separated() -> None:
    messages = [*exchange("a"), *exchange("b"), Message.tool("a", "again")]
    error = broken_at(messages)
    assert error.index == 4
    assert "separated from its call in message 0" in error.reason


def test_a_call_answered_twice_is_named() -> None:
    messages = [*exchange("a"), Message.tool("a", "again")]
    error = broken_at(messages)
    assert error.index == 2
    assert "answered twice" in error.reason


def test_a_call_id_used_twice_is_named() -> None:
    messages = [Message.user("q"), *exchange("a"), Message.user("p"), *exchange("a")]
    error = broken_at(messages)
    assert error.index == 4
    assert "used twice" in error.reason


def test_a_call_id_repeated_within_one_message_is_named() -> None:
    error = broken_at([Message.assistant("", tool_calls=[call("a"), call("a")])])
    assert error.index == 0
    assert "used twice" in error.reason


def test_a_trailing_call_whose_results_are_not_in_yet_is_refused() -> None:
    # The run loop appends every result before it sends, so even at the end
    # a pending call means the transcript is not ready to go out.
    error = broken_at([Message.user("p"), Message.assistant("", tool_calls=[call("a")])])
    assert error.index == 1
    assert "has no result" in error.reason


def test_split_units_refuses_a_broken_transcript() -> None:
    with pytest.raises(TranscriptIntegrityError):
        split_units([Message.tool("a", "r")])


def test_a_stray_result_forms_its_own_unit_when_integrity_is_not_checked() -> None:
    units = units_for([Message.user("q"), Message.tool("a", "r")], {})
    assert [(u.kind, u.start, u.end) for u in units] == [
        (UnitKind.USER, 0, 1),
        (UnitKind.TOOL_EXCHANGE, 1, 2),
    ]
