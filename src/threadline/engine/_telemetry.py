"""OpenTelemetry spans for runs, rounds and tool calls (the ``threadline[otel]`` extra).

A run is an ``invoke_agent`` span; each round is a ``chat {model}`` span of
kind CLIENT (limiting, the provider call and its one context-length retry);
each tool call is an ``execute_tool {name}`` span. Round and tool spans are
children of the run span. Names and attributes follow the OpenTelemetry GenAI
semantic conventions; threadline's own facts (the budget, estimated against
reported tokens, what limiting dropped) are under ``threadline.``.

The cost when nobody traces is a look-up or two per run: spans are made only
when OpenTelemetry has a tracer provider configured (the global one, set by the
application or its ``OTEL_PYTHON_TRACER_PROVIDER``) or threadline was handed
one. ``opentelemetry.trace`` merely imported (another library does it) makes
no span. ``import threadline`` never imports OpenTelemetry.

The run loop is an async generator, and a context attached across a ``yield``
would leak into the consumer's code. So no span is current across a yield:
each span is parented explicitly, and a span is made current only around an
await that never yields (the provider call, a tool call), so spans made there
(an HTTP client's, a tool's own) nest under it, on asyncio and trio alike.

Message content (the prompts, replies, tool arguments and results) is recorded
only when the user opts in (:func:`capture_content`, or the convention's
``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``). A key never reaches a
span: nothing here reads a driver's settings.

The spans themselves are made in ``_telemetry._spans``, imported on the first
traced run, so OpenTelemetry is loaded only then.
"""

from __future__ import annotations

import os
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import TYPE_CHECKING, Protocol

from threadline._provider import ProviderCall, ProviderResponse, StreamChunk
from threadline.tools._tools import Toolset

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer, TracerProvider

    from threadline._messages import ToolCall
    from threadline._result import RunResult
    from threadline.engine._plan import RunPlan
    from threadline.limiting._ledger import LimitingRecord
    from threadline.tools._tools import ToolOutcome

__all__ = [
    "CONTENT_ENV",
    "NOTHING",
    "RoundFacts",
    "Telemetry",
    "capture_content",
    "capturing_content",
    "for_run",
    "set_tracer_provider",
]

CONTENT_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"
"""The GenAI convention's opt-in for message content: ``true`` (or ``span_only``,
``span_and_event``) turns it on."""

_CONTENT_ON = frozenset({"true", "1", "yes", "span_only", "span_and_event"})

_capture_override: bool | None = None
_tracer_provider: TracerProvider | None = None
_tracer_cache: tuple[object, Tracer] | None = None


def capture_content(enabled: bool | None) -> None:
    """Record message content in spans (``True``), never (``False``), or as
    ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT`` says (``None``, the default).

    Content is the prompts and replies a round sends and receives
    (``gen_ai.input.messages``, ``gen_ai.output.messages``) and a tool call's
    arguments and result. It is off by default: it is often private and large.
    The setting is process-wide and read when a run starts.

    Raises:
        TypeError: ``enabled`` is not a bool or ``None``.
    """
    global _capture_override
    if enabled is not None and not isinstance(enabled, bool):
        raise TypeError(f"enabled must be a bool or None, not {enabled!r}")
    _capture_override = enabled


def capturing_content() -> bool:
    """Whether runs started now record message content."""
    if _capture_override is not None:
        return _capture_override
    return os.environ.get(CONTENT_ENV, "").strip().lower() in _CONTENT_ON


def set_tracer_provider(provider: TracerProvider | None) -> None:
    """Send threadline's spans to ``provider``; ``None`` (the default) uses
    OpenTelemetry's global tracer provider.

    Handing threadline a provider also turns its spans on in a process that
    has not imported ``opentelemetry.trace`` itself.
    """
    global _tracer_provider
    _tracer_provider = provider


def _tracer() -> Tracer | None:
    """The tracer for threadline's spans, or ``None`` when nobody traces."""
    global _tracer_cache
    provider = _tracer_provider
    if provider is None:
        if "opentelemetry.trace" not in sys.modules:
            # Nobody could have configured a provider: no span would go anywhere.
            return None
        provider = _configured_global_provider()
        if provider is None:
            return None
    if _tracer_cache is not None and _tracer_cache[0] is provider:
        return _tracer_cache[1]
    tracer = provider.get_tracer("threadline", _version())
    _tracer_cache = (provider, tracer)
    return tracer


def _configured_global_provider() -> TracerProvider | None:
    """OpenTelemetry's global tracer provider, or ``None`` while none is configured.

    A library may import ``opentelemetry.trace`` (the official ``anthropic``
    client does) in an application that never sets a provider. The global is
    then a proxy (or the no-op provider) whose spans record nothing and carry
    their parent's context, so threadline making none of its own is the same
    to every observer, and saves a run the cost of making them.
    """
    from opentelemetry import trace as otel_trace

    provider = otel_trace.get_tracer_provider()
    if isinstance(provider, otel_trace.ProxyTracerProvider | otel_trace.NoOpTracerProvider):
        return None
    return provider


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("threadline")
    except PackageNotFoundError:  # pragma: no cover - a bare source tree
        return "0+unknown"


class RoundFacts(Protocol):
    """What the run loop knows about a round when its span ends."""

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


class Telemetry:
    """The seam the run loop calls. This base records nothing and costs nothing;
    :func:`for_run` returns a tracing one when spans are wanted."""

    def run(self) -> AbstractContextManager[object]:
        """The span of the whole run."""
        return NOTHING

    def finished(self, result: RunResult) -> None:
        """The run ended with ``result``."""

    def round(self, current: RoundFacts) -> AbstractContextManager[object]:
        """The span of one round: limiting, the provider call, its retry."""
        return NOTHING

    def provider_call(self, call: ProviderCall) -> AbstractContextManager[object]:
        """Around a non-streamed provider call (``call`` is what is sent)."""
        return NOTHING

    def provider_stream(
        self,
        call: ProviderCall,
        stream: AbstractAsyncContextManager[AsyncIterator[StreamChunk]],
    ) -> AbstractAsyncContextManager[AsyncIterator[StreamChunk]]:
        """Around a streamed provider call: ``stream`` as it is, or wrapped."""
        return stream

    async def invoke_tools(
        self,
        toolset: Toolset,
        calls: Sequence[ToolCall],
        round_number: int,
        *,
        default_timeout: float | None = None,
    ) -> list[ToolOutcome]:
        """Run ``calls`` concurrently, each in a span when tracing; ``default_timeout``
        is the time limit of a tool without its own."""
        return await toolset.invoke_all(calls, default_timeout=default_timeout)


class _Nothing(AbstractContextManager[object]):
    def __exit__(self, *exc_info: object) -> None:
        return None


NOTHING: AbstractContextManager[object] = _Nothing()
"""A context manager that does nothing, shared by every untraced run."""
_OFF = Telemetry()


def for_run(plan: RunPlan, *, streaming: bool) -> Telemetry:
    """The telemetry of one run of ``plan``: spans when someone traces, else nothing."""
    tracer = _tracer()
    if tracer is None:
        return _OFF
    from threadline.engine._spans import TracedRun

    return TracedRun(tracer, plan, streaming=streaming, content=capturing_content())
