"""Structured output through the engine: ``output_type=T`` gives a validated ``T``.

The schema a driver is handed, the value built from the answer, the repair
round a bad answer gets, ``OutputValidationError`` when repair is spent, the
tagged choice between classes, the other kinds of type, streaming, tools
first, and the schema priced by the budget.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal, NotRequired, TypedDict

import attrs
import pytest

from threadline import (
    Agent,
    Client,
    FinalResult,
    InvalidRequestError,
    Message,
    Model,
    RoundDone,
    TextDelta,
    Tool,
    ToolCall,
    Usage,
)
from threadline.drivers import ProviderCall, ProviderResponse
from threadline.testing import FunctionDriver, ScriptedDriver
from threadline.tools import OutputValidationError
from threadline.tools import tool as make_tool

pytestmark = pytest.mark.anyio

MODEL = Model("fake", context_size=8192)


@attrs.frozen
class LineItem:
    """One line of an invoice.

    Attributes:
        name: What was sold.
        price: Its price in euros.
    """

    name: str
    price: float = attrs.field(validator=attrs.validators.ge(0))


@attrs.frozen
class Invoice:
    """An invoice.

    Attributes:
        customer: Who pays.
        items: What they bought.
    """

    customer: str
    items: list[LineItem]
    note: str | None = None


@dataclasses.dataclass
class Cat:
    name: str
    lives: int = 9


@dataclasses.dataclass
class Dog:
    name: str
    good: bool


class Point(TypedDict):
    """A point on the plane.

    Attributes:
        x: Across.
        y: Up.
    """

    x: int
    y: int
    label: NotRequired[str]


class SchemaDriver(FunctionDriver):
    """A fake driver whose provider enforces the output schema: the run adds no note."""

    def output_constraint(self, model: Model) -> Literal["schema"]:
        return "schema"


def client_of(driver: Any) -> Client:
    return Client(driver, default_model=MODEL)


INVOICE = {"customer": "Ada", "items": [{"name": "tea", "price": 3.5}]}


async def test_the_answer_becomes_a_value_of_the_output_type_and_the_text_stays_raw() -> None:
    text = json.dumps(INVOICE)
    driver = ScriptedDriver([text])
    result = await client_of(driver).request().with_prompt("bill").with_output_type(Invoice).run()
    assert result.output == Invoice(customer="Ada", items=[LineItem(name="tea", price=3.5)])
    assert result.text == text
    assert result.output_repairs == 0
    schema = driver.calls[0].output
    assert schema is not None
    assert schema.name == "Invoice"
    assert schema.schema["required"] == ["customer", "items"]
    assert schema.schema["properties"]["customer"]["description"] == "Who pays."
    item = schema.schema["properties"]["items"]["items"]
    assert item["properties"]["price"] == {"type": "number", "description": "Its price in euros."}


async def test_a_plain_run_has_its_text_as_output_and_sends_no_schema() -> None:
    driver = ScriptedDriver(["hello"])
    result = await client_of(driver).request().with_prompt("hi").run()
    assert result.output == "hello"
    assert driver.calls[0].output is None


async def test_a_driver_that_cannot_constrain_gets_the_schema_in_the_system_message() -> None:
    driver = ScriptedDriver([json.dumps(INVOICE)])
    request = client_of(driver).request().with_system("Be exact.").with_prompt("bill")
    await request.with_output_type(Invoice).run()
    system = driver.calls[0].messages[0]
    assert system.text.startswith("Be exact.\n\nAnswer with one JSON value")
    assert '"customer"' in system.text


async def test_a_driver_that_constrains_gets_no_note_only_the_schema() -> None:
    driver = SchemaDriver(lambda call: json.dumps(INVOICE))
    await client_of(driver).request().with_prompt("bill").with_output_type(Invoice).run()
    assert [m.text for m in driver.calls[0].messages] == ["bill"]
    assert driver.calls[0].output is not None


async def test_an_answer_a_validator_refuses_gets_one_repair_round_with_the_error() -> None:
    bad = json.dumps({"customer": "Ada", "items": [{"name": "tea", "price": -1}]})
    driver = ScriptedDriver([bad, json.dumps(INVOICE)])
    result = await client_of(driver).request().with_prompt("bill").with_output_type(Invoice).run()
    assert result.output.items[0].price == 3.5
    assert result.output_repairs == 1
    assert result.limiting_summary().endswith(
        "; 1 repair round(s) for an answer that failed its type"
    )
    first, second = result.rounds
    assert first.output_error is not None
    assert "'price' must be >= 0" in first.output_error
    assert second.output_error is None
    repair = driver.calls[1].messages[-1]
    assert repair.text.startswith("Your answer does not match the required JSON schema")
    assert "'price' must be >= 0" in repair.text
    assert driver.calls[1].messages[-2].text == bad


async def test_a_second_failure_raises_with_the_raw_text_and_the_error_path() -> None:
    first = json.dumps({"customer": "Ada"})
    second = json.dumps({"customer": "Ada", "items": [{"name": 7, "price": 1}]})
    driver = ScriptedDriver([first, second])
    request = client_of(driver).request().with_prompt("bill").with_output_type(Invoice)
    with pytest.raises(OutputValidationError) as caught:
        await request.run()
    error = caught.value
    assert error.text == second
    assert error.path == "$.items[0].name"
    assert error.attempts == 2
    assert "must be a string" in error.reason
    assert driver.remaining == 0


async def test_output_retries_sets_how_many_repairs_are_tried() -> None:
    driver = ScriptedDriver(["no", "still no", "nope", '{"value": 4}'])
    result = await (
        client_of(driver)
        .request()
        .with_prompt("n?")
        .with_output_type(int)
        .with_output_retries(3)
        .run()
    )
    assert result.output == 4
    assert result.output_repairs == 3

    driver = ScriptedDriver(["no"])
    request = client_of(driver).request().with_prompt("n?").with_output_type(int)
    with pytest.raises(OutputValidationError, match="not JSON") as caught:
        await request.with_output_retries(0).run()
    assert caught.value.attempts == 1


@pytest.mark.parametrize(
    ("finish", "cause"),
    [("length", "cut off"), ("refusal", "refused"), ("content_filter", "stopped")],
)
async def test_a_cut_off_or_refused_answer_raises_without_a_repair(finish: str, cause: str) -> None:
    def reply(call: ProviderCall) -> ProviderResponse:
        return ProviderResponse(
            message=Message.assistant('{"customer": "A'),
            finish_reason=finish,
            usage=_usage(),
            model="m",
        )

    driver = FunctionDriver(reply)
    request = client_of(driver).request().with_prompt("bill").with_output_type(Invoice)
    with pytest.raises(OutputValidationError, match=cause):
        await request.run()
    assert len(driver.calls) == 1


async def test_a_union_of_classes_is_a_tagged_choice() -> None:
    driver = ScriptedDriver(['{"value": {"kind": "Dog", "name": "Rex", "good": true}}'])
    request = client_of(driver).request().with_prompt("pet").with_output_type(Cat | Dog)
    result = await request.run()
    assert result.output == Dog(name="Rex", good=True)
    schema = driver.calls[0].output
    assert schema is not None
    branches = schema.schema["properties"]["value"]["anyOf"]
    assert [b["properties"]["kind"] for b in branches] == [
        {"type": "string", "enum": ["Cat"]},
        {"type": "string", "enum": ["Dog"]},
    ]
    assert all(b["required"][0] == "kind" for b in branches)


async def test_the_tag_decides_the_class_even_where_the_fields_would_fit_another() -> None:
    driver = ScriptedDriver(['{"value": {"kind": "Cat", "name": "Tom"}}'])
    result = await client_of(driver).request().with_prompt("p").with_output_type(Cat | Dog).run()
    assert result.output == Cat(name="Tom", lives=9)


async def test_a_wrong_branch_is_explained_by_the_branch_its_tag_names() -> None:
    driver = ScriptedDriver(['{"value": {"kind": "Dog", "name": "Rex"}}'] * 2)
    request = client_of(driver).request().with_prompt("p").with_output_type(Cat | Dog)
    with pytest.raises(OutputValidationError) as caught:
        await request.run()
    assert caught.value.path == "$.good"
    assert "is required" in caught.value.reason


async def test_a_typed_dict_with_an_optional_key_and_its_docs() -> None:
    driver = ScriptedDriver(['{"x": 1, "y": 2}'])
    result = await client_of(driver).request().with_prompt("p").with_output_type(Point).run()
    assert result.output == {"x": 1, "y": 2}
    schema = driver.calls[0].output
    assert schema is not None
    assert schema.schema["required"] == ["x", "y"]
    assert schema.schema["properties"]["x"]["description"] == "Across."
    assert "default" not in schema.schema["properties"]["label"]


@pytest.mark.parametrize(
    ("output_type", "answer", "value"),
    [
        (int, '{"value": 3}', 3),
        (str, '{"value": "three"}', "three"),
        (float, '{"value": 2}', 2.0),
        (bool, '{"value": false}', False),
        (list[int], '{"value": [1, 2]}', [1, 2]),
        (list[Cat], '{"value": [{"name": "Tom"}]}', [Cat(name="Tom")]),
        (Literal["yes", "no"], '{"value": "no"}', "no"),
    ],
)
async def test_primitives_lists_and_choices_are_wrapped_in_value(
    output_type: Any, answer: str, value: Any
) -> None:
    driver = ScriptedDriver([answer])
    result = await client_of(driver).request().with_prompt("p").with_output_type(output_type).run()
    assert result.output == value
    schema = driver.calls[0].output
    assert schema is not None
    assert schema.schema["required"] == ["value"]
    assert schema.schema["additionalProperties"] is False


async def test_a_fenced_answer_from_a_prompted_model_is_read() -> None:
    driver = ScriptedDriver(['```json\n{"value": 3}\n```'])
    result = await client_of(driver).request().with_prompt("n").with_output_type(int).run()
    assert result.output == 3


async def test_a_type_without_a_schema_is_refused_naming_it() -> None:
    with pytest.raises(InvalidRequestError, match="output_type"):
        client_of(ScriptedDriver([])).request().settings.evolve(output_type=set[int])
    request = client_of(ScriptedDriver([])).request().with_prompt("p").with_output_type(complex)
    with pytest.raises(InvalidRequestError, match=r"with_output_type.*complex"):
        await request.run()


async def test_tool_rounds_run_first_and_the_final_answer_is_structured() -> None:
    @make_tool
    def price_of(name: str) -> float:
        """The price of a product."""
        return 3.5

    call = ToolCall(id="c1", name="price_of", arguments='{"name": "tea"}')
    driver = ScriptedDriver([Message.assistant(tool_calls=[call]), json.dumps(INVOICE)])
    request = client_of(driver).request().with_prompt("bill").with_tools([price_of])
    result = await request.with_output_type(Invoice).run()
    assert result.output.customer == "Ada"
    assert [r.tool_calls for r in result.rounds] == [1, 0]
    assert driver.calls[1].messages[-1].text == "3.5"


async def test_streaming_gives_text_deltas_and_the_value_in_final_result() -> None:
    driver = ScriptedDriver(['{"customer": "Ada", "items": []}'])
    request = client_of(driver).request().with_prompt("bill").with_output_type(Invoice)
    deltas, final = [], None
    async with request.stream() as events:
        async for event in events:
            if isinstance(event, TextDelta):
                deltas.append(event.text)
            elif isinstance(event, FinalResult):
                final = event
    assert "".join(deltas) == '{"customer": "Ada", "items": []}'
    assert final is not None
    assert final.output == Invoice(customer="Ada", items=[])


async def test_a_stream_records_the_repair_round_in_its_round_events() -> None:
    driver = ScriptedDriver(['{"customer": 1, "items": []}', json.dumps(INVOICE)])
    request = client_of(driver).request().with_prompt("bill").with_output_type(Invoice)
    errors = []
    async with request.stream() as events:
        async for event in events:
            if isinstance(event, RoundDone):
                errors.append(event.record.output_error)
    assert errors == ["$.customer: field 'customer' must be a string, got an integer (1)", None]


async def test_an_agent_with_an_output_type_answers_with_values() -> None:
    driver = ScriptedDriver(['{"value": 42}'])
    agent = Agent(client_of(driver), output_type=int, output_retries=2)
    assert agent.settings.output_type is int
    assert agent.settings.output_retries == 2
    assert (await agent.run("n?")).output == 42


async def test_the_budget_prices_the_output_schema_as_a_tool() -> None:
    driver = SchemaDriver(lambda call: json.dumps(INVOICE))
    client = client_of(driver)
    plain = await client.request().with_prompt("n?").run()
    typed = await client.request().with_prompt("n?").with_output_type(Invoice).run()
    output = driver.calls[1].output
    assert output is not None
    as_tool = Tool(name=output.name, description=output.description, parameters=output.schema)
    counter = await client.request().with_prompt("n?").token_counter()
    sent = driver.calls[1].messages
    assert typed.rounds[0].estimated_input_tokens == counter.count(sent, [as_tool])
    assert typed.rounds[0].estimated_input_tokens > plain.rounds[0].estimated_input_tokens


async def test_a_schema_that_does_not_fit_the_budget_puts_the_request_over_it() -> None:
    driver = SchemaDriver(lambda call: "{}")
    client = client_of(driver)
    with pytest.raises(OutputValidationError):
        await client.request().with_prompt("n?").with_output_type(Invoice).run()
    output = driver.calls[0].output
    assert output is not None
    as_tool = Tool(name=output.name, description=output.description, parameters=output.schema)
    counter = await client.request().with_prompt("n?").token_counter()
    bare = counter.count([Message.user("n?")], [])
    priced = counter.count([Message.user("n?")], [as_tool])
    limit = (bare + priced) // 2
    request = (
        client.request().with_prompt("n?").with_max_context_tokens(limit)
    ).with_output_reserve_tokens(0)
    assert not await request.is_token_limit_reached()
    assert await request.with_output_type(Invoice).is_token_limit_reached()


def _usage() -> Usage:
    return Usage(input_tokens=1, output_tokens=1)
