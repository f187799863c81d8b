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

from threadline._messages import ToolCall
from threadline._provider import Driver, ProviderResponse
from threadline.engine._plan import RunPlan
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


@attrs.frozen
class ToolsetRunner:
    """Runs a call with the tool of ``toolset`` it names; ``default_timeout`` is the
    time limit of a tool without its own."""

    toolset: Toolset
    default_timeout: float | None = None

    async def __call__(self, call: ToolCall, *, round_number: int) -> ToolOutcome:
        return await self.toolset.invoke(call, default_timeout=self.default_timeout)


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
    return Instruments(
        driver=plan.driver, tools=ToolsetRunner(plan.toolset, default_timeout=plan.tool_timeout)
    )
