"""``Request``: the builder a user touches first.

The builder collects a model, the system message, history, a prompt, tools
and one :class:`RequestSettings` value (every ``with_*`` option evolves it).
``run()``, ``stream()`` and the budget helpers freeze it into a
:class:`~threadline.engine._plan.RunPlan`, which the run loop (``_run``) consumes.

The functions below the class are the builder's package-internal steps, for
a :class:`~threadline.Conversation`: :func:`with_checked_history` hands over
history it vouches for, :func:`planned` checks a request and returns its plan
(before the conversation writes anything), and :func:`run_plan` and
:func:`stream_plan` run that very plan, so a turn is planned once.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping, Sequence
from contextlib import aclosing, asynccontextmanager
from itertools import repeat
from operator import attrgetter, is_
from typing import TYPE_CHECKING, Any, Generic, Self, TypeVar, Unpack, cast, overload

import attrs

from threadline._errors import InvalidRequestError
from threadline._events import FinalResult, StreamEvent
from threadline._messages import Message, Origin, Role
from threadline._models import Model
from threadline._result import OutputT, RunResult
from threadline._sentinel import NOT_GIVEN, NotGiven
from threadline._settings import RequestSettings, SettingsChanges
from threadline._validate import problem
from threadline.counting._protocol import TokenCounter
from threadline.counting._resolution import ExactCounter
from threadline.engine._defaults import ClientDefaults
from threadline.engine._plan import RunPlan, TranscriptMemo, plan_run, settings_counter
from threadline.engine._replay import sent_form
from threadline.engine._run import Run
from threadline.engine._telemetry import instrument
from threadline.limiting._budget import Budget, BudgetResolution
from threadline.limiting._incremental import CheckedHistory
from threadline.tools._tools import Tool

if TYPE_CHECKING:
    from threadline.limiting._event import TokenLimitHandler

__all__ = ["Request", "planned", "run_plan", "stream_plan", "with_checked_history"]

_SETTING_NAMES = frozenset(attrs.fields_dict(RequestSettings))
_ORIGIN = attrgetter("origin")


_DEFAULT_SETTINGS = RequestSettings()
_Answer = TypeVar("_Answer")


class Request(Generic[OutputT]):
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

    The options (``with_max_context_tokens`` to ``with_tool_timeout``) are one
    :class:`RequestSettings` value, read with :attr:`settings` and replaced
    whole with :meth:`with_settings`.

    Mistakes in the builder (no model, nothing to send, a negative limit, two
    tools with one name) raise ``InvalidRequestError`` from ``run``,
    ``stream`` and ``budget``, naming every problem.

    ``Request[T]`` is a request whose answer is a ``T`` (:meth:`with_output_type`);
    a plain ``Request`` answers with text.
    """

    def __init__(self, defaults: ClientDefaults) -> None:
        # The client's driver and defaults, as a value: a request never sees the Client.
        self._defaults = defaults
        self._model: Model | None = None
        self._system: str | None = None
        self._history: Sequence[Message] = ()
        self._prompt: Message | None = None
        self._tools: tuple[Any, ...] = ()
        self._settings = _DEFAULT_SETTINGS  # frozen: one shared value, validated once
        self._cache_key: str | None = None
        self._checked_history: CheckedHistory | None = None
        # Planning twice (budget_resolution, then run) builds the transcript once.
        self._memo = TranscriptMemo()
        # One entry per argument, so a later valid value clears an earlier mistake.
        self._problems: dict[str, str] = {}

    # -- what is sent -----------------------------------------------------------------

    def with_model(self, model: Model | str) -> Self:
        """The model to call. A bare name has no ``context_size``, hence no budget
        unless ``with_max_context_tokens`` is set."""
        if isinstance(model, str):
            model = Model(model)
        if self._check("with_model", "model", isinstance(model, Model), "a Model or a name", model):
            self._model = model
        return self

    def with_system(self, instructions: str | None) -> Self:
        """The system message, sent first and never dropped."""
        valid = instructions is None or isinstance(instructions, str)
        if self._check("with_system", "instructions", valid, "a str or None", instructions):
            self._system = instructions
        return self

    def with_cache_key(self, key: str | None) -> Self:
        """A stable key for what this request shares with earlier ones (``None``: none).

        Drivers whose provider routes its prompt cache by a key send it (the
        OpenAI driver as ``prompt_cache_key``); a ``Conversation`` sets one of
        its own, derived from its id.
        """
        valid = key is None or (isinstance(key, str) and bool(key))
        if self._check("with_cache_key", "cache_key", valid, "a non-empty str or None", key, "key"):
            self._cache_key = key
        return self

    def with_messages(self, messages: Iterable[Message]) -> Self:
        """The history to continue from (origin ``seed``)."""
        self._checked_history = None
        history = tuple(messages)
        # The checks run in C (map), so a long history that is already seed (a
        # conversation's) is taken as it is, not copied message by message.
        wrong = None
        if not all(map(isinstance, history, repeat(Message))):
            wrong = next(i for i, m in enumerate(history) if not isinstance(m, Message))
        name = f"messages[{wrong}]"
        value = None if wrong is None else history[wrong]
        if self._check("with_messages", "messages", wrong is None, "a Message", value, name):
            if not all(map(is_, map(_ORIGIN, history), repeat(Origin.SEED))):
                history = tuple(m.with_origin(Origin.SEED) for m in history)
            self._history = history
        return self

    def with_prompt(self, prompt: str | Message) -> Self:
        """The user's new message: this run's first ``turn`` message, always sent."""
        if isinstance(prompt, str):
            prompt = Message.user(prompt)
        valid = isinstance(prompt, Message) and prompt.role is Role.USER
        if self._check("with_prompt", "prompt", valid, "a str or a user Message", prompt):
            self._prompt = prompt.with_origin(Origin.TURN)
        return self

    def with_tools(self, tools: Iterable[Tool | Any]) -> Self:
        """Tools the model may call: ``Tool`` objects or plain functions."""
        valid = isinstance(tools, Iterable) and not isinstance(tools, str | bytes)
        if self._check("with_tools", "tools", valid, "a list of tools", tools):
            self._tools = tuple(tools)
        return self

    # -- the settings -----------------------------------------------------------------

    @property
    def settings(self) -> RequestSettings:
        """The options as set so far (a frozen value)."""
        return self._settings

    def with_settings(self, settings: RequestSettings) -> Self:
        """Replace every option at once (what an ``Agent`` or a ``Conversation`` does)."""
        valid = isinstance(settings, RequestSettings)
        if self._check("with_settings", "settings", valid, "a RequestSettings", settings):
            self._settings = settings
            for name in _SETTING_NAMES:
                self._problems.pop(name, None)
        return self

    def with_tool_choice(self, choice: str | None) -> Self:
        """``"auto"``, ``"none"``, ``"required"`` or a tool's name.

        A forcing choice (``"required"`` or a name) applies to the first round
        only; later rounds use ``"auto"`` so the model can answer with the
        tools' results instead of calling again until ``with_max_rounds``.
        """
        return self._change("with_tool_choice", tool_choice=choice)

    def with_max_context_tokens(self, tokens: int | None) -> Self:
        """The context limit: prompt and reply together. Unset: the model's ``context_size``."""
        return self._change("with_max_context_tokens", max_context_tokens=tokens)

    def with_output_reserve_tokens(self, tokens: int | NotGiven = NOT_GIVEN) -> Self:
        """Room kept for the reply, taken off the limit. ``0`` is a real value.

        Unset: ``with_max_output_tokens`` when set, otherwise 4096.
        """
        return self._change("with_output_reserve_tokens", output_reserve_tokens=tokens)

    def with_max_output_tokens(self, tokens: int | None) -> Self:
        """The most tokens the reply may have (sent to the provider)."""
        return self._change("with_max_output_tokens", max_output_tokens=tokens)

    def with_temperature(self, temperature: float | None) -> Self:
        """Sampling temperature; ``None`` leaves the provider's default."""
        return self._change("with_temperature", temperature=temperature)

    def with_top_p(self, top_p: float | None) -> Self:
        """Nucleus sampling; ``None`` leaves the provider's default."""
        return self._change("with_top_p", top_p=top_p)

    def with_seed(self, seed: int | None) -> Self:
        """A sampling seed, for providers that honour one."""
        return self._change("with_seed", seed=seed)

    def with_stop(self, stop: str | Sequence[str] | None) -> Self:
        """Sequences that end the reply: one string, or several."""
        return self._change("with_stop", stop=stop)

    def with_presence_penalty(self, penalty: float | None) -> Self:
        """Presence penalty, for providers that take one."""
        return self._change("with_presence_penalty", presence_penalty=penalty)

    def with_frequency_penalty(self, penalty: float | None) -> Self:
        """Frequency penalty, for providers that take one."""
        return self._change("with_frequency_penalty", frequency_penalty=penalty)

    def with_extra_body(self, extra: Mapping[str, Any]) -> Self:
        """Provider-specific fields merged into the request body as given."""
        return self._change("with_extra_body", extra_body=extra)

    def with_token_counter(self, counter: TokenCounter | None) -> Self:
        """The request tier of the counting chain; it wins over every other tier."""
        return self._change("with_token_counter", token_counter=counter)

    def with_exact_token_counter(self, counter: ExactCounter | None) -> Self:
        """The request tier of the exact counter, which limiting asks only near the
        budget (see :meth:`with_exact_count_margin`); it wins over the client's and
        the driver's."""
        return self._change("with_exact_token_counter", exact_token_counter=counter)

    def with_exact_count_margin(self, margin: float | None) -> Self:
        """How near the budget, as a fraction of it, an estimate must come for the exact
        counter to be asked (default 0.1: above 90% of the budget). ``None`` never
        asks it; ``0`` asks only when the estimate is over the budget."""
        return self._change("with_exact_count_margin", exact_count_margin=margin)

    def pre_max_tokens_reached(self, handler: TokenLimitHandler | None) -> Self:
        """The handler run first when over budget; replaces ``drop_oldest_units(None)``."""
        return self._change("pre_max_tokens_reached", pre_max_tokens_reached=handler)

    def post_max_tokens_reached(self, handler: TokenLimitHandler | None) -> Self:
        """The handler run when still over budget after Pre. No default."""
        return self._change("post_max_tokens_reached", post_max_tokens_reached=handler)

    def with_max_rounds(self, rounds: int) -> Self:
        """The most provider calls one run may make (default 10)."""
        return self._change("with_max_rounds", max_rounds=rounds)

    def with_timeout(self, seconds: float | None) -> Self:
        """The most seconds each provider call may take as a whole, from sending to
        the reply's last byte, the driver's retries included; past it the run
        raises ``RequestTimeoutError``. ``None``: no limit beyond the driver's own."""
        return self._change("with_timeout", timeout=seconds)

    def with_first_token_timeout(self, seconds: float | None) -> Self:
        """The most seconds a streamed call may wait for the first piece of its reply
        (text, reasoning or a tool call); past it the run raises ``RequestTimeoutError``."""
        return self._change("with_first_token_timeout", first_token_timeout=seconds)

    def with_tool_timeout(self, seconds: float | None) -> Self:
        """The time limit of each call to a tool without a ``timeout`` of its own; a
        call past it is an error result the model reads, and the run goes on."""
        return self._change("with_tool_timeout", tool_timeout=seconds)

    def with_repair_interrupted_tool_calls(self, repair: bool = True) -> Self:
        """Mend a history whose tool units an interruption broke, instead of refusing it.

        A call without a result (a process died while the tool ran) gets a
        result saying it was interrupted; a result for no call is dropped.
        Each repair is recorded (``RunResult.tool_calls_repaired``). Off by
        default: such a history raises ``InvalidRequestError`` naming the message.
        """
        return self._change(
            "with_repair_interrupted_tool_calls", repair_interrupted_tool_calls=repair
        )

    @overload
    def with_output_type(self, output_type: type[_Answer]) -> Request[_Answer]: ...
    @overload
    def with_output_type(self, output_type: None) -> Request[str]: ...
    @overload
    def with_output_type(self, output_type: Any) -> Request[Any]: ...

    def with_output_type(self, output_type: Any) -> Request[Any]:
        """The type the final answer must be (``None``: text): an attrs class, a
        dataclass, a ``TypedDict``, a primitive, a ``list[...]`` or a union of classes.

        The driver constrains the answer to the type's JSON schema where it can;
        ``RunResult.output`` is then the validated value, ``RunResult.text`` the
        raw answer. An answer that fails the type gets ``with_output_retries``
        repair rounds, then raises ``OutputValidationError`` (see
        docs/structured-output.md)::

            result = await client.request().with_prompt("...").with_output_type(Invoice).run()
            invoice: Invoice = result.output
        """
        self._change("with_output_type", output_type=output_type)
        return cast("Request[Any]", self)

    def with_output_retries(self, retries: int) -> Self:
        """How many repair rounds an answer that fails the output type gets (default 1):
        the model is shown the validation error and answers again."""
        return self._change("with_output_retries", output_retries=retries)

    def _change(self, method: str, **change: Unpack[SettingsChanges]) -> Self:
        # A builder mistake is named when the request is used, not where it is made.
        ((name, _),) = change.items()
        try:
            self._settings = self._settings.evolve(**change)
        except InvalidRequestError as exc:
            self._problems[name] = f"{method}: {exc}"
        else:
            self._problems.pop(name, None)
        return self

    def _check(
        self,
        method: str,
        key: str,
        valid: bool,
        expected: str,
        value: object,
        name: str | None = None,
    ) -> bool:
        if valid:
            self._problems.pop(key, None)
        else:
            self._problems[key] = f"{method}: {problem(name or key, expected, value)}"
        return valid

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

    async def token_counter(self) -> TokenCounter:
        """The counter this request counts with: the very object limiting will use.

        The counting chain's first match (the request's ``with_token_counter``,
        the client's, the driver's, the process default, the built-in),
        fitted to the resolved model: a ``ModelTokenCounter`` as its
        ``for_model(model)``, a built-in bound to the driver's replay projection.

        It needs a model (``with_model`` or the client's ``default_model``),
        not a prompt.

        Raises:
            InvalidRequestError: no model, or a builder mistake (see the class docstring).

        Example::

            counter = await request.token_counter()
            print(type(counter).__name__, counter.count(messages, tools))
        """
        model = self._model or self._defaults.default_model
        problems = list(self._problems.values())
        if model is None:
            problems.append("no model: call with_model() or give the Client a default_model")
        if problems:
            raise InvalidRequestError("invalid request: " + "; ".join(problems))
        assert model is not None
        return settings_counter(self._settings, self._defaults, model)

    async def is_token_limit_reached(self) -> bool:
        """Whether the transcript as built is over the prompt budget; ``False`` without one.

        It is counted as the driver would be handed it, after the replay rules.
        """
        plan = self._plan()
        budget = plan.resolution.budget
        if budget is None:
            return False
        handed = sent_form(plan.transcript, plan.driver, plan.model)
        return plan.counter.count(handed, plan.counted_tools) > budget.prompt_tokens

    # -- running ----------------------------------------------------------------------

    async def run(self) -> RunResult[OutputT]:
        """Run the request to its final answer.

        Raises:
            InvalidRequestError: the request is not valid.
            OutputValidationError: the answer failed the output type after its
                repair rounds (``with_output_retries``).
            HandlerError: a limiting handler left a broken transcript.
            MaxRoundsExceededError: the model kept calling tools.
            ProviderError: the provider failed (after the driver's retries).
        """
        return cast("RunResult[OutputT]", await run_plan(self._plan()))

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
        # Planned on entry: an invalid request is refused here, not on first iteration.
        async with stream_plan(self._plan()) as events:
            yield events

    def _plan(self) -> RunPlan:
        problems = list(self._problems.values())
        if self._prompt is None and not self._history:
            problems.append("nothing to send: call with_prompt() or with_messages()")
        return plan_run(
            self._defaults,
            model=self._model or self._defaults.default_model,
            system=self._system,
            history=self._history,
            prompt=self._prompt,
            tools=self._tools,
            settings=self._settings,
            problems=problems,
            cache_key=self._cache_key,
            checked_history=self._checked_history,
            memo=self._memo,
        )


def with_checked_history(request: Request, history: CheckedHistory) -> Request:
    """``request.with_messages(history.messages)``, for history a conversation vouches
    for: checked as its turns joined, so neither planning nor limiting walks it again."""
    # Seed messages all, as the conversation made them: nothing to check or copy.
    request._problems.pop("messages", None)
    request._history = history.messages
    request._checked_history = history
    return request


def planned(request: Request) -> RunPlan:
    """``request`` checked and frozen into the plan its run would run.

    Raises:
        InvalidRequestError: as ``Request.run`` (see the class docstring).
    """
    return request._plan()


async def run_plan(plan: RunPlan) -> RunResult[Any]:
    """Run ``plan`` to its final answer, as ``Request.run`` does."""
    async with aclosing(_events(plan, streaming=False)) as events:
        async for event in events:
            if isinstance(event, FinalResult):
                return event.result
    raise AssertionError("the run loop ended without a result")  # pragma: no cover


@asynccontextmanager
async def stream_plan(plan: RunPlan) -> AsyncIterator[AsyncIterator[StreamEvent]]:
    """Run ``plan``, yielding its events, as ``Request.stream`` does."""
    events = _events(plan, streaming=True)
    try:
        yield events
    finally:
        await events.aclose()


def _events(plan: RunPlan, *, streaming: bool) -> AsyncGenerator[StreamEvent, None]:
    """The events of a run of ``plan``, sent and observed through what telemetry hands it."""
    instruments = instrument(plan, streaming=streaming)
    return Run(plan, streaming=streaming, instruments=instruments).events()
