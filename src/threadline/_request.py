"""``Request``: the builder a user touches first, and the run loop behind it.

One round is: limit the transcript to the budget, send it, and when the model
calls tools, run them concurrently and append their results. Rounds repeat
until the model answers without calling a tool, or ``with_max_rounds`` is hit.
``run()`` and ``stream()`` drive the same loop; ``run()`` simply drains it.
"""

from __future__ import annotations

import logging
import math
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping, Sequence
from contextlib import aclosing, asynccontextmanager
from typing import TYPE_CHECKING, Any, Self

import attrs

from threadline._errors import (
    ContextLengthExceededError,
    InvalidRequestError,
    MaxRoundsExceededError,
    ProviderResponseError,
    TranscriptIntegrityError,
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
from threadline._messages import Message, Origin, Role
from threadline._models import Model
from threadline._provider import (
    ProviderCall,
    ProviderResponse,
    ReasoningChunk,
    ResponseDone,
    SamplingSettings,
    TextChunk,
)
from threadline._result import RoundRecord, RunResult
from threadline._sentinel import NOT_GIVEN, NotGiven
from threadline.counting import resolve_token_counter
from threadline.counting._protocol import TokenCounter, is_token_counter
from threadline.limiting._budget import Budget, BudgetResolution, is_int, resolve_budget
from threadline.limiting._engine import apply_limits
from threadline.limiting._event import TokenLimitHandler
from threadline.limiting._ledger import LimitingOutcome
from threadline.limiting._units import check_integrity
from threadline.tools._tools import Tool, Toolset, tool

if TYPE_CHECKING:
    from threadline._client import Client

__all__ = ["DEFAULT_MAX_ROUNDS", "Request"]

logger = logging.getLogger("threadline.request")

DEFAULT_MAX_ROUNDS = 10
"""Provider calls one run may make before ``MaxRoundsExceededError``."""

_TOOL_CHOICES = ("auto", "none", "required")
_CONTEXT_RETRY_MARGIN = 0.95
"""A tightened budget aims this far under what the provider said would fit."""


@attrs.frozen(kw_only=True)
class _Plan:
    """A validated request, ready to run."""

    model: Model
    transcript: tuple[Message, ...]
    prompt_index: int | None
    toolset: Toolset
    counter: TokenCounter
    resolution: BudgetResolution
    call_template: ProviderCall


class Request:
    """A request to a model, built step by step and then run.

    Every ``with_*`` returns the request itself, so calls chain::

        result = await (
            client.request()
            .with_model(Model("gpt-4o-mini", context_size=128_000))
            .with_system("You are terse.")
            .with_messages(history)
            .with_prompt("What did I ask before?")
            .run()
        )

    Mistakes in the builder (no model, nothing to send, a negative limit, two
    tools with one name) raise ``InvalidRequestError`` from ``run``,
    ``stream`` and ``budget``, naming the problem.
    """

    def __init__(self, client: Client) -> None:
        self._client = client
        self._model: Model | None = None
        self._system: str | None = None
        self._history: tuple[Message, ...] = ()
        self._prompt: Message | None = None
        self._tools: tuple[Any, ...] = ()
        self._tool_choice: str | None = None
        self._max_context_tokens: Any = None
        self._output_reserve: Any = NOT_GIVEN
        self._max_output_tokens: Any = None
        self._sampling: dict[str, Any] = {}
        self._extra_body: dict[str, Any] = {}
        self._counter: TokenCounter | None = None
        self._pre: TokenLimitHandler | None = None
        self._post: TokenLimitHandler | None = None
        self._max_rounds: Any = DEFAULT_MAX_ROUNDS
        self._problems: list[str] = []

    # -- the builder ----------------------------------------------------------------

    def with_model(self, model: Model | str) -> Self:
        """The model to call. A bare name has no ``context_size``, hence no budget
        unless ``with_max_context_tokens`` is set."""
        if isinstance(model, str):
            model = Model(model)
        if not isinstance(model, Model):
            self._problems.append(f"with_model takes a Model or a name, not {type(model).__name__}")
        else:
            self._model = model
        return self

    def with_system(self, instructions: str | None) -> Self:
        """The system message, sent first and never dropped."""
        if instructions is not None and not isinstance(instructions, str):
            self._problems.append("with_system takes a str")
        else:
            self._system = instructions
        return self

    def with_messages(self, messages: Iterable[Message]) -> Self:
        """The history to continue from (origin ``seed``)."""
        history = tuple(messages)
        for index, message in enumerate(history):
            if not isinstance(message, Message):
                self._problems.append(
                    f"with_messages: item {index} is a {type(message).__name__}, not a Message"
                )
                return self
        self._history = tuple(m.with_origin(Origin.SEED) for m in history)
        return self

    def with_prompt(self, prompt: str | Message) -> Self:
        """The user's new message: this run's first ``turn`` message, always sent."""
        if isinstance(prompt, str):
            prompt = Message.user(prompt)
        if not isinstance(prompt, Message) or prompt.role is not Role.USER:
            self._problems.append("with_prompt takes a str or a user Message")
        else:
            self._prompt = prompt.with_origin(Origin.TURN)
        return self

    def with_tools(self, tools: Iterable[Tool | Any]) -> Self:
        """Tools the model may call: ``Tool`` objects or plain functions."""
        if isinstance(tools, str | bytes) or not isinstance(tools, Iterable):
            self._problems.append(f"with_tools takes a list of tools, not {type(tools).__name__}")
        else:
            self._tools = tuple(tools)
        return self

    def with_tool_choice(self, choice: str | None) -> Self:
        """``"auto"``, ``"none"``, ``"required"`` or a tool's name.

        A forcing choice (``"required"`` or a name) applies to the first round
        only; later rounds use ``"auto"`` so the model can answer with the
        tools' results instead of calling again until ``with_max_rounds``.
        """
        self._tool_choice = choice
        return self

    def with_max_context_tokens(self, tokens: int | None) -> Self:
        """The context limit: prompt and reply together. Unset: the model's ``context_size``."""
        self._max_context_tokens = tokens
        return self

    def with_output_reserve_tokens(self, tokens: int | NotGiven = NOT_GIVEN) -> Self:
        """Room kept for the reply, taken off the limit. ``0`` is a real value.

        Unset: ``with_max_output_tokens`` when set, otherwise 4096.
        """
        self._output_reserve = tokens
        return self

    def with_max_output_tokens(self, tokens: int | None) -> Self:
        """The most tokens the reply may have (sent to the provider)."""
        self._max_output_tokens = tokens
        return self

    def with_temperature(self, temperature: float | None) -> Self:
        """Sampling temperature; ``None`` leaves the provider's default."""
        return self._set_number("temperature", temperature)

    def with_top_p(self, top_p: float | None) -> Self:
        """Nucleus sampling; ``None`` leaves the provider's default."""
        return self._set_number("top_p", top_p)

    def with_seed(self, seed: int | None) -> Self:
        """A sampling seed, for providers that honour one."""
        if seed is not None and not is_int(seed):
            self._problems.append(f"with_seed takes an int, not {seed!r}")
            return self
        return self._set_sampling("seed", seed)

    def with_stop(self, stop: str | Sequence[str] | None) -> Self:
        """Sequences that end the reply: one string, or several."""
        if isinstance(stop, str):
            stop = (stop,)
        if stop is not None and (
            not isinstance(stop, Sequence) or not all(isinstance(s, str) and s for s in stop)
        ):
            self._problems.append(f"with_stop takes a string or a list of strings, not {stop!r}")
            return self
        return self._set_sampling("stop", None if stop is None else tuple(stop))

    def with_presence_penalty(self, penalty: float | None) -> Self:
        """Presence penalty, for providers that take one."""
        return self._set_number("presence_penalty", penalty)

    def with_frequency_penalty(self, penalty: float | None) -> Self:
        """Frequency penalty, for providers that take one."""
        return self._set_number("frequency_penalty", penalty)

    def with_extra_body(self, extra: Mapping[str, Any]) -> Self:
        """Provider-specific fields merged into the request body as given."""
        if not isinstance(extra, Mapping):
            self._problems.append(f"with_extra_body takes a mapping, not {type(extra).__name__}")
        else:
            self._extra_body = dict(extra)
        return self

    def with_token_counter(self, counter: TokenCounter | None) -> Self:
        """The request tier of the counting chain; it wins over every other tier."""
        if counter is not None and not is_token_counter(counter):
            self._problems.append(
                f"with_token_counter takes a TokenCounter, not {type(counter).__name__}"
            )
        else:
            self._counter = counter
        return self

    def pre_max_tokens_reached(self, handler: TokenLimitHandler | None) -> Self:
        """The handler run first when over budget; replaces ``drop_oldest_units(None)``."""
        self._pre = self._check_handler("pre_max_tokens_reached", handler)
        return self

    def post_max_tokens_reached(self, handler: TokenLimitHandler | None) -> Self:
        """The handler run when still over budget after Pre. No default."""
        self._post = self._check_handler("post_max_tokens_reached", handler)
        return self

    def with_max_rounds(self, rounds: int) -> Self:
        """The most provider calls one run may make (default 10)."""
        self._max_rounds = rounds
        return self

    def _set_sampling(self, name: str, value: Any) -> Self:
        self._sampling[name] = value
        return self

    def _set_number(self, name: str, value: Any) -> Self:
        is_number = isinstance(value, int | float) and not isinstance(value, bool)
        if value is not None and not (is_number and math.isfinite(value)):
            self._problems.append(f"with_{name} takes a finite number, not {value!r}")
            return self
        return self._set_sampling(name, value)

    def _check_handler(
        self, where: str, handler: TokenLimitHandler | None
    ) -> TokenLimitHandler | None:
        if handler is not None and not callable(handler):
            self._problems.append(f"{where} takes a callable, not {type(handler).__name__}")
            return None
        return handler

    # -- inspection -------------------------------------------------------------------

    async def budget(self) -> Budget | None:
        """The resolved prompt budget, or ``None`` when none can be resolved.

        Why there is none is logged at DEBUG and given by :meth:`budget_resolution`.

        Raises:
            InvalidRequestError: the request is not valid (see the class docstring).
        """
        return (await self.budget_resolution()).budget

    async def budget_resolution(self) -> BudgetResolution:
        """The budget with the reason for it (or for its absence)."""
        return self._plan().resolution

    async def is_token_limit_reached(self) -> bool:
        """Whether the transcript as built is over the prompt budget; ``False`` without one."""
        plan = self._plan()
        budget = plan.resolution.budget
        if budget is None:
            return False
        return plan.counter.count(plan.transcript, plan.toolset.tools) > budget.prompt_tokens

    # -- running ----------------------------------------------------------------------

    async def run(self) -> RunResult:
        """Run the request to its final answer.

        Raises:
            InvalidRequestError: the request is not valid.
            HandlerError: a limiting handler left a broken transcript.
            MaxRoundsExceededError: the model kept calling tools.
            ProviderError: the provider failed (after the driver's retries).
        """
        async with aclosing(self._events(streaming=False)) as events:
            async for event in events:
                if isinstance(event, FinalResult):
                    return event.result
        raise AssertionError("the run loop ended without a result")  # pragma: no cover

    @asynccontextmanager
    async def stream(self) -> AsyncIterator[AsyncIterator[StreamEvent]]:
        """Run the request, yielding events as they happen.

        Leaving the ``async with`` early stops the run and closes the
        provider's stream::

            async with request.stream() as events:
                async for event in events:
                    if isinstance(event, TextDelta):
                        print(event.text, end="")
        """
        self._plan()  # refuse an invalid request on entry, not on first iteration
        events = self._events(streaming=True)
        try:
            yield events
        finally:
            await events.aclose()

    def _plan(self) -> _Plan:
        problems = list(self._problems)
        model = self._model or self._client.default_model
        if model is None:
            problems.append("no model: call with_model() or give the Client a default_model")
        if self._prompt is None and not self._history:
            problems.append("nothing to send: call with_prompt() or with_messages()")
        if not is_int(self._max_rounds) or self._max_rounds < 1:
            problems.append(f"with_max_rounds needs an int of 1 or more, not {self._max_rounds!r}")
        for name, value in (
            ("with_max_context_tokens", self._max_context_tokens),
            ("with_max_output_tokens", self._max_output_tokens),
        ):
            if value is not None and (not is_int(value) or value <= 0):
                problems.append(f"{name} needs a positive int, not {value!r}")
        reserve = self._output_reserve
        if not isinstance(reserve, NotGiven) and (not is_int(reserve) or reserve < 0):
            problems.append(
                f"with_output_reserve_tokens needs an int of 0 or more, not {reserve!r}"
            )
        toolset: Toolset | None = None
        try:
            toolset = Toolset(tuple(t if isinstance(t, Tool) else tool(t) for t in self._tools))
        except (InvalidRequestError, TypeError) as exc:
            problems.append(str(exc))
        choice = self._tool_choice
        if choice is not None and choice not in _TOOL_CHOICES:
            names = toolset.names if toolset is not None else ()
            if not isinstance(choice, str) or choice not in names:
                problems.append(
                    f"with_tool_choice({choice!r}): use 'auto', 'none', 'required' or the "
                    f"name of one of the tools ({', '.join(names) or 'none given'})"
                )
        if problems:
            raise InvalidRequestError("invalid request: " + "; ".join(problems))
        assert model is not None
        assert toolset is not None

        transcript: list[Message] = []
        if self._system is not None:
            transcript.append(Message.system(self._system))
        transcript.extend(self._history)
        prompt_index: int | None = None
        if self._prompt is not None:
            prompt_index = len(transcript)
            transcript.append(self._prompt)
        try:
            check_integrity(transcript)
        except TranscriptIntegrityError as exc:
            raise InvalidRequestError(f"the history cannot be sent as it is: {exc}") from None

        resolution = resolve_budget(
            model,
            max_context_tokens=self._max_context_tokens,
            output_reserve_tokens=self._output_reserve,
            max_output_tokens=self._max_output_tokens,
        )
        client = self._client
        counter = resolve_token_counter(self._counter, client.token_counter, client.driver, model)
        template = ProviderCall(
            model=model,
            messages=(),
            tools=toolset.tools,
            tool_choice=choice,
            max_output_tokens=self._max_output_tokens,
            sampling=SamplingSettings(**self._sampling),
            extra_body=dict(self._extra_body),
        )
        return _Plan(
            model=model,
            transcript=tuple(transcript),
            prompt_index=prompt_index,
            toolset=toolset,
            counter=counter,
            resolution=resolution,
            call_template=template,
        )

    async def _events(self, *, streaming: bool) -> AsyncGenerator[StreamEvent, None]:
        plan = self._plan()
        run = _Run(plan, self, streaming=streaming)
        async with aclosing(run.events()) as events:
            async for event in events:
                yield event


class _Run:
    """The state of one run: the engine's own transcript and the ledger."""

    def __init__(self, plan: _Plan, request: Request, *, streaming: bool) -> None:
        self.plan = plan
        self.driver = request._client.driver
        self.pre = request._pre
        self.post = request._post
        self.max_rounds: int = request._max_rounds
        self.streaming = streaming
        self.transcript: tuple[Message, ...] = plan.transcript
        self.prompt_index = plan.prompt_index
        self.turn_messages: list[Message] = (
            [] if plan.prompt_index is None else [plan.transcript[plan.prompt_index]]
        )
        self.rounds: list[RoundRecord] = []

    async def _limit(self, budget: Budget | None, round_number: int) -> LimitingOutcome:
        outcome = await apply_limits(
            self.transcript,
            tools=self.plan.toolset.tools,
            counter=self.plan.counter,
            budget=budget,
            pre=self.pre,
            post=self.post,
            round=round_number,
            prompt_index=self.prompt_index,
        )
        self.transcript = outcome.messages
        self.prompt_index = outcome.prompt_index
        return outcome

    def _call(self, round_number: int) -> ProviderCall:
        template = self.plan.call_template
        choice = template.tool_choice
        if round_number > 1 and choice not in (None, "auto", "none"):
            choice = "auto"
        return attrs.evolve(template, messages=self.transcript, tool_choice=choice)

    async def events(self) -> AsyncGenerator[StreamEvent, None]:
        budget = self.plan.resolution.budget
        for round_number in range(1, self.max_rounds + 1):
            outcome = await self._limit(budget, round_number)
            if outcome.record.limited:
                yield LimitApplied(record=outcome.record, round=round_number)
            estimated = outcome.record.tokens_after
            first_limiting = outcome.record if budget is not None else None
            retry_limiting = None
            context_retry = False
            response: ProviderResponse | None = None
            while response is None:
                emitted = False
                try:
                    if self.streaming:
                        call = self._call(round_number)
                        async with self.driver.stream(call) as chunks:
                            async for chunk in chunks:
                                if isinstance(chunk, TextChunk):
                                    emitted = True
                                    yield TextDelta(text=chunk.text, round=round_number)
                                elif isinstance(chunk, ReasoningChunk):
                                    emitted = True
                                    yield ReasoningDelta(text=chunk.text, round=round_number)
                                elif isinstance(chunk, ResponseDone):
                                    response = chunk.response
                        if response is None:
                            raise ProviderResponseError(
                                "the provider's stream ended without a complete response",
                                provider=self.driver.name,
                            )
                    else:
                        response = await self.driver.complete(self._call(round_number))
                except ContextLengthExceededError as exc:
                    if context_retry or emitted:
                        raise
                    context_retry = True
                    budget = _tightened_budget(budget, estimated, exc, self.plan)
                    logger.warning(
                        "the provider refused %d estimated tokens as too long (%s); "
                        "limiting again to %d tokens and retrying once",
                        estimated,
                        exc.message,
                        budget.prompt_tokens,
                    )
                    outcome = await self._limit(budget, round_number)
                    retry_limiting = outcome.record
                    if outcome.record.limited:
                        yield LimitApplied(record=outcome.record, round=round_number)
                    estimated = outcome.record.tokens_after

            reply = response.message.with_origin(Origin.TURN)
            if reply is not response.message:
                response = attrs.evolve(response, message=reply)
            self.transcript = (*self.transcript, reply)
            self.turn_messages.append(reply)
            calls = reply.tool_calls
            toolset = self.plan.toolset
            runnable = bool(calls) and all(
                (found := toolset.get(c.name)) is None or found.function is not None for c in calls
            )
            for tool_call in calls:
                yield ToolCallEvent(call=tool_call, round=round_number)
            if runnable:
                outcomes = await toolset.invoke_all(calls)
                injected: list[Message] = []
                for result in outcomes:
                    self.transcript = (*self.transcript, result.message)
                    self.turn_messages.append(result.message)
                    injected.extend(result.injected)
                    yield ToolResultEvent(
                        call=result.call,
                        message=result.message,
                        is_error=result.is_error,
                        round=round_number,
                    )
                self.transcript = (*self.transcript, *injected)
            record = RoundRecord(
                round=round_number,
                usage=response.usage,
                estimated_input_tokens=estimated,
                reported_input_tokens=response.usage.input_tokens or None,
                limiting=first_limiting,
                retry_limiting=retry_limiting,
                finish_reason=response.finish_reason,
                tool_calls=len(calls),
                context_retry=context_retry,
            )
            self.rounds.append(record)
            yield RoundDone(record=record)
            if not runnable:
                # No tool calls, or a call to a tool the caller runs itself:
                # the run ends and hands the transcript back.
                yield FinalResult(result=self._result(response, budget))
                return
        raise MaxRoundsExceededError(self.max_rounds)

    def _result(self, response: ProviderResponse, budget: Budget | None) -> RunResult:
        return RunResult(
            response=response,
            messages=self.transcript,
            rounds=tuple(self.rounds),
            budget=budget,
            turn_messages=tuple(self.turn_messages),
        )


def _tightened_budget(
    budget: Budget | None,
    estimated: int,
    error: ContextLengthExceededError,
    plan: _Plan,
) -> Budget:
    """A smaller budget after the provider said the prompt did not fit.

    The reply's room comes off the provider's limit too: the budget's reserve,
    or with no budget the request's ``max_output_tokens``. When the provider
    says how many tokens the prompt had and how many fit, the new budget is
    our estimate scaled by that ratio; when it gives only its limit, that
    limit less the reserve; always at most 90% of what was just refused, so
    the retry sends less.
    """
    reported, limit = error.prompt_tokens, error.context_limit
    reply_room = plan.call_template.max_output_tokens or 0
    reserve = budget.reserve if budget is not None else reply_room
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
    return Budget(limit=prompt_tokens + reserve, reserve=reserve)
