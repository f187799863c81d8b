"""The Anthropic Messages request: threadline's transcript to the JSON body.

Pure translation, no I/O. What differs from Chat Completions:

- there is no system role: every system message becomes a text block of the
  top-level ``system`` field, in transcript order;
- roles alternate: consecutive messages of one role are merged into one turn
  of content blocks; tool results are ``tool_result`` blocks of a user turn
  that comes straight after the assistant's ``tool_use`` blocks, with
  ``is_error`` for a failed tool (threadline writes those as ``error: ...``);
- thinking is replayed by position, as :data:`THINKING_REPLAY` says. The
  current tool-use cycle (the last assistant message, when it called tools
  and only their results and injected context follow) is sent with its
  thinking blocks exactly as they are stored, first in its content, once they
  pass the rules' allow-list (``thinking`` and ``redacted_thinking`` blocks
  only). Thinking of earlier turns is left out: the API strips it anyway and
  does not count it. Reasoning another provider or another model produced is
  never sent, and the request says so in its ``left_out`` notes;
- server-side compaction's ``compaction`` block goes back every turn, and the
  latest one opens what is sent: the API ignores every block before it, so
  the messages before its message are left out (system messages apart).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from itertools import repeat
from operator import attrgetter, eq, is_, itemgetter
from typing import Any, Final, Literal, TypeAlias

import attrs

from threadline._errors import InvalidRequestError
from threadline._messages import ImagePart, Message, Role, TextPart, ToolCall
from threadline._provider import ProviderCall
from threadline._replay import (
    ReplayRules,
    ReplayScope,
    open_tool_cycle,
    replayed,
    window_start,
)
from threadline.drivers._http._wire import (
    JSONCache,
    arguments_object,
    encode_body,
    without_system,
)
from threadline.tools._output import OutputSchema
from threadline.tools._tools import Tool

__all__ = [
    "MIN_THINKING_BUDGET",
    "THINKING_REPLAY",
    "EncodedRequest",
    "Thinking",
    "encode_count_request",
    "encode_message_blocks",
    "encode_request",
    "new_message_cache",
]

logger = logging.getLogger("threadline.drivers.anthropic")

MIN_THINKING_BUDGET: Final = 1024
"""The smallest ``budget_tokens`` the API accepts for enabled thinking."""

COMPACTION_BLOCK: Final = "compaction"
"""Server-side compaction's block (``context_management``): its summary stands
for the turns before it, so it goes back every turn, where it was."""

THINKING_REPLAY: Final = ReplayRules(
    frozenset({"thinking", "redacted_thinking", COMPACTION_BLOCK}),
    scope=ReplayScope.OPEN_TOOL_CYCLE,
    kept={COMPACTION_BLOCK},
    boundary={COMPACTION_BLOCK},
)
"""What the driver sends back of stored reasoning: the thinking blocks of the
tool-use cycle still open, every ``compaction`` block this model made, and
nothing else (a stored ``text`` or ``tool_use`` block would reach the model
as words or calls the assistant never made). The latest ``compaction`` block
opens what is sent: the API ignores every block before it, so the messages
before its message are neither sent nor counted (the transcript keeps them)."""

_TOOL_ERROR_PREFIX: Final = "error: "
# The fields /v1/messages/count_tokens takes; anything else is refused there.
_COUNT_FIELDS: Final = frozenset({"model", "system", "tools", "tool_choice", "thinking"})


def _budget(instance: Thinking, attribute: attrs.Attribute[int | None], value: int | None) -> None:
    if instance.type != "enabled":
        if value is not None:
            raise InvalidRequestError(
                f"thinking budget_tokens only goes with 'enabled', not {instance.type!r}"
            )
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < MIN_THINKING_BUDGET:
        raise InvalidRequestError(
            f"thinking budget_tokens must be an int >= {MIN_THINKING_BUDGET}, not {value!r}"
        )


@attrs.frozen
class Thinking:
    """Extended thinking: ``Thinking.enabled(2048)``, ``Thinking.adaptive()`` or ``disabled()``.

    Give it to ``AnthropicDriver(thinking=...)`` for every call, or per request
    with ``request.with_extra_body({"thinking": Thinking.enabled(4096)})``.
    ``budget_tokens`` must be at least 1024 and below the request's
    ``max_tokens``.

    Raises:
        InvalidRequestError: a budget below 1024, or a budget with another type.
    """

    type: Literal["enabled", "adaptive", "disabled"] = attrs.field(
        validator=attrs.validators.in_(("enabled", "adaptive", "disabled"))
    )
    budget_tokens: int | None = attrs.field(default=None, validator=_budget)

    @classmethod
    def enabled(cls, budget_tokens: int) -> Thinking:
        """Thinking with up to ``budget_tokens`` tokens of reasoning."""
        return cls("enabled", budget_tokens)

    @classmethod
    def adaptive(cls) -> Thinking:
        """Let the model decide how much to think (models that support it)."""
        return cls("adaptive")

    @classmethod
    def disabled(cls) -> Thinking:
        """No thinking, even where the driver's default enables it."""
        return cls("disabled")

    def to_json(self) -> dict[str, Any]:
        """The ``thinking`` field of the body."""
        if self.budget_tokens is None:
            return {"type": self.type}
        return {"type": self.type, "budget_tokens": self.budget_tokens}


@attrs.frozen(kw_only=True)
class EncodedRequest:
    """A body ready to send, and the reasoning it left out (``message i: why``)."""

    body: bytes
    left_out: tuple[str, ...] = ()


# --- content blocks ----------------------------------------------------------


def _text_block(text: str) -> bytes:
    return encode_body({"type": "text", "text": text})


def _image_block(part: ImagePart) -> dict[str, Any]:
    url = part.url
    if url.startswith("data:"):
        header, comma, data = url[5:].partition(",")
        media_type, _, encoding = header.partition(";")
        if comma and encoding == "base64" and media_type:
            return {
                "type": "image",
                "source": {"type": "base64", "media_type": media_type, "data": data},
            }
        raise InvalidRequestError(
            "an image data URL must be 'data:<media type>;base64,<data>' for Anthropic"
        )
    return {"type": "image", "source": {"type": "url", "url": url}}


def _content_blocks(message: Message) -> list[bytes]:
    content = message.content
    if isinstance(content, str):
        return [_text_block(content)] if content else []
    blocks = []
    for part in content:
        if isinstance(part, TextPart):
            if part.text:
                blocks.append(_text_block(part.text))
        else:
            blocks.append(encode_body(_image_block(part)))
    return blocks


def _tool_input(call: ToolCall) -> bytes:
    """The call's arguments as the ``input`` object, their own bytes when they are one."""
    if arguments_object(call.arguments) is None:
        # A reply cut off mid-arguments; the API takes only an object here.
        logger.debug("tool call %r: arguments are not a JSON object; sent as {}", call.id)
        return b"{}"
    text = call.arguments.strip()
    return text.encode("utf-8") if text else b"{}"


def _tool_use_block(call: ToolCall) -> bytes:
    head = encode_body({"type": "tool_use", "id": call.id, "name": call.name})
    return head[:-1] + b',"input":' + _tool_input(call) + b"}"


def _tool_result_block(message: Message) -> bytes:
    text = message.text
    block: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.tool_call_id}
    if not isinstance(message.content, str) and any(
        isinstance(part, ImagePart) for part in message.content
    ):
        # An image the tool returned (an MCP tool's screenshot) goes as an image block.
        block["content"] = [
            _image_block(part)
            if isinstance(part, ImagePart)
            else {"type": "text", "text": part.text}
            for part in message.content
            if isinstance(part, ImagePart) or part.text
        ]
    elif text:
        block["content"] = text
    if text.startswith(_TOOL_ERROR_PREFIX):
        block["is_error"] = True
    return encode_body(block)


def encode_message_blocks(message: Message) -> bytes:
    """``message``'s content blocks, comma-joined, without any thinking.

    This is how every message but the current tool-use cycle is sent, so it
    is what the per-message cache keeps.
    """
    if message.role is Role.TOOL:
        return _tool_result_block(message)
    blocks = _content_blocks(message)
    blocks.extend(_tool_use_block(call) for call in message.tool_calls)
    return b",".join(blocks)


def new_message_cache() -> JSONCache:
    """A cache of :func:`encode_message_blocks`, one per driver."""
    return JSONCache(encode_message_blocks)


# --- the transcript ----------------------------------------------------------


def _thinking_blocks(raw: bytes) -> bytes:
    """Stored blocks the replay rules passed (UTF-8 JSON: one block or a list of
    them), byte for byte, ready to splice into a content array."""
    text = raw.strip()
    return text[1:-1].strip() if text[:1] == b"[" else text


def _replayed(
    messages: Sequence[Message], label: str, left_out: list[str]
) -> tuple[dict[int, bytes], int]:
    """The thinking each message sends, checked (see :data:`THINKING_REPLAY`), and
    where the sent window opens (the latest ``compaction`` block's message, or 0;
    :func:`~threadline._replay.window_start`); a note in ``left_out`` for each
    message whose reasoning another provider made."""
    sent, foreign = replayed(messages, label=label, rules=THINKING_REPLAY)
    left_out.extend(foreign)
    cycle = open_tool_cycle(messages)
    blocks = {
        index: _thinking_blocks(raw) if index == cycle else _compaction_blocks(raw)
        for index, raw in sent.items()
    }
    return blocks, window_start(sent, THINKING_REPLAY)


def _compaction_blocks(raw: bytes) -> bytes:
    """The ``compaction`` blocks of checked state, for a message outside the open
    cycle: its thinking is not sent (the API strips earlier turns' thinking)."""
    document = json.loads(raw)
    listed = document if isinstance(document, list) else [document]
    return b",".join(
        encode_body(block)
        for block in listed
        if isinstance(block, dict) and block.get("type") == COMPACTION_BLOCK
    )


def _turn(role: bytes, blocks: list[bytes]) -> bytes:
    return b'{"role":"' + role + b'","content":[' + b",".join(blocks) + b"]}"


_CACHE_CONTROL = b',"cache_control":{"type":"ephemeral"}}'


def _marked(block: bytes) -> bytes:
    """``block`` (one or more comma-joined JSON objects) with a cache breakpoint on its last."""
    return block[:-1] + _CACHE_CONTROL


_Entry: TypeAlias = tuple[bytes, bytes, bool, bool]
"""A message on the wire: its role there, its blocks, whether a breakpoint may go
there, whether it is a user prompt."""
_WIRE_ROLES: Final = {role: b"assistant" if role is Role.ASSISTANT else b"user" for role in Role}
_TURN_HEADS: Final = {
    wire: b'{"role":"' + wire + b'","content":[' for wire in (b"assistant", b"user")
}
_role_of = attrgetter("role")
_blocks_of = itemgetter(1)


def _encode_transcript(
    messages: Sequence[Message], label: str, cache: JSONCache | None, *, breakpoints: bool = False
) -> tuple[list[bytes], bytes, list[str]]:
    """The system blocks, the JSON array of turns, and the reasoning left out.

    With ``breakpoints``, the last system block and the stable prefix carry
    ``cache_control`` (see :func:`_place_breakpoints`).
    """
    if cache is not None and not cache.serves(messages):
        cache = None
    system: list[bytes] = []
    left_out: list[str] = []
    replays, window = _replayed(messages, label, left_out)
    entries = _cached_entries(messages, cache, system) if not replays else None
    if entries is None:
        entries = _entries(messages, replays, cache, system, window)
    if breakpoints:
        system = _place_breakpoints(system, entries)
    wire = list(map(_wire_role_of, entries))
    if not any(map(eq, wire[1:], wire[:-1])):
        # One message a turn (a conversation's history): each turn made in C passes.
        heads = map(_TURN_HEADS.__getitem__, wire)
        turns = map(b"".join, zip(heads, map(_blocks_of, entries), repeat(b"]}")))
        return system, b"[" + b",".join(turns) + b"]", left_out
    grouped: list[bytes] = []
    role = b""
    blocks: list[bytes] = []
    for this_role, encoded, _, _ in entries:
        if this_role != role and blocks:
            grouped.append(_turn(role, blocks))
            blocks = []
        role = this_role
        blocks.append(encoded)
    if blocks:
        grouped.append(_turn(role, blocks))
    return system, b"[" + b",".join(grouped) + b"]", left_out


_wire_role_of = itemgetter(0)


def _cached_entries(
    messages: Sequence[Message], cache: JSONCache | None, system: list[bytes]
) -> list[_Entry] | None:
    """The entries of a transcript that replays no thinking, in C passes over the
    cache's blocks; ``None`` without a cache, or when a message has no blocks (the
    loop of :func:`_entries` leaves it out)."""
    if cache is None:
        return None
    sent = without_system(messages)
    blocks = cache.get_all(sent)
    if b"" in blocks:
        return None
    for message in messages:
        if message.role is Role.SYSTEM:
            system.extend(_content_blocks(message))
    roles = list(map(_role_of, sent))
    wire = map(_WIRE_ROLES.__getitem__, roles)
    prompts = map(is_, roles, repeat(Role.USER))
    return list(zip(wire, blocks, repeat(True), prompts))


def _entries(
    messages: Sequence[Message],
    replays: dict[int, bytes],
    cache: JSONCache | None,
    system: list[bytes],
    window: int,
) -> list[_Entry]:
    """Each message's entry, one by one, with the thinking ``replays`` sends, from
    message ``window`` on (the latest compaction block's); the system messages'
    blocks go to ``system``."""
    entries: list[_Entry] = []
    # Every message but the system ones, from the cache at once: its misses are
    # encoded together (a first request's whole history), in the loop's order.
    cached = iter(cache.get_all(without_system(messages))) if cache is not None else None
    for index, message in enumerate(messages):
        if message.role is Role.SYSTEM:
            system.extend(_content_blocks(message))
            continue
        known = next(cached) if cached is not None else None
        if index < window:
            continue  # before the latest compaction block, which stands for it
        thinking = replays.get(index)
        if thinking is not None:
            plain = encode_message_blocks(message)
            encoded = b",".join(part for part in (thinking, plain) if part)
            markable = bool(plain)  # a thinking block cannot carry cache_control
        else:
            encoded = known if known is not None else encode_message_blocks(message)
            markable = True
        if not encoded:
            continue  # an empty message: the API refuses empty content
        entries.append((_WIRE_ROLES[message.role], encoded, markable, message.role is Role.USER))
    return entries


def _place_breakpoints(system: list[bytes], entries: list[_Entry]) -> list[bytes]:
    """Mark where the prompt cache should write and read: at most three breakpoints.

    The end of the system blocks (tools come before them in the cached
    prefix, so this covers both, and survives any cut of the history); the
    end of the history before the current prompt (what the last call wrote,
    read back now); and the end of the request (written for the next call,
    which repeats it under a stable window). The API allows four.
    """
    if system:
        system = [*system[:-1], _marked(system[-1])]
    prompt = next((k for k in range(len(entries) - 1, -1, -1) if entries[k][3]), None)
    chosen = {len(entries) - 1}
    if prompt is not None:
        chosen.add(prompt - 1)
    for k in sorted(chosen):
        while k >= 0 and not entries[k][2]:
            k -= 1
        if k >= 0:
            role, encoded, _, is_prompt = entries[k]
            entries[k] = (role, _marked(encoded), False, is_prompt)  # marked once
    return system


# --- fields ------------------------------------------------------------------


def _encode_tool(tool: Tool) -> dict[str, Any]:
    encoded: dict[str, Any] = {"name": tool.name}
    if tool.description:
        encoded["description"] = tool.description
    encoded["input_schema"] = tool.parameters
    return encoded


def _tool_choice(choice: str, tools: tuple[Tool, ...]) -> dict[str, Any]:
    if choice in ("auto", "none"):
        return {"type": choice}
    if choice == "required":
        return {"type": "any"}
    if not any(tool.name == choice for tool in tools):
        raise InvalidRequestError(
            f"tool_choice {choice!r} is neither 'auto', 'none', 'required' nor the name "
            "of a tool sent with the call"
        )
    return {"type": "tool", "name": choice}


def _thinking_json(value: object, max_tokens: int | None) -> dict[str, Any]:
    if isinstance(value, Thinking):
        thinking = value
    elif isinstance(value, Mapping):
        try:
            thinking = Thinking(value.get("type"), value.get("budget_tokens"))  # type: ignore[arg-type]
        except (TypeError, ValueError) as exc:
            raise InvalidRequestError(f"thinking {dict(value)!r} is not valid: {exc}") from None
    else:
        raise InvalidRequestError(
            f"thinking must be a Thinking value or a mapping, not {type(value).__name__}"
        )
    budget = thinking.budget_tokens
    if budget is not None and max_tokens is not None and budget >= max_tokens:
        raise InvalidRequestError(
            f"thinking budget_tokens ({budget}) must be below max_tokens ({max_tokens}); "
            "raise with_max_output_tokens or lower the budget"
        )
    return thinking.to_json()


def _fields(
    call: ProviderCall, *, max_tokens: int | None, thinking: Thinking | None
) -> dict[str, Any]:
    """Every field but ``model``, ``system`` and ``messages``, ``extra_body`` merged last."""
    fields: dict[str, Any] = {}
    if max_tokens is not None:
        fields["max_tokens"] = max_tokens
    if call.tools:
        fields["tools"] = [_encode_tool(tool) for tool in call.tools]
    if call.tool_choice is not None:
        fields["tool_choice"] = _tool_choice(call.tool_choice, call.tools)
    sampling = call.sampling
    for field, value in (
        ("temperature", sampling.temperature),
        ("top_p", sampling.top_p),
        ("stop_sequences", None if sampling.stop is None else list(sampling.stop)),
    ):
        if value is not None:
            fields[field] = value
    # seed, presence_penalty and frequency_penalty have no Anthropic equivalent.
    extra = dict(call.extra_body)
    if call.output is not None:
        # An output_config of extra_body's (an effort) keeps its keys; the format joins them.
        given = extra.pop("output_config", None)
        config = dict(given) if isinstance(given, dict) else {}
        config.setdefault("format", _output_format(call.output))
        fields["output_config"] = config
    chosen = extra.pop("thinking", thinking)
    if chosen is not None:
        fields["thinking"] = _thinking_json(chosen, max_tokens)
    fields.update(extra)
    return fields


def _output_format(output: OutputSchema) -> dict[str, Any]:
    """The native structured-output format: the schema under strict rules where it
    follows them (every property listed as required, optional ones nullable, no
    ``default``), else as it is."""
    schema = output.schema if output.strict_schema is None else output.strict_schema
    return {"type": "json_schema", "schema": dict(schema)}


def _assemble(head: dict[str, Any], system: list[bytes], messages: bytes) -> bytes:
    body = encode_body(head)[:-1]
    if system:
        body += b',"system":[' + b",".join(system) + b"]"
    return body + b',"messages":' + messages + b"}"


def encode_request(
    call: ProviderCall,
    *,
    stream: bool,
    label: str,
    default_max_tokens: int,
    thinking: Thinking | None = None,
    cache: JSONCache | None = None,
    breakpoints: bool = False,
    diagnostics: bool = False,
) -> EncodedRequest:
    """The body of ``POST /v1/messages`` for ``call``.

    ``label`` (``"anthropic:<model>"``) decides whose reasoning is replayed;
    ``max_tokens`` is the call's ``max_output_tokens`` or ``default_max_tokens``.
    ``breakpoints`` places the prompt cache's ``cache_control`` marks: on the
    last system block (or, without a system prompt, the last tool) and on the
    stable prefix of the messages (see ``_place_breakpoints``). ``diagnostics``
    asks for the cache diagnosis against ``call.previous_response_id`` (``null``
    on a first call, which opts in with nothing to compare); a call's
    ``extra_body={"diagnostics": ...}`` wins.

    Raises:
        InvalidRequestError: refused replay state, an unknown forced tool, a
            thinking budget that does not fit, a value JSON cannot carry.
    """
    max_tokens = call.max_output_tokens or default_max_tokens
    system, messages, left_out = _encode_transcript(
        call.messages, label, cache, breakpoints=breakpoints
    )
    head: dict[str, Any] = {"model": call.model.name}
    head.update(_fields(call, max_tokens=max_tokens, thinking=thinking))
    if diagnostics:
        head.setdefault("diagnostics", {"previous_message_id": call.previous_response_id})
    tools = head.get("tools")
    if breakpoints and not system and isinstance(tools, list) and tools:
        head["tools"] = [*tools[:-1], {**tools[-1], "cache_control": {"type": "ephemeral"}}]
    if stream:
        head["stream"] = True
    else:
        head.pop("stream", None)
    for note in left_out:
        logger.info("%s", note)
    return EncodedRequest(body=_assemble(head, system, messages), left_out=tuple(left_out))


def encode_count_request(
    call: ProviderCall,
    *,
    label: str,
    thinking: Thinking | None = None,
    cache: JSONCache | None = None,
) -> bytes:
    """The body of ``POST /v1/messages/count_tokens``: the request's, minus ``max_tokens``.

    Only the fields the counting endpoint takes are kept (model, system,
    messages, tools, tool choice, thinking).
    """
    system, messages, _ = _encode_transcript(call.messages, label, cache)
    head: dict[str, Any] = {"model": call.model.name}
    fields = _fields(call, max_tokens=None, thinking=thinking)
    head.update({name: value for name, value in fields.items() if name in _COUNT_FIELDS})
    return _assemble(head, system, messages)
