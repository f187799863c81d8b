"""What a run is handed besides its plan: a driver, a tool runner and an observer.

The run loop (``_run``) sends every call through the driver it is handed,
runs each tool call through the tool runner (a round's calls concurrently),
and tells the observer where the run and each round begin and end. It knows
the three by their protocols only. :func:`plain_instruments` gives the
plan's own driver, :class:`ToolsetRunner` and an observer that does nothing;
telemetry (``_telemetry``) wraps them when someone traces, as an
instrumented model wraps a model: the loop never calls telemetry.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Protocol

import attrs

from threadline._messages import Message, ToolCall
from threadline._provider import Driver, ProviderResponse
from threadline.counting._protocol import TokenCounter
from threadline.engine._plan import RunPlan
from threadline.tools._results import clamped, without_images
from threadline.tools._tools import ToolOutcome, Toolset

if TYPE_CHECKING:
    from threadline._result import RunResult
    from threadline.limiting._ledger import LimitingRecord
    from threadline.limiting._prefix import CacheReport

__all__ = [
    "NOTHING",
    "UNOBSERVED",
    "Instruments",
    "RoundFacts",
    "RunObserver",
    "ToolRunner",
    "ToolsetRunner",
    "plain_instruments",
]


class RoundFacts(Protocol):
    """What the run loop knows about a round when the round ends."""

    @property
    def number(self) -> int: ...
    @property
    def estimated(self) -> int: ...
    @property
    def limiting(self) -> LimitingRecord | None: ...
    @property
    def retry_limiting(self) -> LimitingRecord | None: ...
    @property
    def context_retry(self) -> bool: ...
    @property
    def response(self) -> ProviderResponse | None: ...
    @property
    def cache(self) -> CacheReport | None: ...


class RunObserver(Protocol):
    """Told where a run and its rounds begin and end."""

    def run(self) -> AbstractContextManager[object]:
        """Around the whole run."""
        ...

    def round(self, current: RoundFacts) -> AbstractContextManager[object]:
        """Around one round (limiting, the provider call, its one retry); ``current``
        holds what the round found out by the time the block is left."""
        ...

    def finished(self, result: RunResult) -> None:
        """The run ended with ``result``."""
        ...


class ToolRunner(Protocol):
    """Runs one tool call of round ``round_number``; a failure is an error outcome."""

    async def __call__(self, call: ToolCall, *, round_number: int) -> ToolOutcome: ...


_NO_BUDGET_RESULT_TOKENS = 25_000
"""A ``"budget"``-sized result cap when the run has no budget to size it by."""


@attrs.frozen
class ToolsetRunner:
    """Runs a call with the tool of ``toolset`` it names; ``default_timeout`` is the
    time limit of a tool without its own.

    The outcome is made what enters the transcript here, once: images become
    notes unless ``images`` (the driver takes them in tool results), and a
    result over its tool's ``max_result_tokens`` (counted by ``counter``;
    ``"budget"``: a quarter of ``prompt_tokens``) is cut with a marker.
    """

    toolset: Toolset
    default_timeout: float | None = None
    counter: TokenCounter | None = None
    prompt_tokens: int | None = None
    images: bool = False

    async def __call__(self, call: ToolCall, *, round_number: int) -> ToolOutcome:
        outcome = await self.toolset.invoke(call, default_timeout=self.default_timeout)
        if not self.images:
            outcome = without_images(outcome)
        found = self.toolset.get(call.name)
        limit = found.max_result_tokens if found is not None else None
        if limit is None or self.counter is None:
            return outcome
        if limit == "budget":
            limit = (
                max(1, self.prompt_tokens // 4)
                if self.prompt_tokens is not None
                else _NO_BUDGET_RESULT_TOKENS
            )
        counter = self.counter
        return clamped(outcome, limit, lambda message: _count_one(counter, message))


def _count_one(counter: TokenCounter, message: Message) -> int:
    return counter.count([message], ())


class _Nothing(AbstractContextManager[object]):
    def __exit__(self, *exc_info: object) -> None:
        return None


NOTHING: AbstractContextManager[object] = _Nothing()
"""A context manager that does nothing, shared by every unobserved run."""


class _Unobserved:
    """The observer of a run nobody watches: it records nothing and costs nothing."""

    def run(self) -> AbstractContextManager[object]:
        return NOTHING

    def round(self, current: RoundFacts) -> AbstractContextManager[object]:
        return NOTHING

    def finished(self, result: RunResult) -> None:
        return None


UNOBSERVED: RunObserver = _Unobserved()


@attrs.frozen(kw_only=True)
class Instruments:
    """The driver a run sends through, its tool runner and its observer."""

    driver: Driver
    tools: ToolRunner
    observer: RunObserver = UNOBSERVED


def plain_instruments(plan: RunPlan) -> Instruments:
    """The plan's own driver and tools, unobserved."""
    budget = plan.resolution.budget
    runner = ToolsetRunner(
        plan.toolset,
        default_timeout=plan.tool_timeout,
        counter=plan.counter,
        prompt_tokens=budget.prompt_tokens if budget is not None else None,
        images=plan.driver.tool_result_images(plan.model),
    )
    return Instruments(driver=plan.driver, tools=runner)
