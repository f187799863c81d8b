"""The engine's quick bookkeeping agrees with the plain computation it replaces (hypothesis)."""

from __future__ import annotations

from collections.abc import Callable

from hypothesis import given
from hypothesis import strategies as st

from threadline import Message, ToolCall
from threadline.limiting import TokenLimitEvent, TranscriptIntegrityError, check_integrity

# These helpers are private to the engine's room; each is checked against the plain
# computation it stands for.
from threadline.limiting._drop_oldest import _none_negative
from threadline.limiting._drops import starts_after
from threadline.limiting._event import _Runs, removed_spans
from threadline.limiting._units import (
    _walked_unit_starts,
    checked_unit_starts,
    one_run,
    unit_starts,
)


class Words:
    def message_tokens(self, message: Message) -> int:
        return 3 + len(message.text.split())

    def overhead_tokens(self, tools: object = ()) -> int:
        return 2

    def count(self, messages: list[Message], tools: object = ()) -> int:
        return sum(map(self.message_tokens, messages)) + 2


@st.composite
def transcripts(draw: st.DrawFn) -> list[Message]:
    messages = [Message.system("be brief")]
    for turn in range(draw(st.integers(1, 12))):
        messages.append(Message.user(f"question {turn}"))
        for exchange in range(draw(st.integers(0, 2))):
            ids = [f"c{turn}-{exchange}-{k}" for k in range(draw(st.integers(1, 3)))]
            calls = [ToolCall(id=i, name="look", arguments="{}") for i in ids]
            messages.append(Message.assistant("", tool_calls=calls))
            messages.extend(Message.tool(i, "found " * draw(st.integers(0, 3))) for i in ids)
        messages.append(Message.assistant(f"answer {turn}"))
    return messages


@given(transcripts(), st.data())
def test_unit_starts_after_a_removal_are_those_of_what_is_left(
    messages: list[Message], data: st.DataObject
) -> None:
    starts = unit_starts(messages, checked=True)
    bounds = [*starts, len(messages)]
    chosen = data.draw(st.lists(st.sampled_from(range(len(starts))), unique=True))
    removed: list[tuple[int, int]] = []
    for k in sorted(chosen):  # whole units, touching ones joined as _gaps would
        if removed and removed[-1][1] == bounds[k]:
            removed[-1] = (removed[-1][0], bounds[k + 1])
        else:
            removed.append((bounds[k], bounds[k + 1]))
    gone = {i for start, end in removed for i in range(start, end)}
    left = [m for i, m in enumerate(messages) if i not in gone]
    assert starts_after(starts, removed) == unit_starts(left, checked=True)


@given(st.integers(0, 60), st.data())
def test_runs_index_slice_and_gaps_like_the_list_of_indices(size: int, data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, size), max_size=8)))
    pieces = list(zip(cuts[::2], cuts[1::2], strict=False))
    runs = _Runs.cut(range(size), pieces)
    plain = [i for start, end in pieces for i in range(start, end)]
    assert list(runs) == plain
    assert len(runs) == len(plain)
    assert [runs[i] for i in range(-len(plain), len(plain))] == plain + plain
    start = data.draw(st.integers(0, len(plain)))
    end = data.draw(st.integers(start, len(plain)))
    assert list(runs[start:end]) == plain[start:end]
    assert list(runs[::2]) == plain[::2]
    assert runs.gaps(size) == removed_spans(plain, size) == removed_spans(list(runs), size)


@given(st.lists(st.one_of(st.integers(-5, 10**6), st.integers(2**64, 2**70), st.floats(-1, 9))))
def test_no_negative_cost_is_found_as_min_finds_it(costs: list[float]) -> None:
    assert _none_negative(costs) == (min(costs, default=0) >= 0)


@given(transcripts(), st.data())
def test_drop_units_takes_any_selection_of_listed_units(
    messages: list[Message], data: st.DataObject
) -> None:
    event = TokenLimitEvent(messages, budget_tokens=1, counter=Words())
    droppable = event.units(pinned=False)
    begin = data.draw(st.integers(0, len(droppable)))
    end = data.draw(st.integers(begin, len(droppable)))
    step = data.draw(st.sampled_from([1, 2, -1]))
    chosen = droppable[begin:end:step]
    gone = {i for unit in chosen for i in unit.indices}
    contiguous = one_run(chosen)
    if contiguous is not None:
        assert gone == set(range(*contiguous))
    event.drop_units(chosen, reason="chosen")
    assert event.messages == [m for i, m in enumerate(messages) if i not in gone]
    check_integrity(event.messages)


@given(transcripts(), st.data())
def test_the_integrity_walk_in_call_order_agrees_with_the_walk_in_any_order(
    messages: list[Message], data: st.DataObject
) -> None:
    edited = list(messages)
    for _ in range(data.draw(st.integers(0, 2))):  # break it, or reorder what may be
        at = data.draw(st.integers(0, len(edited) - 1))
        edit = data.draw(st.sampled_from(["delete", "repeat", "swap", "move", "again"]))
        if edit == "delete":
            del edited[at]
        elif edit == "again" and edited[at].tool_calls:  # the exchange, its ids reused
            end = at + 1 + len(edited[at].tool_calls)
            edited.extend(edited[at:end])
        elif edit == "repeat":
            edited.insert(at, edited[at])
        elif edit == "swap" and at + 1 < len(edited):
            edited[at], edited[at + 1] = edited[at + 1], edited[at]
        elif edit == "move":
            edited.insert(data.draw(st.integers(0, len(edited))), edited.pop(at))
    assert verdict(checked_unit_starts, edited) == verdict(_walked_unit_starts, edited)
    if edited == messages:  # results in their calls' order: no second walk
        assert verdict(checked_unit_starts, edited) == unit_starts(messages, checked=True)


def verdict(
    walk: Callable[[list[Message]], list[int]], messages: list[Message]
) -> list[int] | tuple[int | None, str]:
    """The unit starts a walk finds, or where and why it refuses the transcript."""
    try:
        return walk(messages)
    except TranscriptIntegrityError as exc:
        return exc.index, exc.reason
