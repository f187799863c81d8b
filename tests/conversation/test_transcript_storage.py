"""A conversation's transcript keeps its events compactly and gives back equal ones."""

from __future__ import annotations

import tracemalloc
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from threadline import Message, Origin, Reasoning, ToolCall, Usage
from threadline._provider import ProviderResponse
from threadline.conversation._transcript import SeedWindow, Transcript  # private: under test
from threadline.serialization import ConversationEvent

_usages = st.none() | st.builds(
    Usage,
    input_tokens=st.integers(0, 2**40),
    output_tokens=st.integers(0, 10**6),
    cached_input_tokens=st.integers(0, 10**6),
    reasoning_tokens=st.integers(0, 10**6),
)
_labels = st.none() | st.sampled_from(["gpt-x", "llama", ""])


@st.composite
def _turn(draw: st.DrawFn, turn_id: int) -> list[ConversationEvent]:
    origin = draw(st.sampled_from([Origin.TURN, Origin.SEED]))
    events = [
        ConversationEvent(message=Message.user(f"q{turn_id}", origin=origin), turn_id=turn_id)
    ]
    if draw(st.booleans()):
        call = ToolCall(id=f"c{turn_id}", name="look", arguments="{}")
        events.append(
            ConversationEvent(
                message=Message.assistant(tool_calls=[call], origin=origin),
                turn_id=turn_id,
                usage=draw(_usages),
                model=draw(_labels),
                finish_reason=draw(st.none() | st.just("tool_calls")),
            )
        )
        tool = Message.tool(call.id, "42", origin=origin)
        events.append(ConversationEvent(message=tool, turn_id=turn_id))
    reasoning = draw(st.none() | st.just(Reasoning(text="because")))
    reply = Message.assistant(f"a{turn_id}", reasoning=reasoning, origin=origin)
    events.append(
        ConversationEvent(
            message=reply,
            turn_id=turn_id,
            usage=draw(_usages),
            model=draw(_labels),
            finish_reason=draw(_labels),
        )
    )
    return events


@st.composite
def _turns(draw: st.DrawFn) -> list[list[ConversationEvent]]:
    ids = sorted(draw(st.sets(st.integers(0, 10_000), max_size=6)))
    return [draw(_turn(turn_id)) for turn_id in ids]


def _response(events: list[ConversationEvent]) -> ProviderResponse:
    return ProviderResponse(
        message=events[-1].message, finish_reason="stop", usage=Usage(), model="m"
    )


@given(_turns(), st.integers(0, 3))
def test_events_come_back_equal_whether_loaded_or_appended(
    turns: list[list[ConversationEvent]], loaded: int
) -> None:
    everything = [event for turn in turns for event in turn]
    transcript = Transcript([event for turn in turns[:loaded] for event in turn])
    for turn in turns[loaded:]:
        transcript.append_turn(turn, _response(turn), Usage())
    assert transcript.events == tuple(everything)
    assert [(t.id, t.events) for t in transcript.turns] == [
        (turn[0].turn_id, tuple(turn)) for turn in turns
    ]
    assert transcript.turn_count() == len(turns)
    assert transcript.messages_from(0) == [event.message for event in everything]
    assert [m.origin for m in transcript.messages_from(0)] == [
        event.message.origin for event in everything
    ]
    # What a turn sends: the same messages as seed, the very objects every time.
    sent = transcript.seed_from(0)
    assert sent == tuple(event.message.with_origin(Origin.SEED) for event in everything)
    assert all(a is b for a, b in zip(sent, transcript.seed_from(0), strict=True))
    users = [i for i, event in enumerate(everything) if event.message.role.value == "user"]
    assert transcript.user_indices() == users


def test_an_empty_transcript_has_no_events_turns_or_messages() -> None:
    transcript = Transcript()
    assert (transcript.events, transcript.turns, transcript.messages_from(0)) == ((), (), [])
    assert transcript.seed_from(0) == ()


def test_packed_fields_come_back_for_any_int_and_any_step() -> None:
    from threadline.conversation._packed_events import PackedEvents  # private: the packing

    packed = PackedEvents()
    user = Message.user("q")
    fields = [
        (
            7,
            Usage(
                input_tokens=2**70, output_tokens=0, cached_input_tokens=127, reasoning_tokens=128
            ),
            "m",
            "stop",
        ),
        (7, None, "m", None),
        (3, Usage(input_tokens=-1, output_tokens=-129), None, "stop"),  # a step back, negatives
        (3, None, "n", "length"),
        (2**40, Usage(), "m", "stop"),
    ]
    for turn_id, usage, model, finish in fields:
        packed.append(
            ConversationEvent(
                message=user, turn_id=turn_id, usage=usage, model=model, finish_reason=finish
            )
        )
    assert list(packed) == fields


def _answered(turns: int) -> Transcript:
    transcript = Transcript()
    for turn in range(turns):
        question = ConversationEvent(message=Message.user(f"q{turn}"), turn_id=turn)
        answer = ConversationEvent(message=Message.assistant(f"a{turn}"), turn_id=turn)
        response = ProviderResponse(
            message=answer.message, finish_reason="stop", usage=Usage(), model="m"
        )
        transcript.append_turn([question, answer], response, Usage())
    return transcript


def test_the_history_a_turn_sends_is_a_window_not_a_copy() -> None:
    transcript = _answered(5_000)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        window = transcript.seed_from(0)
        made = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    # A tuple of the 10,000 messages would take 80 KB; the window takes its slots.
    assert made < 1_000
    assert len(window) == 10_000


@given(st.integers(0, 12), st.integers(-14, 14), st.integers(-14, 14), st.integers(-3, 3))
def test_a_window_reads_as_the_tuple_of_its_messages_and_keeps_to_them(
    start: int, first: int, last: int, step: int
) -> None:
    transcript = _answered(6)
    window = transcript.seed_from(start)
    expected = tuple(transcript.messages_from(0))[start:]
    expected = tuple(m.with_origin(Origin.SEED) for m in expected)
    assert window == expected
    assert tuple(window) == expected
    assert list(reversed(window)) == list(reversed(expected))
    assert window[first : last : step or 1] == expected[first : last : step or 1]
    if -len(expected) <= first < len(expected):
        assert window[first] is tuple(window)[first]
    else:
        with pytest.raises(IndexError):
            window[first]
    _extend(transcript)
    assert window == expected  # the transcript grew; the window did not


def _extend(transcript: Transcript) -> None:
    turn = transcript.next_turn_id
    question = ConversationEvent(message=Message.user("later"), turn_id=turn)
    answer = ConversationEvent(message=Message.assistant("later"), turn_id=turn)
    response = ProviderResponse(
        message=answer.message, finish_reason="stop", usage=Usage(), model="m"
    )
    transcript.append_turn([question, answer], response, Usage())


class _CountedList(list[Message]):
    """A list of messages that counts how many of them are read."""

    read = 0

    def __iter__(self) -> Iterator[Message]:
        for message in super().__iter__():
            self.read += 1
            yield message

    def __getitem__(self, index: Any) -> Any:
        found = super().__getitem__(index)
        self.read += len(found) if isinstance(index, slice) else 1
        return found


def test_a_window_that_starts_late_reads_only_its_own_messages() -> None:
    messages = _CountedList(Message.user(f"m{i}") for i in range(10_000))
    for start in (0, 9_000):
        messages.read = 0
        window = SeedWindow(messages, start, 10_000)
        assert tuple(window) == tuple(list.__getitem__(messages, slice(start, None)))
        assert messages.read == 10_000 - start
