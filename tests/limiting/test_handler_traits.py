"""Handler traits: the built-ins declare theirs, and a handler of your own that declares
the same is treated the same, by the engine and by a conversation."""

from __future__ import annotations

import pytest

from threadline import Agent, Client, Conversation, InvalidRequestError, Message, Model
from threadline.counting import ApproximateCounter
from threadline.limiting import (
    HandlerTraits,
    TokenLimitEvent,
    cache_stable_units,
    drop_oldest_units,
    summarize_oldest,
    traits_of,
    with_traits,
)
from threadline.testing import ScriptedDriver

pytestmark = pytest.mark.anyio

BUDGET = 300


def _agent(driver: ScriptedDriver) -> Agent:
    return Agent(
        Client(driver),
        model=Model("scripted-model", context_size=100_000),
        instructions="You answer in one sentence.",
        max_context_tokens=BUDGET + 50,
        output_reserve_tokens=50,
        token_counter=ApproximateCounter(),
    )


async def _turns(conv: Conversation, driver: ScriptedDriver, count: int) -> None:
    for turn in range(count):
        driver.add_replies([f"answer {turn}: " + "cold and windy up there " * 3])
        await conv.run(f"question {turn}: " + "what about the mountains " * 3)


def test_the_built_ins_declare_their_traits() -> None:
    assert traits_of(drop_oldest_units(None)) == HandlerTraits(slides_one_unit=True)
    assert traits_of(cache_stable_units(0.5)) == HandlerTraits(keeps_stable_prefix=True)
    # Priced with a counter of its own, the cut is not the engine's to make.
    assert traits_of(drop_oldest_units(ApproximateCounter())) == HandlerTraits()
    summarize = summarize_oldest(Client(ScriptedDriver()), model=Model("cheap", context_size=8_000))
    assert traits_of(summarize) == HandlerTraits()


def test_a_handler_that_declares_nothing_has_no_traits() -> None:
    def mine(event: TokenLimitEvent) -> None:
        pass

    assert traits_of(mine) == traits_of(None) == HandlerTraits()


def test_with_traits_declares_them_on_the_handler_itself() -> None:
    def mine(event: TokenLimitEvent) -> None:
        pass

    traits = HandlerTraits(keeps_stable_prefix=True)
    assert with_traits(mine, traits) is mine
    assert traits_of(mine) is traits


def test_traits_are_flags_and_with_traits_takes_only_traits() -> None:
    with pytest.raises(InvalidRequestError, match="slides_one_unit must be True or False"):
        HandlerTraits(slides_one_unit=1)  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="traits must be a HandlerTraits"):
        with_traits(drop_oldest_units(None), {"slides_one_unit": True})  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="cannot carry traits"):
        with_traits([].append, HandlerTraits())


async def test_a_handler_of_your_own_that_keeps_a_stable_prefix_keeps_the_window() -> None:
    async def halve(event: TokenLimitEvent) -> None:
        droppable = event.units(pinned=False)
        event.drop_units(droppable[: len(droppable) // 2 + 1], reason="block cut")

    plain = ScriptedDriver()
    conv = Conversation(_agent(plain), pre_max_tokens_reached=halve)
    await _turns(conv, plain, 20)
    assert conv.window_start == 0  # nothing declared: the whole transcript every turn

    driver = ScriptedDriver()
    declared = with_traits(halve, HandlerTraits(keeps_stable_prefix=True))
    conv = Conversation(_agent(driver), pre_max_tokens_reached=declared)
    await _turns(conv, driver, 20)
    assert conv.window_start > 0  # the cut left the window, and the next turns kept it


async def _slid(pre: object) -> tuple[list[tuple[Message, ...]], list[str]]:
    """What each call was sent, and who dropped each unit the last turn's ledger lists."""
    driver = ScriptedDriver()
    conv = Conversation(_agent(driver), pre_max_tokens_reached=pre)
    await _turns(conv, driver, 29)
    driver.add_replies(["the last answer"])
    result = await conv.run("and the last question")
    dropped = [unit.handler for record in result.limiting for unit in record.dropped]
    return [call.messages for call in driver.calls], dropped


async def test_a_handler_of_your_own_that_slides_one_unit_is_cut_as_the_built_in() -> None:
    built_in = drop_oldest_units(None)

    async def window(event: TokenLimitEvent) -> None:
        await built_in(event)  # type: ignore[misc]  # the very cut of the built-in

    sliding, by_built_in = await _slid(built_in)
    undeclared, whole_window = await _slid(window)
    declared, by_window = await _slid(with_traits(window, HandlerTraits(slides_one_unit=True)))
    assert declared == sliding == undeclared  # the same messages sent, whoever cuts
    assert len(sliding[-1]) < 2 * 30  # and the budget did cut
    # Declared, the turn sends only what the last cut left, as under the built-in.
    assert len(by_window) == len(by_built_in) < len(whole_window)
    assert {name.rsplit(".", 1)[-1] for name in by_window} == {"window"}
    assert set(by_built_in) == {"drop_oldest_units"}
