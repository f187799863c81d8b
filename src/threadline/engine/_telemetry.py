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

The run loop does not know telemetry. :func:`instrument` hands a traced run
an instrumented driver (it delegates to the plan's, with the round span
current around each call), a tool runner that runs each call in a span, and
an observer the loop tells where the run and each round begin and end (the
protocols are in ``_instruments``). They are made in ``_spans``, imported on
the first traced run, so OpenTelemetry is loaded only then.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from threadline.engine._instruments import Instruments, plain_instruments
from threadline.engine._plan import RunPlan

if TYPE_CHECKING:
    from opentelemetry.trace import Tracer, TracerProvider

__all__ = [
    "CONTENT_ENV",
    "capture_content",
    "capturing_content",
    "instrument",
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


def instrument(plan: RunPlan, *, streaming: bool) -> Instruments:
    """What a run of ``plan`` is handed: its driver and tool runner wrapped in spans
    and an observer that makes the run and round spans when someone traces, else
    the plan's own, unobserved."""
    plain = plain_instruments(plan)
    tracer = _tracer()
    if tracer is None:
        return plain
    from threadline.engine._spans import traced

    return traced(plain, tracer, plan, streaming=streaming, content=capturing_content())
