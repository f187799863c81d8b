"""The ledger reads in one line, and rounds count from 1 everywhere."""

from __future__ import annotations

import pytest

from threadline import Client, LimitApplied, Message, Model, ToolCall
from threadline.counting import ApproximateCounter
from threadline.limiting import TokenLimitEvent, drop_oldest_units
from threadline.testing import ScriptedDriver

pytestmark = pytest.mark.anyio


def history(turns: int) -> list[Message]:
    messages: list[Message] = []
    for i in range(turns):
        messages.append(Message.user(f"question {i} " + "word " * 40))
        messages.append(Message.assistant(f"answer {i} " + "word " * 40))
    return messages


def add() -> int:
    """Add nothing."""
    return 0


async def test_rounds_count_from_one_in_the_event_the_ledger_and_the_stream() -> None:
    seen: list[int] = []

    async def watching(event: TokenLimitEvent) -> None:
        seen.append(event.round)
        await drop_oldest_units(None)(event)

    call = Message.assistant(tool_calls=[ToolCall(id="c1", name="add", arguments="{}")])
    driver = ScriptedDriver([call, "done"])
    request = (
        Client(driver, default_model=Model("m", context_size=1_000))
        .request()
        .with_messages(history(20))
        .with_prompt("now")
        .with_tools([add])
        .with_output_reserve_tokens(100)
        .with_token_counter(ApproximateCounter())
        .pre_max_tokens_reached(watching)
    )
    async with request.stream() as events:
        applied = [e.round async for e in events if isinstance(e, LimitApplied)]
    assert seen == [1]
    assert applied == [1]
    assert (
        TokenLimitEvent([Message.user("hi")], budget_tokens=9, counter=ApproximateCounter()).round
        == 1
    )

    result = await (
        Client(ScriptedDriver([call, "done"]), default_model=Model("m", context_size=1_000))
        .request()
        .with_messages(history(20))
        .with_prompt("now")
        .with_tools([add])
        .with_output_reserve_tokens(100)
        .with_token_counter(ApproximateCounter())
        .run()
    )
    assert [r.round for r in result.rounds] == [1, 2]
    assert [step.round for step in result.limiting] == [1, 2]


async def test_a_limiting_record_reads_in_one_short_line() -> None:
    driver = ScriptedDriver(["ok"])
    request = (
        Client(driver, default_model=Model("m", context_size=1_000))
        .request()
        .with_messages(history(30))
        .with_prompt("now")
        .with_output_reserve_tokens(100)
        .with_token_counter(ApproximateCounter())
    )
    async with request.stream() as events:
        (applied,) = [e async for e in events if isinstance(e, LimitApplied)]
    record = applied.record
    line = record.summary()
    dropped = len(record.dropped)
    assert line == str(record) == str(applied)
    assert "\n" not in line
    assert line.startswith(f"round 1: drop_oldest_units (pre) dropped {dropped} units (")
    assert f"{record.tokens_before} → {record.tokens_after} tokens, budget 900" in line
    assert "Message(" not in repr(record)
    assert len(repr(record)) < 300
    assert len(repr(applied)) < 400


async def test_a_run_summarizes_its_ledger_in_one_line() -> None:
    def run_on(model: Model) -> Client:
        return Client(ScriptedDriver(["ok"]), default_model=model)

    fits = await run_on(Model("m", context_size=8_192)).request().with_prompt("hi").run()
    assert fits.limiting_summary() == "1 round, prompt budget 4096: nothing dropped"

    cut = await (
        run_on(Model("m", context_size=1_000))
        .request()
        .with_messages(history(30))
        .with_prompt("now")
        .with_output_reserve_tokens(100)
        .with_token_counter(ApproximateCounter())
        .run()
    )
    summary = cut.limiting_summary()
    assert summary.startswith("1 round, prompt budget 900: round 1: drop_oldest_units (pre)")
    assert "\n" not in summary

    unbounded = await run_on(Model("no-window")).request().with_prompt("hi").run()
    assert unbounded.limiting_summary() == (
        "1 round, no budget (no budget: no explicit context limit and model 'no-window' "
        "has no context_size), nothing limited"
    )
    (step,) = unbounded.limiting
    assert str(step) == f"round 1: no budget, nothing limited; {step.tokens_after} tokens sent"
