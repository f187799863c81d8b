"""The spans of a traced run: what ``_telemetry.for_run`` hands the run loop when
someone traces. Imported only then, so OpenTelemetry is loaded only then.

Spans are parented explicitly (the run loop is an async generator; see
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
from threadline._provider import ProviderCall, ProviderResponse, StreamChunk
from threadline.engine._telemetry import NOTHING, RoundFacts, Telemetry
from threadline.tools._tools import ToolOutcome, Toolset, invoke_concurrently

if TYPE_CHECKING:
    from threadline._result import RunResult
    from threadline.engine._plan import RunPlan
    from threadline.limiting._ledger import LimitingRecord

__all__ = ["TracedRun"]

# The GenAI convention's names for the providers threadline's drivers speak to;
# another driver's own name is used as it is (a custom value is allowed).
_PROVIDER_NAMES = {"openai-chat": "openai", "anthropic": "anthropic"}


class TracedRun(Telemetry):
    """The spans of one run: ``invoke_agent``, a ``chat {model}`` per round, and an
    ``execute_tool {name}`` per tool call, the last two children of the first."""

    def __init__(self, tracer: Tracer, plan: RunPlan, *, streaming: bool, content: bool) -> None:
        self._tracer = tracer
        self._plan = plan
        self._streaming = streaming
        self._content = content
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

    def _child_of_run(self, name: str, kind: SpanKind, attributes: Mapping[str, Any]) -> Span:
        parent = trace.set_span_in_context(self._run_span) if self._run_span else None
        return self._tracer.start_span(
            name, context=parent, kind=kind, attributes=_without_none(attributes)
        )

    # -- rounds -------------------------------------------------------------------------

    def round(self, current: RoundFacts) -> AbstractContextManager[object]:
        call = self._plan.call_template
        sampling = call.sampling
        model = self._plan.model.name
        span = self._child_of_run(
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
        response = current.response
        if response is not None:
            attributes["gen_ai.response.model"] = response.model
            attributes["gen_ai.response.finish_reasons"] = [response.finish_reason]
            if response.request_id:
                attributes["gen_ai.response.id"] = response.request_id
            attributes.update(_usage_attributes(response.usage))
            if response.usage.input_tokens:
                attributes["threadline.input_tokens.reported"] = response.usage.input_tokens
            if self._content:
                attributes["gen_ai.output.messages"] = _output_json(response)
        span.set_attributes(attributes)
        for event in _handler_events(records):
            span.add_event("threadline.limiting.handler", event)

    def provider_call(self, call: ProviderCall) -> AbstractContextManager[object]:
        span = self._sending(call)
        return _current(span) if span is not None else NOTHING

    def provider_stream(
        self,
        call: ProviderCall,
        stream: AbstractAsyncContextManager[AsyncIterator[StreamChunk]],
    ) -> AbstractAsyncContextManager[AsyncIterator[StreamChunk]]:
        span = self._sending(call)
        return stream if span is None else _TracedStream(span, stream)

    def _sending(self, call: ProviderCall) -> Span | None:
        span = self._round_span
        if span is not None and self._content and span.is_recording():
            # A retried round records what its second send carried.
            span.set_attribute("gen_ai.input.messages", _messages_json(call.messages))
        return span

    # -- tools --------------------------------------------------------------------------

    async def invoke_tools(
        self,
        toolset: Toolset,
        calls: Sequence[ToolCall],
        round_number: int,
        *,
        default_timeout: float | None = None,
    ) -> list[ToolOutcome]:
        # What Toolset.invoke_all does, with each call in a span of its own made in
        # its own task, so the tool's own spans nest under it.
        async def invoke(call: ToolCall) -> ToolOutcome:
            return await self._invoke(toolset, call, round_number, default_timeout)

        return await invoke_concurrently(calls, invoke)

    async def _invoke(
        self, toolset: Toolset, call: ToolCall, round_number: int, default_timeout: float | None
    ) -> ToolOutcome:
        found = toolset.get(call.name)
        span = self._child_of_run(
            f"execute_tool {call.name}",
            SpanKind.INTERNAL,
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": call.name,
                "gen_ai.tool.call.id": call.id,
                "gen_ai.tool.type": "function",
                "gen_ai.tool.description": (found.description or None) if found else None,
                "gen_ai.tool.call.arguments": call.arguments if self._content else None,
                "threadline.round": round_number,
            },
        )
        with _Ending(span):
            with _current(span):
                outcome = await toolset.invoke(call, default_timeout=default_timeout)
            self._tool_ended(span, outcome)
        return outcome

    def _tool_ended(self, span: Span, outcome: ToolOutcome) -> None:
        if self._content:
            span.set_attribute("gen_ai.tool.call.result", outcome.text)
        if not outcome.is_error:
            return
        cause = outcome.exception
        span.set_attribute("error.type", _error_type(cause) if cause is not None else "_OTHER")
        span.set_status(Status(StatusCode.ERROR))
        # A tool's error text can quote the model's arguments: content, so opt-in.
        if cause is not None and self._content:
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
