"""The Anthropic Messages response: a whole message or a stream of events, to threadline.

Pure translation, no I/O. ``thinking`` and ``redacted_thinking`` blocks become
the message's ``Reasoning``: ``provider_reasoning`` is the JSON list of those
blocks in the order they came (each block's fields as received, compact
JSON), ``text`` the thinking a person may read, ``provider`` the driver and
model. The list is sent back exactly as stored (``_request``).

A stream is ``message_start``; per content block ``content_block_start``,
deltas and ``content_block_stop``; ``message_delta`` (stop reason, usage so
far); ``message_stop``. ``ping`` may come anywhere, an ``error`` event after
the 200 is the provider failing mid-answer, and event types this module does
not know are skipped, as the API asks of clients: before their data is read
(see :data:`STREAM_EVENTS`), since nothing promises it is JSON.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from threadline._messages import Message, Origin, Reasoning, ToolCall, Usage
from threadline._provider import (
    CacheDiagnosis,
    ProviderResponse,
    ReasoningChunk,
    StreamChunk,
    TextChunk,
    ToolCallChunk,
)
from threadline.drivers._http._wire import (
    MalformedResponse,
    count_field,
    encode_body,
    json_kind,
    json_object,
    optional_str,
)

__all__ = [
    "FINISH_REASONS",
    "STREAM_EVENTS",
    "StreamAssembler",
    "compaction_usage",
    "parse_diagnosis",
    "parse_message",
    "parse_usage",
]

FINISH_REASONS: Final = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "max_tokens": "length",
    "model_context_window_exceeded": "length",
    "tool_use": "tool_calls",
    "refusal": "content_filter",
    "pause_turn": "pause_turn",
}
"""Anthropic's stop reasons in threadline's words; an unknown one passes through."""

STREAM_EVENTS: Final = frozenset(
    {
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
        "error",
        "message",
    }
)
"""The stream events whose data is read: the documented ones, and ``message``
(SSE's name for an event that names none; its data's ``type`` says what it is).
Any other, ``ping`` or a type added later, is skipped unread."""

_THINKING_TYPES: Final = frozenset({"thinking", "redacted_thinking"})
_KEPT_TYPES: Final = frozenset({*_THINKING_TYPES, "compaction"})
"""Blocks kept opaque as the message's replay state: thinking, and server-side
compaction's ``compaction`` block (the summary that stands for the turns before it)."""

_SHOWN: Final = frozenset({"text", "tool_use", *_KEPT_TYPES})
"""Blocks the message holds; any other (a server tool's) is output it omits."""


def finish_reason(stop_reason: str | None, has_tool_calls: bool) -> str:
    """threadline's finish reason for Anthropic's ``stop_reason``."""
    if not stop_reason:
        return "tool_calls" if has_tool_calls else "stop"
    return FINISH_REASONS.get(stop_reason, stop_reason)


def parse_usage(value: object, where: str = "usage", base: Usage | None = None) -> Usage:
    """``usage``: input is fresh + cache writes + cache reads; cached input is the reads.

    With ``base`` (a stream's usage so far), fields the event leaves out keep
    their earlier values: ``message_delta`` carries cumulative counts, often
    only ``output_tokens``.
    """
    usage = json_object(value, where)
    fresh = _field(usage, "input_tokens", where)
    written = _field(usage, "cache_creation_input_tokens", where)
    read = _field(usage, "cache_read_input_tokens", where)
    output = _field(usage, "output_tokens", where)
    if base is not None and fresh is None and written is None and read is None:
        input_tokens, cached = base.input_tokens, base.cached_input_tokens
    else:
        input_tokens, cached = (fresh or 0) + (written or 0) + (read or 0), read or 0
    if output is None:
        output = base.output_tokens if base is not None else 0
    return Usage(input_tokens=input_tokens, output_tokens=output, cached_input_tokens=cached)


def compaction_usage(value: object, where: str = "usage") -> Usage:
    """What the server-side compaction iterations of ``usage.iterations`` cost.

    With compaction (``context_management``), the top-level counts are the
    answer's own iteration only; each ``{"type": "compaction"}`` entry of
    ``iterations`` is a summarizing call of its own, billed beside it, so the
    run's totals add them. No iterations: nothing.
    """
    usage = value if isinstance(value, dict) else {}
    iterations = usage.get("iterations")
    total = Usage()
    if not isinstance(iterations, list):
        return total
    for position, entry in enumerate(iterations):
        if isinstance(entry, dict) and entry.get("type") == "compaction":
            total = total + parse_usage(entry, f"{where}.iterations[{position}]")
    return total


def _field(usage: Mapping[str, Any], key: str, where: str) -> int | None:
    return count_field(usage, key, where) if usage.get(key) is not None else None


_REASON_CHARS: Final = 100
"""A provider's word is kept to this length: a response is untrusted input."""


def parse_diagnosis(value: object, provider: str) -> CacheDiagnosis | None:
    """A message's ``diagnostics`` (cache diagnosis, asked with
    ``diagnostics.previous_message_id``) as a :class:`CacheDiagnosis`.

    ``{"cache_miss_reason": {"type": "tools_changed", "cache_missed_input_tokens": N}}``;
    a ``null`` reason (no divergence, or the comparison still running when the
    message was sent), a missing object or one of another shape give ``None``:
    a diagnosis is a report, never a reason to fail the answer.
    """
    reason = value.get("cache_miss_reason") if isinstance(value, dict) else None
    kind = reason.get("type") if isinstance(reason, dict) else None
    if not isinstance(kind, str) or not kind:
        return None
    assert isinstance(reason, dict)
    missed = reason.get("cache_missed_input_tokens")
    if isinstance(missed, bool) or not isinstance(missed, int) or missed < 0:
        missed = None
    return CacheDiagnosis(provider=provider, reason=kind[:_REASON_CHARS], missed_tokens=missed)


def _reasoning(blocks: list[dict[str, Any]], provider: str) -> Reasoning | None:
    if not blocks:
        return None
    shown = "\n\n".join(
        block["thinking"]
        for block in blocks
        if block.get("type") == "thinking" and isinstance(block.get("thinking"), str)
    )
    raw = b"[" + b",".join(encode_body(block) for block in blocks) + b"]"
    return Reasoning(text=shown, provider_reasoning=raw, provider=provider)


def _tool_call(block: Mapping[str, Any], where: str) -> ToolCall:
    call_id = optional_str(block, "id", where)
    name = optional_str(block, "name", where)
    if not call_id or not name:
        raise MalformedResponse(f"{where} is a tool_use block without an id or a name")
    value = block.get("input")
    if value is None:
        return ToolCall(id=call_id, name=name, arguments="{}")
    arguments = encode_body(json_object(value, f"{where}.input")).decode("utf-8")
    return ToolCall(id=call_id, name=name, arguments=arguments)


def parse_message(
    payload: object, *, requested_model: str, provider: str, request_id: str | None
) -> ProviderResponse:
    """The ``ProviderResponse`` of a whole (non-streamed) message.

    Raises:
        MalformedResponse: the payload is not a message.
    """
    body = json_object(payload, "the response")
    content = body.get("content")
    if not isinstance(content, list):
        raise MalformedResponse(
            f"the response's content should be a list, not {json_kind(content)}"
        )
    texts: list[str] = []
    thinking: list[dict[str, Any]] = []
    calls: list[ToolCall] = []
    omitted = False
    for index, item in enumerate(content):
        where = f"content[{index}]"
        block = json_object(item, where)
        kind = block.get("type")
        if kind == "text":
            texts.append(optional_str(block, "text", where) or "")
        elif kind in _KEPT_TYPES:
            thinking.append(block)
        elif kind == "tool_use":
            calls.append(_tool_call(block, where))
        omitted = omitted or kind not in _SHOWN  # server tools' blocks are not kept
    usage = body.get("usage")
    return ProviderResponse(
        message=Message.assistant(
            "".join(texts),
            tool_calls=calls,
            reasoning=_reasoning(thinking, provider),
            origin=Origin.TURN,
        ),
        finish_reason=finish_reason(optional_str(body, "stop_reason", "the response"), bool(calls)),
        usage=Usage() if usage is None else parse_usage(usage) + compaction_usage(usage),
        model=optional_str(body, "model", "the response") or requested_model,
        request_id=request_id,
        response_id=_id_of(body),
        cache_diagnosis=parse_diagnosis(body.get("diagnostics"), provider),
        omitted_output=omitted,
    )


def _id_of(body: Mapping[str, Any]) -> str | None:
    value = body.get("id")
    return value if isinstance(value, str) and value else None


class _Block:
    __slots__ = ("call_index", "fields", "json", "kind", "text")

    def __init__(self, kind: str, fields: dict[str, Any], call_index: int | None) -> None:
        self.kind = kind
        self.fields = fields
        self.call_index = call_index
        self.text: list[str] = []  # text, thinking, or the tool input's JSON pieces
        self.json: dict[str, list[str]] = {}  # other accumulated string fields (signature)


class StreamAssembler:
    """Reads a stream's decoded events, yields chunks, and assembles the response."""

    def __init__(self, *, requested_model: str, provider: str) -> None:
        self._requested_model = requested_model
        self._provider = provider
        self._blocks: dict[int, _Block] = {}
        self._calls = 0
        self._model: str | None = None
        self._usage = Usage()
        self._stop_reason: str | None = None
        self._id: str | None = None
        self._compaction = Usage()  # server-side compaction iterations, as last reported
        self._diagnosis: CacheDiagnosis | None = None
        self.started = False
        self.finished = False

    def add(self, payload: object, event_name: str) -> list[StreamChunk]:
        """Take one event's JSON; return the chunks it carries.

        Raises:
            MalformedResponse: an event of a known type in the wrong shape.
        """
        event = payload if type(payload) is dict else json_object(payload, "a stream event")
        kind = event.get("type") or event_name
        if kind == "content_block_delta":
            return self._delta(event)
        if kind == "content_block_start":
            return self._start_block(event)
        if kind == "message_start":
            self._message_start(event)
        elif kind == "message_delta":
            self._message_delta(event)
        elif kind == "message_stop":
            self.finished = True
        # ping, content_block_stop and unknown types change nothing here.
        return []

    def _message_start(self, event: dict[str, Any]) -> None:
        message = json_object(event.get("message"), "message_start.message")
        self._model = optional_str(message, "model", "message_start.message") or self._model
        usage = message.get("usage")
        if usage is not None:
            self._usage = parse_usage(usage, "message_start.message.usage")
            self._iterations(usage)
        self._id = _id_of(message)
        # The cache diagnosis comes with message_start only.
        self._diagnosis = parse_diagnosis(message.get("diagnostics"), self._provider)
        self.started = True

    def _message_delta(self, event: dict[str, Any]) -> None:
        delta = event.get("delta")
        if delta is not None:
            stop = optional_str(
                json_object(delta, "message_delta.delta"), "stop_reason", "message_delta.delta"
            )
            if stop:
                self._stop_reason = stop
        usage = event.get("usage")
        if usage is not None:
            self._usage = parse_usage(usage, "message_delta.usage", base=self._usage)
            self._iterations(usage)

    def _iterations(self, usage: object) -> None:
        # Cumulative, like the counts beside them: the latest report replaces.
        if isinstance(usage, dict) and isinstance(usage.get("iterations"), list):
            self._compaction = compaction_usage(usage)

    def _index(self, event: dict[str, Any], where: str) -> int:
        index = event.get("index")
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise MalformedResponse(f"{where} has index {index!r}, not a non-negative int")
        return index

    def _start_block(self, event: dict[str, Any]) -> list[StreamChunk]:
        index = self._index(event, "content_block_start")
        block = json_object(event.get("content_block"), "content_block_start.content_block")
        kind = block.get("type")
        if not isinstance(kind, str):
            raise MalformedResponse("content_block_start.content_block has no type")
        call_index = None
        chunks: list[StreamChunk] = []
        if kind == "tool_use":
            call_index = self._calls
            self._calls += 1
            where = "content_block_start.content_block"
            chunks.append(
                ToolCallChunk(
                    index=call_index,
                    id=optional_str(block, "id", where),
                    name=optional_str(block, "name", where),
                )
            )
        state = _Block(kind, dict(block), call_index)
        self._blocks[index] = state
        initial = block.get("text") if kind == "text" else block.get("thinking")
        if isinstance(initial, str) and initial:
            state.text.append(initial)
            chunks.append(
                TextChunk(text=initial) if kind == "text" else ReasoningChunk(text=initial)
            )
        return chunks

    def _delta(self, event: dict[str, Any]) -> list[StreamChunk]:
        index = event.get("index")
        state = self._blocks.get(index) if type(index) is int else None
        if state is None:
            raise MalformedResponse(f"content_block_delta for block {index!r}, which never started")
        delta = event.get("delta")
        if type(delta) is not dict:
            delta = json_object(delta, "content_block_delta.delta")
        kind = delta.get("type")
        if kind == "text_delta":
            text = delta.get("text")
            if type(text) is not str:
                optional_str(delta, "text", "content_block_delta.delta")
            if text:
                state.text.append(text)
                return [TextChunk(text=text)]
        elif kind == "input_json_delta":
            piece = optional_str(delta, "partial_json", "content_block_delta.delta") or ""
            if piece and state.call_index is not None:
                state.text.append(piece)
                return [ToolCallChunk(index=state.call_index, arguments=piece)]
        elif kind == "thinking_delta":
            piece = optional_str(delta, "thinking", "content_block_delta.delta") or ""
            if piece:
                state.text.append(piece)
                return [ReasoningChunk(text=piece)]
        elif kind == "compaction_delta":
            # The summary of a compaction block, in pieces: kept, never shown.
            piece = optional_str(delta, "content", "content_block_delta.delta") or ""
            state.json.setdefault("content", []).append(piece)
        elif kind == "signature_delta":
            # Appended, never replaced: a signature may arrive in several pieces.
            piece = optional_str(delta, "signature", "content_block_delta.delta") or ""
            state.json.setdefault("signature", []).append(piece)
        return []

    def finish(self, *, request_id: str | None) -> ProviderResponse:
        """The assembled response, once the stream has ended.

        Raises:
            MalformedResponse: a tool_use block without an id or a name.
        """
        texts: list[str] = []
        thinking: list[dict[str, Any]] = []
        calls: list[ToolCall] = []
        for index in sorted(self._blocks):
            state = self._blocks[index]
            if state.kind == "text":
                texts.append("".join(state.text))
            elif state.kind in _KEPT_TYPES:
                thinking.append(_finished_thinking(state))
            elif state.kind == "tool_use":
                calls.append(_finished_call(state, index))
        return ProviderResponse(
            message=Message.assistant(
                "".join(texts),
                tool_calls=calls,
                reasoning=_reasoning(thinking, self._provider),
                origin=Origin.TURN,
            ),
            finish_reason=finish_reason(self._stop_reason, bool(calls)),
            usage=self._usage + self._compaction,
            model=self._model or self._requested_model,
            request_id=request_id,
            response_id=self._id,
            cache_diagnosis=self._diagnosis,
            omitted_output=any(b.kind not in _SHOWN for b in self._blocks.values()),
        )

    @property
    def complete(self) -> bool:
        """True once ``message_stop`` came, or at least a stop reason did."""
        return self.finished or self._stop_reason is not None


def _finished_thinking(state: _Block) -> dict[str, Any]:
    block = dict(state.fields)
    if state.kind == "thinking":
        block["thinking"] = "".join(state.text) or block.get("thinking", "")
    for name, pieces in state.json.items():
        start = block.get(name)
        block[name] = (start if isinstance(start, str) else "") + "".join(pieces)
    return block


def _finished_call(state: _Block, index: int) -> ToolCall:
    where = f"the stream's content block {index}"
    call_id = optional_str(state.fields, "id", where)
    name = optional_str(state.fields, "name", where)
    if not call_id or not name:
        raise MalformedResponse(f"{where} is a tool_use block without an id or a name")
    arguments = "".join(state.text)
    if not arguments.strip():
        start = state.fields.get("input")
        arguments = encode_body(start).decode("utf-8") if isinstance(start, dict) else "{}"
    return ToolCall(id=call_id, name=name, arguments=arguments)
