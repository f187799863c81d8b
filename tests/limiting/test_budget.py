"""Budget resolution, the token-limit pre-flight and the budget report (SPEC §4)."""

from __future__ import annotations

import copy
import logging
import pickle
from collections.abc import Sequence

import pytest

from threadline import (
    NOT_GIVEN,
    Budget,
    Client,
    InvalidRequestError,
    Message,
    Model,
    Origin,
    Request,
    Tool,
    ToolCall,
)

# Budget resolution, the report and the NotGiven type live in private rooms.
from threadline._sentinel import NotGiven
from threadline.limiting._budget import (
    DEFAULT_OUTPUT_RESERVE_TOKENS,
    budget_report,
    message_costs,
    resolve_budget,
)
from threadline.limiting._units import pinned_messages
from threadline.testing import ScriptedDriver


class WordCounter:
    """Incremental: 3 tokens of framing per message plus one per word; 2 per reply, 10 per tool."""

    def message_tokens(self, message: Message) -> int:
        return 3 + len(message.text.split()) + sum(1 for _ in message.tool_calls)

    def overhead_tokens(self, tools: Sequence[Tool] = ()) -> int:
        return 2 + 10 * len(tools)

    def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        return sum(self.message_tokens(m) for m in messages) + self.overhead_tokens(tools)


class PlainCounter:
    """Only ``count``: a flat 5 per message besides the words, 1 per reply, 7 per tool."""

    def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        return 1 + 7 * len(tools) + sum(5 + len(m.text.split()) for m in messages)


MODEL = Model("m", context_size=128_000)


# -- resolution ------------------------------------------------------------------------


def test_an_explicit_limit_minus_an_explicit_reserve_is_the_prompt_budget() -> None:
    resolution = resolve_budget(MODEL, max_context_tokens=100_000, output_reserve_tokens=8_000)
    assert resolution.budget == Budget(limit=100_000, reserve=8_000)
    assert resolution.budget.prompt_tokens == 92_000
    assert "with_max_context_tokens" in resolution.reason


def test_a_reserve_of_zero_gives_the_whole_limit_to_the_prompt() -> None:
    budget = resolve_budget(MODEL, max_context_tokens=10_000, output_reserve_tokens=0).budget
    assert budget is not None
    assert (budget.reserve, budget.prompt_tokens) == (0, 10_000)


def test_the_reserve_defaults_to_4096() -> None:
    budget = resolve_budget(MODEL).budget
    assert DEFAULT_OUTPUT_RESERVE_TOKENS == 4096
    assert budget == Budget(limit=128_000, reserve=4096)
    assert budget.prompt_tokens == 128_000 - 4096


def test_the_reserve_is_max_output_tokens_when_that_is_set() -> None:
    budget = resolve_budget(MODEL, max_output_tokens=1_000).budget
    assert budget == Budget(limit=128_000, reserve=1_000)


def test_an_explicit_reserve_wins_over_max_output_tokens_even_when_it_is_zero() -> None:
    budget = resolve_budget(MODEL, output_reserve_tokens=0, max_output_tokens=1_000).budget
    assert budget == Budget(limit=128_000, reserve=0)


def test_the_models_own_max_output_tokens_is_the_reserve_when_the_request_sets_none() -> None:
    model = Model("m", context_size=200_000, max_output_tokens=100_000)
    assert resolve_budget(model).budget == Budget(limit=200_000, reserve=100_000)
    assert resolve_budget(model, max_output_tokens=2_000).budget == Budget(
        limit=200_000, reserve=2_000
    )


def test_without_an_explicit_limit_the_limit_is_the_models_context_size() -> None:
    resolution = resolve_budget(Model("m", context_size=32_000), output_reserve_tokens=2_000)
    assert resolution.budget == Budget(limit=32_000, reserve=2_000)
    assert "context_size" in resolution.reason


def test_an_explicit_limit_wins_over_the_models_context_size() -> None:
    budget = resolve_budget(MODEL, max_context_tokens=50_000).budget
    assert budget == Budget(limit=50_000, reserve=4096)


@pytest.mark.parametrize(
    ("limit", "reserve"),
    [(4096, NOT_GIVEN), (1_000, NOT_GIVEN), (8_000, 8_000), (8_000, 9_000)],
)
def test_an_explicit_limit_the_reserve_fills_is_refused(
    limit: int, reserve: int | NotGiven
) -> None:
    with pytest.raises(InvalidRequestError, match="fills the context limit"):
        resolve_budget(MODEL, max_context_tokens=limit, output_reserve_tokens=reserve)


def test_a_small_explicit_limit_works_with_a_reserve_of_zero() -> None:
    budget = resolve_budget(MODEL, max_context_tokens=1_000, output_reserve_tokens=0).budget
    assert budget == Budget(limit=1_000, reserve=0)


def test_a_model_without_context_size_and_no_explicit_limit_has_no_budget(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.DEBUG, logger="threadline.budget"):
        # An explicit None: no catalog lookup, so no catalog warning either.
        resolution = resolve_budget(Model("bare", context_size=None))
    assert resolution.budget is None
    assert "has no context_size" in resolution.reason
    assert [r.levelno for r in caplog.records] == [logging.DEBUG]
    assert resolution.reason in caplog.records[0].getMessage()


def test_no_model_and_no_explicit_limit_has_no_budget() -> None:
    resolution = resolve_budget(None)
    assert resolution.budget is None
    assert "no model" in resolution.reason


def test_a_4096_token_model_with_the_default_reserve_has_no_budget() -> None:
    resolution = resolve_budget(Model("small", context_size=4096))
    assert resolution.budget is None
    assert "fills model 'small'" in resolution.reason


def test_a_reserve_at_or_above_the_models_context_size_means_no_budget() -> None:
    model = Model("small", context_size=2_000)
    assert resolve_budget(model, output_reserve_tokens=2_000).budget is None
    assert resolve_budget(model, max_output_tokens=3_000).budget is None
    assert resolve_budget(model, output_reserve_tokens=1_999).budget == Budget(
        limit=2_000, reserve=1_999
    )


@pytest.mark.parametrize(
    "options",
    [
        {"max_context_tokens": 0},
        {"max_context_tokens": -5},
        {"max_context_tokens": 1.5},
        {"max_context_tokens": True},
        {"output_reserve_tokens": -1},
        {"output_reserve_tokens": "8"},
        {"max_output_tokens": 0},
    ],
)
def test_values_of_the_wrong_type_or_sign_are_refused(options: dict[str, object]) -> None:
    with pytest.raises(InvalidRequestError):
        resolve_budget(MODEL, **options)  # type: ignore[arg-type]


@pytest.mark.parametrize(("limit", "reserve"), [(0, 0), (10, -1), (10, 10), (10, 11)])
def test_a_budget_without_room_for_the_prompt_cannot_be_built(limit: int, reserve: int) -> None:
    with pytest.raises(InvalidRequestError):
        Budget(limit=limit, reserve=reserve)


def test_a_budget_is_a_frozen_value() -> None:
    budget = Budget(limit=10, reserve=4)
    assert budget == Budget(limit=10, reserve=4)
    assert hash(budget) == hash(Budget(limit=10, reserve=4))
    assert repr(budget) == "Budget(limit=10, reserve=4, prompt_tokens=6)"
    with pytest.raises(AttributeError):
        budget.limit = 20  # type: ignore[misc]


# -- the pre-flight --------------------------------------------------------------------


@pytest.mark.anyio
async def test_the_limit_is_reached_only_above_the_prompt_budget() -> None:
    messages = [Message.system("be brief"), Message.user("hello there")]
    counter = WordCounter()
    tokens = counter.count(messages)

    def request(limit: int) -> Request:
        return (
            Client(ScriptedDriver(), default_model=Model("m"))
            .request()
            .with_system("be brief")
            .with_prompt("hello there")
            .with_token_counter(counter)
            .with_max_context_tokens(limit)
            .with_output_reserve_tokens(10)
        )

    assert await request(tokens + 11).is_token_limit_reached() is False
    assert await request(tokens + 10).is_token_limit_reached() is False  # exactly at it fits
    assert await request(tokens + 9).is_token_limit_reached() is True


@pytest.mark.anyio
async def test_the_limit_is_never_reached_without_a_budget() -> None:
    request = Client(ScriptedDriver(), default_model=Model("m")).request().with_prompt("hi " * 999)
    assert await request.budget() is None
    assert await request.is_token_limit_reached() is False


# -- NOT_GIVEN -------------------------------------------------------------------------


def test_not_given_is_a_falsy_singleton_that_survives_copy_and_pickle() -> None:
    assert not NOT_GIVEN
    assert repr(NOT_GIVEN) == "NOT_GIVEN"
    assert NotGiven() is NOT_GIVEN
    assert copy.copy(NOT_GIVEN) is NOT_GIVEN
    assert copy.deepcopy(NOT_GIVEN) is NOT_GIVEN
    assert pickle.loads(pickle.dumps(NOT_GIVEN)) is NOT_GIVEN


# -- pricing and the report ------------------------------------------------------------


def test_an_incremental_counter_prices_messages_exactly() -> None:
    counter = WordCounter()
    messages = [Message.user("one two"), Message.assistant("three")]
    tools = [Tool(name="t")]
    costs, overhead = message_costs(counter, messages, tools)
    assert costs == [5, 4]
    assert sum(costs) + overhead == counter.count(messages, tools)


def test_a_plain_counter_is_priced_by_difference_with_the_empty_transcript() -> None:
    messages = [Message.user("one two"), Message.assistant("three")]
    costs, overhead = message_costs(PlainCounter(), messages, [Tool(name="t")])
    assert costs == [7, 6]
    assert overhead == 8


def test_the_report_parts_add_up_to_what_is_sent() -> None:
    counter = WordCounter()
    messages = [
        Message.system("be brief"),
        Message.user("old question"),
        Message.assistant("old answer here"),
        Message.user("the prompt", origin=Origin.TURN),
        Message.assistant("", tool_calls=[ToolCall(id="a", name="t")]),
        Message.tool("a", "a result"),
        Message.user("mind the time", origin=Origin.INJECTION),
    ]
    tools = [Tool(name="t"), Tool(name="u")]
    report = budget_report(
        messages,
        tools=tools,
        counter=counter,
        pinned=pinned_messages(messages, prompt_index=3),
        budget=Budget(limit=500, reserve=100),
    )
    assert report.system_tokens == 5
    assert report.tools_tokens == 20
    assert report.history_tokens == 5 + 6
    assert report.pinned_tokens == 5 + 4 + 5 + 6
    assert report.overhead_tokens == 2
    assert report.total_tokens == counter.count(messages, tools)
    assert (report.reserve_tokens, report.prompt_budget, report.limit_tokens) == (100, 400, 500)


def test_a_report_with_a_plain_counter_and_no_budget_still_adds_up() -> None:
    counter = PlainCounter()
    messages = [Message.system("s"), Message.user("a b c")]
    report = budget_report(
        messages,
        tools=[Tool(name="t")],
        counter=counter,
        pinned=pinned_messages(messages),
        budget=None,
    )
    parts = (
        report.system_tokens
        + report.tools_tokens
        + report.history_tokens
        + report.pinned_tokens
        + report.overhead_tokens
    )
    assert parts == report.total_tokens == counter.count(messages, [Tool(name="t")])
    assert (report.tools_tokens, report.reserve_tokens, report.limit_tokens) == (7, None, None)
