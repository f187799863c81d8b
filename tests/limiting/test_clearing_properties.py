"""Clearing, for any tool-heavy transcript and budget (hypothesis): never a malformed
transcript, every call still answered by its own result, and a prefix that changes
only once per batch over a long conversation."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

import anyio
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from threadline import Budget, Message, Origin, Reasoning, Role, Tool, ToolCall
from threadline.limiting import (
    cache_stable_units,
    check_integrity,
    clear_thinking,
    clear_tool_results,
)

# The engine itself is private; its one-step entry point is what a round runs.
from threadline.limiting._engine import apply_limits
from threadline.limiting._ledger import LimitingOutcome


class WordCounter:
    """Incremental: 3 tokens per message plus one per word."""

    def message_tokens(self, message: Message) -> int:
        return 3 + len(message.text.split()) + len(message.tool_calls)

    def overhead_tokens(self, tools: Sequence[Tool] = ()) -> int:
        return 2

    def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        return sum(self.message_tokens(m) for m in messages) + self.overhead_tokens(tools)


COUNTER = WordCounter()


def exchange(serial: itertools.count[int], sizes: list[int], origin: Origin) -> list[Message]:
    ids = [f"c{next(serial)}" for _ in sizes]
    calls = [ToolCall(id=i, name=f"tool{len(i) % 3}") for i in ids]
    return [
        Message.assistant(tool_calls=calls, origin=origin),
        *(
            Message.tool(i, f"{i} " + "w " * size, name=call.name, origin=origin)
            for i, size, call in zip(ids, sizes, calls, strict=True)
        ),
    ]


@st.composite
def tool_heavy(draw: st.DrawFn) -> list[Message]:
    """Turns of a question, zero to two exchanges of one or two big results, an answer;
    then the prompt, maybe with a live exchange."""
    serial = itertools.count()
    sizes = st.lists(st.integers(0, 300), min_size=1, max_size=2)
    messages = [Message.system("be brief")]
    for t in range(draw(st.integers(0, 12))):
        messages.append(Message.user(f"question {t}"))
        for _ in range(draw(st.integers(0, 2))):
            messages += exchange(serial, draw(sizes), Origin.SEED)
        if draw(st.integers(0, 5)) > 0:
            messages.append(Message.assistant(f"answer {t}"))
    messages.append(Message.user("the prompt", origin=Origin.TURN))
    if draw(st.booleans()):
        messages += exchange(serial, draw(sizes), Origin.TURN)
    return messages


def limited(messages: Sequence[Message], budget: int, pre: object, post: object) -> LimitingOutcome:
    async def step() -> LimitingOutcome:
        return await apply_limits(
            messages,
            counter=COUNTER,
            budget=Budget(limit=budget + 10, reserve=10),
            pre=pre,  # type: ignore[arg-type]
            post=post,  # type: ignore[arg-type]
        )

    return anyio.run(step)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=tool_heavy(),
    budget=st.integers(50, 3_000),
    keep=st.integers(0, 4),
    min_tokens=st.integers(0, 200),
    with_post=st.booleans(),
)
def test_clearing_never_breaks_a_transcript_or_a_pairing(
    messages: list[Message], budget: int, keep: int, min_tokens: int, with_post: bool
) -> None:
    pre = clear_tool_results(keep=keep, min_tokens=min_tokens)
    outcome = limited(messages, budget, pre, cache_stable_units() if with_post else None)
    sent = outcome.messages
    check_integrity(sent)
    # Each result still answers its own call, from the same tool.
    calls = {c.id: c.name for m in sent for c in m.tool_calls}
    assert all(calls[m.tool_call_id or ""] == m.name for m in sent if m.role is Role.TOOL)
    # What is not a tool result is the very message given (clearing changes results only).
    given_ids = {id(m) for m in messages}
    assert all(id(m) in given_ids for m in sent if m.role is not Role.TOOL)
    # A result sent is either as given or a note, and this run's own results are as given.
    originals = {m.tool_call_id: m for m in messages if m.role is Role.TOOL}
    for message in sent:
        if message.role is Role.TOOL and message is not originals[message.tool_call_id]:
            assert message.text.startswith("[tool result cleared")
            assert originals[message.tool_call_id].origin is Origin.SEED
    if not with_post:  # clearing alone drops nothing
        assert len(sent) == len(messages)
    assert len(outcome.record.cleared) == sum(
        m is not originals.get(m.tool_call_id) for m in sent if m.role is Role.TOOL
    )


# Found by hypothesis: two Post cuts, each followed by a turn that fits unlimited
# (sent uncleared, before clearing ran every round).
CUT_TWICE = [30] * 5 + [53, 59, 75, 77, 113, 140, 141, 167, 175, 176, 181, 181, 259, 288]
CUT_TWICE += [30, 30, 130, 163, 209, 251, 151, 279, 30, 30, 30, 30, 54, 107, 119, 135, 168]
CUT_TWICE += [171, 264, 30, 30, 30, 30, 128, 141, 167, 197, 199, 215, 218, 188, 97, 149, 217]
CUT_TWICE += [251, 277, 30, 30, 30, 30, 135]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@example(sizes=CUT_TWICE, budget=2765, keep=1)
@given(
    sizes=st.lists(st.integers(30, 300), min_size=60, max_size=60),
    budget=st.integers(1_500, 4_000),
    keep=st.integers(1, 3),
)
def test_the_prefix_changes_once_per_batch_over_a_long_conversation(
    sizes: list[int], budget: int, keep: int
) -> None:
    """Each turn sends the window a conversation keeps; a change of what was sent
    before comes only after the transcript grew by the room a batch made, a cut by
    the Post handler included (the handler runs every round, so a window the cut
    left that fits unlimited is still sent with its results cleared)."""
    pre, post = clear_tool_results(keep=keep), cache_stable_units()
    serial = itertools.count()
    system = Message.system("be brief")
    window: list[Message] = []
    previous: tuple[Message, ...] = ()
    changes = added = 0
    for t, size in enumerate(sizes):
        prompt = Message.user(f"question {t} " + "q " * 10, origin=Origin.TURN)
        given_now = [system, *window, prompt]
        outcome = limited(given_now, budget, pre, post)
        sent = outcome.messages
        check_integrity(sent)
        if sent[: len(previous)] != previous:
            changes += 1
        # What the run adds after the prompt: an exchange and an answer.
        reply = [*exchange(serial, [size], Origin.TURN), Message.assistant(f"answer {t}")]
        added += COUNTER.count([prompt, *reply]) - COUNTER.count([])
        kept = [given_now[s] for s in outcome.sources if s is not None][1:]
        window = [*kept, *reply]
        previous = (*sent, *reply)
    room = budget - int(budget * 0.6)
    assert changes <= 1 + added // room, (changes, added, room)


@st.composite
def reasoning_heavy(draw: st.DrawFn) -> list[Message]:
    """Turns whose replies (and tool calls) carry reasoning of any size; then the
    prompt, maybe with this run's own exchange, reasoning and all."""
    serial = itertools.count()

    def thought() -> Reasoning | None:
        size = draw(st.integers(0, 200))
        return Reasoning(text="hmm " * size) if draw(st.booleans()) else None

    def call(origin: Origin) -> list[Message]:
        i = f"c{next(serial)}"
        return [
            Message.assistant(
                tool_calls=[ToolCall(id=i, name="t")], reasoning=thought(), origin=origin
            ),
            Message.tool(i, "ok", origin=origin),
        ]

    messages = [Message.system("be brief")]
    for t in range(draw(st.integers(0, 10))):
        messages.append(Message.user(f"question {t}"))
        if draw(st.booleans()):
            messages += call(Origin.SEED)
        messages.append(Message.assistant(f"answer {t}", reasoning=thought()))
    messages.append(Message.user("the prompt", origin=Origin.TURN))
    if draw(st.booleans()):
        messages += call(Origin.TURN)
    return messages


class ReasoningCounter(WordCounter):
    def message_tokens(self, message: Message) -> int:
        reasoning = len(message.reasoning.text.split()) if message.reasoning else 0
        return super().message_tokens(message) + reasoning


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(messages=reasoning_heavy(), budget=st.integers(30, 2_000), keep=st.integers(0, 3))
def test_clearing_reasoning_never_touches_this_runs_cycle_or_the_transcripts_shape(
    messages: list[Message], budget: int, keep: int
) -> None:
    async def step() -> LimitingOutcome:
        return await apply_limits(
            messages,
            counter=ReasoningCounter(),
            budget=Budget(limit=budget + 10, reserve=10),
            pre=clear_thinking(keep=keep, min_tokens=1),
        )

    outcome = anyio.run(step)
    sent = outcome.messages
    check_integrity(sent)
    assert len(sent) == len(messages)
    for before, after in zip(messages, sent, strict=True):
        if after is before:
            continue
        # Only the reasoning went, only from an earlier turn's reply.
        assert before.origin is Origin.SEED
        assert after.reasoning is None
        assert before.reasoning is not None
        assert (after.role, after.content, after.tool_calls) == (
            before.role,
            before.content,
            before.tool_calls,
        )
    assert {c.what for c in outcome.record.cleared} <= {"reasoning"}
