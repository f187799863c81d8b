"""The Chat Completions wire format: threadline's types to JSON and back.

Pure translation, no I/O: :func:`request_body` builds the body of a call,
:func:`parse_completion` reads a whole response and :class:`StreamAssembler`
reads a stream's events one at a time. Response JSON is untrusted: every
shape is checked, and a wrong one raises :class:`MalformedResponse` naming
where (``choices[0].message.tool_calls[1].function.name``), which the driver
turns into a ``ProviderResponseError``.

Request building is on the hot path of every round (a long history is a
thousand messages), so it does one small dict per message and nothing more.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from typing import Any, Final, Literal, TypeAlias

from threadline._errors import InvalidRequestError
from threadline._messages import (
    ImagePart,
    Message,
    Origin,
    Reasoning,
    Role,
    TextPart,
    ToolCall,
    Usage,
)
from threadline._provider import (
    ProviderCall,
    ProviderResponse,
    ReasoningChunk,
    StreamChunk,
    TextChunk,
    ToolCallChunk,
)
from threadline.drivers._http._wire import (
    DEFAULT_CACHE_BYTES,
    DEFAULT_CACHE_MIN_MESSAGES,
    JSONCache,
    MalformedResponse,
    count_field,
    encode_body,
    json_kind,
    json_object,
    optional_str,
)
from threadline.drivers._tool_calls import tool_call_dicts
from threadline.tools._output import OutputSchema
from threadline.tools._tools import Tool

__all__ = [
    "OUTPUT_STYLES",
    "MalformedResponse",
    "MessageJSONCache",
    "OutputStyle",
    "StreamAssembler",
    "encode_body",
    "encode_request",
    "parse_completion",
    "request_body",
]

OutputStyle: TypeAlias = Literal["json_schema", "json_object", "prompt"]
"""How a call's output schema goes in the body: ``response_format`` of type
``json_schema`` (OpenAI, llama-server, vLLM), of type ``json_object`` with a
``schema`` (llama-cpp-python's server, which takes no other), or not at all."""
OUTPUT_STYLES: Final = ("json_schema", "json_object", "prompt")

_ROLE_NAMES = {role: role.value for role in Role}
_TOOL_CHOICE_MODES = frozenset({"auto", "none", "required"})
# The field servers use for the model's display reasoning: "reasoning_content"
# (DeepSeek, vLLM, llama.cpp), "reasoning" (newer vLLM, Ollama, OpenRouter).
_REASONING_FIELDS = ("reasoning_content", "reasoning")


# --- request -----------------------------------------------------------------


def invented_call_id() -> str:
    """An id for a tool call the server sent without one.

    Unique, not positional: a run sends every round's calls back, and a second
    ``call_0`` would break the transcript's tool units.
    """
    return f"call_{uuid.uuid4().hex[:24]}"


def _encode_part(part: TextPart | ImagePart) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"type": "text", "text": part.text}
    image: dict[str, Any] = {"url": part.url}
    if part.detail is not None:
        image["detail"] = part.detail
    return {"type": "image_url", "image_url": image}


def _encode_message(message: Message) -> dict[str, Any]:
    content = message.content
    wire: dict[str, Any] = {
        "role": _ROLE_NAMES[message.role],
        "content": content if isinstance(content, str) else [_encode_part(p) for p in content],
    }
    if message.tool_calls:
        # A reply that only calls tools keeps "content": "" rather than the
        # null the API itself returns: OpenAI, vLLM and Ollama take either,
        # but llama-cpp-python's server, LM Studio and older llama.cpp refuse null.
        wire["tool_calls"] = tool_call_dicts(message.tool_calls)
    if message.tool_call_id is not None:
        wire["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        wire["name"] = message.name
    return wire


def _encode_tool(tool: Tool) -> dict[str, Any]:
    function: dict[str, Any] = {"name": tool.name}
    if tool.description:
        function["description"] = tool.description
    function["parameters"] = tool.parameters
    return {"type": "function", "function": function}


def _encode_tool_choice(choice: str, tools: tuple[Tool, ...]) -> str | dict[str, Any]:
    if choice in _TOOL_CHOICE_MODES:
        return choice
    if not any(tool.name == choice for tool in tools):
        raise InvalidRequestError(
            f"tool_choice {choice!r} is neither 'auto', 'none', 'required' nor the name "
            "of a tool sent with the call"
        )
    return {"type": "function", "function": {"name": choice}}


def response_format(output: OutputSchema, style: OutputStyle) -> dict[str, Any] | None:
    """The ``response_format`` that constrains the answer to ``output`` (``None``: none).

    ``json_schema`` is strict where the schema follows strict mode's rules
    (``OutputSchema.strict_schema``), and otherwise sent as it is, non-strict.
    """
    if style == "prompt":
        return None
    if style == "json_object":
        return {"type": "json_object", "schema": dict(output.schema)}
    strict = output.strict_schema
    described: dict[str, Any] = {"name": output.name}
    if output.description:
        described["description"] = output.description
    described["schema"] = dict(output.schema if strict is None else strict)
    described["strict"] = strict is not None
    return {"type": "json_schema", "json_schema": described}


def _fields(
    call: ProviderCall,
    *,
    stream: bool,
    max_tokens_field: str,
    stream_usage: bool,
    output_style: OutputStyle = "json_schema",
) -> dict[str, Any]:
    """Every field of the body but ``model`` and ``messages``, before ``extra_body``."""
    fields: dict[str, Any] = {}
    if call.tools:
        fields["tools"] = [_encode_tool(tool) for tool in call.tools]
    if call.tool_choice is not None:
        fields["tool_choice"] = _encode_tool_choice(call.tool_choice, call.tools)
    if call.max_output_tokens is not None:
        fields[max_tokens_field] = call.max_output_tokens
    if call.output is not None:
        constraint = response_format(call.output, output_style)
        if constraint is not None:
            fields["response_format"] = constraint
    sampling = call.sampling
    for field, value in (
        ("temperature", sampling.temperature),
        ("top_p", sampling.top_p),
        ("stop", None if sampling.stop is None else list(sampling.stop)),
        ("seed", sampling.seed),
        ("presence_penalty", sampling.presence_penalty),
        ("frequency_penalty", sampling.frequency_penalty),
    ):
        if value is not None:
            fields[field] = value
    if stream:
        fields["stream"] = True
        if stream_usage:
            fields["stream_options"] = {"include_usage": True}
    return fields


def request_body(
    call: ProviderCall,
    *,
    stream: bool,
    max_tokens_field: str = "max_tokens",
    stream_usage: bool = True,
    output_style: OutputStyle = "json_schema",
) -> dict[str, Any]:
    """The JSON body (as a dict) of ``call``; ``extra_body`` is merged last.

    Raises:
        InvalidRequestError: ``tool_choice`` names no tool sent. (Reasoning
            replay state is never sent, so it has nothing here to check: see
            ``threadline._replay`` for the drivers that do send it.)
    """
    body: dict[str, Any] = {
        "model": call.model.name,
        "messages": [_encode_message(message) for message in call.messages],
    }
    body.update(
        _fields(
            call,
            stream=stream,
            max_tokens_field=max_tokens_field,
            stream_usage=stream_usage,
            output_style=output_style,
        )
    )
    body.update(call.extra_body)
    return body


class MessageJSONCache(JSONCache):
    """Each message's Chat Completions JSON, encoded once (see ``JSONCache``)."""

    __slots__ = ()

    def __init__(
        self, max_bytes: int = DEFAULT_CACHE_BYTES, min_messages: int = DEFAULT_CACHE_MIN_MESSAGES
    ) -> None:
        super().__init__(_encode_message_json, max_bytes, min_messages)


def _encode_message_json(message: Message) -> bytes:
    return encode_body(_encode_message(message))


def encode_request(
    call: ProviderCall,
    *,
    stream: bool,
    max_tokens_field: str = "max_tokens",
    stream_usage: bool = True,
    cache: MessageJSONCache | None = None,
    output_style: OutputStyle = "json_schema",
) -> bytes:
    """The encoded body of ``call``: what :func:`request_body` builds, as UTF-8 JSON.

    ``stream`` is final: a ``"stream"`` key in ``extra_body`` is overridden,
    since the driver reads the answer the way it asked for it. With a
    ``cache``, each message's JSON is reused from earlier requests.

    Raises:
        InvalidRequestError: as :func:`request_body`, or a value JSON cannot carry.
    """
    if cache is None or not cache.serves(call.messages) or "messages" in call.extra_body:
        body = request_body(
            call,
            stream=stream,
            max_tokens_field=max_tokens_field,
            stream_usage=stream_usage,
            output_style=output_style,
        )
        _force_stream(body, stream)
        return encode_body(body)
    head: dict[str, Any] = {"model": call.model.name}
    head.update(
        _fields(
            call,
            stream=stream,
            max_tokens_field=max_tokens_field,
            stream_usage=stream_usage,
            output_style=output_style,
        )
    )
    head.update(call.extra_body)
    _force_stream(head, stream)
    # "messages" goes last: the head's closing brace is replaced by it.
    return encode_body(head)[:-1] + b',"messages":' + cache.encode(call.messages) + b"}"


def _force_stream(body: dict[str, Any], stream: bool) -> None:
    if stream:
        body["stream"] = True
    else:
        body.pop("stream", None)


# --- response ----------------------------------------------------------------


def _details(obj: Mapping[str, Any], key: str, where: str) -> dict[str, Any] | None:
    value = obj.get(key)
    return None if value is None else json_object(value, f"{where}.{key}")


def parse_usage(value: object, where: str = "usage", timings: object = None) -> Usage:
    """The ``usage`` object of a response or of a stream's last event.

    Cached input is ``prompt_tokens_details.cached_tokens``; a llama.cpp
    server that leaves it out still reports ``timings.cache_n`` (the prompt
    tokens its KV cache served), which ``timings`` carries.
    """
    usage = json_object(value, where)
    prompt_details = _details(usage, "prompt_tokens_details", where)
    output_details = _details(usage, "completion_tokens_details", where)
    if prompt_details is None and isinstance(timings, dict):
        cached = count_field(timings, "cache_n", "timings")
    else:
        cached = count_field(prompt_details, "cached_tokens", f"{where}.prompt_tokens_details")
    return Usage(
        input_tokens=count_field(usage, "prompt_tokens", where),
        output_tokens=count_field(usage, "completion_tokens", where),
        cached_input_tokens=cached,
        reasoning_tokens=count_field(
            output_details, "reasoning_tokens", f"{where}.completion_tokens_details"
        ),
    )


def _text_content(obj: Mapping[str, Any], where: str) -> str:
    value = obj.get("content")
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        # A few servers answer with content parts; keep their text.
        texts = []
        for index, part in enumerate(value):
            part_obj = json_object(part, f"{where}.content[{index}]")
            text = optional_str(part_obj, "text", f"{where}.content[{index}]")
            texts.append(text or "")
        return "".join(texts)
    raise MalformedResponse(f"{where}.content should be a string, not {json_kind(value)}")


def _reasoning_text(obj: Mapping[str, Any], where: str) -> str:
    for field in _REASONING_FIELDS:
        value = optional_str(obj, field, where)
        if value:
            return value
    return ""


def _arguments(function: Mapping[str, Any], where: str) -> str | None:
    value = function.get("arguments")
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, dict):
        # Some servers send the arguments decoded; re-encode them once, as sent.
        return json.dumps(value, ensure_ascii=False)
    raise MalformedResponse(f"{where}.arguments should be a string, not {json_kind(value)}")


def _parse_tool_calls(value: object, where: str) -> tuple[ToolCall, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise MalformedResponse(f"{where} should be a list, not {json_kind(value)}")
    calls = []
    for index, item in enumerate(value):
        item_where = f"{where}[{index}]"
        call = json_object(item, item_where)
        function = json_object(call.get("function"), f"{item_where}.function")
        name = optional_str(function, "name", f"{item_where}.function")
        if not name:
            raise MalformedResponse(f"{item_where}.function.name is missing")
        arguments = _arguments(function, f"{item_where}.function")
        call_id = optional_str(call, "id", item_where) or invented_call_id()
        calls.append(ToolCall(id=call_id, name=name, arguments=arguments or "{}"))
    return tuple(calls)


def _reasoning(text: str, provider: str) -> Reasoning | None:
    return Reasoning(text=text, provider=provider) if text else None


def parse_completion(
    payload: object, *, requested_model: str, provider: str, request_id: str | None
) -> ProviderResponse:
    """The ``ProviderResponse`` of a whole (non-streamed) Chat Completions answer.

    ``provider`` labels display reasoning (``"openai-chat:<model>"``).

    Raises:
        MalformedResponse: the payload is not a chat completion.
    """
    body = json_object(payload, "the response")
    choices = body.get("choices")
    if not isinstance(choices, list) or not choices:
        raise MalformedResponse(f"the response has no choices (choices is {json_kind(choices)})")
    choice = json_object(choices[0], "choices[0]")
    message = json_object(choice.get("message"), "choices[0].message")
    tool_calls = _parse_tool_calls(message.get("tool_calls"), "choices[0].message.tool_calls")
    finish_reason = optional_str(choice, "finish_reason", "choices[0]")
    usage = body.get("usage")
    model = optional_str(body, "model", "the response")
    # A structured answer the model declines comes as "refusal", not "content".
    refusal = optional_str(message, "refusal", "choices[0].message")
    if refusal:
        finish_reason = "refusal"
    return ProviderResponse(
        message=Message.assistant(
            refusal or _text_content(message, "choices[0].message"),
            tool_calls=tool_calls,
            reasoning=_reasoning(_reasoning_text(message, "choices[0].message"), provider),
            origin=Origin.TURN,
        ),
        finish_reason=finish_reason or ("tool_calls" if tool_calls else "stop"),
        usage=Usage() if usage is None else parse_usage(usage, timings=body.get("timings")),
        model=model or requested_model,
        request_id=request_id,
        response_id=optional_str(body, "id", "the response"),
        omitted_output=bool(message.get("audio")),
    )


class _PartialToolCall:
    __slots__ = ("arguments", "id", "name")

    def __init__(self) -> None:
        self.id: str | None = None
        self.name: str | None = None
        self.arguments: list[str] = []


class StreamAssembler:
    """Reads a stream's decoded events, yields chunks, and assembles the response.

    Tool calls arrive in pieces keyed by ``index``: the first piece carries
    the id and name, later ones more of the arguments text.
    """

    def __init__(self, *, requested_model: str, provider: str) -> None:
        self._requested_model = requested_model
        self._provider = provider
        self._text: list[str] = []
        self._refusal: list[str] = []
        self._reasoning: list[str] = []
        self._calls: dict[int, _PartialToolCall] = {}
        self._last_call_index: int | None = None
        self.finish_reason: str | None = None
        self._usage: Usage | None = None
        self._model: str | None = None
        self._id: str | None = None
        self._audio = False

    def add(self, payload: object) -> list[StreamChunk]:
        """Take one event's JSON; return the chunks it carries.

        This runs once per token, so the common shapes take the shortest path
        and the ``where`` of an error is only spelled out when one is raised.

        Raises:
            MalformedResponse: the event is not a chat completion chunk.
        """
        event = payload if type(payload) is dict else json_object(payload, "a stream event")
        model = event.get("model")
        if model and isinstance(model, str):
            self._model = model
        if self._id is None:
            ident = event.get("id")
            self._id = ident if ident and isinstance(ident, str) else None
        usage = event.get("usage")
        if usage is not None:
            self._usage = parse_usage(usage, "a stream event's usage", event.get("timings"))
        choices = event.get("choices")
        if not choices:
            return []
        if type(choices) is not list:
            raise MalformedResponse(f"a stream event's choices is {json_kind(choices)}, not a list")
        chunks: list[StreamChunk] = []
        for position, choice in enumerate(choices):
            if type(choice) is not dict:
                json_object(choice, f"a stream event's choices[{position}]")
            if choice.get("index", 0) != 0:
                continue  # only one choice is asked for; ignore any other
            delta = choice.get("delta")
            if delta:
                if type(delta) is not dict:
                    json_object(delta, f"a stream event's choices[{position}].delta")
                self._add_delta(delta, position, chunks)
            finish_reason = choice.get("finish_reason")
            if finish_reason is not None:
                if type(finish_reason) is not str:
                    optional_str(choice, "finish_reason", f"a stream event's choices[{position}]")
                if finish_reason:
                    self.finish_reason = finish_reason
        return chunks

    def _add_delta(self, delta: dict[str, Any], position: int, chunks: list[StreamChunk]) -> None:
        for field in _REASONING_FIELDS:
            reasoning = delta.get(field)
            if reasoning:
                if type(reasoning) is not str:
                    optional_str(delta, field, f"a stream event's choices[{position}].delta")
                self._reasoning.append(reasoning)
                chunks.append(ReasoningChunk(text=reasoning))
                break
        text = delta.get("content")
        if text:
            if type(text) is not str:
                optional_str(delta, "content", f"a stream event's choices[{position}].delta")
            self._text.append(text)
            chunks.append(TextChunk(text=text))
        if delta.get("audio"):  # spoken output the message does not hold
            self._audio = True
        refusal = delta.get("refusal")
        if refusal:
            self._refusal.append(
                optional_str(delta, "refusal", f"a stream event's choices[{position}].delta") or ""
            )
        tool_calls = delta.get("tool_calls")
        if tool_calls is None:
            return
        where = f"a stream event's choices[{position}].delta.tool_calls"
        if not isinstance(tool_calls, list):
            raise MalformedResponse(f"{where} should be a list, not {json_kind(tool_calls)}")
        for index, item in enumerate(tool_calls):
            chunks.append(self._add_tool_call(json_object(item, f"{where}[{index}]")))

    def _add_tool_call(self, piece: dict[str, Any]) -> ToolCallChunk:
        where = "a stream event's tool call"
        call_id = optional_str(piece, "id", where)
        index = piece.get("index")
        if index is None:
            # Servers that omit the index send each call whole, or continue the last.
            new_call = call_id is not None or self._last_call_index is None
            index = len(self._calls) if new_call else self._last_call_index
        if isinstance(index, bool) or not isinstance(index, int) or index < 0:
            raise MalformedResponse(f"{where} has index {index!r}, not a non-negative int")
        function_value = piece.get("function")
        function = (
            {} if function_value is None else json_object(function_value, f"{where}.function")
        )
        name = optional_str(function, "name", f"{where}.function")
        arguments = _arguments(function, f"{where}.function") or ""
        partial = self._calls.get(index)
        if partial is None:
            partial = self._calls[index] = _PartialToolCall()
        self._last_call_index = index
        if call_id and partial.id is None:
            partial.id = call_id
        if name and partial.name is None:
            partial.name = name
        if arguments:
            partial.arguments.append(arguments)
        return ToolCallChunk(index=index, id=call_id, name=name, arguments=arguments)

    def finish(self, *, request_id: str | None) -> ProviderResponse:
        """The assembled response, once the stream has ended.

        Raises:
            MalformedResponse: a tool call never got its name.
        """
        tool_calls = []
        for index in sorted(self._calls):
            partial = self._calls[index]
            if not partial.name:
                raise MalformedResponse(f"the stream's tool call {index} never got a name")
            tool_calls.append(
                ToolCall(
                    id=partial.id or invented_call_id(),
                    name=partial.name,
                    arguments="".join(partial.arguments) or "{}",
                )
            )
        refusal = "".join(self._refusal)
        return ProviderResponse(
            message=Message.assistant(
                refusal or "".join(self._text),
                tool_calls=tool_calls,
                reasoning=_reasoning("".join(self._reasoning), self._provider),
                origin=Origin.TURN,
            ),
            finish_reason="refusal"
            if refusal
            else self.finish_reason or ("tool_calls" if tool_calls else "stop"),
            usage=self._usage or Usage(),
            model=self._model or self._requested_model,
            request_id=request_id,
            response_id=self._id,
            omitted_output=self._audio,
        )
