"""Exact only near the boundary: when limiting asks the exact counter, what its count
decides, and what the ledger and the round record keep of it."""

from __future__ import annotations

import logging
from collections.abc import Sequence

import anyio
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from threadline import Client, Message, Model, ProviderUnavailableError, RunResult, Tool
from threadline.counting import AsyncTokenCounter, TokenCalibration
from threadline.testing import ScriptedDriver

MODEL = Model("m", context_size=100_000)


class PerMessageCounter:
    """Ten tokens a message: the estimate."""

    def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        return 10 * len(messages)

    def message_tokens(self, message: Message) -> int:
        return 10

    def overhead_tokens(self, tools: Sequence[Tool] = ()) -> int:
        return 0


class Server:
    """An exact counter that costs ``per_message`` tokens a message, and counts its calls."""

    def __init__(self, per_message: int) -> None:
        self.per_message = per_message
        self.calls = 0

    async def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        self.calls += 1
        return self.per_message * len(messages)


class Broken:
    async def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        raise ProviderUnavailableError("count_tokens is down", provider="test")


def history(turns: int) -> list[Message]:
    messages: list[Message] = []
    for n in range(turns):
        messages += [Message.user(f"q{n}"), Message.assistant(f"a{n}")]
    return messages


async def run(
    exact: object,
    *,
    turns: int,
    budget: int,
    margin: float | None = 0.1,
    calibration: TokenCalibration | None = None,
) -> tuple[RunResult, ScriptedDriver]:
    driver = ScriptedDriver(["ok"])
    client = Client(
        driver,
        token_counter=PerMessageCounter(),
        exact_token_counter=exact,  # type: ignore[arg-type]
        calibration=calibration,
        default_model=MODEL,
    )
    request = (
        client.request()
        .with_messages(history(turns))
        .with_prompt("now")
        .with_max_context_tokens(budget)
        .with_output_reserve_tokens(0)
        .with_exact_count_margin(margin)
    )
    return await request.run(), driver


@pytest.mark.anyio
async def test_far_from_the_budget_the_exact_counter_is_not_asked() -> None:
    server = Server(per_message=12)
    result, _ = await run(server, turns=4, budget=1_000)  # 90 of 1,000 estimated
    assert server.calls == 0
    record = result.rounds[0].limiting
    assert record is not None
    assert record.counted_by == "estimate"
    assert record.exact_tokens is None
    assert result.rounds[0].exact_input_tokens is None


@pytest.mark.anyio
async def test_near_the_budget_an_exact_count_that_fits_keeps_everything() -> None:
    server = Server(per_message=9)  # the estimate overcounts: 90 said, 81 true
    result, driver = await run(server, turns=4, budget=95)
    assert server.calls == 1
    assert len(driver.calls[0].messages) == 9
    record = result.rounds[0].limiting
    assert record is not None
    assert record.counted_by == "exact"
    assert (record.estimated_tokens, record.exact_tokens) == (90, 81)
    assert record.estimate_error == pytest.approx(9 / 81)
    assert not record.handlers
    assert record.exact_tokens_sent == 81
    assert result.rounds[0].exact_input_tokens == 81
    assert result.rounds[0].decided_input_tokens == 81


@pytest.mark.anyio
async def test_an_exact_count_over_the_budget_drops_what_the_estimate_would_have_sent() -> None:
    server = Server(per_message=13)  # the estimate undercounts: 90 said, 117 true
    result, driver = await run(server, turns=4, budget=95)
    assert server.calls == 1
    sent = driver.calls[0].messages
    assert server.per_message * len(sent) <= 95
    assert sent[0].text == "q2"  # whole turns went, oldest first
    record = result.rounds[0].limiting
    assert record is not None
    assert record.counted_by == "exact"
    assert (record.tokens_before, record.exact_tokens) == (90, 117)
    assert record.tokens_after <= 95
    assert record.dropped
    # What was sent was not counted exactly: only its anchored count is known.
    assert record.exact_tokens_sent is None
    assert result.rounds[0].exact_input_tokens is None


@pytest.mark.anyio
async def test_over_the_budget_what_the_estimate_keeps_is_counted_exactly() -> None:
    # 90 estimated against 85: the built-in keeps 7 messages by the estimate, and
    # those are counted exactly, so however long the history only they are at stake.
    server = Server(per_message=9)
    result, driver = await run(server, turns=4, budget=85)
    assert server.calls == 1
    assert len(driver.calls[0].messages) == 7
    record = result.rounds[0].limiting
    assert record is not None
    assert (record.counted_by, record.estimated_tokens, record.exact_tokens) == ("exact", 70, 63)
    assert [run.handler for run in record.handlers] == ["drop_oldest_units"]
    assert result.rounds[0].exact_input_tokens == 63


@pytest.mark.anyio
async def test_a_long_history_is_cut_to_the_budget_not_far_below_it() -> None:
    server = Server(per_message=13)
    # Uncalibrated, the estimate is 30% under: what is kept is the same, however
    # long the history it is cut from.
    sizes = []
    for turns in (20, 200):
        _, driver = await run(server, turns=turns, budget=400)
        sizes.append(len(driver.calls[0].messages))
    assert sizes[0] == sizes[1]
    # Calibrated, the cut lands at the budget.
    _, driver = await run(server, turns=200, budget=400, calibration=TokenCalibration({"m": 1.3}))
    assert 400 - 26 <= server.per_message * len(driver.calls[0].messages) <= 400  # a turn short
    assert server.calls == 3


@pytest.mark.anyio
async def test_margin_zero_asks_only_when_the_estimate_is_over() -> None:
    server = Server(per_message=10)
    await run(server, turns=4, budget=90, margin=0)
    assert server.calls == 0
    await run(server, turns=4, budget=89, margin=0)
    assert server.calls == 1


@pytest.mark.anyio
async def test_no_margin_never_asks() -> None:
    server = Server(per_message=13)
    result, _ = await run(server, turns=4, budget=50, margin=None)
    assert server.calls == 0
    assert result.rounds[0].limiting is not None
    assert result.rounds[0].limiting.counted_by == "estimate"


@pytest.mark.anyio
async def test_a_calibrated_estimate_decides_far_from_the_budget_and_asks_near_it() -> None:
    server = Server(per_message=12)
    far, _ = await run(server, turns=4, budget=1_000, calibration=TokenCalibration({"m": 1.2}))
    assert far.rounds[0].limiting is not None
    assert far.rounds[0].limiting.counted_by == "calibrated estimate"
    assert far.rounds[0].calibrated_input_tokens == 108
    # 90 estimated is 108 calibrated: within a tenth of 115, so the server is asked.
    near, _ = await run(server, turns=4, budget=115, calibration=TokenCalibration({"m": 1.2}))
    record = near.rounds[0].limiting
    assert record is not None
    assert record.counted_by == "exact"
    assert record.estimated_tokens == 108
    assert near.rounds[0].calibrated_input_tokens == 108


@pytest.mark.anyio
async def test_until_calibration_learns_a_model_the_exact_counter_decides() -> None:
    # The model's tokenizer costs three times the estimate: 90 estimated is 270.
    server = Server(per_message=30)
    calibration = TokenCalibration()
    first, driver = await run(server, turns=4, budget=200, calibration=calibration)
    assert server.calls == 1
    record = first.rounds[0].limiting
    assert record is not None
    assert record.counted_by == "exact"
    assert record.estimated_tokens == 90
    # Decided on the exact count, what was sent fits the budget by it.
    assert 30 * len(driver.calls[0].messages) <= 200
    # With a ratio learned, far from the budget the estimate decides again.
    calibration.absorb({"m": 3.0})
    _, _ = await run(server, turns=1, budget=1_000, calibration=calibration)
    assert server.calls == 1


@pytest.mark.anyio
async def test_a_failing_exact_counter_leaves_the_decision_to_the_estimate(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="threadline.limiting"):
        result, driver = await run(Broken(), turns=4, budget=85)
    assert "the exact counter failed" in caplog.text
    assert "count_tokens is down" in caplog.text
    record = result.rounds[0].limiting
    assert record is not None
    assert record.counted_by == "estimate"
    assert 10 * len(driver.calls[0].messages) <= 85


@pytest.mark.anyio
async def test_a_synchronous_exact_counter_is_used_as_it_is() -> None:
    class LocalExact:
        calls = 0

        def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
            LocalExact.calls += 1
            return 9 * len(messages)

    result, _ = await run(LocalExact(), turns=4, budget=95)
    assert LocalExact.calls == 1
    assert result.rounds[0].exact_input_tokens == 81


@pytest.mark.anyio
async def test_a_drivers_exact_counter_is_asked_without_any_wiring() -> None:
    server = Server(per_message=9)

    class CountingDriver(ScriptedDriver):
        def exact_token_counter(self, model: Model) -> AsyncTokenCounter:
            return server

    client = Client(CountingDriver(["ok"]), token_counter=PerMessageCounter(), default_model=MODEL)
    result = await (
        client.request()
        .with_messages(history(4))
        .with_prompt("now")
        .with_max_context_tokens(95)
        .with_output_reserve_tokens(0)
        .run()
    )
    assert server.calls == 1
    assert result.rounds[0].exact_input_tokens == 81


# -- for any transcript: what is sent fits by the exact count --------------------------


class TextCost:
    """An exact counter whose per-message cost is its ratio times the estimate of 10."""

    def __init__(self, ratios: dict[str, float]) -> None:
        self.ratios = ratios

    async def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        return sum(round(10 * self.ratios[m.text]) for m in messages)


@settings(max_examples=60, deadline=None)
@given(
    ratios=st.lists(st.floats(min_value=1.0, max_value=3.5), min_size=3, max_size=24),
    share=st.floats(min_value=0.2, max_value=1.2),
    calibration_off=st.floats(min_value=0.91, max_value=1.5),
)
def test_what_is_sent_fits_the_budget_by_the_exact_count(
    ratios: list[float], share: float, calibration_off: float
) -> None:
    # Each message's own ratio to the estimate may differ threefold (English to
    # Cyrillic) as long as the model's tokenizer costs no less than the estimate;
    # the calibrated estimate of the whole is within the margin, or over.
    turns = len(ratios) // 2
    texts = [m.text for m in history(turns)] + ["now"]
    costs = dict(zip(texts, [*ratios[: len(texts) - 1], 1.0], strict=True))
    exact = TextCost(costs)
    total = sum(round(10 * costs[t]) for t in texts)
    budget = max(40, int(total * share))
    ratio = total / (10 * len(texts)) * calibration_off

    async def scenario() -> None:
        calibration = TokenCalibration({"m": ratio})
        _, driver = await run(exact, turns=turns, budget=budget, calibration=calibration)
        sent = driver.calls[0].messages
        if len(sent) > 1:  # more than the pinned prompt is left
            assert await exact.count(sent) <= budget

    anyio.run(scenario)
