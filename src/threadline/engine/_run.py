"""The run loop: rounds of limit, send (with one context-length retry), tools, record.

One round is: limit the transcript to the budget, send it, and when the model
calls tools, run them concurrently and append their results. Rounds repeat
until the model answers without calling a tool, or the plan's ``max_rounds``
is hit. ``Request.run()`` and ``Request.stream()`` drive the same loop over a
:class:`RunPlan`; ``run()`` simply drains it.

The loop sends through the driver it is handed, runs tool calls through the
tool runner it is handed, and tells the observer it is handed where the run
and each round begin and end (``_instruments``). Telemetry wraps the first
two and is the third when someone traces; the loop does not know it.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from typing import Any

import attrs

from threadline._errors import (
    ContextLengthExceededError,
    MaxRoundsExceededError,
    OutputValidationError,
    ProviderResponseError,
)
from threadline._events import (
    FinalResult,
    LimitApplied,
    ReasoningDelta,
    RoundDone,
    StreamEvent,
    TextDelta,
    ToolCallEvent,
    ToolResultEvent,
)
from threadline._messages import Message, Origin
from threadline._provider import (
    ProviderResponse,
    ReasoningChunk,
    ResponseDone,
    StreamChunk,
    TextChunk,
)
from threadline._replay import label_of
from threadline._result import RoundRecord, RunResult
from threadline.counting._calibration import calibrated_estimate
from threadline.counting._deferred import Deferred, resolved
from threadline.counting._protocol import TokenCounter
from threadline.engine._instruments import Instruments
from threadline.engine._plan import RunPlan
from threadline.engine._replay import ReplayGuard
from threadline.limiting._budget import Budget
from threadline.limiting._engine import apply_limits
from threadline.limiting._incremental import CheckedHistory
from threadline.limiting._ledger import DroppedReasoning, LimitingOutcome, LimitingRecord
from threadline.limiting._prefix import CacheReport, SentPrompt, compare_prompts
from threadline.limiting._units import split_units
from threadline.tools._output import OutputProblem
from threadline.tools._tools import invoke_concurrently

__all__ = ["Run"]

logger = logging.getLogger("threadline.request")

_CONTEXT_RETRY_MARGIN = 0.95
"""A tightened budget aims this far under what the provider said would fit."""

_NOT_REPAIRED = {
    "length": "the answer was cut off at the output limit (raise max_output_tokens)",
    "content_filter": "the provider stopped the answer (content filter or refusal)",
    "refusal": "the model refused to answer",
}
"""Finish reasons whose failed answer raises at once: asking again would end the same way."""

_NO_OUTPUT: Any = object()


@attrs.define(kw_only=True)
class _Round:
    """What one round has found out so far."""

    number: int
    decided: int | Deferred[int] = 0
    """The count limiting decided on for what was sent (calibrated, when it was);
    made when first read where a bound decided (``counting._deferred``)."""
    raw_estimate: int | Deferred[int] = 0
    """The request counter's own estimate of what was sent."""
    calibrated: int | None = None
    exact: int | None = None
    """The exact count of what was sent, when one was taken of it."""
    sent: tuple[Message, ...] = ()
    history: CheckedHistory | None = None
    """The history a conversation vouches for, as it stands in ``sent``."""
    limiting: LimitingRecord | None = None
    retry_limiting: LimitingRecord | None = None
    context_retry: bool = False
    budget_reason: str = ""
    retry_reason: str | None = None
    emitted: bool = False
    """Whether this send already yielded reply text (then it is never retried)."""
    response: ProviderResponse | None = None
    runnable: bool = False
    reasoning_dropped: tuple[DroppedReasoning, ...] = ()
    output: Any = _NO_OUTPUT
    """The final answer's value, when the run has an ``output_type`` and it validated."""
    output_error: str | None = None
    """Why the final answer failed the ``output_type``, when a repair round follows."""
    cache: CacheReport | None = None

    @property
    def estimated(self) -> int:
        """:attr:`decided`, made now if it was not yet."""
        return resolved(self.decided)


class Run:
    """The state of one run: the engine's own transcript, the budget and the ledger."""

    def __init__(self, plan: RunPlan, *, streaming: bool, instruments: Instruments) -> None:
        self.plan = plan
        self.streaming = streaming
        self.budget: Budget | None = plan.resolution.budget
        self.budget_reason = plan.resolution.reason
        self.transcript: tuple[Message, ...] = plan.transcript
        self.prompt_index = plan.prompt_index
        self.turn_messages: list[Message] = (
            [] if plan.prompt_index is None else [plan.transcript[plan.prompt_index]]
        )
        self.rounds: list[RoundRecord] = []
        self.checked_history = plan.checked_history
        self.previous: SentPrompt | None = plan.previous_prompt  # what the last call sent
        self.driver = instruments.driver
        self.tools = instruments.tools
        self.observer = instruments.observer
        label = label_of(plan.driver.name, plan.model.name)
        self.replay = ReplayGuard(label, plan.driver.replay_rules(plan.model))

    async def events(self) -> AsyncGenerator[StreamEvent, None]:
        """Every event of the run, ending with ``FinalResult``.

        Raises:
            MaxRoundsExceededError: the model was still calling tools after the last round.
        """
        with self.observer.run():
            for number in range(1, self.plan.max_rounds + 1):
                current = _Round(number=number)
                with self.observer.round(current):
                    async with aclosing(self._send_round(current)) as sending:
                        async for event in sending:
                            yield event
                async with aclosing(self._run_tools(current)) as tools:
                    async for event in tools:
                        yield event
                self._check_output(current)
                yield RoundDone(record=self._record(current))
                if current.output_error is not None:
                    self._append(_repair_prompt(current.output_error))
                elif not current.runnable:
                    # No tool calls, or a call to a tool the caller runs itself:
                    # the run ends and hands the transcript back.
                    assert current.response is not None
                    result = self._result(current.response, current.output)
                    self.observer.finished(result)
                    yield FinalResult(result=result)
                    return
            raise MaxRoundsExceededError(self.plan.max_rounds)

    # -- structured output --------------------------------------------------------------

    def _check_output(self, current: _Round) -> None:
        """Validate a final answer against the ``output_type``: its value, or the error
        a repair round sends back, or ``OutputValidationError`` when none is left."""
        output, response = self.plan.output, current.response
        if output is None or response is None or current.runnable:
            return
        if response.message.tool_calls:
            return  # calls the caller runs: the run hands them back, nothing to validate
        try:
            current.output = output.parse(response.text)
        except OutputProblem as problem:
            repairs = sum(record.output_error is not None for record in self.rounds)
            cause = _NOT_REPAIRED.get(response.finish_reason)
            if cause is not None or repairs >= self.plan.output_retries:
                reason = problem.reason if cause is None else f"{cause}; {problem.reason}"
                raise OutputValidationError(
                    reason, text=response.text, path=problem.path, attempts=repairs + 1
                ) from None
            current.output_error = str(problem)
            logger.info("the answer failed the output type (%s); asking again", problem)

    # -- limiting and sending -----------------------------------------------------------

    def _counter(self, handed: Sequence[Message]) -> TokenCounter:
        """The estimate limiting counts ``handed`` with: calibrated, when the client
        calibrates (at its bound when the budget is near)."""
        plan = self.plan
        if plan.calibration is None:
            return plan.counter
        budget = None if self.budget is None else self.budget.prompt_tokens
        return plan.calibration.estimate(
            plan.model.name, plan.counter, handed, plan.counted_tools, budget=budget
        )

    def _exact_always(self) -> bool:
        """Whether the exact counter decides however far the estimate is from the budget.

        It does while the client's calibration has learned nothing of this model:
        until then the estimate's distance from the budget means little (o200k and
        a model's own tokenizer can differ threefold).
        """
        plan = self.plan
        calibration = plan.calibration
        if plan.exact_counter is None or calibration is None:
            return False
        tools = [tool.name for tool in plan.toolset.tools]
        return calibration.ratio(plan.model.name, tools) is None

    async def _limit(self, current: _Round) -> LimitingOutcome:
        # Limiting counts the transcript as the driver is handed it, after the
        # replay rules: what is counted is what is sent.
        given = self.transcript
        handed = self.replay.prepare(given, self.checked_history)
        counter = self._counter(handed.messages)
        outcome = await apply_limits(
            handed.messages,
            tools=self.plan.counted_tools,
            counter=counter,
            budget=self.budget,
            pre=self.plan.pre,
            post=self.plan.post,
            round=current.number,
            prompt_index=handed.position(self.prompt_index),
            exact_counter=self.plan.exact_counter,
            exact_margin=self.plan.exact_margin,
            exact_always=self._exact_always(),
            history=handed.history,
        )
        if outcome.record.handlers:
            self.checked_history = None  # a handler rewrote the history it vouched for
        self.transcript = self.replay.originals(outcome, given)
        self.prompt_index = outcome.prompt_index
        record = outcome.record
        current.sent = outcome.messages
        current.decided = record.tokens_sent()
        current.exact = record.exact_tokens_sent
        tools = self.plan.counted_tools
        if record.counted_by == "estimate":
            current.raw_estimate, current.calibrated = current.decided, None
        else:
            current.raw_estimate = self.plan.counter.count(current.sent, tools)
            # What is sent is shown at the count calibration gives it on its own: the
            # bound decided what to keep, but once the kept transcript fits the budget
            # even at its bound, its likeliest count is the fitted one.
            current.calibrated = (
                None
                if calibrated_estimate(counter) is None
                else self._counter(current.sent).count(current.sent, tools)
            )
        return outcome

    async def _send_round(self, current: _Round) -> AsyncGenerator[StreamEvent, None]:
        """Limit, then send until there is a response, retrying once when the
        provider says the prompt is too long (and nothing was shown yet)."""
        current.budget_reason = self.budget_reason
        outcome = await self._limit(current)
        if outcome.record.limited:
            yield LimitApplied(record=outcome.record, round=current.number)
        current.limiting = outcome.record
        while current.response is None:
            current.emitted = False
            try:
                async with aclosing(self._send(current)) as sent:
                    async for event in sent:
                        yield event
            except ContextLengthExceededError as exc:
                if current.context_retry or current.emitted or not self._droppable():
                    raise
                async with aclosing(self._limit_again(current, exc)) as limited:
                    async for event in limited:
                        yield event
        self._compare_prompt(current)

    def _compare_prompt(self, current: _Round) -> None:
        """Set ``current.cache``: how what the round sent relates to the prompt before
        it, beside what the provider said of its cache."""
        response = current.response
        assert response is not None
        tools = self.plan.toolset.tools
        steps = [r for r in (current.limiting, current.retry_limiting) if r is not None]
        usage = response.usage
        current.cache = CacheReport(
            prefix=compare_prompts(self.previous, current.sent, tools, steps, current.history),
            input_tokens=usage.input_tokens,
            cached_input_tokens=usage.cached_input_tokens,
            diagnosis=response.cache_diagnosis,
        )
        self.previous = SentPrompt(
            messages=current.sent,
            tools=tools,
            response_id=response.response_id or response.request_id,
            history=None if current.history is None else current.history.span(),
        )

    async def _send(self, current: _Round) -> AsyncGenerator[StreamEvent, None]:
        driver = self.driver
        handed = self.replay.prepare(self.transcript, self.checked_history)
        current.sent, current.reasoning_dropped = handed.messages, handed.dropped
        current.history = handed.history
        previous = self.previous
        call = self.plan.call(
            handed.messages,
            current.number,
            previous_response_id=None if previous is None else previous.response_id,
            history=None if handed.history is None else handed.history.span(),
        )
        deadline = self.plan.deadline(streaming=self.streaming)
        if not self.streaming:
            with deadline.bound():
                current.response = await driver.complete(call)
            return
        with deadline.bound():
            async with driver.stream(call) as chunks:
                # Entered per event only when there are limits to lift: once per token.
                handing_over = deadline.handed_over() if deadline.limited else None
                async for chunk in chunks:
                    deadline.first_token()
                    event = _event_of(chunk, current)
                    if event is None:
                        continue
                    if handing_over is None:
                        yield event
                    else:
                        async with handing_over:
                            yield event
        if current.response is None:
            raise ProviderResponseError(
                "the provider's stream ended without a complete response", provider=driver.name
            )

    async def _limit_again(
        self, current: _Round, error: ContextLengthExceededError
    ) -> AsyncGenerator[StreamEvent, None]:
        current.context_retry = True
        reply_room = self.plan.call_template.max_output_tokens or 0
        self.budget, current.retry_reason = tightened_budget(
            self.budget, current.estimated, error, reply_room
        )
        logger.warning("%s (%s); retrying once", current.retry_reason, error.message)
        self.budget_reason = f"set by round {current.number}'s retry: {current.retry_reason}"
        outcome = await self._limit(current)
        current.retry_limiting = outcome.record
        if outcome.record.limited:
            yield LimitApplied(record=outcome.record, round=current.number)

    def _droppable(self) -> bool:
        """Whether limiting could still send less: some unit is not pinned."""
        units = split_units(self.transcript, prompt_index=self.prompt_index)
        return any(not unit.pinned for unit in units)

    # -- tools and the record -----------------------------------------------------------

    async def _run_tools(self, current: _Round) -> AsyncGenerator[StreamEvent, None]:
        """Keep the reply; run the tools it calls when every one can be run here."""
        assert current.response is not None
        reply = current.response.message.with_origin(Origin.TURN)
        if reply is not current.response.message:
            current.response = attrs.evolve(current.response, message=reply)
        self._append(reply)
        calls = reply.tool_calls
        toolset = self.plan.toolset
        current.runnable = bool(calls) and all(
            (found := toolset.get(c.name)) is None or found.function is not None for c in calls
        )
        for tool_call in calls:
            yield ToolCallEvent(call=tool_call, round=current.number)
        if not current.runnable:
            return
        injected: list[Message] = []
        run_one = functools.partial(self.tools, round_number=current.number)
        for result in await invoke_concurrently(calls, run_one):
            self._append(result.message)
            injected.extend(result.injected)
            yield ToolResultEvent(
                call=result.call,
                message=result.message,
                is_error=result.is_error,
                round=current.number,
            )
        if injected:
            self.transcript = self.transcript + tuple(injected)

    def _append(self, message: Message) -> None:
        # Concatenation copies the transcript once; unpacking it into a new
        # tuple goes through a list (three passes over every message).
        self.transcript = self.transcript + (message,)  # noqa: RUF005
        self.turn_messages.append(message)

    def _record(self, current: _Round) -> RoundRecord:
        response = current.response
        assert response is not None
        reported = response.usage.input_tokens or None
        calibration = self.plan.calibration
        if calibration is not None and reported is not None:
            calibration.observe(
                self.plan.model.name,
                estimated_tokens=resolved(current.raw_estimate),
                reported_tokens=reported,
                tools=self.plan.toolset.names,
                sent=current.sent,
                counter=self.plan.counter,
                window=self.plan.model.context_size,
                reply=None if response.omitted_output else response.message,
                output_tokens=response.usage.output_tokens,
                reasoning_tokens=response.usage.reasoning_tokens,
            )
        record = RoundRecord(
            round=current.number,
            usage=response.usage,
            estimated_input_tokens=current.raw_estimate,
            calibrated_input_tokens=current.calibrated,
            exact_input_tokens=current.exact,
            reported_input_tokens=reported,
            limiting=current.limiting,
            budget_reason=current.budget_reason,
            retry_limiting=current.retry_limiting,
            retry_reason=current.retry_reason,
            finish_reason=response.finish_reason,
            tool_calls=len(response.message.tool_calls),
            context_retry=current.context_retry,
            reasoning_dropped=current.reasoning_dropped,
            replay_notes=response.replay_notes,
            tool_calls_repaired=self.plan.tool_call_repairs if current.number == 1 else (),
            output_error=current.output_error,
            cache=current.cache,
        )
        self.rounds.append(record)
        return record

    def _result(self, response: ProviderResponse, output: Any) -> RunResult[Any]:
        # Without an output_type the result's output stays its default: the text.
        valued = {} if output is _NO_OUTPUT else {"output": output}
        return RunResult(
            response=response,
            messages=self.transcript,
            rounds=tuple(self.rounds),
            budget=self.budget,
            turn_messages=tuple(self.turn_messages),
            last_prompt=self.previous,
            **valued,
        )


def _repair_prompt(error: str) -> Message:
    """The user message of a repair round: what was wrong, and to answer again."""
    return Message.user(
        f"Your answer does not match the required JSON schema: {error}. "
        "Answer again with only the corrected JSON value.",
        origin=Origin.TURN,
    )


def _event_of(chunk: StreamChunk, current: _Round) -> StreamEvent | None:
    """The event a stream chunk gives the caller; a ``ResponseDone`` ends the round's reply."""
    if isinstance(chunk, TextChunk):
        current.emitted = True
        return TextDelta(text=chunk.text, round=current.number)
    if isinstance(chunk, ReasoningChunk):
        current.emitted = True
        return ReasoningDelta(text=chunk.text, round=current.number)
    if isinstance(chunk, ResponseDone):
        current.response = chunk.response
    return None


def tightened_budget(
    budget: Budget | None,
    estimated: int,
    error: ContextLengthExceededError,
    reply_room: int,
) -> tuple[Budget, str]:
    """A smaller budget after the provider said the prompt did not fit, and a
    sentence for the ledger saying how it was made.

    The reply's room comes off the provider's limit too: the budget's reserve,
    or with no budget ``reply_room`` (the request's ``max_output_tokens``).
    A reserve that would leave the prompt less than half the provider's
    limit (a model whose ``context_size`` is larger than what the server
    runs) is shrunk to a quarter of that limit for the retry, rather than the
    history cut to nothing. When the provider says how many tokens the prompt
    had and how many fit, the new budget is our estimate scaled by that
    ratio; when it gives only its limit, that limit less the reserve; always
    at most 90% of what was just refused, so the retry sends less.
    """
    reported, limit = error.prompt_tokens, error.context_limit
    reserve = budget.reserve if budget is not None else reply_room
    shrunk = ""
    if limit and reserve > limit // 2:
        shrunk = (
            f"; the reserve of {reserve} tokens does not fit the provider's limit of "
            f"{limit}, so the retry keeps {limit // 4} for the reply"
        )
        reserve = limit // 4
    ceiling = estimated * 0.9
    if limit and reported and reported > 0:
        target = min(ceiling, estimated * max(limit - reserve, 1) / reported)
    elif limit:
        target = min(ceiling, max(limit - reserve, 1))
    else:
        target = ceiling
    prompt_tokens = math.floor(target * _CONTEXT_RETRY_MARGIN)
    if budget is not None:
        prompt_tokens = min(prompt_tokens, budget.prompt_tokens - 1)
    prompt_tokens = max(1, prompt_tokens)
    said = f"its limit is {limit}" if limit else "it gave no limit"
    reason = (
        f"the provider refused {estimated} estimated tokens as too long ({said}); "
        f"limited again to a prompt budget of {prompt_tokens}{shrunk}"
    )
    return Budget(limit=prompt_tokens + reserve, reserve=reserve), reason
