"""ScriptedDriver's pretend usage: the sum over what was sent, each message priced once."""

from __future__ import annotations

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

import threadline.testing
from threadline import Agent, Client, Conversation, Message, Model
from threadline.counting import estimate_message_tokens
from threadline.drivers import HistorySpan, ProviderCall
from threadline.testing import ScriptedDriver

pytestmark = pytest.mark.anyio

MODEL = Model("scripted-model", context_size=1_000_000)


async def test_a_long_conversation_prices_only_the_messages_new_to_each_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    priced: list[Message] = []

    def spy(message: Message) -> int:
        priced.append(message)
        return estimate_message_tokens(message)

    monkeypatch.setattr(threadline.testing, "estimate_message_tokens", spy)
    driver = ScriptedDriver([f"answer {turn}" for turn in range(40)])
    conversation = Conversation(Agent(Client(driver), model=MODEL))
    per_turn = []
    for turn in range(40):
        before = len(priced)
        result = await conversation.run(f"question {turn}")
        per_turn.append(len(priced) - before)
        sent = driver.calls[-1].messages
        assert result.response.usage.input_tokens == sum(map(estimate_message_tokens, sent))
    # A turn prices its prompt, the last turn's two messages again (they come
    # back as seed copies) and its reply: never the history.
    assert per_turn[1:] == [per_turn[1]] * 39
    assert per_turn[1] <= 4


MESSAGES = [Message.user(f"question {i} " * i) for i in range(6)] + [
    Message.assistant(f"answer {i}") for i in range(6)
]


@given(st.lists(st.lists(st.sampled_from(MESSAGES), max_size=8), min_size=1, max_size=6))
def test_input_usage_is_the_sum_over_what_was_sent_however_the_history_was_cut_or_edited(
    calls: list[list[Message]],
) -> None:
    driver = ScriptedDriver(["ok"] * len(calls))

    async def send_all() -> list[int]:
        usages = []
        for sent in calls:
            response = await driver.complete(ProviderCall(model=MODEL, messages=tuple(sent)))
            usages.append(response.usage.input_tokens)
        return usages

    priced = anyio.run(send_all)
    assert priced == [sum(map(estimate_message_tokens, sent)) for sent in calls]


async def test_a_history_edited_in_the_middle_is_priced_as_sent() -> None:
    driver = ScriptedDriver(["ok", "ok"])
    history = [Message.user("a" * 400), Message.assistant("b"), Message.user("c")]
    await driver.complete(ProviderCall(model=MODEL, messages=tuple(history)))
    history[0] = Message.user("short")  # the same place, other content
    response = await driver.complete(ProviderCall(model=MODEL, messages=tuple(history)))
    assert response.usage.input_tokens == sum(map(estimate_message_tokens, history))


# -- the call log: every call as sent, kept as what each added ---------------------------


@given(
    st.lists(
        st.tuples(st.integers(0, 8), st.lists(st.sampled_from(MESSAGES), max_size=4)),
        min_size=1,
        max_size=8,
    )
)
def test_every_logged_call_is_the_call_as_sent_however_the_history_changed(
    steps: list[tuple[int, list[Message]]],
) -> None:
    # Each call keeps some start of the call before it (or all of it) and adds
    # messages: a conversation's growth, cuts and edits at any place.
    log = threadline.testing.CallLog()
    sent: list[ProviderCall] = []
    messages: tuple[Message, ...] = ()
    for keep, added in steps:
        messages = (*messages[:keep], *added)
        call = ProviderCall(model=MODEL, messages=messages, max_output_tokens=len(sent) + 1)
        log.record(call)
        sent.append(call)
    assert len(log) == len(sent)
    assert list(log) == sent
    assert log == sent
    assert log[-1] is sent[-1]  # the latest is the very call received
    assert log[1:3] == sent[1:3]
    for index, call in enumerate(sent):
        assert log[index].messages == call.messages
        assert log[index - len(sent)] == call


async def test_a_long_conversations_log_holds_what_each_call_added_not_a_transcript_each() -> None:
    driver = ScriptedDriver([f"answer {turn}" for turn in range(200)])
    conversation = Conversation(Agent(Client(driver), model=MODEL, instructions="Be brief."))
    for turn in range(200):
        await conversation.run(f"question {turn}")
    # A list of the calls would hold 2 + 4 + ... + 400 messages (40,200); each
    # call adds its prompt and the last turn's two messages as seed copies
    # (the system message, made anew each call, is equal to the last one's).
    held = sum(map(len, driver.calls._added))
    assert held <= 3 * 200 + 1
    assert driver.calls[0].messages[-1].text == "question 0"
    assert [m.text for m in driver.calls[150].messages][-3:] == [
        "question 149",
        "answer 149",
        "question 150",
    ]
    assert len(driver.calls[150].messages) == 1 + 2 * 150 + 1


async def test_the_log_is_a_sequence_a_subclass_can_append_to_and_a_test_can_clear() -> None:
    driver = ScriptedDriver(["one", "two"])
    assert driver.calls == []
    first = ProviderCall(model=MODEL, messages=(Message.user("hi"),))
    await driver.complete(first)
    driver.calls.append(first)
    assert driver.calls == [first, first]
    assert driver.calls != [first]
    assert "CallLog([ProviderCall(" in repr(driver.calls)
    with pytest.raises(IndexError, match="call 2 of 2 calls"):
        driver.calls[2]
    driver.calls.clear()
    assert len(driver.calls) == 0
    await driver.complete(first)
    assert driver.calls[0] is first


# -- what the engine vouches for: the log compares no history it knows alike -------------


class _Watched(tuple[Message, ...]):
    """A call's messages that note every place a comparison reads."""

    read: set[int]

    def __getitem__(self, index):  # type: ignore[no-untyped-def, override]
        places = range(len(self))[index]
        self.read.update(places if isinstance(places, range) else (places,))
        return super().__getitem__(index)


async def test_a_conversations_calls_carry_where_their_history_stands() -> None:
    driver = ScriptedDriver([f"answer {turn}" for turn in range(3)])
    conversation = Conversation(Agent(Client(driver), model=MODEL, instructions="Be brief."))
    for turn in range(3):
        await conversation.run(f"question {turn}")
    spans = [call.history for call in driver.calls]
    assert all(span is not None for span in spans)
    assert [(span.offset, span.length) for span in spans if span] == [(1, 0), (1, 2), (1, 4)]
    first, second, third = spans
    assert first is not None
    assert second is not None
    assert first.begins(second)
    assert first.begins(third)
    assert second.begins(third)
    assert not second.begins(first)
    # The span is where the messages came from, not what is sent.
    call = driver.calls[-1]
    assert call == ProviderCall(model=call.model, messages=call.messages, cache_key=call.cache_key)


async def test_a_structured_turn_without_instructions_moves_the_history_behind_its_own_system() -> (
    None
):
    driver = ScriptedDriver(["first", '{"value": [1, 2]}'])
    conversation = Conversation(Agent(Client(driver), model=MODEL))
    await conversation.run("question 0")
    await conversation.run("list two numbers", output_type=list[int])
    call = driver.calls[-1]
    assert call.messages[0].role.value == "system"  # the output instruction's own
    assert call.history is not None
    assert call.history.offset == 1
    history = call.messages[call.history.offset : call.history.offset + call.history.length]
    assert [m.text for m in history] == ["question 0", "first"]


def test_the_log_compares_only_the_messages_around_a_history_known_alike() -> None:
    long = tuple(Message.user(f"message {i}") for i in range(500))
    log = threadline.testing.CallLog()
    first = ProviderCall(
        model=MODEL,
        messages=long,
        history=HistorySpan(source=(TOKEN, 0), offset=1, length=498),
    )
    log.record(first)
    grown = _Watched((*long, Message.assistant("reply"), Message.user("next")))
    grown.read = set()
    second = ProviderCall(
        model=MODEL,
        messages=grown,
        history=HistorySpan(source=(TOKEN, 0), offset=1, length=499),
    )
    priced = log.record(second)
    assert priced == sum(map(estimate_message_tokens, grown))
    assert log[0] == first
    assert log[1] == second
    # The system message in front, and from where the first call's history ended.
    assert grown.read <= {0, *range(499, 502)}


def test_spans_of_another_source_or_place_say_nothing_and_the_messages_are_compared() -> None:
    messages = tuple(Message.user(f"message {i}") for i in range(20))
    edited = (Message.user("changed"), *messages[1:])
    for later in (
        HistorySpan(source=(object(), 0), offset=0, length=20),
        HistorySpan(source=(TOKEN, 0), offset=1, length=19),
        HistorySpan(source=(TOKEN, 0), offset=0, length=19),
        None,
    ):
        log = threadline.testing.CallLog()
        span = HistorySpan(source=(TOKEN, 0), offset=0, length=20)
        log.record(ProviderCall(model=MODEL, messages=messages, history=span))
        priced = log.record(ProviderCall(model=MODEL, messages=edited, history=later))
        assert priced == sum(map(estimate_message_tokens, edited))
        assert log[0].messages == messages
        assert log[1].messages == edited


TOKEN = object()
