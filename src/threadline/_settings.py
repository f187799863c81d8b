"""``RequestSettings``: every knob of a request in one frozen value.

An :class:`~threadline.Agent`, a :class:`~threadline.Conversation` and a
:class:`~threadline.Request` hold one of these. Keyword arguments and the
``with_*`` builder methods make a new value with :meth:`RequestSettings.evolve`;
every value is checked when it is made (:mod:`threadline._validate`).

A new sampling option is one field here (and in ``SettingsChanges``, which
types the keyword arguments), one in ``SamplingSettings`` and its translation
in each driver.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

import attrs

from threadline._provider import SamplingSettings
from threadline._sentinel import NOT_GIVEN, NotGiven
from threadline._validate import (
    attrs_check,
    callable_or_none,
    fail,
    finite_number_or_none,
    int_at_least,
    int_or_none,
    non_negative_int,
    positive_int_or_none,
    positive_seconds_or_none,
)
from threadline.counting._protocol import (
    TokenCounter,
    is_async_token_counter,
    is_token_counter,
)
from threadline.counting._resolution import ExactCounter
from threadline.tools._output import output_spec

if TYPE_CHECKING:
    from threadline.limiting._event import TokenLimitHandler

__all__ = [
    "DEFAULT_EXACT_COUNT_MARGIN",
    "DEFAULT_MAX_ROUNDS",
    "DEFAULT_OUTPUT_RETRIES",
    "RequestSettings",
    "SettingsChanges",
    "exact_counter_or_none",
    "token_counter_or_none",
]

DEFAULT_MAX_ROUNDS = 10
"""Provider calls one run may make before ``MaxRoundsExceededError``."""


DEFAULT_OUTPUT_RETRIES = 1
"""Repair rounds a structured answer that fails its type gets before ``OutputValidationError``."""


DEFAULT_EXACT_COUNT_MARGIN = 0.1
"""How close to the budget (as a fraction of it) an estimate must come for the exact
counter to be asked."""


def _reserve(name: str, value: Any) -> None:
    if not isinstance(value, NotGiven):
        non_negative_int(name, value)


def _stop(name: str, value: Any) -> None:
    if value is not None and not (
        isinstance(value, tuple) and all(isinstance(s, str) and s for s in value)
    ):
        fail(name, "a string, a list of non-empty strings or None", value)


def _stop_tuple(value: Any) -> Any:
    if isinstance(value, str):
        return (value,)
    if isinstance(value, Sequence):
        return tuple(value)
    return value  # refused by the validator, naming what was given


def _tool_choice(name: str, value: Any) -> None:
    # Whether a name is one of the tools is checked when the request is planned.
    if value is not None and not isinstance(value, str):
        fail(name, "'auto', 'none', 'required', a tool's name or None", value)


def token_counter_or_none(name: str, value: Any) -> TokenCounter | None:
    """``value`` when it is ``None`` or a :class:`TokenCounter` (never a name)."""
    if is_async_token_counter(value):
        fail(
            name,
            "a TokenCounter whose count is synchronous (an AsyncTokenCounter, which awaits "
            "a round trip, goes in exact_token_counter)",
            value,
        )
    if value is not None and not is_token_counter(value):
        fail(name, "a TokenCounter (an object with count(messages, tools)) or None", value)
    counter: TokenCounter | None = value
    return counter


def exact_counter_or_none(name: str, value: Any) -> ExactCounter | None:
    """``value`` when it is ``None``, an :class:`AsyncTokenCounter` or a :class:`TokenCounter`."""
    if value is not None and not (is_async_token_counter(value) or is_token_counter(value)):
        fail(name, "an AsyncTokenCounter, a TokenCounter or None", value)
    counter: ExactCounter | None = value
    return counter


def _margin(name: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        fail(name, "a fraction of the budget from 0 up to (not including) 1, or None", value)


def _bool(name: str, value: Any) -> None:
    if not isinstance(value, bool):
        fail(name, "a bool", value)


def _extra_body(name: str, value: Any) -> None:
    if not isinstance(value, Mapping):
        fail(name, "a mapping", value)


def _output_type(name: str, value: Any) -> None:
    # Described now, so a type without a JSON schema is refused where it is given.
    if value is not None:
        output_spec(value)


_EMPTY: Mapping[str, Any] = MappingProxyType({})


def _frozen_mapping(value: Any) -> Any:
    if not isinstance(value, Mapping):
        return value
    # Empty, the usual case, is one shared value: every copy of the settings (one per
    # conversation) would otherwise hold a dict and a proxy of its own.
    return MappingProxyType(dict(value)) if value else _EMPTY


def _number() -> Any:
    return attrs.field(default=None, validator=attrs_check(finite_number_or_none))


def _seconds() -> Any:
    return attrs.field(default=None, validator=attrs_check(positive_seconds_or_none))


@attrs.frozen(kw_only=True, repr=False)
class RequestSettings:
    """What a request is sent with, besides its model, messages and tools.

    Budget (see docs/limiting.md): ``max_context_tokens`` (the limit; unset,
    the model's ``context_size``), ``output_reserve_tokens`` (room kept for the
    reply, ``0`` included; unset, ``max_output_tokens``, else 4096) and
    ``max_output_tokens`` (sent to the provider). Sampling: ``temperature``,
    ``top_p``, ``seed``, ``stop``, ``presence_penalty``, ``frequency_penalty``
    (``None`` leaves the provider's default). ``tool_choice``, ``max_rounds``,
    ``token_counter`` (the request tier of the counting chain),
    ``exact_token_counter`` (the request tier of the exact counter, asked
    only near the budget) and ``exact_count_margin`` (how near: a fraction
    of the prompt budget, default 0.1; ``None`` never asks), the limiting
    handlers ``pre_max_tokens_reached`` / ``post_max_tokens_reached`` and
    ``extra_body`` (provider-specific fields merged into the body).

    ``repair_interrupted_tool_calls`` (default ``False``: refused) mends a
    history whose tool units an interruption broke: a call without a result
    gets one saying it was interrupted, a result for no call is dropped, and
    ``RoundRecord.tool_calls_repaired`` lists each repair (docs/requests.md).

    Structured output (docs/structured-output.md): ``output_type`` (``None``:
    a text answer) is the type the final answer must be, an attrs class, a
    dataclass, a ``TypedDict``, a primitive, a ``list[...]`` or a union of
    classes; ``output_retries`` (default 1) how many repair rounds an answer
    that fails it gets before ``OutputValidationError``.

    Time limits, in seconds (``None``: none; see docs/requests.md):
    ``timeout`` bounds each provider call as a whole, the driver's retries
    included; ``first_token_timeout`` bounds a stream's wait for the first
    piece of its reply; ``tool_timeout`` bounds each tool call of a tool
    without a ``timeout`` of its own.

    Raises:
        InvalidRequestError: a value of the wrong type or sign, naming it.

    Example::

        settings = RequestSettings(max_context_tokens=32_000, temperature=0.2)
        agent = Agent(client, model=model, settings=settings)
        colder = settings.evolve(temperature=0.0)
    """

    max_context_tokens: int | None = attrs.field(
        default=None, validator=attrs_check(positive_int_or_none)
    )
    output_reserve_tokens: int | NotGiven = attrs.field(
        default=NOT_GIVEN, validator=attrs_check(_reserve)
    )
    max_output_tokens: int | None = attrs.field(
        default=None, validator=attrs_check(positive_int_or_none)
    )
    temperature: float | None = _number()
    top_p: float | None = _number()
    seed: int | None = attrs.field(default=None, validator=attrs_check(int_or_none))
    stop: tuple[str, ...] | None = attrs.field(
        default=None, converter=_stop_tuple, validator=attrs_check(_stop)
    )
    presence_penalty: float | None = _number()
    frequency_penalty: float | None = _number()
    tool_choice: str | None = attrs.field(default=None, validator=attrs_check(_tool_choice))
    max_rounds: int = attrs.field(
        default=DEFAULT_MAX_ROUNDS,
        validator=attrs_check(lambda name, value: int_at_least(name, value, 1)),
    )
    token_counter: TokenCounter | None = attrs.field(
        default=None, validator=attrs_check(token_counter_or_none)
    )
    exact_token_counter: ExactCounter | None = attrs.field(
        default=None, validator=attrs_check(exact_counter_or_none)
    )
    exact_count_margin: float | None = attrs.field(
        default=DEFAULT_EXACT_COUNT_MARGIN, validator=attrs_check(_margin)
    )
    pre_max_tokens_reached: TokenLimitHandler | None = attrs.field(
        default=None, validator=attrs_check(callable_or_none)
    )
    post_max_tokens_reached: TokenLimitHandler | None = attrs.field(
        default=None, validator=attrs_check(callable_or_none)
    )
    extra_body: Mapping[str, Any] = attrs.field(
        factory=dict, converter=_frozen_mapping, validator=attrs_check(_extra_body)
    )
    timeout: float | None = _seconds()
    first_token_timeout: float | None = _seconds()
    tool_timeout: float | None = _seconds()
    repair_interrupted_tool_calls: bool = attrs.field(default=False, validator=attrs_check(_bool))
    output_type: Any = attrs.field(default=None, validator=attrs_check(_output_type))
    output_retries: int = attrs.field(
        default=DEFAULT_OUTPUT_RETRIES, validator=attrs_check(non_negative_int)
    )

    def evolve(self, **changes: Unpack[SettingsChanges]) -> RequestSettings:
        """A copy with ``changes`` applied, checked like a new value.

        Raises:
            InvalidRequestError: an unknown option, or a value of the wrong
                type or sign.
        """
        if not changes:
            return self  # immutable: nothing to change is this very object
        names = attrs.fields_dict(RequestSettings)
        for name in changes:
            if name not in names:
                fail("an option", f"one of {', '.join(names)}", name)
        return attrs.evolve(self, **changes)

    def sampling(self) -> SamplingSettings:
        """The sampling options, as drivers receive them."""
        return SamplingSettings(
            **{f.name: getattr(self, f.name) for f in attrs.fields(SamplingSettings)}
        )

    def __repr__(self) -> str:
        # Only what differs from the defaults: a value read at a glance.
        default = _DEFAULT
        changed = [
            f"{f.name}={getattr(self, f.name)!r}"
            for f in attrs.fields(RequestSettings)
            if getattr(self, f.name) != getattr(default, f.name)
        ]
        return f"RequestSettings({', '.join(changed)})"


_DEFAULT = RequestSettings()


class SettingsChanges(TypedDict, total=False):
    """The keyword arguments that change a :class:`RequestSettings` (all optional)."""

    max_context_tokens: int | None
    output_reserve_tokens: int | NotGiven
    max_output_tokens: int | None
    temperature: float | None
    top_p: float | None
    seed: int | None
    stop: str | Sequence[str] | None
    presence_penalty: float | None
    frequency_penalty: float | None
    tool_choice: str | None
    max_rounds: int
    token_counter: TokenCounter | None
    exact_token_counter: ExactCounter | None
    exact_count_margin: float | None
    pre_max_tokens_reached: TokenLimitHandler | None
    post_max_tokens_reached: TokenLimitHandler | None
    extra_body: Mapping[str, Any]
    timeout: float | None
    first_token_timeout: float | None
    tool_timeout: float | None
    repair_interrupted_tool_calls: bool
    output_type: Any
    output_retries: int
