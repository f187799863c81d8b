"""The spans of a traced run: what ``_telemetry.instrument`` hands a run when
someone traces. Imported only then, so OpenTelemetry is loaded only then.

:class:`TracedRun` observes the run and its rounds (the ``invoke_agent`` and
``chat {model}`` spans); :class:`InstrumentedDriver` delegates to the plan's
driver with the round span current around each call; :class:`TracedTools`
runs each tool call through the plain runner in an ``execute_tool {name}``
span. Spans are parented explicitly (the run loop is an async generator; see
``_telemetry``), and made current only around awaits that never yield to the
consumer: the provider call and each tool call.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager, contextmanager
from types import TracebackType
from typing import TYPE_CHECKING, Any

import anyio
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, Tracer

from threadline._messages import ImagePart, Message, Role, TextPart, ToolCall, Usage
from threadline._models import Model
from threadline._provider import Driver, ProviderCall, ProviderResponse, StreamChunk
from threadline._replay import ReplayRules
from threadline.counting._protocol import ExactCounter, ReplayProjection, TokenCounter
from threadline.engine._instruments import Instruments, RoundFacts, ToolRunner
from threadline.engine._plan import RunPlan
from threadline.tools._tools import ToolOutcome, Toolset

if TYPE_CHECKING:
    from threadline._result import RunResult
    from threadline.limiting._ledger import LimitingRecord
    from threadline.limiting._prefix import CacheReport

__all__ = ["InstrumentedDriver", "TracedRun", "TracedTools", "traced"]

# The GenAI convention's names for the providers threadline's drivers speak to;
# another driver's own name is used as it is (a custom value is allowed).
_PROVIDER_NAMES = {
    "openai-chat": "openai",
    "openai-responses": "openai",
    "anthropic": "anthropic",
    "gemini": "gcp.gemini",
}


def traced(
    plain: Instruments, tracer: Tracer, plan: RunPlan, *, streaming: bool, content: bool
) -> Instruments:
    """``plain`` wrapped in the spans of one run of ``plan``; ``content`` records
    the messages, tool arguments and results too."""
    spans = TracedRun(tracer, plan, streaming=streaming, content=content)
    return Instruments(
        driver=InstrumentedDriver(plain.driver, spans),
        tools=TracedTools(plain.tools, spans, plan.toolset),
        observer=spans,
    )


class TracedRun:
    """The spans of one run: ``invoke_agent``, and a ``chat {model}`` per round, a
    child of the first. The run's observer; the instrumented driver and the
    tool runner of the run make their spans through it."""

    def __init__(self, tracer: Tracer, plan: RunPlan, *, streaming: bool, content: bool) -> None:
        self._tracer = tracer
        self._plan = plan
        self._streaming = streaming
        self.content = content
        self._provider = _PROVIDER_NAMES.get(plan.driver.name, plan.driver.name)
        self._run_span: Span | None = None
        self._round_span: Span | None = None
        self._result_given = False

    # -- the run ------------------------------------------------------------------------

    def run(self) -> AbstractContextManager[object]:
        budget = self._plan.resolution.budget
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.provider.name": self._provider,
            "gen_ai.request.model": self._plan.model.name,
            "threadline.streaming": self._streaming,
            "threadline.max_rounds": self._plan.max_rounds,
            "threadline.budget.reason": self._plan.resolution.reason,
        }
        if budget is not None:
            attributes["threadline.budget.limit"] = budget.limit
            attributes["threadline.budget.reserve"] = budget.reserve
            attributes["threadline.budget.prompt_tokens"] = budget.prompt_tokens
        span = self._tracer.start_span(
            "invoke_agent", kind=SpanKind.INTERNAL, attributes=attributes
        )
        self._run_span = span
        # Request.run() closes the run once it has its result: no cancellation.
        return _Ending(span, done=lambda: self._result_given)

    def finished(self, result: RunResult) -> None:
        self._result_given = True
        span = self._run_span
        if span is None or not span.is_recording():
            return
        response = result.response
        span.set_attributes(
            {
                "gen_ai.response.model": response.model,
                "gen_ai.response.finish_reasons": [response.finish_reason],
                **_usage_attributes(result.usage),
                "threadline.rounds": len(result.rounds),
                "threadline.limiting.units_dropped": sum(len(r.dropped) for r in result.limiting),
                "threadline.context_retries": sum(1 for r in result.rounds if r.context_retry),
            }
        )

    def child_of_run(self, name: str, kind: SpanKind, attributes: Mapping[str, Any]) -> Span:
        """A span whose parent is the run's, whatever span is current."""
        parent = trace.set_span_in_context(self._run_span) if self._run_span else None
        return self._tracer.start_span(
            name, context=parent, kind=kind, attributes=_without_none(attributes)
        )

    # -- rounds -------------------------------------------------------------------------

    def round(self, current: RoundFacts) -> AbstractContextManager[object]:
        call = self._plan.call_template
        sampling = call.sampling
        model = self._plan.model.name
        span = self.child_of_run(
            f"chat {model}",
            SpanKind.CLIENT,
            {
                "gen_ai.operation.name": "chat",
                "gen_ai.provider.name": self._provider,
                "gen_ai.request.model": model,
                "gen_ai.request.stream": True if self._streaming else None,
                "gen_ai.request.max_tokens": call.max_output_tokens,
                "gen_ai.request.temperature": sampling.temperature,
                "gen_ai.request.top_p": sampling.top_p,
                "gen_ai.request.seed": sampling.seed,
                "gen_ai.request.presence_penalty": sampling.presence_penalty,
                "gen_ai.request.frequency_penalty": sampling.frequency_penalty,
                "gen_ai.request.stop_sequences": list(sampling.stop) if sampling.stop else None,
                "threadline.round": current.number,
            },
        )
        self._round_span = span
        return _Ending(span, before_end=lambda: self._round_ended(span, current))

    def _round_ended(self, span: Span, current: RoundFacts) -> None:
        if not span.is_recording():
            return
        records = [r for r in (current.limiting, current.retry_limiting) if r is not None]
        attributes = _limiting_attributes(records)
        attributes["threadline.input_tokens.estimated"] = current.estimated
        attributes["threadline.context_retry"] = current.context_retry
        attributes.update(_cache_attributes(current.cache))
        response = current.response
        if response is not None:
            attributes["gen_ai.response.model"] = response.model
            attributes["gen_ai.response.finish_reasons"] = [response.finish_reason]
            # The provider's id of the completion (semconv), not the HTTP request id.
            if response.response_id:
                attributes["gen_ai.response.id"] = response.response_id
            if response.request_id:
                attributes["threadline.request_id"] = response.request_id
            attributes.update(_usage_attributes(response.usage))
            if response.usage.input_tokens:
                attributes["threadline.input_tokens.reported"] = response.usage.input_tokens
            if self.content:
                attributes["gen_ai.output.messages"] = _output_json(response)
        span.set_attributes(attributes)
        for event in _handler_events(records):
            span.add_event("threadline.limiting.handler", event)

    def sending(self, call: ProviderCall) -> Span | None:
        """The span of the round sending ``call``, which notes what it carries."""
        span = self._round_span
        if span is not None and self.content and span.is_recording():
            # A retried round records what its second send carried.
            span.set_attribute("gen_ai.input.messages", _messages_json(call.messages))
        return span


class InstrumentedDriver(Driver):
    """A driver that delegates to ``inner``, its calls made with the round span current
    (so an HTTP client's spans nest in the round) and a stream's first chunk timed."""

    def __init__(self, inner: Driver, spans: TracedRun) -> None:
        self._inner = inner
        self._spans = spans

    @property
    def name(self) -> str:
        return self._inner.name

    async def complete(self, call: ProviderCall) -> ProviderResponse:
        span = self._spans.sending(call)
        if span is None:
            return await self._inner.complete(call)
        with _current(span):
            return await self._inner.complete(call)

    def stream(self, call: ProviderCall) -> AbstractAsyncContextManager[AsyncIterator[StreamChunk]]:
        span = self._spans.sending(call)
        stream = self._inner.stream(call)
        return stream if span is None else _TracedStream(span, stream)

    def token_counter(self) -> TokenCounter | None:
        return self._inner.token_counter()

    def replay_projection(self, model: Model) -> ReplayProjection:
        return self._inner.replay_projection(model)

    def replay_rules(self, model: Model) -> ReplayRules:
        return self._inner.replay_rules(model)

    def exact_token_counter(self, model: Model) -> ExactCounter | None:
        return self._inner.exact_token_counter(model)

    async def load(self) -> None:
        await self._inner.load()

    async def aclose(self) -> None:
        await self._inner.aclose()

    def __repr__(self) -> str:
        return f"InstrumentedDriver({self._inner!r})"


class TracedTools:
    """A tool runner that runs each call through ``inner`` in an ``execute_tool {name}``
    span, a child of the run's, current while the tool runs (in its own task, so the
    tool's own spans nest under it)."""

    def __init__(self, inner: ToolRunner, spans: TracedRun, toolset: Toolset) -> None:
        self._inner = inner
        self._spans = spans
        self._toolset = toolset

    async def __call__(self, call: ToolCall, *, round_number: int) -> ToolOutcome:
        found = self._toolset.get(call.name)
        content = self._spans.content
        span = self._spans.child_of_run(
            f"execute_tool {call.name}",
            SpanKind.INTERNAL,
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": call.name,
                "gen_ai.tool.call.id": call.id,
                "gen_ai.tool.type": "function",
                "gen_ai.tool.description": (found.description or None) if found else None,
                "gen_ai.tool.call.arguments": call.arguments if content else None,
                "threadline.round": round_number,
            },
        )
        with _Ending(span):
            with _current(span):
                outcome = await self._inner(call, round_number=round_number)
            _tool_ended(span, outcome, content=content)
        return outcome


def _cache_attributes(cache: CacheReport | None) -> dict[str, Any]:
    """Why the round's cache missed (or could hit), as span attributes."""
    if cache is None:
        return {}
    prefix = cache.prefix
    attributes: dict[str, Any] = {
        "threadline.cache.prefix": prefix.reason,
        "threadline.cache.kept_messages": prefix.kept_messages,
    }
    if prefix.position is not None:
        attributes["threadline.cache.changed_at"] = prefix.position
    if cache.cached_share is not None:
        attributes["threadline.cache.cached_share"] = round(cache.cached_share, 4)
    if cache.diagnosis is not None:
        attributes["threadline.cache.provider_diagnosis"] = cache.diagnosis.reason
        if cache.diagnosis.missed_tokens is not None:
            attributes["threadline.cache.provider_missed_tokens"] = cache.diagnosis.missed_tokens
    return attributes


def _tool_ended(span: Span, outcome: ToolOutcome, *, content: bool) -> None:
    if content:
        span.set_attribute("gen_ai.tool.call.result", outcome.text)
    if not outcome.is_error:
        return
    cause = outcome.exception
    span.set_attribute("error.type", _error_type(cause) if cause is not None else "_OTHER")
    span.set_status(Status(StatusCode.ERROR))
    # A tool's error text can quote the model's arguments: content, so opt-in.
    if cause is not None and content:
        span.record_exception(cause)


# -- span scopes ------------------------------------------------------------------------


class _Ending(AbstractContextManager[Span]):
    """Ends ``span`` on leaving the block, recording how the block ended."""

    def __init__(
        self,
        span: Span,
        before_end: Callable[[], None] | None = None,
        done: Callable[[], bool] | None = None,
    ) -> None:
        self._span = span
        self._before_end = before_end
        self._done = done

    def __enter__(self) -> Span:
        return self._span

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if self._before_end is not None:
                self._before_end()
            closed_when_done = isinstance(error, GeneratorExit) and self._done and self._done()
            if error is not None and not closed_when_done:
                _record_failure(self._span, error)
        finally:
            self._span.end()


@contextmanager
def _current(span: Span) -> Iterator[None]:
    """``span`` is the current span inside the block (never across a ``yield``)."""
    with trace.use_span(span, record_exception=False, set_status_on_exception=False):
        yield


class _TracedStream(AbstractAsyncContextManager[AsyncIterator[StreamChunk]]):
    """A provider stream opened and closed with the round span current, which
    notes the time to the first chunk."""

    def __init__(
        self, span: Span, stream: AbstractAsyncContextManager[AsyncIterator[StreamChunk]]
    ) -> None:
        self._span = span
        self._stream = stream

    async def __aenter__(self) -> AsyncIterator[StreamChunk]:
        started = time.perf_counter()
        with _current(self._span):
            chunks = await self._stream.__aenter__()
        return _FirstChunk(chunks, self._span, started)

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        with _current(self._span):
            return await self._stream.__aexit__(kind, error, tb)


class _FirstChunk(AsyncIterator[StreamChunk]):
    # A class, not an async generator: nothing to finalize when abandoned.
    def __init__(self, chunks: AsyncIterator[StreamChunk], span: Span, started: float) -> None:
        self._chunks = chunks
        self._span = span
        self._started: float | None = started

    async def __anext__(self) -> StreamChunk:
        chunk = await self._chunks.__anext__()
        if self._started is not None:
            elapsed = time.perf_counter() - self._started
            self._span.set_attribute("gen_ai.response.time_to_first_chunk", elapsed)
            self._started = None
        return chunk


# -- attribute values -------------------------------------------------------------------


def _record_failure(span: Span, error: BaseException) -> None:
    if _is_cancellation(error):
        # Leaving a stream early, or a cancel scope: the span ends, not as a failure.
        span.set_attribute("threadline.cancelled", True)
        return
    span.set_attribute("error.type", _error_type(error))
    span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
    # threadline's errors never hold a key (the house rules); a provider's message is kept.
    span.record_exception(error)


def _is_cancellation(error: BaseException) -> bool:
    if isinstance(error, GeneratorExit):
        return True
    try:
        return isinstance(error, anyio.get_cancelled_exc_class())
    except Exception:  # no event loop: a generator finalized at interpreter exit
        return False


def _error_type(error: BaseException) -> str:
    """``error.type``: the exception's canonical name (``threadline.RateLimitError``)."""
    kind = type(error)
    module = kind.__module__
    return kind.__qualname__ if module == "builtins" else f"{module}.{kind.__qualname__}"


def _usage_attributes(usage: Usage) -> dict[str, Any]:
    # Usage.input_tokens already counts cached input (the convention asks for it):
    # the drivers add cache reads and writes into it.
    if not (usage.input_tokens or usage.output_tokens):
        return {}
    attributes: dict[str, Any] = {
        "gen_ai.usage.input_tokens": usage.input_tokens,
        "gen_ai.usage.output_tokens": usage.output_tokens,
    }
    if usage.cached_input_tokens:
        attributes["gen_ai.usage.cache_read.input_tokens"] = usage.cached_input_tokens
    if usage.reasoning_tokens:
        attributes["gen_ai.usage.reasoning.output_tokens"] = usage.reasoning_tokens
    return attributes


def _limiting_attributes(records: Sequence[LimitingRecord]) -> dict[str, Any]:
    if not records:
        return {}
    last = records[-1]
    attributes: dict[str, Any] = {
        "threadline.limiting.tokens_before": records[0].tokens_before,
        "threadline.limiting.units_dropped": sum(len(r.dropped) for r in records),
        "threadline.limiting.handlers": [h.handler for r in records for h in r.handlers],
        "threadline.limiting.sent_over_budget": last.sent_over_budget,
    }
    if last.budget_tokens is not None:
        # After a context-length refusal, the tightened budget of the retry.
        attributes["threadline.budget.prompt_tokens"] = last.budget_tokens
    return attributes


def _handler_events(records: Sequence[LimitingRecord]) -> Iterator[dict[str, Any]]:
    for record in records:
        for run in record.handlers:
            units = sum(
                1 for d in record.dropped if d.handler == run.handler and d.phase == run.phase
            )
            yield {
                "threadline.limiting.handler": run.handler,
                "threadline.limiting.phase": run.phase,
                "threadline.limiting.units_dropped": units,
                "threadline.limiting.messages_dropped": run.dropped_messages,
                "threadline.limiting.messages_added": run.added_messages,
                "threadline.limiting.tokens_before": run.tokens_before,
                "threadline.limiting.tokens_after": run.tokens_after,
            }


def _without_none(values: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}


# -- content (opt-in): the convention's input and output message forms -----------------


def _messages_json(messages: Sequence[Message]) -> str:
    return json.dumps([_message_json(m) for m in messages], ensure_ascii=False)


def _output_json(response: ProviderResponse) -> str:
    message = _message_json(response.message)
    message["finish_reason"] = response.finish_reason
    return json.dumps([message], ensure_ascii=False)


def _message_json(message: Message) -> dict[str, Any]:
    parts: list[dict[str, Any]] = []
    if message.reasoning is not None and message.reasoning.text:
        # Only what a person may be shown; the opaque replay state never.
        parts.append({"type": "reasoning", "content": message.reasoning.text})
    if message.role is Role.TOOL:
        parts.append(
            {"type": "tool_call_response", "id": message.tool_call_id, "response": message.text}
        )
    elif isinstance(message.content, str):
        if message.content:
            parts.append({"type": "text", "content": message.content})
    else:
        parts.extend(_part_json(part) for part in message.content)
    for call in message.tool_calls:
        parts.append(
            {"type": "tool_call", "id": call.id, "name": call.name, "arguments": _arguments(call)}
        )
    shown: dict[str, Any] = {"role": message.role.value, "parts": parts}
    if message.name:
        shown["name"] = message.name
    return shown


def _part_json(part: TextPart | ImagePart) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"type": "text", "content": part.text}
    if part.url.startswith("data:") and "," in part.url:
        header, data = part.url[5:].split(",", 1)
        mime_type = header.split(";", 1)[0] or None
        return {"type": "blob", "modality": "image", "mime_type": mime_type, "content": data}
    return {"type": "uri", "modality": "image", "uri": part.url}


def _arguments(call: ToolCall) -> object:
    try:
        return json.loads(call.arguments)
    except ValueError:
        return call.arguments
