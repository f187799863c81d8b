"""The async counting protocol, the exact counter's resolution, and the anchored counter
limiting prices rewrites with after an exact count."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from threadline import Client, InvalidRequestError, Message, Model, Origin, RequestSettings, Tool
from threadline.counting import (
    AnchoredCounter,
    ApproximateCounter,
    AsyncTokenCounter,
    BindableCounter,
    TokenCounter,
    resolve_exact_token_counter,
)
from threadline.testing import ScriptedDriver

MODEL = Model("m", context_size=1_000)


class PerMessageCounter:
    def __init__(self, tokens: int = 10) -> None:
        self.tokens = tokens

    def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        return self.tokens * len(messages) + 3

    def message_tokens(self, message: Message) -> int:
        return self.tokens

    def overhead_tokens(self, tools: Sequence[Tool] = ()) -> int:
        return 3


class ServerCounter:
    """An async counter, as a provider's counting endpoint is."""

    def __init__(self, name: str = "server") -> None:
        self.name = name
        self.calls = 0

    async def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        self.calls += 1
        return 13 * len(messages)


class DriverWithExactCounter(ScriptedDriver):
    def __init__(self) -> None:
        super().__init__()
        self.asked_for: list[Model] = []

    def exact_token_counter(self, model: Model) -> AsyncTokenCounter:
        self.asked_for.append(model)
        return ServerCounter("driver")


# -- the protocol -------------------------------------------------------------------------


def test_an_async_counter_is_not_taken_where_an_estimate_is_needed() -> None:
    with pytest.raises(InvalidRequestError, match="exact_token_counter"):
        RequestSettings(token_counter=ServerCounter())  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="exact_token_counter"):
        Client(ScriptedDriver(), token_counter=ServerCounter())  # type: ignore[arg-type]


def test_the_exact_tier_takes_async_and_sync_counters_and_nothing_else() -> None:
    assert RequestSettings(exact_token_counter=ServerCounter()).exact_token_counter is not None
    assert RequestSettings(exact_token_counter=PerMessageCounter()).exact_token_counter
    with pytest.raises(InvalidRequestError, match="exact_token_counter"):
        RequestSettings(exact_token_counter="server")  # type: ignore[arg-type]


@pytest.mark.parametrize("margin", [-0.1, 1, 1.5, "0.1", True])
def test_the_exact_count_margin_is_a_fraction_below_one(margin: object) -> None:
    with pytest.raises(InvalidRequestError, match="exact_count_margin"):
        RequestSettings(exact_count_margin=margin)  # type: ignore[arg-type]


def test_the_exact_count_margin_defaults_to_a_tenth_and_none_turns_it_off() -> None:
    assert RequestSettings().exact_count_margin == 0.1
    assert RequestSettings(exact_count_margin=None).exact_count_margin is None
    assert RequestSettings(exact_count_margin=0).exact_count_margin == 0


# -- resolution: request, client, driver; no default ------------------------------------


def test_the_request_tier_wins_then_the_client_then_the_driver() -> None:
    driver = DriverWithExactCounter()
    request_tier, client_tier = ServerCounter("request"), ServerCounter("client")
    assert resolve_exact_token_counter(request_tier, client_tier, driver, MODEL) is request_tier
    assert resolve_exact_token_counter(None, client_tier, driver, MODEL) is client_tier
    found = resolve_exact_token_counter(None, None, driver, MODEL)
    assert isinstance(found, ServerCounter)
    assert found.name == "driver"
    assert driver.asked_for == [MODEL]


def test_without_any_tier_nothing_is_counted_exactly() -> None:
    assert resolve_exact_token_counter(None, None, ScriptedDriver(), MODEL) is None
    assert resolve_exact_token_counter(None, None, None, MODEL) is None


def test_a_counter_with_for_model_is_bound_to_the_model() -> None:
    class PerModel(ServerCounter, BindableCounter):
        def for_model(self, model: Model) -> ServerCounter:
            return ServerCounter(f"for {model.name}")

    found = resolve_exact_token_counter(PerModel(), None, None, MODEL)
    assert isinstance(found, ServerCounter)
    assert found.name == "for m"


# -- the anchored counter ----------------------------------------------------------------


def _transcript(n: int) -> list[Message]:
    return [Message.user(f"q{i}") if i % 2 == 0 else Message.assistant(f"a{i}") for i in range(n)]


def test_the_anchor_counts_exactly_what_the_exact_counter_said() -> None:
    anchor = _transcript(6)
    counter = AnchoredCounter.near_budget(
        PerMessageCounter(), anchor, (), exact_tokens=80, margin=0.1
    )
    assert counter.count(anchor) == 80
    assert counter.count(anchor) == counter.overhead_tokens() + sum(
        counter.message_tokens(m) for m in anchor
    )


def test_a_dropped_message_saves_no_more_than_its_discounted_estimate() -> None:
    anchor = _transcript(6)
    # Estimated 63, exact 126: the ratio is 2, but a single message is only
    # trusted to save 1 * (1 - 0.1) of its estimate of 10 tokens.
    counter = AnchoredCounter.near_budget(
        PerMessageCounter(), anchor, (), exact_tokens=126, margin=0.1
    )
    assert counter.count(anchor[2:]) == 126 - 2 * 9
    # Under 1, the ratio itself discounts: estimated 63, exact 50.
    low = AnchoredCounter.near_budget(PerMessageCounter(), anchor, (), exact_tokens=50, margin=0.1)
    assert low.message_tokens(anchor[0]) == 7  # floor(10 * 50/63 * 0.9)


def test_an_added_message_costs_its_estimate_scaled_up() -> None:
    anchor = _transcript(4)
    counter = AnchoredCounter.near_budget(
        PerMessageCounter(), anchor, (), exact_tokens=86, margin=0.1
    )
    summary = Message.user("a summary")
    # ratio 86 / 43 = 2; an addition costs ceil(10 * 2 * 1.1) = 22
    assert counter.message_tokens(summary) == 22
    # Messages match by value, their origin aside: the next request's history.
    again = Message.user("q0", origin=Origin.TURN)
    assert again is not anchor[0]
    assert counter.message_tokens(again) == counter.message_tokens(anchor[0]) == 9


def test_a_repeated_message_object_keeps_the_anchor_exact() -> None:
    same = Message.user("again")
    anchor = [same, Message.assistant("x"), same]
    counter = AnchoredCounter.near_budget(
        PerMessageCounter(), anchor, (), exact_tokens=40, margin=0.0
    )
    assert counter.count(anchor) == 40


def test_tools_other_than_the_anchors_are_priced_like_additions() -> None:
    def lookup(city: str) -> str:
        """Look a city up."""
        return city

    tool = Tool.from_function(lookup)
    estimate: TokenCounter = ApproximateCounter()
    anchor = _transcript(4)
    counter = AnchoredCounter.near_budget(estimate, anchor, (), exact_tokens=100, margin=0.1)
    extra = estimate.count([], [tool])
    assert counter.count(anchor, [tool]) > 100 + extra
