"""The Responses answer: a whole response object or a stream of events, to threadline.

Pure translation, no I/O. Output items become one assistant message:
``message`` items its text, ``function_call`` items its tool calls, and the
opaque items, ``reasoning`` and ``compaction``, its ``Reasoning``:
``provider_reasoning`` is the item's JSON as received (every field kept,
compact JSON), or a JSON list of them in output order when the answer held
several, ``text`` the reasoning summary a person may read (or, from servers
that send no summary, the reasoning text; a compaction item shows nothing),
``provider`` the driver and model. Other item types (built-in tools) are not
threadline's to keep.

The representation of a compaction item, for whoever builds on it: a
``{"type": "compaction", "id": ..., "encrypted_content": ...}`` object kept
exactly as received, in the ``provider_reasoning`` of the assistant message
of the answer that returned it (beside that answer's reasoning items, in
output order), tagged ``"openai-responses:<model>"``. An answer of
``/responses/compact`` (:func:`parse_compaction`) is an assistant message
with no text and no tool call whose state is the whole output in order:
the ``message`` items the compaction retained, then its compaction item.
When sending, the latest compaction item this model made opens the window,
with the message items straight before it (see ``_request``); the store
keeps everything.

A stream is ``response.created``; per output item ``output_item.added``,
its deltas (``output_text``, ``function_call_arguments``,
``reasoning_summary_text``) and ``output_item.done``, which carries the item
whole (a reasoning item's ``encrypted_content`` arrives only there); then
``response.completed``, ``.incomplete`` or ``.failed``. An ``error`` event is
the provider failing after the HTTP 200. Unknown events are skipped.
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
    "INCOMPLETE_REASONS",
    "ResponseFailed",
    "StreamAssembler",
    "parse_compaction",
    "parse_diagnosis",
    "parse_response",
    "parse_usage",
]

INCOMPLETE_REASONS: Final = {
    "max_output_tokens": "length",
    "content_filter": "content_filter",
}
"""``incomplete_details.reason`` in threadline's words; an unknown one passes through."""

_TEXT_PARTS: Final = frozenset({"output_text", "refusal"})
_TERMINAL: Final = frozenset({"response.completed", "response.incomplete", "response.failed"})


class ResponseFailed(Exception):
    """The response's status is ``failed``; ``error`` is its error object (internal)."""

    def __init__(self, error: object) -> None:
        super().__init__("the response failed")
        self.error = error if isinstance(error, dict) else {"message": "the response failed"}


def parse_usage(value: object, where: str = "usage") -> Usage:
    """``usage``: input and output tokens, cached input, and reasoning tokens."""
    usage = json_object(value, where)
    input_details = usage.get("input_tokens_details")
    output_details = usage.get("output_tokens_details")
    return Usage(
        input_tokens=count_field(usage, "input_tokens", where),
        output_tokens=count_field(usage, "output_tokens", where),
        cached_input_tokens=count_field(
            None if input_details is None else json_object(input_details, where),
            "cached_tokens",
            f"{where}.input_tokens_details",
        ),
        reasoning_tokens=count_field(
            None if output_details is None else json_object(output_details, where),
            "reasoning_tokens",
            f"{where}.output_tokens_details",
        ),
    )


def _finish_reason(body: Mapping[str, Any], has_calls: bool) -> str:
    status = optional_str(body, "status", "the response")
    if status == "incomplete":
        details = body.get("incomplete_details")
        reason = (
            optional_str(json_object(details, "incomplete_details"), "reason", "incomplete_details")
            if details is not None
            else None
        )
        return INCOMPLETE_REASONS.get(reason or "", reason or "length")
    return "tool_calls" if has_calls else "stop"


def _message_text(item: Mapping[str, Any], where: str) -> str:
    content = item.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise MalformedResponse(f"{where}.content should be a list, not {json_kind(content)}")
    texts = []
    for index, part in enumerate(content):
        part_where = f"{where}.content[{index}]"
        block = json_object(part, part_where)
        kind = block.get("type")
        if kind in _TEXT_PARTS:
            field = "text" if kind == "output_text" else "refusal"
            texts.append(optional_str(block, field, part_where) or "")
    return "".join(texts)


def _refused(output: list[Any]) -> bool:
    """True when the answer's messages hold a ``refusal`` part and no ``output_text``:
    the model declined, which a structured request must not take for a bad answer."""
    kinds: set[object] = set()
    for item in output:
        content = (
            item.get("content") if type(item) is dict and item.get("type") == "message" else None
        )
        if type(content) is list:
            kinds.update(part.get("type") for part in content if type(part) is dict)
    return "refusal" in kinds and "output_text" not in kinds


def _summary_text(item: Mapping[str, Any], where: str) -> str:
    """The summary's text; else the reasoning text a server sent instead (llama.cpp's)."""
    for field in ("summary", "content"):
        parts = item.get(field)
        if not isinstance(parts, list):
            continue
        texts = [
            text
            for part in parts
            if isinstance(part, dict) and isinstance(text := part.get("text"), str) and text
        ]
        if texts:
            return "\n\n".join(texts)
    return ""


def _tool_call(item: Mapping[str, Any], where: str) -> ToolCall:
    call_id = optional_str(item, "call_id", where)
    name = optional_str(item, "name", where)
    if not call_id or not name:
        raise MalformedResponse(f"{where} is a function_call without a call_id or a name")
    arguments = item.get("arguments")
    if isinstance(arguments, dict):
        arguments = encode_body(arguments).decode("utf-8")
    elif arguments is not None and not isinstance(arguments, str):
        raise MalformedResponse(f"{where}.arguments should be a string, not {json_kind(arguments)}")
    return ToolCall(id=call_id, name=name, arguments=arguments or "{}")


def _reasoning(items: list[dict[str, Any]], texts: list[str], provider: str) -> Reasoning | None:
    """The ``Reasoning`` of an answer's opaque items (reasoning and compaction, in
    output order) and its reasoning summaries."""
    if not items:
        return None
    shown = "\n\n".join(t for t in texts if t)
    if not all(
        isinstance(item.get("encrypted_content"), str)
        for item in items
        if item.get("type") == "reasoning"
    ):
        # Without its encrypted content an item can only be named by id, which a
        # stateless call cannot do (the API answers 404): kept for display only.
        items = [item for item in items if item.get("type") != "reasoning"]
        if not items:
            return Reasoning(text=shown, provider=provider) if shown else None
    if len(items) == 1:
        raw = encode_body(items[0])
    else:
        raw = b"[" + b",".join(encode_body(item) for item in items) + b"]"
    return Reasoning(text=shown, provider_reasoning=raw, provider=provider)


_COMPACTED: Final = frozenset({"message", "compaction", "reasoning"})
"""The item types a ``/responses/compact`` window may hold and this driver sends back."""


def parse_compaction(
    payload: object, *, requested_model: str, provider: str, request_id: str | None
) -> ProviderResponse:
    """The ``ProviderResponse`` of ``/responses/compact``: an assistant message with
    no text and no tool call whose state is the whole output, in order (the
    messages the compaction retained, then its compaction item).

    Raises:
        MalformedResponse: not a compaction response: no output list, an item
            of another type, or no compaction item at all.
    """
    body = json_object(payload, "the compaction response")
    output = body.get("output")
    if not isinstance(output, list):
        raise MalformedResponse(
            f"the compaction's output should be a list, not {json_kind(output)}"
        )
    items = [json_object(item, f"output[{index}]") for index, item in enumerate(output)]
    kinds = [item.get("type") for item in items]
    strange = [kind for kind in kinds if kind not in _COMPACTED]
    if strange:
        shown = json_kind(strange[0]) if not isinstance(strange[0], str) else strange[0][:40]
        raise MalformedResponse(f"the compaction's output holds a {shown!r} item")
    if "compaction" not in kinds:
        raise MalformedResponse("the compaction's output holds no compaction item")
    raw = b"[" + b",".join(encode_body(item) for item in items) + b"]"
    usage = body.get("usage")
    return ProviderResponse(
        message=Message.assistant(
            "", reasoning=Reasoning(provider_reasoning=raw, provider=provider), origin=Origin.TURN
        ),
        finish_reason="compaction",
        usage=Usage() if usage is None else parse_usage(usage),
        model=optional_str(body, "model", "the compaction response") or requested_model,
        request_id=request_id,
        response_id=response_id if isinstance(response_id := body.get("id"), str) else None,
    )


_REASON_CHARS: Final = 100
"""A provider's word is kept to this length: a response is untrusted input."""


def parse_diagnosis(value: object, provider: str) -> CacheDiagnosis | None:
    """A response's ``prompt_cache_diagnostics`` (asked with
    ``prompt_cache_options.comparison_response_id``) as a :class:`CacheDiagnosis`.

    ``{"type": "cache_miss", "reason": ..., "cache_missed_tokens": N}`` gives its
    reason; ``cache_hit``, ``comparison_response_not_found`` and ``unavailable``
    give their type as the reason. Missing, or of another shape: ``None``, since
    a diagnosis is a report, never a reason to fail the answer.
    """
    kind = value.get("type") if isinstance(value, dict) else None
    if not isinstance(kind, str) or not kind:
        return None
    assert isinstance(value, dict)
    reason = value.get("reason") if kind == "cache_miss" else None
    word = reason if isinstance(reason, str) and reason else kind
    missed = value.get("cache_missed_tokens")
    if isinstance(missed, bool) or not isinstance(missed, int) or missed < 0:
        missed = None
    return CacheDiagnosis(provider=provider, reason=word[:_REASON_CHARS], missed_tokens=missed)


_SHOWN: Final = frozenset({"message", "function_call", "reasoning", "compaction"})
"""Output items the message holds; any other (a built-in tool's) is output it omits."""


def build_response(
    body: Mapping[str, Any],
    output: list[Any],
    *,
    requested_model: str,
    provider: str,
    request_id: str | None,
) -> ProviderResponse:
    """The ``ProviderResponse`` of a response object whose output items are ``output``."""
    texts: list[str] = []
    reasoning: list[dict[str, Any]] = []
    summaries: list[str] = []
    calls: list[ToolCall] = []
    omitted = False
    for index, value in enumerate(output):
        where = f"output[{index}]"
        item = json_object(value, where)
        kind = item.get("type")
        omitted = omitted or kind not in _SHOWN
        if kind == "message":
            texts.append(_message_text(item, where))
        elif kind == "function_call":
            calls.append(_tool_call(item, where))
        elif kind == "reasoning":
            reasoning.append(item)
            summaries.append(_summary_text(item, where))
        elif kind == "compaction":
            reasoning.append(item)  # opaque, like reasoning; a boundary when sent back
    usage = body.get("usage")
    return ProviderResponse(
        message=Message.assistant(
            "".join(texts),
            tool_calls=calls,
            reasoning=_reasoning(reasoning, summaries, provider),
            origin=Origin.TURN,
        ),
        finish_reason="refusal" if _refused(output) else _finish_reason(body, bool(calls)),
        usage=Usage() if usage is None else parse_usage(usage),
        model=optional_str(body, "model", "the response") or requested_model,
        request_id=request_id,
        response_id=response_id if isinstance(response_id := body.get("id"), str) else None,
        cache_diagnosis=parse_diagnosis(body.get("prompt_cache_diagnostics"), provider),
        omitted_output=omitted,
    )


def parse_response(
    payload: object, *, requested_model: str, provider: str, request_id: str | None
) -> ProviderResponse:
    """The ``ProviderResponse`` of a whole (non-streamed) response object.

    Raises:
        MalformedResponse: the payload is not a response.
        ResponseFailed: its status is ``failed``.
    """
    body = json_object(payload, "the response")
    if body.get("status") == "failed":
        raise ResponseFailed(body.get("error"))
    output = body.get("output")
    if not isinstance(output, list):
        raise MalformedResponse(f"the response's output should be a list, not {json_kind(output)}")
    return build_response(
        body, output, requested_model=requested_model, provider=provider, request_id=request_id
    )


class _Item:
    __slots__ = ("call_index", "fields", "pieces")

    def __init__(self, fields: dict[str, Any], call_index: int | None) -> None:
        self.fields = fields
        self.call_index = call_index
        self.pieces: list[str] = []  # text, or the arguments' JSON, as it streamed

    def assembled(self) -> dict[str, Any]:
        """The item as far as the stream told it (``output_item.done`` replaces it whole)."""
        item = dict(self.fields)
        if self.pieces and item.get("type") == "function_call":
            item["arguments"] = "".join(self.pieces)
        elif self.pieces and item.get("type") == "message" and not item.get("content"):
            item["content"] = [{"type": "output_text", "text": "".join(self.pieces)}]
        return item


class StreamAssembler:
    """Reads a stream's decoded events, yields chunks, and assembles the response.

    Items are keyed by ``output_index``, or by ``item_id`` for servers that
    send no index (llama.cpp's); an event that names only the item's id finds
    it by that too.
    """

    def __init__(self, *, requested_model: str, provider: str) -> None:
        self._requested_model = requested_model
        self._provider = provider
        self._items: dict[object, _Item] = {}
        self._ids: dict[str, _Item] = {}
        self._calls = 0
        self._final: dict[str, Any] | None = None
        self._model: str | None = None
        self.finished = False
        self.response_id: str | None = None
        """The response's ``id``, once an event named it."""

    def add(self, payload: object) -> list[StreamChunk]:
        """Take one event's JSON; return the chunks it carries.

        Raises:
            MalformedResponse: an event of a known type in the wrong shape.
            ResponseFailed: ``response.failed``.
        """
        event = payload if type(payload) is dict else json_object(payload, "a stream event")
        kind = event.get("type")
        if kind == "response.output_text.delta":
            # Once per token: the common shape takes the shortest path.
            delta, index = event.get("delta"), event.get("output_index")
            state = self._items.get(index) if type(index) is int else None
            if state is not None and type(delta) is str:
                if not delta:
                    return []
                state.pieces.append(delta)
                return [TextChunk(text=delta)]
            return self._delta(event, TextChunk)
        if kind == "response.refusal.delta":
            return self._delta(event, TextChunk)
        if kind == "response.function_call_arguments.delta":
            return self._arguments(event)
        if kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            return self._delta(event, ReasoningChunk)
        if kind == "response.output_item.added":
            return self._added(event)
        if kind == "response.output_item.done":
            self._done(event)
        elif kind in _TERMINAL:
            self._terminal(event, kind)
        elif kind in ("response.created", "response.in_progress"):
            self._started(event)
        return []

    def _key(self, event: Mapping[str, Any]) -> object:
        index = event.get("output_index")
        if type(index) is int:
            return index
        item_id = event.get("item_id")
        if item_id is None:
            item = event.get("item")
            item_id = item.get("id") if isinstance(item, dict) else None
        return item_id if item_id is not None else len(self._items)

    def _started(self, event: Mapping[str, Any]) -> None:
        response = event.get("response")
        if isinstance(response, dict):
            self._model = optional_str(response, "model", "response.created") or self._model
            self.response_id = optional_str(response, "id", "response.created") or self.response_id

    def _added(self, event: Mapping[str, Any]) -> list[StreamChunk]:
        item = json_object(event.get("item"), f"{event.get('type')}.item")
        call_index = None
        chunks: list[StreamChunk] = []
        if item.get("type") == "function_call":
            call_index = self._calls
            self._calls += 1
            where = "response.output_item.added.item"
            chunks.append(
                ToolCallChunk(
                    index=call_index,
                    id=optional_str(item, "call_id", where),
                    name=optional_str(item, "name", where),
                )
            )
        state = self._items[self._key(event)] = _Item(dict(item), call_index)
        if isinstance(item.get("id"), str):
            self._ids[item["id"]] = state
        return chunks

    def _done(self, event: Mapping[str, Any]) -> None:
        item = json_object(event.get("item"), "response.output_item.done.item")
        state = self._find(event)
        if state is None:
            # A done without its added: the item is whole here, but its call had no chunk.
            self._items[self._key(event)] = _Item(dict(item), None)
        else:
            state.fields, state.pieces = dict(item), []

    def _find(self, event: Mapping[str, Any]) -> _Item | None:
        state = self._items.get(self._key(event))
        if state is None:
            item = event.get("item")
            item_id = item.get("id") if isinstance(item, dict) else event.get("item_id")
            state = self._ids.get(item_id) if isinstance(item_id, str) else None
        return state

    def _item(self, event: Mapping[str, Any]) -> _Item:
        state = self._find(event)
        if state is None:
            raise MalformedResponse(
                f"{event.get('type')} for output item {self._key(event)!r}, which was never added"
            )
        return state

    def _delta(
        self, event: Mapping[str, Any], kind: type[TextChunk | ReasoningChunk]
    ) -> list[StreamChunk]:
        delta = event.get("delta")
        if type(delta) is not str:
            delta = optional_str(event, "delta", str(event.get("type")))
        if not delta:
            return []
        if kind is TextChunk:
            self._item(event).pieces.append(delta)
        # Reasoning text is kept from output_item.done, where the whole item comes.
        return [kind(text=delta)]

    def _arguments(self, event: Mapping[str, Any]) -> list[StreamChunk]:
        delta = optional_str(event, "delta", "response.function_call_arguments.delta") or ""
        state = self._item(event)
        if not delta or state.call_index is None:
            return []
        state.pieces.append(delta)
        return [ToolCallChunk(index=state.call_index, arguments=delta)]

    def _terminal(self, event: Mapping[str, Any], kind: str) -> None:
        response = json_object(event.get("response"), f"{kind}.response")
        if kind == "response.failed" or response.get("status") == "failed":
            raise ResponseFailed(response.get("error"))
        self._final = response
        self.response_id = optional_str(response, "id", kind) or self.response_id
        self.finished = True

    def finish(self, *, request_id: str | None) -> ProviderResponse:
        """The assembled response, once the stream has ended.

        Raises:
            MalformedResponse: a function call without a call_id or a name.
        """
        final = self._final or {}
        output = final.get("output")
        if not isinstance(output, list) or not output:
            # Servers may leave the final output out; the items streamed are the answer.
            output = [self._items[key].assembled() for key in self._items]
        body = dict(final)
        body.setdefault("model", self._model)
        body.setdefault("id", self.response_id)
        return build_response(
            body,
            output,
            requested_model=self._requested_model,
            provider=self._provider,
            request_id=request_id,
        )
