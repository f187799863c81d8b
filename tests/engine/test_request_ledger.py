"""What a run says about its budget: the context-length retry, the output ceiling,
the no-budget ledger and the counter a request uses."""

from __future__ import annotations

import pytest

from threadline import (
    Budget,
    Client,
    ContextLengthExceededError,
    InvalidRequestError,
    Message,
    Model,
    Request,
    ToolCall,
)
from threadline.counting import ApproximateCounter, BuiltinTokenCounter
from threadline.testing import ScriptedDriver

pytestmark = pytest.mark.anyio


def history(turns: int, words: int = 30) -> list[Message]:
    messages: list[Message] = []
    for i in range(turns):
        messages.append(Message.user(f"question {i} " + "word " * words))
        messages.append(Message.assistant(f"answer {i} " + "word " * words))
    return messages


def request_on(driver: ScriptedDriver, model: Model) -> Request:
    return Client(driver, default_model=model).request()


# -- the context-length retry --------------------------------------------------------


@pytest.mark.parametrize("prompt_tokens", [None, 5000])
async def test_a_reserve_the_providers_window_cannot_hold_is_shrunk_for_the_retry(
    prompt_tokens: int | None,
) -> None:
    # The model says 8192 tokens, the server runs 2048: the default reserve of
    # 4096 cannot fit, and taking it off 2048 would leave the history nothing.
    refusal = ContextLengthExceededError(
        "too long", context_limit=2048, prompt_tokens=prompt_tokens
    )
    driver = ScriptedDriver([refusal, "fits"])
    counter = ApproximateCounter()
    result = await (
        request_on(driver, Model("m", context_size=8192))
        .with_messages(history(60))
        .with_prompt("now")
        .with_token_counter(counter)
        .run()
    )

    (round_,) = result.rounds
    assert round_.context_retry
    assert result.budget is not None
    assert result.budget.reserve == 512  # a quarter of what the provider reported
    assert result.budget.limit <= 2048
    retried = driver.calls[1].messages
    assert len(retried) > 20  # much of the history, not only the prompt
    assert counter.count(retried, ()) <= result.budget.prompt_tokens
    assert round_.retry_limiting is not None
    assert round_.retry_limiting.report.reserve_tokens == 512
    assert round_.retry_reason is not None
    assert "reserve of 4096 tokens does not fit the provider's limit of 2048" in (
        round_.retry_reason
    )
    assert "keeps 512" in round_.retry_reason


async def test_a_reserve_that_fits_the_providers_window_is_kept_for_the_retry() -> None:
    refusal = ContextLengthExceededError("too long", context_limit=8192)
    driver = ScriptedDriver([refusal, "fits"])
    result = await (
        request_on(driver, Model("m", context_size=16_384))
        .with_messages(history(60))
        .with_prompt("now")
        .run()
    )
    assert result.budget is not None
    assert result.budget.reserve == 4096
    assert result.rounds[0].retry_reason is not None
    assert "reserve" not in result.rounds[0].retry_reason


async def test_with_only_pinned_units_left_a_refusal_is_raised_at_once() -> None:
    refusal = ContextLengthExceededError("too long", context_limit=10)
    driver = ScriptedDriver([refusal, "never sent"])
    request = (
        request_on(driver, Model("m", context_size=8192))
        .with_system("You are terse.")
        .with_prompt("a prompt the window cannot hold")
    )
    with pytest.raises(ContextLengthExceededError) as caught:
        await request.run()
    assert caught.value is refusal
    assert len(driver.calls) == 1


async def test_a_refusal_after_everything_droppable_went_is_raised_at_once() -> None:
    # Limiting already dropped all the history to fit the budget; a refusal
    # then has nothing left to drop.
    refusal = ContextLengthExceededError("too long", context_limit=100)
    driver = ScriptedDriver([refusal, "never sent"])
    request = (
        request_on(driver, Model("m", context_size=8192))
        .with_messages(history(5, words=400))
        .with_prompt("now")
        .with_max_context_tokens(300)
        .with_output_reserve_tokens(0)
    )
    with pytest.raises(ContextLengthExceededError):
        await request.run()
    assert len(driver.calls) == 1
    assert [m.text for m in driver.calls[0].messages] == ["now"]


# -- the model's max_output_tokens ----------------------------------------------------


async def test_the_models_max_output_tokens_is_sent_and_reserved_when_the_request_sets_none() -> (
    None
):
    driver = ScriptedDriver(["ok"])
    request = request_on(driver, Model("m", context_size=8192, max_output_tokens=500))
    request.with_prompt("hi")

    resolution = await request.budget_resolution()
    assert resolution.budget == Budget(limit=8192, reserve=500)
    assert "model 'm''s max_output_tokens" in resolution.reason
    await request.run()
    assert driver.calls[0].max_output_tokens == 500


async def test_a_request_may_ask_for_less_than_the_models_max_output_tokens() -> None:
    driver = ScriptedDriver(["ok"])
    request = request_on(driver, Model("m", context_size=8192, max_output_tokens=500))
    await request.with_prompt("hi").with_max_output_tokens(200).run()
    assert driver.calls[0].max_output_tokens == 200
    assert await request.budget() == Budget(limit=8192, reserve=200)


async def test_a_request_asking_for_more_than_the_models_max_output_tokens_is_refused() -> None:
    driver = ScriptedDriver(["unused"])
    request = (
        request_on(driver, Model("m", context_size=8192, max_output_tokens=500))
        .with_prompt("hi")
        .with_max_output_tokens(1000)
    )
    expected = (
        r"max_output_tokens 1000 is more than model 'm' writes in one reply "
        r"\(its max_output_tokens is 500\); ask for at most 500"
    )
    with pytest.raises(InvalidRequestError, match=expected):
        await request.run()
    with pytest.raises(InvalidRequestError, match=expected):
        await request.budget()
    assert driver.calls == []


async def test_an_explicit_reserve_wins_over_the_models_max_output_tokens() -> None:
    request = request_on(
        ScriptedDriver(), Model("m", context_size=8192, max_output_tokens=500)
    ).with_prompt("hi")
    assert await request.with_output_reserve_tokens(0).budget() == Budget(limit=8192, reserve=0)


# -- the ledger without a budget -------------------------------------------------------


async def test_a_run_without_a_budget_says_so_and_why_in_its_ledger() -> None:
    driver = ScriptedDriver(["ok"])
    result = await (
        request_on(driver, Model("no-window", context_size=None))
        .with_messages(history(2))
        .with_prompt("now")
        .run()
    )

    (round_,) = result.rounds
    assert round_.limiting is not None
    assert round_.limiting.budget_tokens is None
    assert not round_.limiting.handlers
    assert round_.limiting.tokens_after == round_.estimated_input_tokens
    assert result.limiting == (round_.limiting,)
    assert round_.budget_reason == (
        "no budget: no explicit context limit and model 'no-window' has no context_size"
    )
    assert result.budget_reason == round_.budget_reason
    assert result.budget is None


async def test_a_run_with_a_budget_says_where_it_came_from() -> None:
    driver = ScriptedDriver(["ok"])
    result = await request_on(driver, Model("m", context_size=8192)).with_prompt("hi").run()
    assert result.budget_reason == (
        "limit 8192 from model 'm''s context_size, reserve 4096 from the default"
    )


async def test_rounds_after_a_retry_say_their_budget_came_from_it() -> None:
    refusal = ContextLengthExceededError("too long", context_limit=2048)
    add_call = Message.assistant(tool_calls=[ToolCall(id="c1", name="add", arguments="{}")])

    def add() -> int:
        """Add nothing."""
        return 0

    driver = ScriptedDriver([refusal, add_call, "done"])
    result = await (
        request_on(driver, Model("m", context_size=8192))
        .with_messages(history(60))
        .with_prompt("now")
        .with_tools([add])
        .run()
    )
    first, second = result.rounds
    assert first.budget_reason.startswith("limit 8192")
    assert second.budget_reason.startswith("set by round 1's retry: the provider refused")
    assert second.retry_reason is None


# -- which counter ---------------------------------------------------------------------


async def test_a_request_says_which_counter_it_counts_with() -> None:
    driver = ScriptedDriver()
    model = Model("m", context_size=8192)
    assert isinstance(await request_on(driver, model).token_counter(), BuiltinTokenCounter)

    mine = ApproximateCounter()
    chosen = await request_on(driver, model).with_token_counter(mine).token_counter()
    assert isinstance(chosen, ApproximateCounter)
    messages = [Message.user("hello there")]
    assert chosen.count(messages, ()) == mine.count(messages, ())

    client_wide = Client(driver, default_model=model, token_counter=mine).request()
    assert isinstance(await client_wide.token_counter(), ApproximateCounter)


async def test_asking_for_the_counter_of_a_request_without_a_model_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="no model"):
        await Client(ScriptedDriver()).request().with_prompt("hi").token_counter()
