"""The prompt budget: how many tokens a transcript may take, and where they went.

prompt budget = context limit - output reserve

- limit: the explicit ``max_context_tokens``; unset, the model's ``context_size``.
- reserve: the explicit ``output_reserve_tokens``, 0 included; unset, the
  request's ``max_output_tokens`` when set, else the model's; otherwise 4096.
- An explicit limit that the reserve fills or exceeds is refused
  (:class:`InvalidRequestError`): a small limit with the default reserve fails
  rather than silently turning into no limit.
- No budget (``None``, with the reason, and a DEBUG log line on
  ``threadline.budget``): no explicit limit and no model ``context_size``; or
  no explicit limit and a reserve at or above the model's ``context_size``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence

import attrs

from threadline._errors import InvalidRequestError
from threadline._messages import Message
from threadline._models import Model
from threadline._sentinel import NOT_GIVEN, NotGiven
from threadline._validate import non_negative_int, positive_int, positive_int_or_none
from threadline.counting._protocol import TokenCounter, is_incremental
from threadline.limiting._units import PinReason, pinned_units, unit_starts
from threadline.tools._tools import Tool

__all__ = [
    "DEFAULT_OUTPUT_RESERVE_TOKENS",
    "Budget",
    "BudgetReport",
    "BudgetResolution",
    "budget_report",
    "message_costs",
    "resolve_budget",
]

logger = logging.getLogger("threadline.budget")

DEFAULT_OUTPUT_RESERVE_TOKENS = 4096
"""The reply's room when neither a reserve nor ``max_output_tokens`` is given."""


def _prompt_tokens(budget: Budget) -> int:
    return budget.limit - budget.reserve


@attrs.frozen(kw_only=True)
class Budget:
    """A resolved prompt budget.

    ``limit`` is the whole context window the request may use, ``reserve``
    the room kept for the reply, ``prompt_tokens`` what is left for the
    transcript and tool schemas (``limit - reserve``, always at least 1).

    Raises:
        InvalidRequestError: a limit that is not a positive int, a reserve
            that is negative, or a reserve that fills the limit.
    """

    limit: int
    reserve: int
    prompt_tokens: int = attrs.field(
        init=False, default=attrs.Factory(_prompt_tokens, takes_self=True)
    )

    def __attrs_post_init__(self) -> None:
        positive_int("Budget.limit", self.limit)
        non_negative_int("Budget.reserve", self.reserve)
        if self.reserve >= self.limit:
            raise InvalidRequestError(
                f"an output reserve of {self.reserve} tokens fills the context limit of "
                f"{self.limit} tokens, leaving nothing for the prompt; lower the reserve "
                "(with_output_reserve_tokens(0) gives the whole limit to the prompt) "
                "or raise the limit"
            )


@attrs.frozen(kw_only=True)
class BudgetResolution:
    """What :func:`resolve_budget` decided: a budget, or ``None`` and why not.

    ``reason`` is always set: where the limit and reserve came from, or why
    there is no budget.
    """

    budget: Budget | None
    reason: str


def resolve_budget(
    model: Model | None,
    *,
    max_context_tokens: int | None = None,
    output_reserve_tokens: int | NotGiven = NOT_GIVEN,
    max_output_tokens: int | None = None,
) -> BudgetResolution:
    """Resolve the prompt budget of a request.

    ``max_context_tokens`` is the request's explicit limit
    (``with_max_context_tokens``), ``output_reserve_tokens`` its explicit
    reserve (``with_output_reserve_tokens``; ``0`` is a real value, leave it
    out for "unset"), ``max_output_tokens`` the request's cap on the reply
    (``with_max_output_tokens``); unset, the model's ``max_output_tokens``
    (its ceiling) stands in for it.

    Raises:
        InvalidRequestError: an explicit limit the reserve fills or exceeds, or
            a value of the wrong type or sign.

    Example::

        >>> resolve_budget(None, max_context_tokens=100_000, output_reserve_tokens=8_000).budget
        Budget(limit=100000, reserve=8000, prompt_tokens=92000)
    """
    positive_int_or_none("max_context_tokens", max_context_tokens)
    positive_int_or_none("max_output_tokens", max_output_tokens)
    if not isinstance(output_reserve_tokens, NotGiven):
        non_negative_int("output_reserve_tokens", output_reserve_tokens)
        reserve, reserve_from = output_reserve_tokens, "with_output_reserve_tokens"
    elif max_output_tokens is not None:
        reserve, reserve_from = max_output_tokens, "max_output_tokens"
    elif model is not None and model.max_output_tokens is not None:
        reserve, reserve_from = model.max_output_tokens, f"model {model.name!r}'s max_output_tokens"
    else:
        reserve, reserve_from = DEFAULT_OUTPUT_RESERVE_TOKENS, "the default"

    if max_context_tokens is not None:
        budget = Budget(limit=max_context_tokens, reserve=reserve)
        return BudgetResolution(
            budget=budget,
            reason=f"limit {max_context_tokens} from with_max_context_tokens, "
            f"reserve {reserve} from {reserve_from}",
        )

    if model is None or model.context_size is None:
        what = "no model" if model is None else f"model {model.name!r} has no context_size"
        return _no_budget(f"no budget: no explicit context limit and {what}")
    if reserve >= model.context_size:
        return _no_budget(
            f"no budget: no explicit context limit and the reserve of {reserve} tokens "
            f"(from {reserve_from}) fills model {model.name!r}'s context_size of "
            f"{model.context_size}"
        )
    return BudgetResolution(
        budget=Budget(limit=model.context_size, reserve=reserve),
        reason=f"limit {model.context_size} from model {model.name!r}'s context_size, "
        f"reserve {reserve} from {reserve_from}",
    )


def _no_budget(reason: str) -> BudgetResolution:
    logger.debug("%s; the transcript is sent without limiting", reason)
    return BudgetResolution(budget=None, reason=reason)


def message_costs(
    counter: TokenCounter, messages: Sequence[Message], tools: Sequence[Tool] = ()
) -> tuple[list[int], int]:
    """Price each message once: ``(per-message tokens, everything else)``.

    With an :class:`IncrementalTokenCounter` the split is exact. A plain
    :class:`TokenCounter` is priced as ``count([m]) - count([])`` per message
    and ``count([], tools)`` besides, which is an estimate: a caller that must
    be exact verifies with one real count.
    """
    if is_incremental(counter):
        return list(map(counter.message_tokens, messages)), counter.overhead_tokens(tools)
    empty = counter.count([], ())
    return [counter.count([m], ()) - empty for m in messages], counter.count([], tools)


@attrs.frozen(kw_only=True)
class BudgetReport:
    """Where the window of one send went.

    ``system_tokens`` (the first system message), ``tools_tokens`` (the tool
    schemas), ``history_tokens`` (kept droppable messages), ``pinned_tokens``
    (the pinned messages besides the first system message: the current
    prompt, the live tool exchange, unanswered injections) and
    ``overhead_tokens`` (the counter's framing) add up to ``total_tokens``,
    the count of what is sent. ``reserve_tokens`` and ``prompt_budget`` are
    ``None`` without a budget.
    """

    system_tokens: int
    tools_tokens: int
    history_tokens: int
    pinned_tokens: int
    overhead_tokens: int
    total_tokens: int
    reserve_tokens: int | None
    prompt_budget: int | None

    @property
    def limit_tokens(self) -> int | None:
        """The whole context limit (prompt budget plus reserve), when there is a budget."""
        if self.prompt_budget is None or self.reserve_tokens is None:
            return None
        return self.prompt_budget + self.reserve_tokens


def budget_report(
    messages: Sequence[Message],
    *,
    tools: Sequence[Tool] = (),
    counter: TokenCounter,
    pinned: Mapping[int, PinReason],
    budget: Budget | None,
    total_tokens: int | None = None,
    costs: Sequence[int] | None = None,
    starts: Sequence[int] | None = None,
) -> BudgetReport:
    """Break the count of ``messages`` and ``tools`` down for the ledger.

    ``pinned`` is what :func:`threadline.limiting._units.pinned_messages` returned for
    ``messages``; ``total_tokens`` the count already made, if any; ``costs``
    the messages' costs (:func:`message_costs`) and ``starts`` their
    :func:`~threadline.limiting._units.unit_starts`, when the caller has them.
    The framing overhead absorbs whatever a non-additive counter does not
    attribute to single messages, so the parts always add up.
    """
    if costs is None:
        costs, _ = message_costs(counter, messages)
    if total_tokens is None:
        total_tokens = counter.count(messages, tools)
    if is_incremental(counter):
        tools_tokens = counter.overhead_tokens(tools) - counter.overhead_tokens(())
    else:
        tools_tokens = counter.count([], tools) - counter.count([], ()) if tools else 0
    if starts is None:
        starts = unit_starts(messages)
    # Every message is in one unit: what the few pinned units do not take is history.
    system = pinned_part = 0
    last = len(starts) - 1
    for k, reason in pinned_units(starts, pinned).items():
        cost = sum(costs[starts[k] : starts[k + 1] if k < last else len(messages)])
        if reason is PinReason.FIRST_SYSTEM:
            system += cost
        else:
            pinned_part += cost
    history = sum(costs) - system - pinned_part
    return BudgetReport(
        system_tokens=system,
        tools_tokens=tools_tokens,
        history_tokens=history,
        pinned_tokens=pinned_part,
        overhead_tokens=total_tokens - system - tools_tokens - history - pinned_part,
        total_tokens=total_tokens,
        reserve_tokens=budget.reserve if budget is not None else None,
        prompt_budget=budget.prompt_tokens if budget is not None else None,
    )
