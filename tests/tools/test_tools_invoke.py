"""Running tool calls: arguments in, a tool message (or a readable error) out."""

from __future__ import annotations

import datetime
import enum
import json
import threading
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Literal

import anyio
import attrs
import pytest

from threadline import InvalidRequestError, Message, Origin, Role, Tool, ToolCall, ToolResult, tool
from threadline.tools import ToolArgumentsError, ToolOutcome, Toolset

pytestmark = pytest.mark.anyio


class Unit(enum.Enum):
    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


@attrs.frozen
class Place:
    city: str
    country: str | None = None


@attrs.frozen
class Forecast:
    place: Place
    unit: Unit
    days: int
    when: datetime.date


@attrs.frozen
class Bounded:
    low: Annotated[int, {"minimum": 0}]
    steps: list[Annotated[float, {"exclusiveMinimum": 0}]] = attrs.Factory(list)


def call(name: str, arguments: Any, call_id: str = "call_1") -> ToolCall:
    text = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return ToolCall(id=call_id, name=name, arguments=text)


@tool
def forecast(place: Place, unit: Unit = Unit.CELSIUS, days: int = 1) -> Forecast:
    """The forecast for a place."""
    return Forecast(place=place, unit=unit, days=days, when=datetime.date(2025, 1, 2))


@tool
async def shout(text: str, times: int = 1) -> str:
    return " ".join([text.upper()] * times)


async def test_sync_tool_gets_converted_arguments_and_returns_json() -> None:
    outcome = await forecast.invoke(
        call("forecast", {"place": {"city": "Porto"}, "unit": "fahrenheit", "days": 2})
    )
    assert not outcome.is_error
    assert outcome.exception is None
    assert outcome.message == Message.tool(
        "call_1",
        '{"place": {"city": "Porto", "country": null}, "unit": "fahrenheit", '
        '"days": 2, "when": "2025-01-02"}',
        name="forecast",
        origin=Origin.TURN,
    )
    assert outcome.injected == ()


async def test_sync_tool_runs_in_a_worker_thread() -> None:
    threads: list[int] = []

    @tool
    def where() -> str:
        threads.append(threading.get_ident())
        return "here"

    outcome = await where.invoke(call("where", {}))
    assert outcome.text == "here"
    assert threads != [threading.get_ident()]


async def test_sync_tool_can_run_inline() -> None:
    threads: list[int] = []

    @tool(in_thread=False)
    def where() -> None:
        threads.append(threading.get_ident())

    outcome = await where.invoke(call("where", {}))
    assert outcome.text == ""
    assert threads == [threading.get_ident()]


async def test_async_tool_is_awaited() -> None:
    outcome = await shout.invoke(call("shout", {"text": "hi", "times": 2}))
    assert (outcome.is_error, outcome.text) == (False, "HI HI")


async def test_callable_object_with_async_call_is_awaited() -> None:
    class Counter:
        def __init__(self) -> None:
            self.total = 0

        async def __call__(self, step: int) -> int:
            self.total += step
            return self.total

    counter = Counter()
    add = tool(counter, name="add")
    assert add.json_schema()["required"] == ["step"]
    assert (await add.invoke(call("add", {"step": 3}))).text == "3"


async def test_arguments_are_converted_to_the_annotated_types() -> None:
    seen: dict[str, Any] = {}

    @tool
    def record(
        count: int,
        ratio: float,
        units: list[Unit],
        places: tuple[Place, ...],
        mode: Literal[1, 2],
        either: int | Place,
        maybe: Place | None = None,
        /,
    ) -> None:
        seen.update(count=count, ratio=ratio, units=units, places=places, mode=mode, either=either)
        seen["maybe"] = maybe

    await record.invoke(
        call(
            "record",
            {
                "count": 4.0,
                "ratio": 2,
                "units": ["celsius"],
                "places": [{"city": "Oslo"}],
                "mode": 2.0,
                "either": {"city": "Rome"},
            },
        )
    )
    assert seen == {
        "count": 4,
        "ratio": 2.0,
        "units": [Unit.CELSIUS],
        "places": (Place("Oslo"),),
        "mode": 2,
        "either": Place("Rome"),
        "maybe": None,
    }
    assert type(seen["count"]) is int
    assert type(seen["ratio"]) is float


async def test_a_union_takes_its_first_fitting_member_in_the_order_written() -> None:
    # typing holds int | float equal to float | int; each tool keeps its own order.
    seen: list[Any] = []

    @tool
    def int_first(x: int | float) -> None:
        seen.append(x)

    @tool
    def float_first(x: float | int) -> None:
        seen.append(x)

    await int_first.invoke(call("int_first", {"x": 2}))
    await float_first.invoke(call("float_first", {"x": 2}))
    assert seen == [2, 2.0]
    assert [type(x) for x in seen] == [int, float]


async def test_annotated_metadata_that_cannot_be_hashed_still_builds_the_arguments() -> None:
    seen: list[Any] = []

    @tool
    def measure(count: Annotated[int, {"minimum": 1}], bounds: Bounded) -> None:
        seen.extend([count, bounds])

    outcome = await measure.invoke(
        call("measure", {"count": 3.0, "bounds": {"low": 1.0, "steps": [1, 2.5]}})
    )
    assert not outcome.is_error, outcome.text
    assert seen == [3, Bounded(low=1, steps=[1.0, 2.5])]
    assert [type(x) for x in (seen[0], seen[1].low, *seen[1].steps)] == [int, int, float, float]


async def test_bad_json_is_an_error_result_the_model_can_read() -> None:
    outcome = await shout.invoke(call("shout", '{"text": '))
    assert outcome.is_error
    assert isinstance(outcome.exception, ToolArgumentsError)
    assert outcome.text.startswith("error: tool call 'call_1' to 'shout' has arguments that are")
    assert outcome.text.endswith("send the arguments as one JSON object")
    assert outcome.message.role is Role.TOOL
    assert outcome.message.origin is Origin.TURN


@pytest.mark.parametrize(
    ("arguments", "text"),
    [
        ({}, "error: argument 'place' is required"),
        ({"place": {}}, "error: argument 'place.city' is required"),
        (
            {"place": {"city": 7}},
            "error: argument 'place.city' must be a string, got an integer (7)",
        ),
        (
            {"place": {"city": "Oslo"}, "days": "two"},
            "error: argument 'days' must be an integer, got a string (\"two\")",
        ),
        (
            {"place": {"city": "Oslo"}, "days": True},
            "error: argument 'days' must be an integer, got true",
        ),
        (
            {"place": {"city": "Oslo"}, "unit": "kelvin"},
            'error: argument \'unit\' must be one of "celsius", "fahrenheit", got "kelvin"',
        ),
        (
            {"place": {"city": "Oslo"}, "day": 1},
            "error: unexpected argument 'day' (allowed: place, unit, days)",
        ),
        (
            {"place": {"city": "Oslo", "country": 1}},
            "error: argument 'place.country' must be a string or null, got an integer (1)",
        ),
        ([1, 2], "error: the arguments must be an object, got an array ([1, 2])"),
        (
            {"days": 1.5, "place": "Oslo"},
            "error: argument 'days' must be an integer, got a number (1.5); "
            "argument 'place' must be an object, got a string (\"Oslo\")",
        ),
    ],
)
async def test_arguments_that_do_not_fit_the_schema_are_error_results(
    arguments: Any, text: str
) -> None:
    outcome = await forecast.invoke(call("forecast", arguments))
    assert outcome.is_error
    assert outcome.text == text
    assert isinstance(outcome.exception, ToolArgumentsError)


async def test_a_function_that_raises_gives_an_error_result() -> None:
    @tool
    async def lookup(city: str) -> str:
        raise LookupError(f"no city called {city}")

    outcome = await lookup.invoke(call("lookup", {"city": "Atlantis"}))
    assert outcome.is_error
    assert outcome.text == "error: the tool raised LookupError: no city called Atlantis"
    assert isinstance(outcome.exception, LookupError)
    assert outcome.message.name == "lookup"


async def test_a_sync_function_that_raises_gives_an_error_result() -> None:
    @tool
    def divide(a: int, b: int) -> float:
        return a / b

    outcome = await divide.invoke(call("divide", {"a": 1, "b": 0}))
    assert outcome.text == "error: the tool raised ZeroDivisionError: division by zero"


async def test_a_result_with_no_json_form_is_an_error_result() -> None:
    @tool
    def opaque() -> object:
        return object()

    outcome = await opaque.invoke(call("opaque", {}))
    assert outcome.is_error
    assert outcome.text == (
        "error: the tool's result could not be turned into text: "
        "a value of type object has no JSON form"
    )


async def test_cancellation_is_not_turned_into_a_result() -> None:
    started = anyio.Event()

    @tool
    async def wait_forever() -> str:
        started.set()
        await anyio.Event().wait()
        return "never"

    outcomes: list[ToolOutcome] = []

    async def run() -> None:
        outcomes.append(await wait_forever.invoke(call("wait_forever", {})))

    async with anyio.create_task_group() as group:
        group.start_soon(run)
        await started.wait()
        group.cancel_scope.cancel()
    assert outcomes == []


async def test_tool_result_injects_messages_with_injection_origin() -> None:
    @tool
    def open_ticket(ticket_id: str) -> ToolResult:
        return ToolResult(
            {"id": ticket_id, "status": "open"},
            inject=["The ticket body: printer on fire.", Message.system("Be brief.")],
        )

    outcome = await open_ticket.invoke(call("open_ticket", {"ticket_id": "T-1"}))
    assert outcome.text == '{"id": "T-1", "status": "open"}'
    assert outcome.message.origin is Origin.TURN
    assert outcome.injected == (
        Message.user("The ticket body: printer on fire.", origin=Origin.INJECTION),
        Message.system("Be brief.", origin=Origin.INJECTION),
    )


async def test_tool_without_function_cannot_be_invoked() -> None:
    declared = Tool(name="client_side", description="Run by the caller.")
    with pytest.raises(InvalidRequestError, match="has no function"):
        await declared.invoke(call("client_side", {}))


async def test_hand_written_schema_is_checked_and_arguments_passed_as_json() -> None:
    received: list[dict[str, Any]] = []

    def add(**arguments: Any) -> int:
        received.append(arguments)
        return int(arguments["a"] + arguments["b"])

    adder = Tool(
        name="add",
        parameters={
            "type": "object",
            "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            "required": ["a", "b"],
            "additionalProperties": False,
        },
        function=add,
    )
    assert (await adder.invoke(call("add", {"a": 1, "b": 2.5}))).text == "3"
    assert received == [{"a": 1, "b": 2.5}]
    missing = await adder.invoke(call("add", {"a": 1}))
    assert missing.text == "error: argument 'b' is required"


async def test_toolset_finds_the_named_tool() -> None:
    tools = Toolset([shout, forecast])
    outcome = await tools.invoke(call("shout", {"text": "ok"}))
    assert outcome.text == "OK"


async def test_toolset_answers_an_unknown_tool_with_the_available_names() -> None:
    tools = Toolset([shout, forecast])
    outcome = await tools.invoke(call("weather", {}))
    assert outcome.is_error
    assert outcome.text == "error: unknown tool 'weather'; available: shout, forecast"
    assert outcome.message.name == "weather"
    assert outcome.message.tool_call_id == "call_1"


async def test_toolset_runs_calls_concurrently_in_call_order() -> None:
    first_started = anyio.Event()
    second_started = anyio.Event()

    # Each tool waits for the other to have started: run one after the other,
    # they would never finish.
    @tool
    async def first() -> str:
        first_started.set()
        await second_started.wait()
        return "first"

    @tool
    async def second() -> str:
        second_started.set()
        await first_started.wait()
        return "second"

    tools = Toolset([first, second])
    with anyio.fail_after(5):
        outcomes = await tools.invoke_all(
            [call("second", {}, "b"), call("first", {}, "a"), call("third", {}, "c")]
        )
    assert [(o.call.id, o.text) for o in outcomes] == [
        ("b", "second"),
        ("a", "first"),
        ("c", "error: unknown tool 'third'; available: first, second"),
    ]


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this exception cannot say what it is")


async def test_an_exception_that_cannot_be_printed_is_still_an_error_result() -> None:
    @tool
    async def broken() -> str:
        raise Unprintable

    outcome = await broken.invoke(call("broken", {}))
    assert outcome.is_error
    assert outcome.text == "error: the tool raised Unprintable (its message could not be read)"
    assert isinstance(outcome.exception, Unprintable)


async def test_an_unprintable_exception_never_escapes_a_toolset_as_a_group() -> None:
    @tool
    def broken() -> str:
        raise Unprintable

    outcomes = await Toolset([broken]).invoke_all(
        [call("broken", {}, "a"), call("broken", {}, "b")]
    )
    assert [o.is_error for o in outcomes] == [True, True]


async def test_a_result_whose_conversion_raises_anything_is_an_error_result() -> None:
    class Hostile(Mapping[str, Any]):
        # json_default turns a mapping into a dict, which runs this code.
        def __getitem__(self, key: str) -> Any:
            raise Unprintable

        def __iter__(self) -> Iterator[str]:
            raise Unprintable

        def __len__(self) -> int:
            return 1

    @tool
    def hostile() -> Any:
        return [Hostile()]

    outcome = await hostile.invoke(call("hostile", {}))
    assert outcome.is_error
    assert outcome.text.startswith("error: the tool's result could not be turned into text")


async def test_arguments_nested_too_deeply_are_an_error_result() -> None:
    outcome = await shout.invoke(call("shout", "[" * 100_000 + "]" * 100_000))
    assert outcome.is_error
    assert "nested too deeply" in outcome.text
    assert isinstance(outcome.exception, ToolArgumentsError)


async def test_a_long_exception_message_is_cut_for_the_model() -> None:
    @tool
    def chatty() -> str:
        raise ValueError("x" * 100_000)

    outcome = await chatty.invoke(call("chatty", {}))
    assert outcome.is_error
    assert len(outcome.text) < 2_100
    assert outcome.text.endswith("...")


def test_an_inject_that_is_not_a_list_of_messages_is_refused_by_name() -> None:
    with pytest.raises(InvalidRequestError, match="inject must be"):
        ToolResult("x", inject=5)  # type: ignore[arg-type]


@pytest.mark.parametrize("anyio_backend", ["trio"])
async def test_ctrl_c_in_a_tool_comes_out_as_itself_not_in_a_group() -> None:
    # trio delivers Ctrl-C inside a task; asyncio raises it out of its loop at once,
    # which is why this runs on trio only.
    @tool
    async def interrupted() -> str:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        await Toolset([interrupted]).invoke_all([call("interrupted", {})])
