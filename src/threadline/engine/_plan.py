"""``RunPlan``: a checked request, frozen, holding everything the run loop reads.

:func:`plan_run` turns what a builder collected (a model, the system message,
history, a prompt, tools and :class:`RequestSettings`) into a plan, or one
``InvalidRequestError`` naming every problem. The run loop (``_run``) consumes
plans and never sees a builder.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable, Sequence
from itertools import chain
from operator import is_
from typing import TYPE_CHECKING, Any, TypeAlias

import attrs

from threadline._errors import InvalidRequestError, TranscriptIntegrityError
from threadline._messages import Message, Role
from threadline._models import Model
from threadline._provider import Driver, HistorySpan, ProviderCall
from threadline._settings import RequestSettings
from threadline._validate import problem
from threadline.counting import default_token_counter, resolve_token_counter
from threadline.counting._calibration import TokenCalibration
from threadline.counting._protocol import TokenCounter
from threadline.counting._resolution import ExactCounter, resolve_exact_token_counter
from threadline.engine._deadline import CallDeadline
from threadline.engine._defaults import ClientDefaults
from threadline.engine._replay import check_transcript_reasoning
from threadline.limiting._budget import BudgetResolution, resolve_budget
from threadline.limiting._incremental import CheckedHistory
from threadline.limiting._ledger import ToolCallRepair
from threadline.limiting._prefix import SentPrompt
from threadline.limiting._repair import repair_tool_units
from threadline.limiting._units import check_integrity
from threadline.tools._output import OutputSpec, output_spec
from threadline.tools._tools import Tool, Toolset

if TYPE_CHECKING:
    from threadline.limiting._event import TokenLimitHandler

__all__ = [
    "RunPlan",
    "TranscriptMemo",
    "plan_run",
    "reply_cap",
    "settings_budget",
    "settings_counter",
]

_TOOL_CHOICES = ("auto", "none", "required")
_UNFORCED = (None, "auto", "none")


@attrs.frozen(kw_only=True)
class RunPlan:
    """A validated request, ready to run."""

    driver: Driver
    model: Model
    transcript: tuple[Message, ...]
    """The system message, the history (origin ``seed``) and the prompt, in order."""
    prompt_index: int | None
    toolset: Toolset
    counter: TokenCounter
    """The estimate (the counting chain's winner), never calibrated."""
    exact_counter: ExactCounter | None
    """What limiting asks near the budget; ``None``: the estimate decides alone."""
    exact_margin: float | None
    calibration: TokenCalibration | None
    """The client's calibration: scales the estimate, learns from every round."""
    resolution: BudgetResolution
    call_template: ProviderCall
    """Everything a round sends except its messages."""
    pre: TokenLimitHandler | None
    post: TokenLimitHandler | None
    max_rounds: int
    timeout: float | None = None
    """Each provider call's time limit, in seconds."""
    first_token_timeout: float | None = None
    """A streamed call's time limit for the first piece of its reply."""
    tool_timeout: float | None = None
    """The time limit of a tool call whose tool has none of its own."""
    checked_history: CheckedHistory | None = None
    """The history a conversation vouches for, where it stands in ``transcript``."""
    tool_call_repairs: tuple[ToolCallRepair, ...] = ()
    """What the request's repair of interrupted tool calls changed in its history."""
    output: OutputSpec | None = None
    """The request's ``output_type``, described; ``None``: a text answer."""
    output_retries: int = 0
    """Repair rounds a final answer that fails ``output`` gets."""
    output_instruction: str | None = None
    """What each call adds to its system message, when the driver cannot constrain the
    answer to ``output`` (its ``output_constraint`` is ``"prompt"``)."""

    @property
    def counted_tools(self) -> tuple[Tool, ...]:
        """What every count of a round prices as tools: the tools sent, and the output
        schema (sent as a field or a system note, priced as a tool declaration is)."""
        if self.output is None:
            return self.toolset.tools
        return (*self.toolset.tools, self.output.schema.counted_tool())

    previous_prompt: SentPrompt | None = None
    """What the call before this run's first sent (a conversation's previous turn):
    the first round's prompt is compared with it (``RoundRecord.cache``)."""

    def deadline(self, *, streaming: bool) -> CallDeadline:
        """The time limits of one provider call; the first-token one holds for streams."""
        return CallDeadline(
            timeout=self.timeout,
            first_token_timeout=self.first_token_timeout if streaming else None,
            provider=self.driver.name,
        )

    def call(
        self,
        messages: tuple[Message, ...],
        round_number: int,
        previous_response_id: str | None = None,
        history: HistorySpan | None = None,
    ) -> ProviderCall:
        """What round ``round_number`` sends: a forcing tool choice applies to the first
        round only, so the model can answer with the tools' results afterwards."""
        choice = self.call_template.tool_choice
        if round_number > 1 and choice not in _UNFORCED:
            choice = "auto"
        if self.output_instruction is not None:
            instructed = with_instruction(messages, self.output_instruction)
            if history is not None and len(instructed) > len(messages):
                # A system message of its own went in front of the history.
                history = attrs.evolve(history, offset=history.offset + 1)
            messages = instructed
        return attrs.evolve(
            self.call_template,
            messages=messages,
            tool_choice=choice,
            previous_response_id=previous_response_id,
            history=history,
        )


def with_instruction(messages: tuple[Message, ...], instruction: str) -> tuple[Message, ...]:
    """``messages`` with ``instruction`` closing the system message (a new one first when
    there is none); only the call carries it, never the transcript."""
    if messages and messages[0].role is Role.SYSTEM:
        first = messages[0]
        joined = f"{first.text}\n\n{instruction}" if first.text else instruction
        return (Message.system(joined, origin=first.origin), *messages[1:])
    return (Message.system(instruction), *messages)


_Built: TypeAlias = tuple[
    tuple[Message, ...], int | None, CheckedHistory | None, tuple[ToolCallRepair, ...]
]
"""A plan's transcript, where its prompt stands, the history it vouches for, and what
was repaired of it."""


@attrs.define(eq=False)
class TranscriptMemo:
    """The transcript the last plan of a request built, for the next plan of the same inputs.

    A request's system text, history, prompt and checked history are
    immutable, so a plan of the very same objects builds, checks and refuses
    exactly what the last one did. A caller that asks for the budget and then
    runs plans twice: the second plan reuses the first's transcript instead of
    copying the history again.
    """

    inputs: tuple[object, ...] = ()
    built: _Built | None = None

    def reuse(self, inputs: tuple[object, ...]) -> _Built | None:
        """What was built from these very objects (by identity), else ``None``."""
        if self.built is None or len(inputs) != len(self.inputs):
            return None
        return self.built if all(map(is_, inputs, self.inputs)) else None

    def keep(self, inputs: tuple[object, ...], built: _Built) -> None:
        self.inputs, self.built = inputs, built


def plan_run(
    defaults: ClientDefaults,
    *,
    model: Model | None,
    system: str | None,
    history: Sequence[Message],
    prompt: Message | None,
    tools: Iterable[Tool | Any],
    settings: RequestSettings,
    problems: Sequence[str] = (),
    cache_key: str | None = None,
    checked_history: CheckedHistory | None = None,
    memo: TranscriptMemo | None = None,
) -> RunPlan:
    """Check a request and freeze it into a plan.

    ``defaults`` are the client's: its driver, counters and calibration.
    ``problems`` are what the builder already found; they come first in the error.
    ``cache_key`` goes to every call (see ``Request.with_cache_key``).
    ``checked_history`` is a conversation's word that ``history`` is whole
    (see ``limiting._incremental``): it is not checked again. ``memo`` keeps
    the transcript built, for the next plan of the same messages.

    Raises:
        InvalidRequestError: every problem at once (no model, tools that cannot
            be used, a tool choice naming no tool, a history whose tool units are
            broken), a message whose reasoning replay state is refused (see
            ``threadline.engine._replay``), or a reserve that fills an explicit limit.
    """
    found = list(problems)
    if model is None:
        found.append("no model: call with_model() or give the Client a default_model")
    toolset = _toolset(tools, found)
    _check_tool_choice(settings.tool_choice, toolset, found)
    if found:
        raise InvalidRequestError("invalid request: " + "; ".join(found))
    assert model is not None
    assert toolset is not None
    repair = settings.repair_interrupted_tool_calls
    inputs = (system, history, prompt, checked_history, repair)
    built = memo.reuse(inputs) if memo is not None else None
    if built is None:
        built = _built(system, history, prompt, checked_history, repair=repair)
        if memo is not None:
            memo.keep(inputs, built)
    transcript, prompt_index, checked_history, repairs = built
    resolution = settings_budget(settings, model)
    counter = _plan_counter(settings, defaults, model)
    output = None if settings.output_type is None else output_spec(settings.output_type)
    instruction = None
    if output is not None and defaults.driver.output_constraint(model) == "prompt":
        instruction = output.schema.instruction()
    template = ProviderCall(
        model=model,
        messages=(),
        tools=toolset.tools,
        tool_choice=settings.tool_choice,
        max_output_tokens=reply_cap(settings, model),
        sampling=settings.sampling(),
        extra_body=dict(settings.extra_body),
        cache_key=cache_key,
        output=None if output is None else output.schema,
    )
    return RunPlan(
        driver=defaults.driver,
        model=model,
        transcript=transcript,
        prompt_index=prompt_index,
        toolset=toolset,
        counter=counter,
        exact_counter=resolve_exact_token_counter(
            settings.exact_token_counter, defaults.exact_token_counter, defaults.driver, model
        ),
        exact_margin=settings.exact_count_margin,
        calibration=defaults.calibration,
        resolution=resolution,
        call_template=template,
        pre=settings.pre_max_tokens_reached,
        post=settings.post_max_tokens_reached,
        max_rounds=settings.max_rounds,
        timeout=settings.timeout,
        first_token_timeout=settings.first_token_timeout,
        tool_timeout=settings.tool_timeout,
        checked_history=checked_history,
        tool_call_repairs=repairs,
        output=output,
        output_retries=settings.output_retries,
        output_instruction=instruction,
    )


def reply_cap(settings: RequestSettings, model: Model) -> int | None:
    """The ``max_output_tokens`` a request sends: its own, else the model's.

    Raises:
        InvalidRequestError: the request asks for more than the model's
            ``max_output_tokens``, the most it writes in one reply.
    """
    asked, ceiling = settings.max_output_tokens, model.max_output_tokens
    if asked is None:
        return ceiling
    if ceiling is not None and asked > ceiling:
        raise InvalidRequestError(
            f"max_output_tokens {asked} is more than model {model.name!r} writes in one "
            f"reply (its max_output_tokens is {ceiling}); ask for at most {ceiling}, or "
            f"leave it unset to get {ceiling}"
        )
    return asked


def settings_budget(settings: RequestSettings, model: Model) -> BudgetResolution:
    """The budget ``settings`` resolve to for ``model`` (see ``resolve_budget``).

    Raises:
        InvalidRequestError: an explicit limit the reserve fills, or a
            ``max_output_tokens`` above the model's.
    """
    reply_cap(settings, model)
    return resolve_budget(
        model,
        max_context_tokens=settings.max_context_tokens,
        output_reserve_tokens=settings.output_reserve_tokens,
        max_output_tokens=settings.max_output_tokens,
    )


def settings_counter(
    settings: RequestSettings, defaults: ClientDefaults, model: Model
) -> TokenCounter:
    """The counter a request counts with: settings → client → driver → default → built-in.

    ``defaults`` is the client's (``Client.defaults``).
    """
    return resolve_token_counter(
        settings.token_counter, defaults.token_counter, defaults.driver, model
    )


_resolved: weakref.WeakKeyDictionary[Driver, tuple[tuple[object, ...], TokenCounter]] = (
    weakref.WeakKeyDictionary()
)
"""Per driver: what its last plan's counter was resolved from, and that counter."""


def _plan_counter(
    settings: RequestSettings, defaults: ClientDefaults, model: Model
) -> TokenCounter:
    """``settings_counter``: the very counter of the driver's last plan when it is
    resolved from the same things. A counter made anew each plan (a model counter
    bound to the driver's projection) prices as the last one did, but only the
    same one lets a conversation carry the count of its history over from turn to
    turn (``history_tokens``) instead of counting it again."""
    driver = defaults.driver
    key = (
        settings.token_counter,
        defaults.token_counter,
        model,
        default_token_counter(),
        driver.token_counter(),
        driver.replay_projection(model),  # equal projections: a counter prices alike
    )
    last = _resolved.get(driver)
    if last is not None and all(map(is_, last[0][:-1], key[:-1])) and last[0][-1] == key[-1]:
        return last[1]
    counter = settings_counter(settings, defaults, model)
    _resolved[driver] = (key, counter)
    return counter


def _toolset(tools: Iterable[Tool | Any], problems: list[str]) -> Toolset | None:
    try:
        # Functions become tools and tool sources (MCP servers) offer their tools now.
        return Toolset(tuple(tools))
    except (InvalidRequestError, TypeError) as exc:
        problems.append(str(exc))
        return None


def _check_tool_choice(choice: str | None, toolset: Toolset | None, problems: list[str]) -> None:
    if choice is None or choice in _TOOL_CHOICES:
        return
    names = toolset.names if toolset is not None else ()
    if choice not in names:
        expected = (
            "'auto', 'none', 'required' or the name of one of the tools "
            f"({', '.join(names) or 'none given'})"
        )
        problems.append(problem("tool_choice", expected, choice))


def _built(
    system: str | None,
    history: Sequence[Message],
    prompt: Message | None,
    checked_history: CheckedHistory | None,
    *,
    repair: bool = False,
) -> _Built:
    """The plan's transcript, checked (its interrupted tool calls repaired when
    ``repair``), with the history it vouches for placed in it."""
    vouched = checked_history is not None and checked_history.messages is history
    offset = 0 if system is None else 1
    repairs: tuple[ToolCallRepair, ...] = ()
    if not vouched:
        checked_history = None
        if repair:  # a history vouched for is whole already
            history, repairs = repair_tool_units(history, offset=offset)
    elif checked_history is not None:
        checked_history = attrs.evolve(checked_history, offset=offset)
    transcript, prompt_index = _transcript(system, history, prompt, checked=checked_history)
    return transcript, prompt_index, checked_history, repairs


def _transcript(
    system: str | None,
    history: Sequence[Message],
    prompt: Message | None,
    *,
    checked: CheckedHistory | None,
) -> tuple[tuple[Message, ...], int | None]:
    head = () if system is None else (_system_message(system),)
    tail = () if prompt is None else (prompt,)
    # One pass over a long history: unpacking goes through a list (a copy, a
    # second into the tuple, a third to free the list), each touching every
    # message's reference count; a tuple made from a chain touches each once.
    transcript = tuple(chain(head, history, tail))
    prompt_index = None if prompt is None else len(transcript) - 1
    try:
        # A checked history is whole and has no system message; around it stand a
        # system message and a user prompt, which break no tool unit.
        if checked is None:
            check_integrity(transcript)
    except TranscriptIntegrityError as exc:
        hint = ""
        if _repairable(history):
            hint = (
                "; if a tool call was interrupted (or a result lost its call), "
                "with_repair_interrupted_tool_calls(True) mends the history instead"
            )
        raise InvalidRequestError(f"the history cannot be sent as it is: {exc}{hint}") from None
    # Refused replay state fails the request here, before limiting or any driver sees it.
    check_transcript_reasoning(transcript, checked)
    return transcript, prompt_index


_system_messages: weakref.WeakValueDictionary[str, Message] = weakref.WeakValueDictionary()
"""The system message made of each instructions text, while a transcript still holds it."""


def _system_message(text: str) -> Message:
    """``Message.system(text)``: the very one the last plans of ``text`` sent, while any
    transcript or kept prompt holds it. Every request of an agent opens with its
    instructions, and a thousand conversations each keeping their last prompt would
    otherwise keep a thousand equal messages (each priced once, too)."""
    message = _system_messages.get(text)
    if message is None:
        message = _system_messages[text] = Message.system(text)
    return message


def _repairable(history: Sequence[Message]) -> bool:
    """Whether :func:`repair_tool_units` would make ``history`` whole."""
    repaired, _ = repair_tool_units(history)
    try:
        check_integrity(repaired)
    except TranscriptIntegrityError:
        return False
    return True
