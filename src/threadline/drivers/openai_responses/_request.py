"""The Responses request: threadline's transcript to the JSON body of ``POST /responses``.

Pure translation, no I/O. The call is stateless: ``store: false``, and the
whole transcript the run kept (limiting is threadline's job) goes as
``input`` items every round, with ``include: ["reasoning.encrypted_content"]``
so that reasoning comes back in a form that can be replayed.

- System messages become ``instructions`` (joined, in transcript order);
  user messages ``{"role": "user", "content": ...}``; an assistant message its
  reasoning items, then its text as an assistant message, then one
  ``function_call`` item per tool call; a tool result a
  ``function_call_output`` item.
- Reasoning items are replayed byte for byte, as they were received (see
  ``_response``), straight before the items of the message that carries
  them: threadline keeps reasoning on the assistant message, so a reasoning
  item and the message or calls that follow it are one unit and are kept or
  dropped together. Reasoning another provider or model produced is left out,
  and the request says so in its ``left_out`` notes; so is reasoning with no
  item after it to belong to (:func:`_replayed`).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from typing import Any, Final

import attrs

from threadline._errors import InvalidRequestError
from threadline._messages import ImagePart, Message, Role, TextPart
from threadline._provider import ProviderCall
from threadline._replay import ReplayRules, replayed
from threadline.drivers._http._wire import JSONCache, encode_body
from threadline.tools._output import OutputSchema
from threadline.tools._tools import Tool

__all__ = [
    "COUNT_FIELDS",
    "REASONING_REPLAY",
    "EncodedRequest",
    "encode_count_request",
    "encode_message_items",
    "encode_request",
    "new_message_cache",
]

logger = logging.getLogger("threadline.drivers.openai_responses")

_TOOL_CHOICE_MODES: Final = frozenset({"auto", "none", "required"})
COUNT_FIELDS: Final = frozenset(
    {
        "model",
        "instructions",
        "input",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "reasoning",
        "text",
        "truncation",
    }
)
"""The fields ``/responses/input_tokens`` takes: what shapes the prompt, not the sampling."""


@attrs.frozen(kw_only=True)
class EncodedRequest:
    """A body ready to send, and the reasoning it left out (``message i: why``)."""

    body: bytes
    left_out: tuple[str, ...] = ()


# --- items -------------------------------------------------------------------


def _encode_part(part: TextPart | ImagePart) -> dict[str, Any]:
    if isinstance(part, TextPart):
        return {"type": "input_text", "text": part.text}
    image: dict[str, Any] = {"type": "input_image", "image_url": part.url}
    # The API requires a detail level; "auto" is what it would choose.
    image["detail"] = part.detail if part.detail is not None else "auto"
    return image


def _role_message(role: str, message: Message) -> bytes:
    # "type": "message" is optional for OpenAI, but llama.cpp's server cannot
    # tell an assistant message without it from other items.
    content = message.content
    if isinstance(content, str):
        return encode_body({"type": "message", "role": role, "content": content})
    parts = [_encode_part(part) for part in content]
    return encode_body({"type": "message", "role": role, "content": parts})


def encode_message_items(message: Message) -> bytes:
    """``message``'s input items, comma-joined, without any reasoning (``b""`` for none).

    This is what the per-message cache keeps: reasoning is spliced in front by
    the transcript, since whether it is sent depends on the call's model.
    """
    if message.role is Role.TOOL:
        return encode_body(
            {
                "type": "function_call_output",
                "call_id": message.tool_call_id,
                "output": message.text,
            }
        )
    if message.role is Role.USER:
        return _role_message("user", message)
    items: list[bytes] = []
    if message.text or not message.tool_calls:
        # An assistant message that only called tools sends no empty message item.
        items.append(_role_message("assistant", message))
    items.extend(
        encode_body(
            {
                "type": "function_call",
                "call_id": call.id,
                "name": call.name,
                "arguments": call.arguments,
            }
        )
        for call in message.tool_calls
    )
    return b",".join(items)


def new_message_cache() -> JSONCache:
    """A cache of :func:`encode_message_items`, one per driver."""
    return JSONCache(encode_message_items)


REASONING_REPLAY: Final = ReplayRules({"reasoning"})
"""What this driver sends back: its own reasoning items, before the item they came
with, every turn (the API itself ignores those of turns before the last user
message). Checked by the shared replay check, whoever calls the driver."""


@functools.lru_cache(maxsize=4096)
def _spliced(raw: bytes) -> bytes:
    """Checked state, byte for byte, ready to splice into ``input``: one item as it
    is, a list of items without its brackets. Each distinct state is cut once."""
    text = raw.strip()
    return text[1:-1].strip() if text[:1] == b"[" else text


def _replayed(messages: Sequence[Message], label: str, left_out: list[str]) -> dict[int, bytes]:
    """The reasoning items each assistant message sends before its own items.

    The shared check (:func:`~threadline._replay.replayed`) refuses state that
    is not reasoning items and leaves out another provider's or model's; a
    message with no text and no tool call sends none either, since the API
    refuses a reasoning item without a following item. Whatever is not sent
    is noted in ``left_out``.

    Raises:
        InvalidRequestError: this model's state that is not reasoning items.
    """
    sent, foreign = replayed(messages, label=label, rules=REASONING_REPLAY)
    left_out.extend(foreign)
    items: dict[int, bytes] = {}
    for index, raw in sent.items():
        message = messages[index]
        if message.text or message.tool_calls:
            items[index] = _spliced(raw)
        else:
            left_out.append(
                f"message {index}: its reasoning was not sent: the message has no text and no "
                "tool call for the reasoning item to precede"
            )
    return items


# --- the transcript ----------------------------------------------------------


def _encode_input(
    messages: Sequence[Message], label: str, cache: JSONCache | None
) -> tuple[str | None, bytes, list[str]]:
    """The instructions, the JSON array of input items, and the reasoning left out."""
    if cache is not None and not cache.serves(messages):
        cache = None
    system: list[str] = []
    left_out: list[str] = []
    items: list[bytes] = []
    replays = _replayed(messages, label, left_out)
    for index, message in enumerate(messages):
        if message.role is Role.SYSTEM:
            if message.text:
                system.append(message.text)
            continue
        if (reasoning := replays.get(index)) is not None:
            items.append(reasoning)
        encoded = cache.get(message) if cache is not None else encode_message_items(message)
        if encoded:
            items.append(encoded)
    instructions = "\n\n".join(system) if system else None
    return instructions, b"[" + b",".join(items) + b"]", left_out


# --- fields ------------------------------------------------------------------


def _encode_tool(tool: Tool) -> dict[str, Any]:
    encoded: dict[str, Any] = {"type": "function", "name": tool.name}
    if tool.description:
        encoded["description"] = tool.description
    encoded["parameters"] = tool.parameters
    return encoded


def _tool_choice(choice: str, tools: tuple[Tool, ...]) -> str | dict[str, Any]:
    if choice in _TOOL_CHOICE_MODES:
        return choice
    if not any(tool.name == choice for tool in tools):
        raise InvalidRequestError(
            f"tool_choice {choice!r} is neither 'auto', 'none', 'required' nor the name "
            "of a tool sent with the call"
        )
    return {"type": "function", "name": choice}


def _fields(
    call: ProviderCall, *, reasoning: dict[str, str] | None, encrypted: bool = True
) -> dict[str, Any]:
    """Every field but ``model``, ``instructions`` and ``input``, ``extra_body`` merged last."""
    fields: dict[str, Any] = {"store": False}
    if encrypted:
        fields["include"] = ["reasoning.encrypted_content"]
    if call.tools:
        fields["tools"] = [_encode_tool(tool) for tool in call.tools]
    if call.tool_choice is not None:
        fields["tool_choice"] = _tool_choice(call.tool_choice, call.tools)
    if call.max_output_tokens is not None:
        fields["max_output_tokens"] = call.max_output_tokens
    sampling = call.sampling
    # stop, seed and the penalties have no Responses equivalent: not sent.
    if sampling.temperature is not None:
        fields["temperature"] = sampling.temperature
    if sampling.top_p is not None:
        fields["top_p"] = sampling.top_p
    if reasoning:
        fields["reasoning"] = dict(reasoning)
    if call.output is not None:
        fields["text"] = {"format": _text_format(call.output)}
    fields.update(call.extra_body)
    return fields


def _text_format(output: OutputSchema) -> dict[str, Any]:
    """``text.format`` for a structured answer: strict where the schema allows it."""
    strict = output.strict_schema
    described: dict[str, Any] = {"type": "json_schema", "name": output.name}
    if output.description:
        described["description"] = output.description
    described["schema"] = dict(output.schema if strict is None else strict)
    described["strict"] = strict is not None
    return described


def _assemble(head: dict[str, Any], instructions: str | None, items: bytes) -> bytes:
    if instructions is not None:
        head = {**head, "instructions": instructions}
    # "input" goes last: the head's closing brace is replaced by it.
    return encode_body(head)[:-1] + b',"input":' + items + b"}"


def encode_request(
    call: ProviderCall,
    *,
    stream: bool,
    label: str,
    reasoning: dict[str, str] | None = None,
    cache: JSONCache | None = None,
    encrypted: bool = True,
) -> EncodedRequest:
    """The body of ``POST /responses`` for ``call``.

    ``label`` (``"openai-responses:<model>"``) decides whose reasoning is
    replayed; ``reasoning`` is the driver's ``{"effort", "summary"}``, which
    a call's ``extra_body={"reasoning": ...}`` replaces; ``encrypted`` asks for
    ``reasoning.encrypted_content``. ``stream`` is final.

    Raises:
        InvalidRequestError: refused replay state, an unknown forced tool, a
            value JSON cannot carry.
    """
    instructions, items, left_out = _encode_input(call.messages, label, cache)
    head: dict[str, Any] = {"model": call.model.name}
    head.update(_fields(call, reasoning=reasoning, encrypted=encrypted))
    head.pop("input", None)
    if stream:
        head["stream"] = True
    else:
        head.pop("stream", None)
    for note in left_out:
        logger.info("%s", note)
    return EncodedRequest(body=_assemble(head, instructions, items), left_out=tuple(left_out))


def encode_count_request(
    call: ProviderCall,
    *,
    label: str,
    reasoning: dict[str, str] | None = None,
    cache: JSONCache | None = None,
) -> bytes:
    """The body of ``POST /responses/input_tokens``: the request's prompt fields only."""
    instructions, items, _ = _encode_input(call.messages, label, cache)
    head: dict[str, Any] = {"model": call.model.name}
    fields = _fields(call, reasoning=reasoning)
    head.update({name: value for name, value in fields.items() if name in COUNT_FIELDS})
    head.pop("input", None)
    return _assemble(head, instructions, items)
