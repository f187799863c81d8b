"""Gemini's answer, whole or streamed, to threadline.

Pure translation, no I/O. A ``GenerateContentResponse`` holds ``candidates``
(the first is read), each a ``content`` of ``parts``: text, thought text
(``"thought": true``, a summary a person may read), ``functionCall``, and on
any of them a ``thoughtSignature``. The model turn's parts are kept as they
came in ``Reasoning.provider_reasoning`` (a JSON list), with ``provider`` the
driver and model, whenever they carry a thought, a signature or a function
call, so ``_contents`` can send each signature back on its own part.

A stream (``streamGenerateContent?alt=sse``) is the same response in pieces:
every ``data:`` line a whole ``GenerateContentResponse`` whose parts continue
the turn; the last carries ``finishReason`` and the final ``usageMetadata``,
and may be a signature on an empty text part. Consecutive text pieces of one
kind are joined into one part, never a piece carrying a signature with one
that has none (the thought-signature guide forbids both), so the stored parts
are the turn as the whole answer would have held it.

A ``promptFeedback.blockReason`` with no candidate is :class:`PromptBlocked`,
which the driver raises as an error naming the reason, not an empty answer.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from typing import Any, Final

from threadline._messages import Message, Origin, Reasoning, ToolCall, Usage
from threadline._provider import (
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
    json_object,
    optional_str,
)

__all__ = [
    "CONTENT_FILTERED",
    "FINISH_REASONS",
    "PromptBlocked",
    "StreamAssembler",
    "parse_response",
    "parse_usage",
]

CONTENT_FILTERED: Final = frozenset(
    {
        "SAFETY",
        "RECITATION",
        "BLOCKLIST",
        "PROHIBITED_CONTENT",
        "SPII",
        "IMAGE_SAFETY",
        "IMAGE_PROHIBITED_CONTENT",
        "IMAGE_RECITATION",
    }
)
"""Finish reasons that mean a filter withheld the answer: ``"content_filter"``."""

FINISH_REASONS: Final = {
    "STOP": "stop",
    "MAX_TOKENS": "length",
    "MALFORMED_FUNCTION_CALL": "malformed_function_call",
    "UNEXPECTED_TOOL_CALL": "unexpected_tool_call",
    "TOO_MANY_TOOL_CALLS": "too_many_tool_calls",
    "LANGUAGE": "language",
    "OTHER": "other",
    **dict.fromkeys(CONTENT_FILTERED, "content_filter"),
}
"""Gemini's finish reasons in threadline's words; an unknown one passes through,
lower-cased. ``STOP`` with function calls is ``"tool_calls"``."""


class PromptBlocked(Exception):
    """Gemini refused the prompt itself (``promptFeedback.blockReason``); internal."""

    def __init__(self, reason: str, message: str | None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.message = message


def finish_reason(reason: str | None, has_calls: bool) -> str:
    """threadline's finish reason for Gemini's ``finishReason``."""
    if not reason or reason in ("STOP", "FINISH_REASON_UNSPECIFIED"):
        return "tool_calls" if has_calls else "stop"
    return FINISH_REASONS.get(reason, reason.lower())


def parse_usage(value: object, where: str = "usageMetadata") -> Usage:
    """``usageMetadata``: the prompt (cached content included) and tool-use prompt are input;
    candidates and thoughts are output, the thoughts also reasoning."""
    usage = json_object(value, where)
    prompt = count_field(usage, "promptTokenCount", where)
    tool_prompt = count_field(usage, "toolUsePromptTokenCount", where)
    thoughts = count_field(usage, "thoughtsTokenCount", where)
    return Usage(
        input_tokens=prompt + tool_prompt,
        output_tokens=count_field(usage, "candidatesTokenCount", where) + thoughts,
        cached_input_tokens=count_field(usage, "cachedContentTokenCount", where),
        reasoning_tokens=thoughts,
    )


def _blocked(body: Mapping[str, Any]) -> None:
    feedback = body.get("promptFeedback")
    if isinstance(feedback, dict) and isinstance(feedback.get("blockReason"), str):
        message = feedback.get("blockReasonMessage")
        raise PromptBlocked(feedback["blockReason"], message if isinstance(message, str) else None)


def _candidate(body: Mapping[str, Any], where: str) -> dict[str, Any] | None:
    candidates = body.get("candidates")
    if candidates is None or candidates == []:
        return None
    if not isinstance(candidates, list):
        raise MalformedResponse(f"{where}.candidates should be a list")
    return json_object(candidates[0], f"{where}.candidates[0]")


def _parts(candidate: Mapping[str, Any], where: str) -> list[dict[str, Any]]:
    content = candidate.get("content")
    if content is None:
        return []
    parts = json_object(content, f"{where}.content").get("parts")
    if parts is None:
        return []
    if not isinstance(parts, list):
        raise MalformedResponse(f"{where}.content.parts should be a list")
    return [json_object(part, f"{where}.content.parts[{k}]") for k, part in enumerate(parts)]


def _tool_call(part: Mapping[str, Any], where: str) -> ToolCall:
    call = json_object(part.get("functionCall"), f"{where}.functionCall")
    name = optional_str(call, "name", f"{where}.functionCall")
    if not name:
        raise MalformedResponse(f"{where}.functionCall has no name")
    # Gemini may leave the id out; threadline needs one to pair the result with the call.
    call_id = optional_str(call, "id", f"{where}.functionCall") or f"call_{secrets.token_hex(8)}"
    args = call.get("args")
    arguments = encode_body(json_object(args, f"{where}.functionCall.args")) if args else b"{}"
    return ToolCall(id=call_id, name=name, arguments=arguments.decode("utf-8"))


def _message(
    parts: list[dict[str, Any]], provider: str, where: str, streamed: list[ToolCall] | None = None
) -> Message:
    """The assistant message of a turn's ``parts``; ``streamed``: its calls as a stream
    announced them (their ids, made up where Gemini gave none, stay those)."""
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[ToolCall] = []
    keep = False
    for index, part in enumerate(parts):
        text = optional_str(part, "text", f"{where}[{index}]")
        if "functionCall" in part:
            if streamed is None:
                calls.append(_tool_call(part, f"{where}[{index}]"))
            keep = True
        elif part.get("thought") is True:
            thoughts.append(text or "")
            keep = True
        elif text is not None:
            texts.append(text)
        keep = keep or "thoughtSignature" in part
    reasoning = None
    if keep:
        raw = b"[" + b",".join(encode_body(part) for part in parts) + b"]"
        reasoning = Reasoning(text="".join(thoughts), provider_reasoning=raw, provider=provider)
    return Message.assistant(
        "".join(texts),
        tool_calls=calls if streamed is None else streamed,
        reasoning=reasoning,
        origin=Origin.TURN,
    )


def _omits(parts: list[dict[str, Any]]) -> bool:
    """Whether ``parts`` hold output a message does not: code Gemini ran and its
    result, inline data; anything but text, thoughts and function calls."""
    return any("text" not in part and "functionCall" not in part for part in parts)


def parse_response(
    payload: object, *, requested_model: str, provider: str, request_id: str | None
) -> ProviderResponse:
    """The ``ProviderResponse`` of a whole ``generateContent`` answer.

    Raises:
        PromptBlocked: the prompt was blocked (no candidate, a ``blockReason``).
        MalformedResponse: the payload is not a ``GenerateContentResponse``.
    """
    body = json_object(payload, "the response")
    candidate = _candidate(body, "the response")
    if candidate is None:
        _blocked(body)
        raise MalformedResponse("the response has no candidates and no promptFeedback.blockReason")
    parts = _parts(candidate, "candidates[0]")
    message = _message(parts, provider, "candidates[0].content.parts")
    usage = body.get("usageMetadata")
    reason = optional_str(candidate, "finishReason", "candidates[0]")
    return ProviderResponse(
        message=message,
        finish_reason=finish_reason(reason, bool(message.tool_calls)),
        usage=Usage() if usage is None else parse_usage(usage),
        model=optional_str(body, "modelVersion", "the response") or requested_model,
        request_id=request_id,
        response_id=optional_str(body, "responseId", "the response"),
        omitted_output=_omits(parts),
    )


def _joins(last: dict[str, Any] | None, part: dict[str, Any]) -> bool:
    """Whether stream piece ``part`` continues text part ``last``: both plain text of
    one kind (thought or not), neither carrying a signature or anything else."""
    if last is None or "thoughtSignature" in part or "thoughtSignature" in last:
        return False
    plain = {"text", "thought"}
    return (
        isinstance(part.get("text"), str)
        and isinstance(last.get("text"), str)
        and part.keys() <= plain
        and last.keys() <= plain
        and (part.get("thought") is True) == (last.get("thought") is True)
    )


class StreamAssembler:
    """Reads a stream's decoded chunks, yields threadline's chunks, assembles the answer."""

    def __init__(self, *, requested_model: str, provider: str) -> None:
        self._requested_model = requested_model
        self._provider = provider
        self._parts: list[dict[str, Any]] = []
        self._calls: list[ToolCall] = []
        self._open: dict[str, Any] | None = None
        self._reason: str | None = None
        self._usage = Usage()
        self._model: str | None = None
        self._response_id: str | None = None
        self.started = False

    def add(self, payload: object) -> list[StreamChunk]:
        """Take one chunk's JSON; return what it carries.

        Raises:
            PromptBlocked: the prompt was blocked.
            MalformedResponse: a chunk in the wrong shape.
        """
        body = payload if type(payload) is dict else json_object(payload, "a stream chunk")
        self.started = True
        # Every chunk repeats the model and the response id: read them once.
        if self._model is None and "modelVersion" in body:
            self._model = optional_str(body, "modelVersion", "a stream chunk")
        if self._response_id is None and "responseId" in body:
            self._response_id = optional_str(body, "responseId", "a stream chunk")
        usage = body.get("usageMetadata")
        if usage is not None:
            self._usage = parse_usage(usage)  # cumulative: the last one holds
        candidates = body.get("candidates")
        if type(candidates) is list and candidates and type(candidates[0]) is dict:
            candidate = candidates[0]  # the usual shape, checked without the helpers
        else:
            found = _candidate(body, "a stream chunk")
            if found is None:
                _blocked(body)
                return []
            candidate = found
        if "finishReason" in candidate:
            reason = optional_str(candidate, "finishReason", "a stream chunk's candidate")
            self._reason = reason or self._reason
        content = candidate.get("content")
        parts = content.get("parts") if type(content) is dict else None
        if type(parts) is not list:
            parts = _parts(candidate, "a stream chunk's candidate")
        chunks: list[StreamChunk] = []
        for part in parts:
            if type(part) is not dict:
                json_object(part, "a stream chunk's part")
            text = part.get("text")
            if type(text) is str and len(part) == 1:
                self._text(text)  # a plain piece of text: most of a stream
                if text:
                    chunks.append(TextChunk(text=text))
            else:
                chunks.extend(self._part(part))
        return chunks

    def _text(self, text: str) -> None:
        last = self._parts[-1] if self._parts else None
        if last is not None and last is self._open and last.get("thought") is not True:
            last["text"] += text
        else:
            self._open = {"text": text}
            self._parts.append(self._open)

    def _part(self, part: dict[str, Any]) -> list[StreamChunk]:
        last = self._parts[-1] if self._parts else None
        if _joins(last, part):
            assert last is not None
            last["text"] += part["text"]
        else:
            self._parts.append(dict(part))
        # The part a plain piece of text may still be joined to.
        self._open = self._parts[-1] if _joins(self._parts[-1], {"text": ""}) else None
        if "functionCall" in part:
            call = _tool_call(part, "a stream chunk's functionCall part")
            self._calls.append(call)
            index = len(self._calls) - 1
            return [
                ToolCallChunk(index=index, id=call.id, name=call.name, arguments=call.arguments)
            ]
        text = part.get("text")
        if not isinstance(text, str) or not text:
            return []
        return [ReasoningChunk(text=text) if part.get("thought") is True else TextChunk(text=text)]

    @property
    def complete(self) -> bool:
        """True once a chunk carried a ``finishReason``."""
        return self._reason is not None

    def finish(self, *, request_id: str | None) -> ProviderResponse:
        """The assembled answer, once the stream has ended."""
        message = _message(self._parts, self._provider, "the stream's parts", self._calls)
        return ProviderResponse(
            message=message,
            finish_reason=finish_reason(self._reason, bool(message.tool_calls)),
            usage=self._usage,
            model=self._model or self._requested_model,
            request_id=request_id,
            response_id=self._response_id,
            omitted_output=_omits(self._parts),
        )
