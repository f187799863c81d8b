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
- ``compaction`` items are kept the same way (``_response``) and are a
  boundary: only the items from the latest one this model made are sent, its
  own message's state from that item on, with the ``message`` items straight
  before it (what ``/responses/compact`` retained; a message item anywhere
  else is refused). The messages before it are not
  sent (system messages still make ``instructions``). A message with no text
  and no tool call sends its compaction items alone, never a reasoning item
  with nothing after it.
"""

from __future__ import annotations

import functools
import json
import logging
from collections.abc import Sequence
from typing import Any, Final

import attrs

from threadline._errors import InvalidRequestError
from threadline._messages import ImagePart, Message, Role, TextPart
from threadline._provider import ProviderCall
from threadline._replay import ReplayRules, block_types, replayed, window_start
from threadline.drivers._http._wire import JSONCache, encode_body, without_system
from threadline.drivers.openai_responses._state import Continuation, ServerState
from threadline.tools._output import OutputSchema
from threadline.tools._tools import Tool

__all__ = [
    "COUNT_FIELDS",
    "REASONING_REPLAY",
    "EncodedInput",
    "EncodedRequest",
    "encode_compact_request",
    "encode_count_request",
    "encode_input",
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
    """A body ready to send, and the reasoning it left out (``message i: why``).

    ``previous_response_id`` is the stored response the body continues
    (server-state mode), ``None`` when it holds the whole transcript;
    ``continuation_note`` why a server-state call went whole.
    """

    body: bytes
    left_out: tuple[str, ...] = ()
    previous_response_id: str | None = None
    continuation_note: str | None = None


@attrs.frozen(kw_only=True)
class EncodedInput:
    """A transcript as ``instructions`` and ``input`` items.

    ``items`` are the input items in order, a message's items joined in one
    element; ``reply`` is where the last assistant message's elements are
    (``(start, end)``), ``None`` when there is none; ``left_out`` the notes
    on reasoning not sent.
    """

    instructions: str | None
    items: list[bytes]
    reply: tuple[int, int] | None
    left_out: list[str]


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


COMPACTION: Final = "compaction"
"""The item type that carries everything before it (``/responses/compact``, or
server-side compaction with ``context_management``)."""

RETAINED: Final = "message"
"""The item type ``/responses/compact`` returns beside its compaction item: the
messages it retained (the user's), which the compacted window must send too."""

REASONING_REPLAY: Final = ReplayRules({"reasoning", COMPACTION, RETAINED}, boundary={COMPACTION})
"""What this driver sends back: its own reasoning and compaction items, before the
item they came with, every turn (the API itself ignores reasoning of turns before
the last user message); the latest compaction item opens what is sent, with the
message items a compaction returned right before it (see :func:`_trimmed`).
Checked by the shared replay check, whoever calls the driver."""
_WINDOW_ITEMS: Final = frozenset({COMPACTION, RETAINED})

_DECODER = json.JSONDecoder()


@functools.lru_cache(maxsize=4096)
def _spliced(raw: bytes) -> bytes:
    """Checked state, byte for byte, ready to splice into ``input``: one item as it
    is, a list of items without its brackets. Each distinct state is cut once."""
    text = raw.strip()
    return text[1:-1].strip() if text[:1] == b"[" else text


def _skip_space(text: str, position: int) -> int:
    while position < len(text) and text[position] in " \t\r\n":
        position += 1
    return position


@functools.lru_cache(maxsize=1024)
def _items_of(raw: bytes) -> tuple[tuple[str | None, bytes], ...]:
    """The items of checked state, each with its type and its bytes exactly as stored."""
    text = raw.decode("utf-8").strip()
    if text[:1] != "[":
        return ((block_types(json.loads(text))[0], text.encode("utf-8")),)
    items: list[tuple[str | None, bytes]] = []
    position = _skip_space(text, 1)
    while text[position] != "]":
        item, end = _DECODER.raw_decode(text, position)
        items.append((block_types(item)[0], text[position:end].encode("utf-8")))
        position = _skip_space(text, end)
        if text[position] == ",":
            position = _skip_space(text, position + 1)
    return tuple(items)


def _trimmed(raw: bytes, *, opens: bool, alone: bool) -> tuple[bytes, bool]:
    """The items of ``raw`` a message sends, and whether reasoning was left out.

    ``opens``: the message opens the window, so its state goes from its last
    compaction item on, and with the message items straight before it (what
    ``/responses/compact`` retained: its output is the new window, in order);
    ``alone``: it has no text and no call, so only its compaction and message
    items go (a reasoning item must precede something).
    """
    items = _items_of(raw)
    if opens:
        first = max(at for at, (kind, _) in enumerate(items) if kind == COMPACTION)
        while first and items[first - 1][0] == RETAINED:
            first -= 1
        items = items[first:]
    kept = [piece for kind, piece in items if not alone or kind in _WINDOW_ITEMS]
    return b",".join(kept), len(kept) < len(items)


def _check_retained(raw: bytes, index: int) -> None:
    """Refuse message items in state unless a compaction returned them: each must
    stand, with any others, straight before a compaction item.

    Raises:
        InvalidRequestError: a message item anywhere else.
    """
    kinds = [kind for kind, _ in _items_of(raw)]
    for position, kind in enumerate(kinds):
        if kind != RETAINED:
            continue
        following = next((k for k in kinds[position:] if k != RETAINED), None)
        if following != COMPACTION:
            raise InvalidRequestError(
                f"message {index}: its reasoning's provider_reasoning holds a message item "
                f"at position {position} that no compaction item follows; only the messages "
                "a compaction retained (/responses/compact's output) are replayed"
            )


def _replayed(
    messages: Sequence[Message], label: str, left_out: list[str]
) -> tuple[dict[int, bytes], int]:
    """The items each assistant message sends before its own, and where the sent
    window opens (:func:`~threadline._replay.window_start`).

    The shared check (:func:`~threadline._replay.replayed`) refuses state that
    is not reasoning or compaction items and leaves out another provider's or
    model's; a message with no text and no tool call sends its compaction items
    only, since the API refuses a reasoning item without a following item.
    Whatever is not sent is noted in ``left_out``.

    Raises:
        InvalidRequestError: this model's state that is not reasoning or compaction items.
    """
    sent, foreign = replayed(messages, label=label, rules=REASONING_REPLAY)
    left_out.extend(foreign)
    for index, raw in sent.items():
        if b'"message"' in raw:
            _check_retained(raw, index)
    window = window_start(sent, REASONING_REPLAY)
    items: dict[int, bytes] = {}
    for index, raw in sent.items():
        if index < window:
            continue
        message = messages[index]
        alone = not (message.text or message.tool_calls)
        opens = index == window and REASONING_REPLAY.opens_window(raw)
        if opens or alone:
            items[index], reasoning_cut = _trimmed(raw, opens=opens, alone=alone)
        else:
            items[index], reasoning_cut = _spliced(raw), False
        if alone and reasoning_cut:
            left_out.append(
                f"message {index}: its reasoning was not sent: the message has no text and no "
                "tool call for the reasoning item to precede"
            )
    return items, window


# --- the transcript ----------------------------------------------------------


def encode_input(messages: Sequence[Message], label: str, cache: JSONCache | None) -> EncodedInput:
    """The instructions and input items of ``messages``, sent to ``label``.

    Raises:
        InvalidRequestError: refused replay state.
    """
    if cache is not None and not cache.serves(messages):
        cache = None
    system: list[str] = []
    left_out: list[str] = []
    items: list[bytes] = []
    reply: tuple[int, int] | None = None
    replays, window = _replayed(messages, label, left_out)
    # The messages sent (from the window on, but the system ones) from the cache at
    # once: its misses are encoded together (a first request's whole history).
    sent = without_system(messages[window:]) if cache is not None else []
    pieces = cache.get_all(sent) if cache is not None else None
    if pieces is not None and not replays and b"" not in pieces:
        # No reasoning to replay and no empty message: one item a message, as they are.
        texts = [m.text for m in messages if m.role is Role.SYSTEM and m.text]
        return EncodedInput(
            instructions="\n\n".join(texts) if texts else None,
            items=pieces,
            reply=_last_reply(sent),
            left_out=left_out,
        )
    cached = iter(pieces) if pieces is not None else None
    for index, message in enumerate(messages):
        if message.role is Role.SYSTEM:
            if message.text:
                system.append(message.text)
            continue
        if index < window:
            continue  # the compaction item that opens the window carries it
        known = next(cached) if cached is not None else None
        start = len(items)
        if reasoning := replays.get(index):
            items.append(reasoning)
        if not (reasoning and not (message.text or message.tool_calls)):
            # A message's opaque items may stand alone: no empty message after them.
            encoded = known if known is not None else encode_message_items(message)
            if encoded:
                items.append(encoded)
        if message.role is Role.ASSISTANT:
            reply = (start, len(items))
    instructions = "\n\n".join(system) if system else None
    return EncodedInput(instructions=instructions, items=items, reply=reply, left_out=left_out)


def _last_reply(sent: list[Message]) -> tuple[int, int] | None:
    """Where the last assistant message's item is, one item a message."""
    for index in range(len(sent) - 1, -1, -1):
        if sent[index].role is Role.ASSISTANT:
            return (index, index + 1)
    return None


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


def _assemble(head: dict[str, Any], instructions: str | None, items: Sequence[bytes]) -> bytes:
    if instructions is not None:
        head = {**head, "instructions": instructions}
    # "input" goes last: the head's closing brace is replaced by it.
    return encode_body(head)[:-1] + b',"input":[' + b",".join(items) + b"]}"


def encode_request(
    call: ProviderCall,
    *,
    stream: bool,
    label: str,
    reasoning: dict[str, str] | None = None,
    cache: JSONCache | None = None,
    encrypted: bool = True,
    store: bool = False,
    server_state: ServerState | None = None,
    diagnose: bool = False,
) -> EncodedRequest:
    """The body of ``POST /responses`` for ``call``.

    ``label`` (``"openai-responses:<model>"``) decides whose reasoning is
    replayed; ``reasoning`` is the driver's ``{"effort", "summary"}``, which
    a call's ``extra_body={"reasoning": ...}`` replaces; ``encrypted`` asks for
    ``reasoning.encrypted_content``. ``stream`` is final. ``store`` asks the
    server to keep the response; with ``server_state`` the body continues the
    stored response that holds its history, when one does (see ``_state``).
    ``diagnose`` asks for the prompt cache diagnosis against
    ``call.previous_response_id`` (``prompt_cache_options.comparison_response_id``),
    when there is one; a call's ``extra_body`` ``prompt_cache_options`` wins.

    Raises:
        InvalidRequestError: refused replay state, an unknown forced tool, a
            value JSON cannot carry.
    """
    encoded = encode_input(call.messages, label, cache)
    head: dict[str, Any] = {"model": call.model.name}
    head.update(_fields(call, reasoning=reasoning, encrypted=encrypted))
    head.pop("input", None)
    if stream:
        head["stream"] = True
    else:
        head.pop("stream", None)
    if diagnose and call.previous_response_id is not None:
        head.setdefault(
            "prompt_cache_options", {"comparison_response_id": call.previous_response_id}
        )
    items: Sequence[bytes] = encoded.items
    notes = encoded.left_out
    continuation = Continuation()
    if store:
        head["store"] = True
    if server_state is not None:
        head.pop("previous_response_id", None)
        continuation = server_state.continuation(items, encoded.reply)
        if continuation.previous_response_id is not None:
            head["previous_response_id"] = continuation.previous_response_id
            items = items[continuation.start :]
        if continuation.note is not None:
            notes = [*notes, continuation.note]
    for note in notes:
        logger.info("%s", note)
    return EncodedRequest(
        body=_assemble(head, encoded.instructions, items),
        left_out=tuple(notes),
        previous_response_id=continuation.previous_response_id,
        continuation_note=continuation.note,
    )


def encode_compact_request(
    call: ProviderCall, *, label: str, cache: JSONCache | None = None
) -> bytes:
    """The body of ``POST /responses/compact``: ``model``, ``instructions``, the
    ``input`` items as a call would send them, and the ``prompt_cache_key``.

    Raises:
        InvalidRequestError: refused replay state.
    """
    encoded = encode_input(call.messages, label, cache)
    head: dict[str, Any] = {"model": call.model.name}
    if call.cache_key is not None:
        head["prompt_cache_key"] = call.cache_key
    return _assemble(head, encoded.instructions, encoded.items)


def encode_count_request(
    call: ProviderCall,
    *,
    label: str,
    reasoning: dict[str, str] | None = None,
    cache: JSONCache | None = None,
) -> bytes:
    """The body of ``POST /responses/input_tokens``: the request's prompt fields only."""
    encoded = encode_input(call.messages, label, cache)
    head: dict[str, Any] = {"model": call.model.name}
    fields = _fields(call, reasoning=reasoning)
    head.update({name: value for name, value in fields.items() if name in COUNT_FIELDS})
    head.pop("input", None)
    return _assemble(head, encoded.instructions, encoded.items)
