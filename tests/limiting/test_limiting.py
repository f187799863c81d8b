"""The limiting engine and its handlers, rule by rule (SPEC §3, §6)."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import pytest

from threadline import Budget, HandlerError, Message, Origin, Role, Tool, ToolCall
from threadline.limiting import (
    PinReason,
    TokenLimitEvent,
    TranscriptIntegrityError,
    UnitKind,
    drop_oldest_units,
)

# The engine's entry point, its handler naming and message matching are private rooms:
# these tests pin the rules they implement.
from threadline.limiting._engine import apply_limits
from threadline.limiting._event import handler_name
from threadline.limiting._units import match_messages

pytestmark = pytest.mark.anyio


class WordCounter:
    """Incremental: 3 tokens of framing per message plus one per word, 2 per reply, 10 per tool."""

    def __init__(self) -> None:
        self.counts = 0

    def message_tokens(self, message: Message) -> int:
        return 3 + len(message.text.split()) + len(message.tool_calls)

    def overhead_tokens(self, tools: Sequence[Tool] = ()) -> int:
        return 2 + 10 * len(tools)

    def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        self.counts += 1
        return sum(self.message_tokens(m) for m in messages) + self.overhead_tokens(tools)


class LumpyCounter:
    """A plain counter (no ``message_tokens``) that is not a sum of per-message costs.

    Every fourth message costs 4 more, the way batched framing might: pricing
    single messages underestimates a long transcript.
    """

    def __init__(self) -> None:
        self.counts = 0

    def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        self.counts += 1
        words = sum(len(m.text.split()) + len(m.tool_calls) for m in messages)
        return 2 + 10 * len(tools) + 3 * len(messages) + words + 4 * (len(messages) // 4)


def budget(prompt_tokens: int) -> Budget:
    return Budget(limit=prompt_tokens + 100, reserve=100)


def words(n: int, tag: str) -> str:
    return " ".join([tag] * n)


def exchange(call_id: str, *, results: int = 1, size: int = 1) -> list[Message]:
    ids = [f"{call_id}{k}" for k in range(results)]
    return [
        Message.assistant("", tool_calls=[ToolCall(id=i, name="lookup") for i in ids]),
        *(Message.tool(i, words(size, i)) for i in ids),
    ]


def history(turns: int, *, size: int = 5) -> list[Message]:
    """``turns`` complete turns: question, a tool exchange, answer."""
    messages: list[Message] = []
    for t in range(turns):
        messages += [
            Message.user(words(size, f"q{t}")),
            *exchange(f"t{t}-", size=size),
            Message.assistant(words(size, f"a{t}")),
        ]
    return messages


SYSTEM = Message.system("be brief")
PROMPT = Message.user("what now", origin=Origin.TURN)


def transcript(turns: int = 4) -> list[Message]:
    return [SYSTEM, *history(turns), PROMPT]


# -- when nothing is over --------------------------------------------------------------


async def test_a_transcript_that_fits_is_sent_exactly_as_it_is() -> None:
    messages = transcript()
    called: list[TokenLimitEvent] = []
    outcome = await apply_limits(
        messages,
        counter=WordCounter(),
        budget=budget(10_000),
        pre=called.append,
        post=called.append,
    )
    assert all(a is b for a, b in zip(outcome.messages, messages, strict=True))
    assert len(outcome.messages) == len(messages)
    assert called == []
    assert outcome.record.handlers == ()
    assert not outcome.record.limited
    assert not outcome.record.sent_over_budget


async def test_a_transcript_exactly_at_the_budget_fits() -> None:
    messages = transcript()
    counter = WordCounter()
    outcome = await apply_limits(messages, counter=counter, budget=budget(counter.count(messages)))
    assert outcome.messages == tuple(messages)
    assert outcome.record.handlers == ()


async def test_without_a_budget_nothing_is_limited() -> None:
    messages = transcript(50)
    outcome = await apply_limits(messages, counter=WordCounter(), budget=None)
    assert outcome.messages == tuple(messages)
    assert outcome.record.budget_tokens is None
    assert outcome.record.report.prompt_budget is None


async def test_the_callers_list_is_never_modified() -> None:
    messages = transcript(10)
    before = list(messages)
    outcome = await apply_limits(messages, counter=WordCounter(), budget=budget(60))
    assert len(outcome.messages) < len(messages)
    assert messages == before


# -- the default: drop_oldest_units ----------------------------------------------------


async def test_unset_pre_drops_the_oldest_units_until_it_fits() -> None:
    messages = transcript(6)
    counter = WordCounter()
    outcome = await apply_limits(messages, counter=counter, budget=budget(80))
    kept = outcome.messages
    assert kept[0] is SYSTEM
    assert kept[-1] is PROMPT
    assert counter.count(kept) <= 80
    # The newest turns are the ones kept, whole and in order.
    assert kept[1:-1] == tuple(messages[len(messages) - len(kept) + 1 : -1])
    assert [r.handler for r in outcome.record.handlers] == ["drop_oldest_units"]
    assert outcome.record.tokens_before == counter.count(messages)
    assert outcome.record.tokens_after == counter.count(kept)


async def test_dropping_goes_on_until_the_transcript_opens_with_a_user_message() -> None:
    messages = [
        SYSTEM,
        Message.user(words(40, "q")),
        Message.assistant(words(2, "a")),
        Message.assistant(words(2, "b")),
        *exchange("x"),
        Message.user("q2"),
        Message.assistant("a2"),
        PROMPT,
    ]
    counter = WordCounter()
    # Dropping the first question alone would fit, but would leave answers
    # opening the transcript: they go too, down to the next user message.
    outcome = await apply_limits(messages, counter=counter, budget=budget(50))
    assert outcome.messages == (SYSTEM, messages[6], messages[7], PROMPT)
    reasons = [d.reason for d in outcome.record.dropped]
    assert reasons[0].startswith("oldest droppable unit")
    assert all("opens with a user message" in r for r in reasons[1:])
    assert [d.kind for d in outcome.record.dropped] == [
        UnitKind.USER,
        UnitKind.ASSISTANT,
        UnitKind.ASSISTANT,
        UnitKind.TOOL_EXCHANGE,
    ]


async def test_a_tool_exchange_leaves_whole() -> None:
    messages = [SYSTEM, Message.user("q"), *exchange("x", results=3, size=20), PROMPT]
    outcome = await apply_limits(messages, counter=WordCounter(), budget=budget(30))
    assert outcome.messages == (SYSTEM, PROMPT)
    exchange_drop = next(d for d in outcome.record.dropped if d.kind is UnitKind.TOOL_EXCHANGE)
    assert (exchange_drop.start, exchange_drop.end) == (2, 6)
    assert exchange_drop.roles == (Role.ASSISTANT, Role.TOOL, Role.TOOL, Role.TOOL)


async def test_later_system_messages_are_droppable() -> None:
    late = Message.system(words(30, "late"))
    messages = [SYSTEM, Message.user("q"), Message.assistant("a"), late, PROMPT]
    outcome = await apply_limits(messages, counter=WordCounter(), budget=budget(20))
    assert late not in outcome.messages
    assert outcome.messages == (SYSTEM, PROMPT)


async def test_the_live_exchange_and_unanswered_injections_are_never_dropped() -> None:
    live = exchange("live", results=2, size=30)
    injected = Message.user("note: it is late", origin=Origin.INJECTION)
    messages = [SYSTEM, *history(3), PROMPT, *exchange("done", size=30), *live, injected]
    counter = WordCounter()
    outcome = await apply_limits(messages, counter=counter, budget=budget(100), prompt_index=13)
    assert outcome.messages == (SYSTEM, PROMPT, *live, injected)
    assert outcome.prompt_index == 1
    # The earlier exchange of this run had been answered: it was droppable.
    assert any(d.start == 14 for d in outcome.record.dropped)


async def test_when_only_pinned_messages_are_left_it_is_sent_over_budget_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    big_prompt = Message.user(words(500, "p"), origin=Origin.TURN)
    messages = [SYSTEM, *history(2), big_prompt]
    with caplog.at_level(logging.WARNING, logger="threadline.limiting"):
        outcome = await apply_limits(messages, counter=WordCounter(), budget=budget(100))
    assert outcome.messages == (SYSTEM, big_prompt)
    assert outcome.record.sent_over_budget
    [record] = caplog.records
    assert record.levelno == logging.WARNING
    assert "only pinned messages are left" in record.getMessage()


async def test_a_transcript_over_budget_that_a_handler_leaves_is_sent_with_a_warning(
    caplog: pytest.LogCaptureFixture,
) -> None:
    def keep_everything(event: TokenLimitEvent) -> None:
        return None

    messages = transcript(5)
    with caplog.at_level(logging.WARNING, logger="threadline.limiting"):
        outcome = await apply_limits(
            messages, counter=WordCounter(), budget=budget(20), pre=keep_everything
        )
    assert outcome.messages == tuple(messages)
    assert outcome.record.sent_over_budget
    assert "left droppable units in place" in caplog.records[0].getMessage()


async def test_the_default_handler_works_with_a_plain_counter_and_verifies_the_result() -> None:
    messages = transcript(12)
    counter = LumpyCounter()
    for prompt_budget in (40, 90, 150, 300):
        outcome = await apply_limits(messages, counter=counter, budget=budget(prompt_budget))
        assert counter.count(outcome.messages) <= prompt_budget
        # Just enough was dropped: one more unit back would not fit.
        assert len(outcome.messages) < len(messages)


async def test_the_default_handler_prices_each_message_once_with_an_incremental_counter() -> None:
    class Tally(WordCounter):
        def __init__(self) -> None:
            super().__init__()
            self.priced = 0

        def message_tokens(self, message: Message) -> int:
            self.priced += 1
            return super().message_tokens(message)

    messages = transcript(100)
    tally = Tally()
    event = TokenLimitEvent(messages, budget_tokens=200, counter=tally, estimated_tokens=0)
    await drop_oldest_units(None)(event)
    assert tally.priced == len(messages)
    assert tally.counts == 0
    assert WordCounter().count(event.messages) <= 200


async def test_drop_oldest_units_with_its_own_counter_prices_with_that_counter() -> None:
    class Heavy(WordCounter):
        def message_tokens(self, message: Message) -> int:
            return 10 * super().message_tokens(message)

    messages = transcript(6)
    light = WordCounter()
    event = TokenLimitEvent(messages, budget_tokens=light.count(messages), counter=light)
    await drop_oldest_units(Heavy())(event)
    # Fits by the event's counter, not by the heavy one: units were dropped.
    assert len(event.messages) < len(messages)
    assert Heavy().count(event.messages) <= event.budget_tokens


async def test_drop_oldest_units_leaves_a_fitting_list_as_the_very_same_list() -> None:
    messages = transcript()
    event = TokenLimitEvent(messages, budget_tokens=10_000, counter=WordCounter())
    handed = event.messages
    await drop_oldest_units(None)(event)
    assert event.messages is handed


# -- Pre and Post ----------------------------------------------------------------------


async def test_a_pre_handler_replaces_the_default_outright() -> None:
    seen: list[int] = []

    async def drop_nothing_but_look(event: TokenLimitEvent) -> None:
        seen.append(len(event.messages))

    messages = transcript(6)
    outcome = await apply_limits(
        messages, counter=WordCounter(), budget=budget(50), pre=drop_nothing_but_look
    )
    assert seen == [len(messages)]
    assert outcome.messages == tuple(messages)  # the default never ran behind it
    assert [r.handler for r in outcome.record.handlers] == [
        "test_a_pre_handler_replaces_the_default_outright.<locals>.drop_nothing_but_look"
    ]


async def test_pre_then_post_drop_oldest_units_takes_what_is_still_over() -> None:
    summary = Message.user("summary: we talked about q0..q3", origin=Origin.TURN)

    async def summarize_first_turns(event: TokenLimitEvent) -> None:
        # Replace the first two turns (8 messages after the system message) by a summary.
        event.messages[1:9] = [summary]

    messages = transcript(8)
    counter = WordCounter()
    outcome = await apply_limits(
        messages,
        counter=counter,
        budget=budget(60),
        pre=summarize_first_turns,
        post=drop_oldest_units(None),
    )
    pre, post = outcome.record.handlers
    assert (pre.phase, post.phase) == ("pre", "post")
    assert pre.added_messages == 1
    assert pre.dropped_messages == 8
    assert post.handler == "drop_oldest_units"
    assert post.tokens_before == pre.tokens_after > 60 >= post.tokens_after
    assert summary not in outcome.messages  # oldest, so the window took it first
    assert outcome.sources[0] == 0
    assert outcome.messages[-1] is PROMPT
    assert {d.phase for d in outcome.record.dropped} == {"pre", "post"}
    pre_drops = [d for d in outcome.record.dropped if d.phase == "pre"]
    assert [(d.start, d.end) for d in pre_drops] == [(1, 2), (2, 4), (4, 5), (5, 6), (6, 8), (8, 9)]
    assert all(d.reason.startswith("over budget") for d in pre_drops)


async def test_post_does_not_run_when_pre_made_it_fit() -> None:
    ran: list[str] = []

    def post(event: TokenLimitEvent) -> None:
        ran.append("post")

    outcome = await apply_limits(transcript(6), counter=WordCounter(), budget=budget(80), post=post)
    assert ran == []
    assert [r.phase for r in outcome.record.handlers] == ["pre"]


async def test_a_plain_function_is_accepted_as_a_handler() -> None:
    def keep_last_turn(event: TokenLimitEvent) -> None:
        event.messages = [event.messages[0], *event.messages[-5:]]

    messages = transcript(6)
    outcome = await apply_limits(
        messages, counter=WordCounter(), budget=budget(60), pre=keep_last_turn
    )
    assert outcome.messages == (SYSTEM, *messages[-5:])
    assert outcome.record.handlers[0].dropped_messages == len(messages) - 6


async def test_a_handler_may_rewrite_in_place() -> None:
    async def trim(event: TokenLimitEvent) -> None:
        del event.messages[1:5]

    messages = transcript(3)
    outcome = await apply_limits(messages, counter=WordCounter(), budget=budget(40), pre=trim)
    assert outcome.messages == (SYSTEM, *messages[5:])
    assert [(d.start, d.kind) for d in outcome.record.dropped] == [
        (1, UnitKind.USER),
        (2, UnitKind.TOOL_EXCHANGE),
        (4, UnitKind.ASSISTANT),
    ]


async def test_a_callable_object_is_named_by_its_type() -> None:
    class Trimmer:
        def __call__(self, event: TokenLimitEvent) -> None:
            del event.messages[1:5]

    outcome = await apply_limits(
        transcript(3), counter=WordCounter(), budget=budget(40), pre=Trimmer()
    )
    assert outcome.record.handlers[0].handler.endswith("Trimmer")
    assert handler_name(drop_oldest_units(None)) == "drop_oldest_units"


async def test_a_handler_can_recount_with_is_over_budget() -> None:
    progress: list[tuple[bool, int]] = []

    async def drop_until_it_fits(event: TokenLimitEvent) -> None:
        while event.is_over_budget():
            progress.append((True, event.estimated_tokens))
            del event.messages[1:5]  # one whole turn
        progress.append((False, event.estimated_tokens))

    counter = WordCounter()
    messages = transcript(4)
    outcome = await apply_limits(
        messages, counter=counter, budget=budget(50), pre=drop_until_it_fits
    )
    assert progress[0] == (True, counter.count(messages))
    assert progress[-1] == (False, counter.count(outcome.messages))
    assert [over for over, _ in progress] == [True] * (len(progress) - 1) + [False]


async def test_the_event_carries_what_the_handler_needs() -> None:
    events: list[TokenLimitEvent] = []
    tools = [Tool(name="search")]
    messages = transcript(4)
    counter = WordCounter()
    await apply_limits(
        messages, tools=tools, counter=counter, budget=budget(50), round=3, pre=events.append
    )
    [event] = events
    assert event.messages == messages
    assert event.messages is not messages
    assert event.tools == tuple(tools)
    assert event.budget_tokens == 50
    assert event.round == 3
    assert event.counter is counter
    assert event.estimated_tokens == counter.count(messages, tools)
    assert "round=3" in repr(event)
    with pytest.raises(AttributeError):
        event.tools = ()  # type: ignore[misc]
    with pytest.raises(AttributeError):
        event.budget_tokens = 10**6  # type: ignore[misc]


async def test_event_units_follow_the_handlers_edits() -> None:
    messages = [SYSTEM, *history(2), PROMPT]
    event = TokenLimitEvent(messages, budget_tokens=10, counter=WordCounter())
    before = event.units()
    assert [u.reason for u in before if u.pinned] == [
        PinReason.FIRST_SYSTEM,
        PinReason.CURRENT_PROMPT,
    ]
    del event.messages[1:5]
    after = event.units()
    assert [(u.start, u.pinned) for u in after] == [
        (0, True),
        (1, False),
        (2, False),
        (4, False),
        (5, True),
    ]
    event.messages.insert(1, Message.assistant("stray", tool_calls=[ToolCall(id="z", name="n")]))
    with pytest.raises(TranscriptIntegrityError):
        event.units()


# -- refusing broken rewrites ----------------------------------------------------------


async def test_a_handler_that_orphans_a_tool_result_gets_a_handler_error() -> None:
    async def cut_anywhere(event: TokenLimitEvent) -> None:
        # Index 2 is the assistant message of the first exchange: its result stays.
        del event.messages[1:3]

    messages = transcript(4)
    with pytest.raises(HandlerError) as info:
        await apply_limits(messages, counter=WordCounter(), budget=budget(50), pre=cut_anywhere)
    error = info.value
    assert error.handler.endswith("cut_anywhere")
    assert error.index == 1
    assert "answers no call" in str(error)
    assert isinstance(error.__cause__, TranscriptIntegrityError)


async def test_a_handler_that_drops_a_result_gets_a_handler_error() -> None:
    def drop_a_result(event: TokenLimitEvent) -> None:
        del event.messages[4]

    messages = [SYSTEM, Message.user("q"), *exchange("x", results=3), PROMPT]
    with pytest.raises(HandlerError, match="has no result") as info:
        await apply_limits(messages, counter=WordCounter(), budget=budget(5), pre=drop_a_result)
    assert info.value.index == 2


async def test_a_handler_that_drops_the_prompt_gets_a_handler_error() -> None:
    def drop_the_end(event: TokenLimitEvent) -> None:
        event.messages.pop()

    with pytest.raises(HandlerError, match="current prompt") as info:
        await apply_limits(
            transcript(3), counter=WordCounter(), budget=budget(10), pre=drop_the_end
        )
    assert info.value.index is None
    assert info.value.handler.endswith("drop_the_end")


async def test_a_handler_that_rewrites_the_system_message_gets_a_handler_error() -> None:
    def reword(event: TokenLimitEvent) -> None:
        event.messages[0] = Message.system("be verbose")

    with pytest.raises(HandlerError, match="first system message"):
        await apply_limits(transcript(3), counter=WordCounter(), budget=budget(10), pre=reword)


async def test_a_post_handler_that_drops_the_live_exchange_gets_a_handler_error() -> None:
    live = exchange("live")

    def drop_tail(event: TokenLimitEvent) -> None:
        del event.messages[-2:]

    def nothing(event: TokenLimitEvent) -> None:
        return None

    messages = [SYSTEM, *history(2), PROMPT, *live]
    with pytest.raises(HandlerError, match="live tool exchange"):
        await apply_limits(
            messages, counter=WordCounter(), budget=budget(10), pre=nothing, post=drop_tail
        )


async def test_a_pinned_message_replaced_by_an_equal_one_is_still_there() -> None:
    def rebuild(event: TokenLimitEvent) -> None:
        event.messages = [Message.system("be brief"), Message.user("what now", origin=Origin.TURN)]

    outcome = await apply_limits(
        transcript(3), counter=WordCounter(), budget=budget(20), pre=rebuild
    )
    assert outcome.messages == (SYSTEM, PROMPT)
    assert outcome.sources == (0, len(transcript(3)) - 1)


@pytest.mark.parametrize("leftover", ["not a list", ("tuple", "of", "str")])
async def test_a_handler_that_leaves_something_else_than_messages_gets_a_handler_error(
    leftover: object,
) -> None:
    def scramble(event: TokenLimitEvent) -> None:
        event.messages = leftover  # type: ignore[assignment]

    with pytest.raises(HandlerError, match="scramble"):
        await apply_limits(transcript(1), counter=WordCounter(), budget=budget(5), pre=scramble)


async def test_a_handler_that_raises_aborts_and_leaves_the_transcript_untouched() -> None:
    class Boom(RuntimeError):
        pass

    async def explode(event: TokenLimitEvent) -> None:
        event.messages.clear()
        raise Boom("summarizer is down")

    messages = transcript(4)
    before = list(messages)
    with pytest.raises(Boom, match="summarizer is down"):
        await apply_limits(messages, counter=WordCounter(), budget=budget(30), pre=explode)
    assert messages == before


async def test_a_broken_input_transcript_is_refused_before_any_handler_runs() -> None:
    ran: list[object] = []
    with pytest.raises(TranscriptIntegrityError):
        await apply_limits(
            [Message.user("q"), Message.tool("nowhere", "r")],
            counter=WordCounter(),
            budget=budget(1),
            pre=ran.append,
        )
    assert ran == []


# -- the ledger ------------------------------------------------------------------------


async def test_the_ledger_names_dropped_units_by_input_index_role_and_handler() -> None:
    messages = transcript(3)
    counter = WordCounter()
    outcome = await apply_limits(
        messages, tools=[Tool(name="t")], counter=counter, budget=budget(60), round=2
    )
    record = outcome.record
    assert record.round == 2
    assert record.budget_tokens == 60
    assert [(d.start, d.end, d.roles, d.handler) for d in record.dropped] == [
        (1, 2, (Role.USER,), "drop_oldest_units"),
        (2, 4, (Role.ASSISTANT, Role.TOOL), "drop_oldest_units"),
        (4, 5, (Role.ASSISTANT,), "drop_oldest_units"),
        (5, 6, (Role.USER,), "drop_oldest_units"),
        (6, 8, (Role.ASSISTANT, Role.TOOL), "drop_oldest_units"),
        (8, 9, (Role.ASSISTANT,), "drop_oldest_units"),
    ]
    assert outcome.sources == (0, 9, 10, 11, 12, 13)
    report = record.report
    assert (
        report.total_tokens
        == record.tokens_after
        == counter.count(outcome.messages, [Tool(name="t")])
    )
    assert report.tools_tokens == 10
    assert report.system_tokens == counter.message_tokens(SYSTEM)
    assert report.pinned_tokens == counter.message_tokens(PROMPT)
    assert report.reserve_tokens == 100


def test_messages_are_matched_as_the_same_objects_or_else_by_value_in_order() -> None:
    a1, a2 = Message.user("same"), Message.user("same")
    b = Message.assistant("b")
    before = [a1, b, a2]
    # Only removals: the very objects are the matches.
    assert match_messages(before, [a1, b, a2]) == [0, 1, 2]
    assert match_messages(before, [a1]) == [0]
    assert match_messages(before, [a2]) == [2]
    # Anything else is matched by value, newest equal message first.
    assert match_messages(before, [Message.user("same")]) == [2]
    assert match_messages(before, [b, Message.user("new")]) == [1, None]
    assert match_messages(before, [a2, b]) == [0, 1]
    assert match_messages(before, [b, a1]) == [1, 2]
    # Not a subsequence: b comes back out of order, as a new message.
    assert match_messages(before, [b, a1, a2]) == [None, 0, 2]


@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_limiting_runs_on_asyncio_and_trio(anyio_backend: str) -> None:
    async def trim(event: TokenLimitEvent) -> None:
        del event.messages[1:5]

    outcome = await apply_limits(
        transcript(3), counter=WordCounter(), budget=budget(40), pre=trim, post=drop_oldest_units()
    )
    assert outcome.messages[-1] is PROMPT


async def test_a_pinned_injection_before_the_prompt_may_open_the_kept_transcript() -> None:
    note = Message.system("the user is on a phone", origin=Origin.INJECTION)
    messages = [SYSTEM, *history(3), Message.user("unanswered"), note, PROMPT]
    outcome = await apply_limits(messages, counter=WordCounter(), budget=budget(20))
    # Everything droppable went; the injection is pinned, so it stays in front.
    assert outcome.messages == (SYSTEM, note, PROMPT)
