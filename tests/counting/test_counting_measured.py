"""What steps between reports measured messages at, and a fitted count after a cut."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from threadline import Message, Tool, ToolCall
from threadline.counting import BuiltinTokenCounter, TokenCalibration

# The ledger is private to the counting room; its arithmetic is what these tests pin down.
from threadline.counting._calibration._classes import message_classes
from threadline.counting._calibration._measured import MeasuredCosts
from threadline.counting._calibration._slopes import price_of

COUNTER = BuiltinTokenCounter()
SYSTEM = Message.system("Answer briefly.")


def _even(_: Message) -> float:
    return 1.0


class _Ledger(MeasuredCosts):
    """The ledger, every message priced alike unless told: :meth:`now` is its shares."""

    __slots__ = ()

    def observe(
        self, prompt: Sequence[Message], tokens: int, price: Callable[[Message], float] = _even
    ) -> None:
        super().observe(prompt, tokens, price)

    def now(self) -> dict[Message, int]:
        return self.shares()


def _turns(count: int, *, varied: bool = False) -> list[Message]:
    """``count`` questions and answers, each a different text (with ``varied``, of
    lengths that differ too)."""
    messages = []
    for number in range(count):
        more = " and why" * (number * 5 % 4) if varied else ""
        messages += [
            Message.user(f"Question {number}{more}?"),
            Message.assistant(f"Answer {number}{more * 2}."),
        ]
    return messages


def test_a_step_that_adds_messages_measures_them_at_its_growth() -> None:
    turns = _turns(3)
    measured = _Ledger()
    measured.observe([SYSTEM, turns[0]], 40, _even)
    measured.observe([SYSTEM, *turns[:3]], 70, _even)  # an answer and a question: 30
    shares = measured.now()
    assert set(shares) == {turns[1], turns[2]}
    assert shares[turns[1]] + shares[turns[2]] == 30
    assert shares[turns[1]] == 15  # shared by price: even here


def test_a_groups_cost_is_shared_by_the_fitted_prices() -> None:
    turns = _turns(2)
    measured = _Ledger()
    measured.observe([SYSTEM, turns[0]], 40, _even)
    priced = {turns[1]: 3.0, turns[2]: 1.0}
    measured.observe([SYSTEM, *turns[:3]], 80, priced.__getitem__)
    assert measured.now() == {turns[1]: 30, turns[2]: 10}


def test_prompts_that_end_otherwise_are_not_measured_against_each_other() -> None:
    call = ToolCall(id="call1", name="lookup", arguments="{}")
    asked = [SYSTEM, Message.user("Weather?")]
    result = [*asked, Message.assistant("", tool_calls=[call]), Message.tool("call1", "Snow.")]
    answered = [*result, Message.assistant("Snow."), Message.user("Thanks.")]
    measured = _Ledger()
    measured.observe(asked, 40, _even)
    # A template may leave the system message out when a tool result ends the prompt: the
    # step from a question to a result is no measurement of the call and the result.
    measured.observe(result, 45, _even)
    assert measured.now() == {}
    measured.observe(answered, 90, _even)  # question to question: all four, 50 tokens
    assert sum(measured.now().values()) == 50
    assert set(measured.now()) == set(answered[2:])


def test_a_cut_measures_what_it_added_when_all_it_left_out_was_measured() -> None:
    turns = _turns(4)
    measured = _Ledger()
    measured.observe([SYSTEM, turns[0]], 40, _even)
    measured.observe([SYSTEM, *turns[:3]], 70, _even)  # turns[1:3] cost 30
    measured.observe([SYSTEM, *turns[:5]], 110, _even)  # turns[3:5] cost 40
    # Cut turns[1:3] (measured) and add two messages: 110 - 30 + 45.
    measured.observe([SYSTEM, turns[0], *turns[3:7]], 125, _even)
    shares = measured.now()
    assert set(shares) == set(turns[3:7])
    assert shares[turns[5]] + shares[turns[6]] == 45


def test_a_cut_of_an_unmeasured_message_measures_nothing() -> None:
    turns = _turns(3)
    measured = _Ledger()
    measured.observe([SYSTEM, turns[0]], 40, _even)
    measured.observe([SYSTEM, *turns[:3]], 70, _even)
    measured.observe([SYSTEM, *turns[1:5]], 85, _even)  # turns[0], never measured, is gone
    assert set(measured.now()) == {turns[1], turns[2]}


def test_a_changed_prompt_measures_nothing_and_the_next_step_measures_again() -> None:
    turns = _turns(4)
    measured = _Ledger()
    measured.observe([SYSTEM, turns[0]], 40, _even)
    changed = [SYSTEM, Message.user("Question 0, reworded?"), *turns[1:3]]
    measured.observe(changed, 72, _even)
    assert measured.now() == {}
    measured.observe([*changed, *turns[3:5]], 100, _even)
    assert measured.now() == {turns[3]: 14, turns[4]: 14}


def test_messages_measured_already_are_taken_off_the_other_endings_step() -> None:
    call = ToolCall(id="call1", name="lookup", arguments="{}")
    first = [SYSTEM, Message.user("Weather?")]
    tooled = [*first, Message.assistant("", tool_calls=[call]), Message.tool("call1", "Snow.")]
    asked = [*tooled, Message.assistant("Snow."), Message.user("And tomorrow?")]
    call2 = ToolCall(id="call2", name="lookup", arguments='{"day": 2}')
    again = [*asked, Message.assistant("", tool_calls=[call2]), Message.tool("call2", "Sun.")]
    measured = _Ledger()
    measured.observe(first, 40, _even)
    measured.observe(tooled, 50, _even)
    measured.observe(asked, 100, _even)  # the four after the question: 60
    measured.observe(again, 125, _even)  # from ``tooled``: 75, of which 30 measured already
    shares = measured.now()
    assert shares[again[-2]] + shares[again[-1]] == 45
    assert sum(shares.values()) == 60 + 45


class _Template:
    """A provider's count that no class fit can know: each message costs its estimate
    plus an amount of its own (a template's whitespace, a vocabulary's merges)."""

    def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        extra = sum(len(m.text or "") % 7 * 3 for m in messages)
        return COUNTER.count(messages, tools) + extra


def test_after_a_cut_the_fitted_count_prices_what_is_gone_as_measured() -> None:
    provider = _Template()
    calibration = TokenCalibration(min_estimated_tokens=0)
    turns = _turns(6, varied=True)
    reported = [SYSTEM, turns[0]]
    for number in range(1, len(turns), 2):
        calibration.observe(
            "m",
            estimated_tokens=COUNTER.count(reported),
            reported_tokens=provider.count(reported),
            sent=reported,
            counter=COUNTER,
        )
        if number + 2 <= len(turns) - 1:
            reported = [*reported, *turns[number : number + 2]]
    assert reported == [SYSTEM, *turns[:11]]  # the last prompt reported
    kept = [SYSTEM, turns[0], *turns[7:11]]  # six measured messages cut from its middle
    gone = turns[1:7]
    exact = provider.count(kept)
    fitted = calibration.estimate("m", COUNTER, kept, budget=100_000).count(kept)
    bound = calibration.estimate("m", COUNTER, kept).count(kept)
    assert fitted == exact
    assert bound > exact  # the bound, which decides, still leans high
    # The class fit alone cannot know what those six cost: it prices them otherwise.
    fit = calibration.fitted("m")
    assert fit is not None
    priced = sum(price_of(message_classes(COUNTER, m), fit.slopes) for m in gone)
    assert abs(priced - (provider.count(reported) - exact)) > 3


def test_a_step_that_adds_a_message_twice_measures_nothing() -> None:
    turns = _turns(1)
    again, done = Message.user("Continue."), Message.assistant("OK.")
    measured = _Ledger()
    measured.observe([SYSTEM, turns[0]], 40)
    # Two copies are one message to the ledger: their cost cannot be told apart.
    measured.observe([SYSTEM, turns[0], done, again, done, again], 80)
    assert measured.now() == {}


def test_a_step_whose_report_shrank_measures_nothing() -> None:
    turns = _turns(2)
    measured = _Ledger()
    measured.observe([SYSTEM, turns[0]], 40)
    measured.observe([SYSTEM, *turns[:3]], 35)  # less than before: no cost of messages
    assert measured.now() == {}


def test_shares_add_up_in_the_prompts_order_whatever_order_they_were_measured_in() -> None:
    call = ToolCall(id="call1", name="lookup", arguments="{}")
    asked = [SYSTEM, Message.user("Weather?")]
    tooled = [*asked, Message.assistant("", tool_calls=[call]), Message.tool("call1", "Snow.")]
    turns = _turns(3)
    measured = _Ledger()
    measured.observe(tooled, 50)
    measured.observe([*tooled, *turns[:1]], 61)  # the other ending: nothing measured
    measured.observe([*tooled, *turns[:3]], 84)  # 23 over two: 11.5 each
    prompt = [*tooled, *turns[:3]]
    call2 = ToolCall(id="call2", name="lookup", arguments='{"n": 2}')
    ended = [*prompt, Message.assistant("", tool_calls=[call2]), Message.tool("call2", "Sun.")]
    # From ``tooled``, 60 over five, 23 of it measured already: the first question (last
    # measured) and the call and result share 37.
    measured.observe(ended, 110)
    shares = measured.shares()
    costs = [37 / 3, 11.5, 11.5]
    for start in range(3):
        for end in range(start + 1, 4):
            run = sum(shares[m] for m in turns[start:end])
            assert abs(run - sum(costs[start:end])) <= 1
