"""OpenTelemetry spans for runs, rounds and tool calls: ``pip install 'threadline[otel]'``.

threadline makes spans when the application uses OpenTelemetry (it has
imported ``opentelemetry.trace``, as configuring the SDK does) or has handed
threadline a provider with :func:`set_tracer_provider`; otherwise a run costs
nothing extra. A run is an ``invoke_agent`` span, each round a
``chat {model}`` span (kind CLIENT), each tool call an
``execute_tool {name}`` span, named and attributed after the OpenTelemetry
GenAI semantic conventions, with threadline's own facts under
``threadline.``. Message content is recorded only when
:func:`capture_content` (or ``OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT``)
says so. See docs/telemetry.md.
"""

from threadline._public import publish
from threadline.engine._telemetry import (
    CONTENT_ENV,
    capture_content,
    capturing_content,
    set_tracer_provider,
)

__all__ = ["CONTENT_ENV", "capture_content", "capturing_content", "set_tracer_provider"]

publish(globals(), __all__, __name__)
del publish
