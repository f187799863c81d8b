"""The Request builder and its run loop, against ScriptedDriver."""

from __future__ import annotations

import anyio
import pytest

from threadline import (
    Budget,
    Client,
    ContextLengthExceededError,
    FinalResult,
    InvalidRequestError,
    LimitApplied,
    MaxRoundsExceededError,
    Message,
    Model,
    Origin,
    ProviderUnavailableError,
    Role,
    RoundDone,
    TextDelta,
    Tool,
    ToolCall,
    ToolCallEvent,
    ToolResult,
    ToolResultEvent,
    tool,
)
from threadline.counting import ApproximateCounter
from threadline.limiting import TokenLimitEvent, drop_oldest_units
from threadline.testing import ScriptedDriver

MODEL = Model("scripted-model", context_size=8192)


def call(id: str, name: str, arguments: str = "{}") -> ToolCall:
    return ToolCall(id=id, name=name, arguments=arguments)


def calling(*calls: ToolCall) -> Message:
    return Message.assistant(tool_calls=calls)


def history(turns: int, words: int = 50) -> list[Message]:
    messages: list[Message] = []
    for i in range(turns):
        messages.append(Message.user(f"question {i} " + "word " * words))
        messages.append(Message.assistant(f"answer {i} " + "word " * words))
    return messages


@tool
def add(a: int, b: int) -> int:
    """Add two numbers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b


# -- builder misuse ------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("build", "problem"),
    [
        (lambda r: r.with_prompt("hi"), "no model"),
        (lambda r: r.with_model(MODEL), "nothing to send"),
        (lambda r: r.with_model(MODEL).with_prompt("hi").with_max_context_tokens(-5), "positive"),
        (
            lambda r: r.with_model(MODEL).with_prompt("hi").with_output_reserve_tokens(-1),
            "0 or more",
        ),
        (lambda r: r.with_model(MODEL).with_prompt("hi").with_max_rounds(0), "with_max_rounds"),
        (lambda r: r.with_model(MODEL).with_prompt("hi").with_tools([add, add]), "twice"),
        (lambda r: r.with_model(MODEL).with_prompt("hi").with_tool_choice("nope"), "nope"),
        (lambda r: r.with_model(MODEL).with_prompt(Message.assistant("x")), "user Message"),
    ],
)
async def test_builder_misuse_raises_invalid_request_naming_the_problem(
    build: object, problem: str
) -> None:
    driver = ScriptedDriver(["unused"])
    request = build(Client(driver).request())  # type: ignore[operator]
    with pytest.raises(InvalidRequestError, match=problem):
        await request.run()
    assert driver.calls == []


@pytest.mark.anyio
async def test_a_history_with_an_orphaned_tool_result_is_refused_before_sending() -> None:
    driver = ScriptedDriver(["unused"])
    request = (
        Client(driver, default_model=MODEL)
        .request()
        .with_messages([Message.user("q"), Message.tool("ghost", "result")])
        .with_prompt("next")
    )
    with pytest.raises(InvalidRequestError, match="ghost"):
        await request.run()
    assert driver.calls == []


# -- what is sent and what comes back --------------------------------------------------


@pytest.mark.anyio
async def test_system_history_and_prompt_are_sent_in_order_with_their_origins() -> None:
    driver = ScriptedDriver(["Ada."])
    past = [Message.user("My name is Ada."), Message.assistant("Hello Ada.", origin=Origin.TURN)]
    result = await (
        Client(driver, default_model=MODEL)
        .request()
        .with_system("Be terse.")
        .with_messages(past)
        .with_prompt("What is my name?")
        .run()
    )
    sent = driver.calls[0].messages
    assert [m.role for m in sent] == [Role.SYSTEM, Role.USER, Role.ASSISTANT, Role.USER]
    assert [m.text for m in sent] == [
        "Be terse.",
        "My name is Ada.",
        "Hello Ada.",
        "What is my name?",
    ]
    assert [m.origin for m in sent] == [Origin.SEED, Origin.SEED, Origin.SEED, Origin.TURN]
    assert result.text == "Ada."
    assert result.response.finish_reason == "stop"
    assert result.response.model == "scripted-model"
    assert [m.text for m in result.new_messages()] == ["What is my name?", "Ada."]
    assert all(m.origin is Origin.TURN for m in result.new_messages())
    assert result.messages[-1].origin is Origin.TURN


@pytest.mark.anyio
async def test_each_round_keeps_the_estimate_beside_the_reported_input_tokens() -> None:
    driver = ScriptedDriver([calling(call("c1", "add", '{"a": 2, "b": 3}')), "5"])
    result = (
        await Client(driver, default_model=MODEL)
        .request()
        .with_prompt("2+3?")
        .with_tools([add])
        .run()
    )
    assert len(result.rounds) == 2
    for record in result.rounds:
        assert record.estimated_input_tokens > 0
        assert record.reported_input_tokens == record.usage.input_tokens
    assert result.usage == result.rounds[0].usage + result.rounds[1].usage


# -- tools -------------------------------------------------------------------------------


@pytest.mark.anyio
async def test_tool_results_join_the_transcript_and_the_next_round_answers() -> None:
    driver = ScriptedDriver([calling(call("c1", "add", '{"a": 1, "b": 2}')), "It is 3."])
    result = await (
        Client(driver, default_model=MODEL).request().with_prompt("1+2?").with_tools([add]).run()
    )
    assert result.text == "It is 3."
    second = driver.calls[1].messages
    assert second[-1].role is Role.TOOL
    assert second[-1].tool_call_id == "c1"
    assert second[-1].text == "3"
    assert [m.role for m in result.new_messages()] == [
        Role.USER,
        Role.ASSISTANT,
        Role.TOOL,
        Role.ASSISTANT,
    ]


@pytest.mark.anyio
async def test_tools_of_one_round_run_concurrently() -> None:
    # Each tool waits for the other to start: run one after the other, they would deadlock.
    started = {"left": anyio.Event(), "right": anyio.Event()}

    async def meet(side: str) -> str:
        other = "right" if side == "left" else "left"
        started[side].set()
        await started[other].wait()
        return f"{side} met {other}"

    tools = [
        Tool(name="left", function=lambda: meet("left")),
        Tool(name="right", function=lambda: meet("right")),
    ]
    driver = ScriptedDriver([calling(call("a", "left"), call("b", "right")), "done"])
    with anyio.fail_after(5):
        result = await (
            Client(driver, default_model=MODEL).request().with_prompt("go").with_tools(tools).run()
        )
    results = [m.text for m in result.messages if m.role is Role.TOOL]
    assert results == ["left met right", "right met left"]


@pytest.mark.anyio
async def test_a_tool_that_raises_gives_the_model_an_error_result_and_the_run_goes_on() -> None:
    def explode() -> str:
        raise RuntimeError("the weather service is down")

    driver = ScriptedDriver([calling(call("c1", "explode")), "Sorry, try later."])
    result = await (
        Client(driver, default_model=MODEL)
        .request()
        .with_prompt("weather?")
        .with_tools([Tool(name="explode", function=explode)])
        .run()
    )
    tool_message = driver.calls[1].messages[-1]
    assert tool_message.text.startswith("error:")
    assert "the weather service is down" in tool_message.text
    assert result.text == "Sorry, try later."


@pytest.mark.anyio
async def test_arguments_that_do_not_match_the_schema_give_an_error_result() -> None:
    driver = ScriptedDriver([calling(call("c1", "add", '{"a": "one"}')), "fixed"])
    result = await (
        Client(driver, default_model=MODEL).request().with_prompt("?").with_tools([add]).run()
    )
    tool_message = driver.calls[1].messages[-1]
    assert tool_message.text.startswith("error:")
    assert "b" in tool_message.text
    assert result.text == "fixed"


@pytest.mark.anyio
async def test_a_run_past_max_rounds_raises_a_clear_error() -> None:
    driver = ScriptedDriver([calling(call(f"c{i}", "add", '{"a":1,"b":1}')) for i in range(3)])
    request = (
        Client(driver, default_model=MODEL)
        .request()
        .with_prompt("loop")
        .with_tools([add])
        .with_max_rounds(2)
    )
    with pytest.raises(MaxRoundsExceededError, match="2 round"):
        await request.run()
    assert len(driver.calls) == 2


@pytest.mark.anyio
async def test_injected_messages_are_sent_but_never_new_messages() -> None:
    @tool
    def open_ticket(ticket_id: str) -> ToolResult:
        """Open a ticket.

        Args:
            ticket_id: Which ticket.
        """
        return ToolResult("opened", inject=[f"Ticket {ticket_id} body: printer on fire"])

    driver = ScriptedDriver([calling(call("c1", "open_ticket", '{"ticket_id": "T1"}')), "ok"])
    result = await (
        Client(driver, default_model=MODEL)
        .request()
        .with_prompt("look at T1")
        .with_tools([open_ticket])
        .run()
    )
    sent = driver.calls[1].messages
    assert sent[-1].origin is Origin.INJECTION
    assert "printer on fire" in sent[-1].text
    assert all(m.origin is not Origin.INJECTION for m in result.new_messages())
    assert any(m.origin is Origin.INJECTION for m in result.messages)


@pytest.mark.anyio
async def test_a_forced_tool_choice_applies_to_the_first_round_only() -> None:
    driver = ScriptedDriver([calling(call("c1", "add", '{"a":1,"b":1}')), "2"])
    await (
        Client(driver, default_model=MODEL)
        .request()
        .with_prompt("1+1")
        .with_tools([add])
        .with_tool_choice("add")
        .run()
    )
    assert [c.tool_choice for c in driver.calls] == ["add", "auto"]


@pytest.mark.anyio
async def test_a_call_to_a_tool_without_a_function_ends_the_run_for_the_caller() -> None:
    declared = Tool(name="approve", parameters={"type": "object", "properties": {}})
    driver = ScriptedDriver([calling(call("c1", "approve"))])
    result = await (
        Client(driver, default_model=MODEL)
        .request()
        .with_prompt("approve it")
        .with_tools([declared])
        .run()
    )
    assert result.response.finish_reason == "tool_calls"
    assert result.response.message.tool_calls[0].name == "approve"
    assert len(driver.calls) == 1


# -- budget and limiting -----------------------------------------------------------------


@pytest.mark.anyio
async def test_budget_resolves_limit_minus_reserve_and_says_why_when_there_is_none() -> None:
    client = Client(ScriptedDriver())
    request = (
        client.request()
        .with_model(MODEL)
        .with_prompt("hi")
        .with_max_context_tokens(100_000)
        .with_output_reserve_tokens(8_000)
    )
    assert await request.budget() == Budget(limit=100_000, reserve=8_000)
    bare = client.request().with_model("no-size").with_prompt("hi")
    assert await bare.budget() is None
    assert "context_size" in (await bare.budget_resolution()).reason
    assert await bare.is_token_limit_reached() is False


@pytest.mark.anyio
async def test_is_token_limit_reached_counts_the_transcript_as_built() -> None:
    request = (
        Client(ScriptedDriver(), default_model=MODEL)
        .request()
        .with_messages(history(20))
        .with_prompt("and now?")
        .with_max_context_tokens(600)
        .with_output_reserve_tokens(0)
    )
    assert await request.is_token_limit_reached() is True
    assert await request.with_max_context_tokens(100_000).is_token_limit_reached() is False


@pytest.mark.anyio
async def test_limiting_drops_old_history_but_new_messages_stay_whole() -> None:
    driver = ScriptedDriver(["short answer"])
    counter = ApproximateCounter()
    result = await (
        Client(driver, default_model=MODEL)
        .request()
        .with_system("sys")
        .with_messages(history(30))
        .with_prompt("latest question")
        .with_max_context_tokens(500)
        .with_output_reserve_tokens(100)
        .with_token_counter(counter)
        .run()
    )
    sent = driver.calls[0].messages
    assert counter.count(sent, ()) <= 400
    assert sent[0].role is Role.SYSTEM
    assert sent[1].role is Role.USER
    assert sent[-1].text == "latest question"
    (record,) = result.limiting
    assert record.dropped
    assert record.tokens_before > record.budget_tokens >= record.tokens_after  # type: ignore[operator]
    assert [m.text for m in result.new_messages()] == ["latest question", "short answer"]


@pytest.mark.anyio
async def test_a_pre_handler_replaces_the_default_and_post_runs_after_it() -> None:
    seen: list[str] = []

    def keep_everything(event: TokenLimitEvent) -> None:
        seen.append(f"pre {event.round}")

    driver = ScriptedDriver(["ok"])
    result = await (
        Client(driver, default_model=MODEL)
        .request()
        .with_messages(history(30))
        .with_prompt("q")
        .with_max_context_tokens(500)
        .with_output_reserve_tokens(0)
        .pre_max_tokens_reached(keep_everything)
        .post_max_tokens_reached(drop_oldest_units(None))
        .run()
    )
    assert seen == ["pre 1"]
    (record,) = result.limiting
    assert [run.phase for run in record.handlers] == ["pre", "post"]
    assert all(d.phase == "post" for d in record.dropped)


@pytest.mark.anyio
async def test_a_handler_that_raises_aborts_the_run_before_anything_is_sent() -> None:
    def broken(event: TokenLimitEvent) -> None:
        raise LookupError("summary store unavailable")

    driver = ScriptedDriver(["never"])
    request = (
        Client(driver, default_model=MODEL)
        .request()
        .with_messages(history(30))
        .with_prompt("q")
        .with_max_context_tokens(500)
        .with_output_reserve_tokens(0)
        .pre_max_tokens_reached(broken)
    )
    with pytest.raises(LookupError, match="summary store"):
        await request.run()
    assert driver.calls == []


@pytest.mark.anyio
async def test_context_length_exceeded_tightens_the_budget_and_retries_once() -> None:
    refusal = ContextLengthExceededError(
        "maximum context length is 2000 tokens", prompt_tokens=3000, context_limit=2000
    )
    driver = ScriptedDriver([refusal, "fits now"])
    result = await (
        Client(driver, default_model=MODEL)
        .request()
        .with_messages(history(20))
        .with_prompt("q")
        .run()
    )
    assert result.text == "fits now"
    first, second = driver.calls
    assert len(second.messages) < len(first.messages)
    assert second.messages[-1].text == "q"
    assert result.rounds[0].context_retry is True


@pytest.mark.anyio
async def test_a_second_context_length_refusal_is_raised() -> None:
    refusal = ContextLengthExceededError("too long")
    driver = ScriptedDriver([refusal, ContextLengthExceededError("still too long")])
    request = (
        Client(driver, default_model=MODEL).request().with_messages(history(5)).with_prompt("q")
    )
    with pytest.raises(ContextLengthExceededError, match="still too long"):
        await request.run()


@pytest.mark.anyio
async def test_provider_errors_other_than_context_length_are_not_retried_by_the_loop() -> None:
    driver = ScriptedDriver([ProviderUnavailableError("down", status=503), "never"])
    with pytest.raises(ProviderUnavailableError):
        await Client(driver, default_model=MODEL).request().with_prompt("q").run()
    assert len(driver.calls) == 1


# -- streaming ---------------------------------------------------------------------------


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_stream_yields_typed_events_in_order_and_ends_with_the_result() -> None:
    driver = ScriptedDriver([calling(call("c1", "add", '{"a":2,"b":2}')), "The answer is 4."])
    request = (
        Client(driver, default_model=MODEL)
        .request()
        .with_messages(history(30))
        .with_prompt("2+2?")
        .with_tools([add])
        .with_max_context_tokens(1500)
        .with_output_reserve_tokens(0)
    )
    async with request.stream() as events:
        kinds = [event async for event in events]
    names = [type(e).__name__ for e in kinds]
    assert names[0] == "LimitApplied"
    assert names.index("ToolCallEvent") < names.index("ToolResultEvent") < names.index("RoundDone")
    assert isinstance(kinds[-1], FinalResult)
    text = "".join(e.text for e in kinds if isinstance(e, TextDelta))
    assert text == "The answer is 4." == kinds[-1].result.text
    assert sum(isinstance(e, TextDelta) for e in kinds) > 1
    assert [e.round for e in kinds if isinstance(e, RoundDone)] == [1, 2]
    assert isinstance(kinds[0], LimitApplied)
    tool_events = [e for e in kinds if isinstance(e, ToolCallEvent | ToolResultEvent)]
    assert tool_events[1].message.text == "4"  # type: ignore[union-attr]


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio", "trio"])
async def test_leaving_a_stream_early_stops_the_run() -> None:
    driver = ScriptedDriver(["a long answer that streams in pieces", "never asked for"])
    async with Client(driver, default_model=MODEL).request().with_prompt("q").stream() as events:
        async for event in events:
            assert isinstance(event, TextDelta)
            break
    assert len(driver.calls) == 1
    assert driver.remaining == 1


@pytest.mark.anyio
async def test_stream_refuses_an_invalid_request_on_entry() -> None:
    with pytest.raises(InvalidRequestError, match="no model"):
        async with Client(ScriptedDriver()).request().with_prompt("q").stream():
            pass  # pragma: no cover


@pytest.mark.anyio
async def test_without_a_budget_the_retry_keeps_room_for_the_requested_reply() -> None:
    # No context_size, so no budget: the refusal's numbers alone must shrink the
    # transcript, and the completion the provider counted comes off its limit.
    refusal = ContextLengthExceededError(
        "maximum context length is 4097 tokens; you requested 5280 (3280 in the messages, "
        "2000 in the completion)",
        prompt_tokens=3280,
        context_limit=4097,
    )
    driver = ScriptedDriver([refusal, "fits"])
    counter = ApproximateCounter()
    result = await (
        Client(driver)
        .request()
        .with_model("no-size")
        .with_messages(history(40, words=10))
        .with_prompt("now")
        .with_max_output_tokens(2000)
        .with_token_counter(counter)
        .run()
    )
    first, second = driver.calls
    sent_before = counter.count(first.messages, ())
    sent_after = counter.count(second.messages, ())
    # Our estimate of what fits: (4097 - 2000) / 3280 of what was refused.
    assert sent_after <= sent_before * (4097 - 2000) / 3280
    assert result.text == "fits"


@pytest.mark.anyio
async def test_a_refusal_that_names_only_the_limit_tightens_to_that_limit() -> None:
    refusal = ContextLengthExceededError("maximum context length is 600 tokens", context_limit=600)
    driver = ScriptedDriver([refusal, "fits"])
    counter = ApproximateCounter()
    await (
        Client(driver)
        .request()
        .with_model("no-size")
        .with_messages(history(40))
        .with_prompt("now")
        .with_token_counter(counter)
        .run()
    )
    assert counter.count(driver.calls[1].messages, ()) <= 600


@pytest.mark.anyio
async def test_both_limiting_steps_of_a_retried_round_are_in_the_ledger() -> None:
    refusal = ContextLengthExceededError("too long", prompt_tokens=1500, context_limit=1000)
    driver = ScriptedDriver([refusal, "ok"])
    result = await (
        Client(driver, default_model=MODEL)
        .request()
        .with_messages(history(40))
        .with_prompt("now")
        .with_max_context_tokens(2400)
        .with_output_reserve_tokens(0)
        .run()
    )
    (round_,) = result.rounds
    assert round_.limiting is not None
    assert round_.retry_limiting is not None
    assert round_.limiting.dropped
    assert round_.retry_limiting.dropped
    assert result.limiting == (round_.limiting, round_.retry_limiting)
    assert round_.retry_limiting.tokens_before == round_.limiting.tokens_after


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("build", "problem"),
    [
        (lambda r: r.with_tools(5), "with_tools: tools must be a list of tools, not 5"),
        (lambda r: r.with_extra_body(5), "with_extra_body: extra_body must be a mapping, not 5"),
        (lambda r: r.with_stop(5), "with_stop: stop must be a string"),
        (
            lambda r: r.with_temperature("hot"),
            "with_temperature: temperature must be a finite number",
        ),
        (lambda r: r.with_top_p(float("nan")), "with_top_p: top_p must be a finite number"),
        (lambda r: r.with_seed(1.5), "with_seed: seed must be an int or None, not 1.5"),
        (
            lambda r: r.with_token_counter("o200k_base"),
            "with_token_counter: token_counter must be a TokenCounter",
        ),
    ],
)
async def test_wrong_builder_values_are_named_at_run_not_raised_obscurely(
    build: object, problem: str
) -> None:
    driver = ScriptedDriver(["unused"])
    request = build(Client(driver, default_model=MODEL).request().with_prompt("hi"))  # type: ignore[operator]
    with pytest.raises(InvalidRequestError, match=problem):
        await request.run()
    assert driver.calls == []


@pytest.mark.anyio
async def test_one_stop_string_is_one_stop_sequence() -> None:
    driver = ScriptedDriver(["ok"])
    await Client(driver, default_model=MODEL).request().with_prompt("hi").with_stop("END").run()
    assert driver.calls[0].sampling.stop == ("END",)


def test_a_counter_given_by_name_is_refused_where_it_is_given() -> None:
    from threadline.counting import set_default_token_counter

    with pytest.raises(TypeError):
        set_default_token_counter("o200k_base")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError):
        Client(ScriptedDriver(), token_counter="o200k_base")  # type: ignore[arg-type]
    with pytest.raises(InvalidRequestError, match="drop_oldest_units"):
        drop_oldest_units(5)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_a_request_changed_after_planning_sends_what_it_holds_when_run() -> None:
    # Planning keeps the transcript it built for the next plan of the same messages
    # (budget_resolution, then run); a change in between must still reach the model.
    driver = ScriptedDriver(["first", "second"])
    client = Client(driver, default_model=MODEL)
    request = client.request().with_system("Be brief.").with_messages(history(2))
    request.with_prompt("one")
    await request.budget_resolution()
    assert (await request.run()).text == "first"
    request.with_system("Be long.").with_messages(history(1)).with_prompt("two")
    await request.budget_resolution()
    assert (await request.run()).text == "second"
    first, second = driver.calls
    assert [m.text for m in first.messages] == ["Be brief.", *(m.text for m in history(2)), "one"]
    assert [m.text for m in second.messages] == ["Be long.", *(m.text for m in history(1)), "two"]


@pytest.mark.anyio
async def test_a_request_planned_twice_refuses_a_broken_history_both_times() -> None:
    request = Client(ScriptedDriver(["unused"]), default_model=MODEL).request()
    request.with_messages([calling(call("c1", "add"))]).with_prompt("hi")
    with pytest.raises(InvalidRequestError, match="cannot be sent as it is"):
        await request.budget_resolution()
    with pytest.raises(InvalidRequestError, match="cannot be sent as it is"):
        await request.run()


@pytest.mark.anyio
async def test_a_driver_built_on_driver_inherits_its_optional_powers() -> None:
    from collections.abc import AsyncIterator
    from contextlib import asynccontextmanager

    from threadline import Usage
    from threadline.counting import DefaultReplayProjection
    from threadline.drivers import Driver, ProviderCall, ProviderResponse, StreamChunk

    class Minimal(Driver):
        """Only what every driver must say; exact counting, loading and closing are inherited."""

        name = "minimal"

        async def complete(self, call: ProviderCall) -> ProviderResponse:
            return ProviderResponse(
                message=Message.assistant("ok"), finish_reason="stop", usage=Usage(), model="m"
            )

        @asynccontextmanager
        async def stream(self, call: ProviderCall) -> AsyncIterator[AsyncIterator[StreamChunk]]:
            raise NotImplementedError
            yield

        def token_counter(self) -> None:
            return None

        def replay_projection(self, model: Model) -> DefaultReplayProjection:
            return DefaultReplayProjection()

    driver = Minimal()
    assert driver.exact_token_counter(MODEL) is None
    await driver.load()
    async with Client(driver, default_model=MODEL) as client:
        assert (await client.request().with_prompt("hi").run()).text == "ok"
