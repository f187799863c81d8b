"""A history a conversation vouches for is limited as the full step limits it (hypothesis)."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from threadline import (
    Agent,
    Budget,
    Client,
    Conversation,
    Message,
    Model,
    Origin,
    Tool,
    ToolCall,
)
from threadline.counting import BuiltinTokenCounter
from threadline.limiting import cache_stable_units, drop_oldest_units

# The fast path is the engine's own, a private room.
from threadline.limiting._engine import apply_limits
from threadline.limiting._incremental import CheckedHistory, HistoryTally, history_tokens
from threadline.limiting._ledger import LimitingOutcome
from threadline.testing import ScriptedDriver


class WordCounter:
    """Incremental: 3 per message plus one per word; 2 per reply, 10 per tool."""

    def message_tokens(self, message: Message) -> int:
        return 3 + len(message.text.split()) + len(message.tool_calls)

    def overhead_tokens(self, tools: Sequence[Tool] = ()) -> int:
        return 2 + 10 * len(tools)

    def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        return sum(map(self.message_tokens, messages)) + self.overhead_tokens(tools)


@st.composite
def histories(draw: st.DrawFn) -> list[Message]:
    """Answered turns: a question, maybe tool exchanges, an answer."""
    history: list[Message] = []
    for turn in range(draw(st.integers(0, 12))):
        history.append(Message.user("q " * draw(st.integers(0, 30))))
        for exchange in range(draw(st.integers(0, 2))):
            ids = [f"c{turn}-{exchange}-{k}" for k in range(draw(st.integers(1, 2)))]
            history.append(Message.assistant(tool_calls=[ToolCall(id=i, name="f") for i in ids]))
            history.extend(Message.tool(i, "r " * draw(st.integers(0, 20))) for i in ids)
        if draw(st.booleans()) or turn == 0:
            history.append(Message.assistant("a " * draw(st.integers(0, 30))))
    return history


async def _limit(
    transcript: tuple[Message, ...], budget: Budget | None, handler: object, vouched: bool
) -> LimitingOutcome:
    offset = 1
    history = transcript[offset:-1]
    checked = CheckedHistory(
        messages=history,
        call_ids={c.id for m in history for c in m.tool_calls},
        offset=offset,
    )
    return await apply_limits(
        transcript,
        counter=WordCounter(),
        budget=budget,
        pre=handler,  # type: ignore[arg-type]
        round=1,
        prompt_index=len(transcript) - 1,
        history=checked if vouched else None,
    )


@pytest.mark.parametrize("handler", [drop_oldest_units(None), cache_stable_units()])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(history=histories(), share=st.one_of(st.none(), st.floats(0.05, 1.5)))
def test_a_vouched_history_is_limited_as_the_full_step_limits_it(
    handler: object, history: list[Message], share: float | None
) -> None:
    prompt = Message.user("and now? " * 3, origin=Origin.TURN)
    transcript = (Message.system("Be terse."), *history, prompt)
    budget = None
    if share is not None:
        prompt_tokens = max(1, int(WordCounter().count(transcript) * share))
        budget = Budget(limit=prompt_tokens + 1, reserve=1)
    full = anyio.run(_limit, transcript, budget, handler, False)
    quick = anyio.run(_limit, transcript, budget, handler, True)
    assert quick.messages == full.messages
    assert quick.sources == full.sources
    assert quick.prompt_index == full.prompt_index
    assert quick.record == full.record


def test_a_history_that_reuses_a_call_id_takes_the_full_step() -> None:
    call = ToolCall(id="same", name="f")
    history = (
        Message.user("q"),
        Message.assistant(tool_calls=[call]),
        Message.tool("same", "r"),
        Message.assistant("a"),
        Message.user("again", origin=Origin.TURN),
    )
    transcript = (*history[:-1], history[-1], Message.assistant(tool_calls=[call]))
    transcript = (*transcript, Message.tool("same", "r2"))
    checked = CheckedHistory(messages=history[:4], call_ids={"same"}, offset=0)

    async def limit() -> LimitingOutcome:
        return await apply_limits(
            transcript, counter=WordCounter(), budget=None, prompt_index=4, history=checked
        )

    from threadline.limiting import TranscriptIntegrityError

    with pytest.raises(TranscriptIntegrityError, match="used twice"):
        anyio.run(limit)


class CountingWords(WordCounter):
    """A WordCounter that lists the size of every transcript it counts whole."""

    def __init__(self) -> None:
        self.counted: list[int] = []

    def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        self.counted.append(len(messages))
        return super().count(messages, tools)


@pytest.mark.anyio
async def test_a_conversations_history_is_counted_once_then_only_what_each_turn_adds() -> None:
    counter = CountingWords()
    driver = ScriptedDriver([f"answer {turn} " * 3 for turn in range(60)])
    agent = Agent(
        Client(driver, token_counter=counter),
        model=Model("scripted", context_size=1_000_000),
        instructions="Be brief.",
    )
    conv = Conversation(agent)
    for turn in range(60):
        result = await conv.run(f"question {turn} " * (turn % 7))
        # The estimate is the count of what was sent, however it was made.
        sent = driver.calls[-1].messages
        assert result.rounds[0].estimated_input_tokens == WordCounter().count(sent)
    # The history (origin seed, vouched for) is counted whole on the first turn
    # only: each later turn adds the count of its new messages to the last one's.
    assert counter.counted == [0]


def test_a_tally_counts_whole_for_another_counter_or_another_source() -> None:
    tally = HistoryTally()
    source = (object(), 0)
    first, second = CountingWords(), CountingWords()
    messages = tuple(Message.user(f"m {i}") for i in range(6))
    grown = CheckedHistory(messages=messages, call_ids=(), source=source, tally=tally)
    assert history_tokens(attrs.evolve(grown, messages=messages[:4]), first) == first.count(
        messages[:4]
    )
    assert history_tokens(grown, first) == WordCounter().count(messages)
    assert first.counted == [4, 4]  # the second count added two messages
    assert history_tokens(grown, second) == WordCounter().count(messages)
    assert second.counted == [6]  # another counter: counted whole
    other = attrs.evolve(grown, source=(object(), 0))
    assert history_tokens(other, second) == WordCounter().count(messages)
    assert second.counted == [6, 6]  # another source: counted whole


@pytest.mark.anyio
async def test_the_built_in_counter_bound_anew_for_each_plan_still_carries_the_count_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The default counter is bound to the driver's replay projection for every
    # plan; resolved from the same things, each turn gets the very same counter,
    # so the history's count carries over (and the estimate is unchanged).
    counted: list[int] = []
    count = BuiltinTokenCounter.count

    def spy(
        self: BuiltinTokenCounter, messages: Sequence[Message], tools: Sequence[Tool] = ()
    ) -> int:
        counted.append(len(messages))
        return count(self, messages, tools)

    monkeypatch.setattr(BuiltinTokenCounter, "count", spy)
    driver = ScriptedDriver([f"answer {turn}" for turn in range(30)])
    model = Model("scripted", context_size=1_000_000)
    conv = Conversation(Agent(Client(driver), model=model, instructions="Be brief."))
    for turn in range(30):
        result = await conv.run(f"question {turn}")
        assert result.rounds[0].estimated_input_tokens == count(
            BuiltinTokenCounter(), driver.calls[-1].messages
        )
    assert counted == [0]
