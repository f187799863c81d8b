"""What a handler of your own can do with TokenLimitEvent: list units, drop them with a reason."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from threadline import Budget, HandlerError, InvalidRequestError, Message, Origin, Tool, ToolCall
from threadline.limiting import (
    PinReason,
    TokenLimitEvent,
    TranscriptIntegrityError,
    Unit,
    UnitKind,
    Units,
    drop_oldest_units,
    split_units,
)

# apply_limits is the engine's private entry point: the ledger is what these tests check.
from threadline.limiting._engine import apply_limits

pytestmark = pytest.mark.anyio


class WordCounter:
    """3 tokens per message plus one per word; 2 of framing."""

    def message_tokens(self, message: Message) -> int:
        return 3 + len(message.text.split())

    def overhead_tokens(self, tools: Sequence[Tool] = ()) -> int:
        return 2

    def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        return sum(self.message_tokens(m) for m in messages) + self.overhead_tokens(tools)


SYSTEM = Message.system("be brief")
PROMPT = Message.user("what now", origin=Origin.TURN)


def exchange(call_id: str) -> list[Message]:
    return [
        Message.assistant("", tool_calls=[ToolCall(id=call_id, name="lookup")]),
        Message.tool(call_id, f"result {call_id} " * 3),
    ]


def transcript(turns: int) -> list[Message]:
    """The system message, ``turns`` turns (question, tool exchange, answer), the prompt."""
    messages = [SYSTEM]
    for t in range(turns):
        messages += [Message.user(f"question {t}"), *exchange(f"c{t}"), Message.assistant(f"a{t}")]
    return [*messages, PROMPT]


def event_for(messages: list[Message], budget: int = 10) -> TokenLimitEvent:
    return TokenLimitEvent(messages, budget_tokens=budget, counter=WordCounter())


def budget(prompt_tokens: int) -> Budget:
    return Budget(limit=prompt_tokens + 100, reserve=100)


# -- listing units ---------------------------------------------------------------------


def test_units_lists_what_split_units_lists() -> None:
    messages = transcript(2)
    units = event_for(messages).units()
    assert isinstance(units, Units)
    assert list(units) == split_units(messages)
    assert units == split_units(messages)
    assert len(units) == 8
    assert units[1] == Unit(kind=UnitKind.USER, start=1, end=2)
    assert units[-1] == Unit(kind=UnitKind.USER, start=9, end=10, reason=PinReason.CURRENT_PROMPT)
    assert "Unit(kind=<UnitKind.SYSTEM" in repr(units)


def test_a_slice_of_units_is_units_in_the_same_order() -> None:
    units = event_for(transcript(2)).units()
    part = units[2:5]
    assert isinstance(part, Units)
    assert [(u.kind, u.start) for u in part] == [
        (UnitKind.TOOL_EXCHANGE, 2),
        (UnitKind.ASSISTANT, 4),
        (UnitKind.USER, 5),
    ]
    assert list(units[::-1]) == list(reversed(list(units)))


def test_units_can_be_listed_pinned_or_droppable_only() -> None:
    event = event_for(transcript(2))
    pinned = event.units(pinned=True)
    droppable = event.units(pinned=False)
    assert [u.reason for u in pinned] == [PinReason.FIRST_SYSTEM, PinReason.CURRENT_PROMPT]
    assert all(not u.pinned for u in droppable)
    assert sorted([*pinned, *droppable], key=lambda u: u.start) == list(event.units())


def test_units_follow_the_messages_a_handler_left() -> None:
    event = event_for(transcript(2))
    del event.messages[1:5]  # the first turn
    assert [(u.start, u.end, u.pinned) for u in event.units()] == [
        (0, 1, True),
        (1, 2, False),
        (2, 4, False),
        (4, 5, False),
        (5, 6, True),
    ]


def test_units_of_a_broken_transcript_are_refused() -> None:
    event = event_for(transcript(1))
    del event.messages[2]  # the call; its result stays
    with pytest.raises(TranscriptIntegrityError):
        event.units()


# -- dropping units --------------------------------------------------------------------


def test_drop_units_removes_whole_units() -> None:
    messages = transcript(2)
    event = event_for(messages)
    units = event.units()
    event.drop_units([units[2], units[1]], reason="not needed")  # any order
    assert event.messages == [SYSTEM, *messages[4:]]


def test_drop_units_takes_a_slice_of_units_as_it_is() -> None:
    messages = transcript(3)
    event = event_for(messages)
    event.drop_units(event.units(pinned=False)[:6], reason="old turns")  # two turns
    assert event.messages == [SYSTEM, *messages[9:]]


def test_drop_units_twice_with_a_fresh_listing_in_between() -> None:
    messages = transcript(2)
    event = event_for(messages)
    event.drop_units(event.units(pinned=False)[:1], reason="first")
    event.drop_units(event.units(pinned=False)[:1], reason="second")
    assert event.messages == [SYSTEM, *messages[4:]]


def test_drop_units_of_nothing_leaves_the_very_same_list() -> None:
    event = event_for(transcript(1))
    handed = event.messages
    event.drop_units([], reason="nothing")
    event.drop_units(event.units(pinned=False)[:0], reason="nothing")
    assert event.messages is handed


@pytest.mark.parametrize("reason", ["", "   ", None, 3])
def test_drop_units_needs_a_reason(reason: object) -> None:
    event = event_for(transcript(1))
    with pytest.raises(InvalidRequestError, match="reason"):
        event.drop_units(event.units()[1:2], reason=reason)  # type: ignore[arg-type]


def test_drop_units_refuses_what_is_not_a_unit() -> None:
    event = event_for(transcript(1))
    with pytest.raises(InvalidRequestError, match="not int"):
        event.drop_units([1, 2], reason="indices are not units")  # type: ignore[list-item]


def test_drop_units_refuses_a_unit_outside_the_messages_now() -> None:
    event = event_for(transcript(2))
    last = event.units()[-1]
    del event.messages[1:]
    with pytest.raises(InvalidRequestError, match=r"messages\[9:10\].*list the units again"):
        event.drop_units([last], reason="stale")


# -- what the ledger says --------------------------------------------------------------


async def test_the_ledger_names_the_handler_and_the_reason_it_gave() -> None:
    async def forget_tool_output(event: TokenLimitEvent) -> None:
        exchanges = [u for u in event.units() if u.kind is UnitKind.TOOL_EXCHANGE]
        event.drop_units(exchanges, reason="tool output is stale")

    messages = transcript(3)
    outcome = await apply_limits(
        messages, counter=WordCounter(), budget=budget(40), pre=forget_tool_output
    )
    assert [(d.start, d.end, d.kind, d.reason) for d in outcome.record.dropped] == [
        (2, 4, UnitKind.TOOL_EXCHANGE, "tool output is stale"),
        (6, 8, UnitKind.TOOL_EXCHANGE, "tool output is stale"),
        (10, 12, UnitKind.TOOL_EXCHANGE, "tool output is stale"),
    ]
    assert {d.handler for d in outcome.record.dropped} == {
        "test_the_ledger_names_the_handler_and_the_reason_it_gave.<locals>.forget_tool_output"
    }
    [run] = outcome.record.handlers
    assert run.dropped_messages == 6


async def test_each_drop_keeps_its_own_reason_after_edits_in_between() -> None:
    def two_steps(event: TokenLimitEvent) -> None:
        event.drop_units(event.units(pinned=False)[3:6], reason="second turn")
        event.messages.insert(1, note)
        event.drop_units(event.units(pinned=False)[1:4], reason="first turn")

    note = Message.user("a note the handler added")
    messages = transcript(3)
    outcome = await apply_limits(messages, counter=WordCounter(), budget=budget(40), pre=two_steps)
    assert outcome.messages == (SYSTEM, note, *messages[9:])
    assert [(d.start, d.reason) for d in outcome.record.dropped] == [
        (1, "first turn"),
        (2, "first turn"),
        (4, "first turn"),
        (5, "second turn"),
        (6, "second turn"),
        (8, "second turn"),
    ]
    assert outcome.record.handlers[0].added_messages == 1


async def test_units_that_came_together_after_a_drop_keep_apart_in_the_ledger() -> None:
    def around(event: TokenLimitEvent) -> None:
        event.drop_units(event.units()[2:3], reason="the exchange")
        event.drop_units(event.units()[1:3], reason="the question and its answer")

    outcome = await apply_limits(
        transcript(2), counter=WordCounter(), budget=budget(30), pre=around
    )
    assert [(d.start, d.reason) for d in outcome.record.dropped] == [
        (1, "the question and its answer"),
        (2, "the exchange"),
        (4, "the question and its answer"),
    ]


async def test_a_drop_without_a_reason_is_put_down_to_the_budget() -> None:
    def trim(event: TokenLimitEvent) -> None:
        del event.messages[1:5]

    messages = transcript(2)
    tokens = WordCounter().count(messages)
    outcome = await apply_limits(messages, counter=WordCounter(), budget=budget(30), pre=trim)
    assert {d.reason for d in outcome.record.dropped} == {f"over budget: {tokens} > 30 tokens"}


async def test_a_user_handler_can_do_what_drop_oldest_units_does() -> None:
    async def window(event: TokenLimitEvent) -> None:
        # Drop the oldest turns, whole, until it fits: turns start at user messages.
        while event.is_over_budget():
            droppable = event.units(pinned=False)
            turn = next(
                (k for k in range(1, len(droppable)) if droppable[k].kind is UnitKind.USER),
                len(droppable),
            )
            if not droppable:
                return
            event.drop_units(droppable[:turn], reason="the oldest turn")

    messages = transcript(6)
    mine = await apply_limits(messages, counter=WordCounter(), budget=budget(50), pre=window)
    builtin = await apply_limits(messages, counter=WordCounter(), budget=budget(50))
    assert mine.messages == builtin.messages
    assert [(d.start, d.end) for d in mine.record.dropped] == [
        (d.start, d.end) for d in builtin.record.dropped
    ]
    assert {d.reason for d in mine.record.dropped} == {"the oldest turn"}
    tokens = WordCounter().count(messages)
    assert builtin.record.dropped[0].reason == f"oldest droppable unit while {tokens} > 50 tokens"


# -- a broken drop is refused, as any broken rewrite -----------------------------------


async def test_dropping_a_pinned_unit_is_refused() -> None:
    def drop_the_prompt(event: TokenLimitEvent) -> None:
        event.drop_units(event.units(pinned=True)[-1:], reason="too long")

    with pytest.raises(HandlerError, match="current prompt") as info:
        await apply_limits(
            transcript(2), counter=WordCounter(), budget=budget(20), pre=drop_the_prompt
        )
    assert info.value.handler.endswith("drop_the_prompt")


async def test_a_made_up_unit_that_splits_a_tool_exchange_is_refused() -> None:
    def half_an_exchange(event: TokenLimitEvent) -> None:
        call = event.units()[2]
        event.drop_units([Unit(kind=call.kind, start=call.start, end=call.start + 1)], reason="x")

    with pytest.raises(HandlerError, match="answers no call") as info:
        await apply_limits(
            transcript(2), counter=WordCounter(), budget=budget(20), pre=half_an_exchange
        )
    assert info.value.index == 2


async def test_a_refused_drop_leaves_the_transcript_to_the_engine() -> None:
    messages = transcript(2)
    before = list(messages)

    def drop_everything(event: TokenLimitEvent) -> None:
        event.drop_units(event.units(), reason="all of it")

    with pytest.raises(HandlerError):
        await apply_limits(messages, counter=WordCounter(), budget=budget(20), pre=drop_everything)
    assert messages == before


async def test_a_rewrite_by_hand_after_drop_units_is_checked_in_full() -> None:
    def drop_then_break(event: TokenLimitEvent) -> None:
        event.drop_units(event.units(pinned=False)[:1], reason="the oldest")
        event.messages.insert(1, Message.tool("ghost", "a result of no call"))

    with pytest.raises(HandlerError, match="answers no call"):
        await apply_limits(
            transcript(2), counter=WordCounter(), budget=budget(20), pre=drop_then_break
        )


async def test_the_ledger_reads_as_a_sequence_equal_to_a_tuple_of_its_units() -> None:
    outcome = await apply_limits(transcript(4), counter=WordCounter(), budget=budget(30))
    dropped = outcome.record.dropped
    units = tuple(dropped)
    assert units
    assert dropped == units
    assert dropped == list(units)
    assert dropped[0] == units[0]
    assert dropped[1:] == units[1:]
    assert len(dropped) == len(units)
    assert hash(outcome.record) == hash(outcome.record)


async def test_message_costs_are_the_counters_costs_of_the_messages_now() -> None:
    messages = transcript(2)
    event = event_for(messages)
    counter = WordCounter()
    assert event.message_costs() == [counter.message_tokens(m) for m in messages]
    event.drop_units(event.units(pinned=False)[:2], reason="older")
    assert event.message_costs() == [counter.message_tokens(m) for m in event.messages]


# -- the built-in keeps its word -------------------------------------------------------


async def test_drop_oldest_units_leaves_the_pinned_units_and_the_newest_turns() -> None:
    messages = transcript(40)
    event = event_for(messages, budget=60)
    await drop_oldest_units(None)(event)
    assert event.messages[0] is SYSTEM
    assert event.messages[-1] is PROMPT
    assert event.messages[1:-1] == messages[len(messages) - len(event.messages) + 1 : -1]
    assert event.messages[1].role.value == "user"
    assert WordCounter().count(event.messages) <= 60
