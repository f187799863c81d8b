"""A history a conversation vouches for is limited as the full step limits it (hypothesis)."""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from threadline import Budget, Message, Origin, Tool, ToolCall
from threadline.limiting import cache_stable_units, drop_oldest_units

# The fast path is the engine's own, a private room.
from threadline.limiting._engine import apply_limits
from threadline.limiting._incremental import CheckedHistory
from threadline.limiting._ledger import LimitingOutcome


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
