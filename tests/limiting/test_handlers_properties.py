"""summarize_oldest keeps roles alternating, for any transcript (hypothesis)."""

from __future__ import annotations

import itertools

import anyio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from threadline import Client, Message, Model, Origin, Role, ToolCall
from threadline.counting import ApproximateCounter
from threadline.limiting import TokenLimitEvent, check_integrity, summarize_oldest
from threadline.testing import ScriptedDriver


@st.composite
def transcripts(draw: st.DrawFn) -> tuple[list[Message], int | None]:
    """Seed turns (a question, maybe tool exchanges, usually an answer; some
    later system messages), then the prompt and maybe a live tool exchange."""
    serial = itertools.count()

    def exchange(origin: Origin) -> list[Message]:
        ids = [f"c{next(serial)}" for _ in range(draw(st.integers(1, 2)))]
        calls = [ToolCall(id=i, name="lookup") for i in ids]
        return [
            Message.assistant(tool_calls=calls, origin=origin),
            *(Message.tool(i, f"result {i}", origin=origin) for i in ids),
        ]

    messages: list[Message] = []
    if draw(st.booleans()):
        messages.append(Message.system("be brief"))
    for _ in range(draw(st.integers(0, 7))):
        if draw(st.integers(0, 6)) == 0:
            messages.append(Message.system(f"later {next(serial)}"))
        messages.append(Message.user(f"question {next(serial)}"))
        for _ in range(draw(st.integers(0, 1))):
            messages.extend(exchange(Origin.SEED))
        if draw(st.integers(0, 4)) > 0:
            messages.append(Message.assistant(f"answer {next(serial)}"))
    prompt_index: int | None = len(messages)
    messages.append(Message.user(f"prompt {next(serial)}", origin=Origin.TURN))
    if draw(st.booleans()):
        messages.extend(exchange(Origin.TURN))
    if draw(st.booleans()):
        prompt_index = None
    return messages, prompt_index


def new_neighbours(before: list[Message], after: list[Message]) -> list[tuple[int, Role]]:
    """Where ``after`` has two non-tool messages of one role side by side that
    were not side by side in ``before``."""
    position = {id(m): i for i, m in enumerate(before)}
    found = []
    for index, (a, b) in enumerate(itertools.pairwise(after)):
        if a.role is not b.role or a.role is Role.TOOL:
            continue
        i, j = position.get(id(a)), position.get(id(b))
        if i is None or j is None or j != i + 1:
            found.append((index, a.role))
    return found


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=transcripts(), keep=st.integers(0, 3), rounds=st.integers(1, 3))
def test_a_summary_never_puts_two_new_same_role_messages_side_by_side(
    case: tuple[list[Message], int | None], keep: int, rounds: int
) -> None:
    messages, prompt_index = case
    prompt = None if prompt_index is None else messages[prompt_index]
    writer = Client(ScriptedDriver([f"summary {n}" for n in range(rounds)]))
    handler = summarize_oldest(writer, model=Model("cheap"), keep_last_turns=keep)

    async def fold() -> list[Message]:
        current = messages
        for _ in range(rounds):  # later rounds meet the summary at the front
            event = TokenLimitEvent(
                list(current),
                budget_tokens=1,
                counter=ApproximateCounter(),
                prompt_index=None if prompt is None else current.index(prompt),
            )
            await handler(event)
            current = event.messages
        return current

    result = anyio.run(fold)
    check_integrity(result)
    assert new_neighbours(messages, result) == []
