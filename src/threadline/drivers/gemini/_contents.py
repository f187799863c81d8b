"""threadline's transcript to Gemini ``contents``: the order rules and the thought signatures.

Pure translation, no I/O. Gemini's rules, and what this module does about each:

- ``contents`` alternate ``user`` and ``model`` turns: consecutive messages of
  one role are merged into one content; system messages become the
  ``systemInstruction``, in transcript order. A transcript whose first turn
  would be the model's (a window cut it there) gets a short user turn first,
  and a note says so: a function-call turn must follow a user turn.
- Tool results are ``functionResponse`` parts of the user content straight
  after the model turn that made the calls, matched to them by ``id`` and
  ``name``, in the calls' order (parallel calls answered in one content). A
  result for a call that turn did not make, or a call left without a result
  when the next model turn or the end comes, is refused with
  ``InvalidRequestError`` before anything is sent.
- Thought signatures. A model message's ``Reasoning.provider_reasoning`` is
  its turn's parts as Gemini sent them. The parts go back exactly as received,
  each signature on its own part, as long as the message still says what
  they say: a text part whose text was changed since (a summary, a handler's
  edit), or a function call whose name or arguments were, is sent from the
  message instead, without a signature. Reasoning another model or provider
  made is never sent (the shared replay check leaves it out, with a note).
- Gemini checks the signatures of the current turn only (the model turns after
  the last user message with text), and there the first function call of each
  step must carry one. A step whose first call came with none from this
  model (written by the user, injected, edited, or from another model) gets
  the documented placeholder :data:`DUMMY_SIGNATURE`, and a note records it; a
  call the model itself sent unsigned (a model that signs nothing) stays so.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from itertools import repeat
from operator import attrgetter, is_
from typing import Any, Final

import attrs

from threadline._errors import InvalidRequestError
from threadline._messages import ImagePart, Message, Role, TextPart, ToolCall
from threadline._replay import ReplayRules, ReplayScope, replayed
from threadline.drivers._http._wire import (
    JSONCache,
    arguments_object,
    encode_body,
    without_system,
)

__all__ = [
    "DUMMY_SIGNATURE",
    "GEMINI_REPLAY",
    "OPENING_TEXT",
    "EncodedContents",
    "encode_contents",
    "new_message_cache",
]

logger = logging.getLogger("threadline.drivers.gemini")

DUMMY_SIGNATURE: Final = "skip_thought_signature_validator"
"""The value Gemini's thought-signature guide documents for a function call that
has no real signature (history from another model, calls the client made)."""

GEMINI_REPLAY: Final = ReplayRules(None, scope=ReplayScope.EVERY_TURN)
"""Every model turn's parts go back as received. Gemini parts carry no ``"type"``,
so there is no block allow-list: :func:`encode_contents` checks their shape."""

OPENING_TEXT: Final = "(The conversation before this point was left out.)"
"""The user turn put before a transcript that would begin with the model's turn."""

_SIGNATURE: Final = "thoughtSignature"


@attrs.frozen(kw_only=True)
class EncodedContents:
    """The ``systemInstruction`` parts, the ``contents`` array, and what the driver
    changed to make them sendable (a placeholder signature, a stale one left off, an
    opening user turn), one note each; reasoning another model made is only logged."""

    system: tuple[bytes, ...]
    contents: bytes
    notes: tuple[str, ...] = ()


class _Part:
    """One part on its way out: its JSON, and what the signature rule needs of it.

    Plain slotted classes, not attrs: a long history makes one per message
    per request, and their construction is most of what encoding it costs.
    """

    __slots__ = ("call", "json", "sends_id", "signed", "unsigned_as_received")

    def __init__(
        self,
        json: bytes,
        *,
        call: bool = False,
        signed: bool = False,
        sends_id: bool = False,
        unsigned_as_received: bool = False,
    ) -> None:
        self.json = json
        self.call = call
        self.signed = signed
        self.sends_id = sends_id
        # A function call the model sent without a signature, first of its step: left so.
        self.unsigned_as_received = unsigned_as_received


class _Turn:
    """One content on its way out: its role, its parts, the calls it made (model) or the
    answers it holds (user), by call id."""

    __slots__ = ("answers", "calls", "parts", "role")

    def __init__(self, role: str, parts: list[_Part | bytes]) -> None:
        self.role = role
        self.parts = parts
        # Made on the first write: most turns of a long history have neither.
        self.calls: dict[str, tuple[str, bool]] = _NO_CALLS  # id -> (name, id sent)
        self.answers: dict[str, _Part] = _NO_ANSWERS

    def add_call(self, call_id: str, name: str, sends_id: bool) -> None:
        if self.calls is _NO_CALLS:
            self.calls = {}
        self.calls[call_id] = (name, sends_id)

    def add_answer(self, call_id: str, part: _Part) -> None:
        if self.answers is _NO_ANSWERS:
            self.answers = {}
        self.answers[call_id] = part


_NO_CALLS: Final[dict[str, tuple[str, bool]]] = {}
_NO_ANSWERS: Final[dict[str, _Part]] = {}


# --- single parts ------------------------------------------------------------


def _text(text: str) -> bytes:
    return encode_body({"text": text})


def _image(part: ImagePart) -> dict[str, Any]:
    url = part.url
    if url.startswith("data:"):
        header, comma, data = url[5:].partition(",")
        media_type, _, encoding = header.partition(";")
        if comma and encoding == "base64" and media_type:
            return {"inlineData": {"mimeType": media_type, "data": data}}
        raise InvalidRequestError(
            "an image data URL must be 'data:<media type>;base64,<data>' for Gemini"
        )
    return {"fileData": {"fileUri": url}}


def _user_parts(message: Message) -> list[bytes]:
    content = message.content
    if isinstance(content, str):
        return [_text(content)] if content else []
    return [
        _text(part.text) if isinstance(part, TextPart) else encode_body(_image(part))
        for part in content
        if not isinstance(part, TextPart) or part.text
    ]


def _args(call: ToolCall) -> dict[str, Any]:
    value = arguments_object(call.arguments)
    if value is None:
        # A reply cut off mid-arguments; Gemini takes only an object here.
        logger.debug("tool call %r: arguments are not a JSON object; sent as {}", call.id)
        return {}
    return value


def _call_part(call: ToolCall) -> bytes:
    return encode_body({"functionCall": {"id": call.id, "name": call.name, "args": _args(call)}})


def _fresh_call(call: ToolCall) -> _Part:
    """A call sent from the message: its id named, no signature."""
    return _Part(_call_part(call), call=True, sends_id=True)


def encode_message_parts(message: Message) -> bytes:
    """A user or plain assistant message's parts, comma-joined (what the cache keeps)."""
    parts = _user_parts(message)
    parts.extend(_call_part(call) for call in message.tool_calls)
    return b",".join(parts)


def new_message_cache() -> JSONCache:
    """A cache of :func:`encode_message_parts`, one per driver."""
    return JSONCache(encode_message_parts)


# --- a model turn's stored parts ---------------------------------------------


def _stored_parts(raw: bytes, index: int) -> list[dict[str, Any]]:
    document = json.loads(raw)  # the shared replay check has parsed it once already
    if not isinstance(document, list) or not all(isinstance(part, dict) for part in document):
        raise InvalidRequestError(
            f"message {index}: its reasoning's provider_reasoning should be the list of "
            "the model turn's parts as Gemini sent them (JSON objects); it cannot be sent back"
        )
    return document


def _same_call(part: dict[str, Any], call: ToolCall) -> bool:
    sent = part.get("functionCall")
    if not isinstance(sent, dict) or sent.get("name") != call.name:
        return False
    if "id" in sent and sent["id"] != call.id:
        return False
    args = sent.get("args")
    return (args if isinstance(args, dict) else {}) == _args(call)


def _replayed_parts(
    message: Message, stored: list[dict[str, Any]], index: int, notes: list[str]
) -> list[_Part]:
    """``stored`` as received, but for the parts the message no longer says."""
    texts = [p for p in stored if isinstance(p.get("text"), str) and p.get("thought") is not True]
    text_kept = "".join(part["text"] for part in texts) == message.text
    calls = list(message.tool_calls)
    out: list[_Part] = []
    lost = 0
    text_placed = text_kept or not message.text
    first_call = True
    for part in stored:
        if "functionCall" in part:
            call = calls.pop(0) if calls else None
            if call is not None and _same_call(part, call):
                signed = _SIGNATURE in part
                out.append(
                    _Part(
                        encode_body(part),
                        call=True,
                        signed=signed,
                        sends_id="id" in part["functionCall"],
                        unsigned_as_received=first_call and not signed,
                    )
                )
            else:
                lost += _SIGNATURE in part
                if call is not None:
                    out.append(_fresh_call(call))
            first_call = False
        elif part in texts and not text_kept:
            lost += _SIGNATURE in part
            if not text_placed:
                out.append(_Part(_text(message.text)))
                text_placed = True
        else:
            out.append(_Part(encode_body(part), signed=_SIGNATURE in part))
    if not text_placed:
        at = next((k for k, part in enumerate(out) if part.call), len(out))
        out.insert(at, _Part(_text(message.text)))
    out.extend(_fresh_call(call) for call in calls)
    if lost:
        notes.append(
            f"message {index}: {lost} signed part(s) were changed since the model wrote them "
            "and were sent from the message, without their thought signatures"
        )
    return out


# --- the transcript ----------------------------------------------------------


def _model_turn_start(messages: Sequence[Message]) -> int:
    """Where the current turn begins: after the last user message (tool results aside)."""
    for index in range(len(messages) - 1, -1, -1):
        if messages[index].role is Role.USER:
            return index + 1
    return 0


def _tool_answer(message: Message, index: int, turns: list[_Turn]) -> tuple[str, _Part]:
    """The ``functionResponse`` part of a tool result, matched to the call it answers."""
    call_id = message.tool_call_id or ""
    # The model turn just before: the last turn, or the one before the user turn
    # already holding this turn's other results.
    model = next((t for t in reversed(turns[-2:]) if t.role == "model"), None)
    found = model.calls.get(call_id) if model is not None else None
    if found is None or (turns[-1].role == "user" and call_id in turns[-1].answers):
        said = "a second result" if found is not None else "a tool result"
        raise InvalidRequestError(
            f"message {index}: {said} for call {call_id!r}, which the model turn before it "
            "did not make (or was answered already); Gemini takes one result per call, "
            "right after the turn that made it"
        )
    name, with_id = found
    text = message.text
    answer = {"error": text} if text.startswith("error: ") else {"result": text}
    response: dict[str, Any] = {"id": call_id} if with_id else {}
    response.update(name=name, response=answer)
    return call_id, _Part(encode_body({"functionResponse": response}))


def _close(model: _Turn | None, next_index: int | None, turns: list[_Turn]) -> None:
    """Refuse to go on past ``model`` (the last model turn) with a call of it unanswered."""
    if model is None or not model.calls:
        return
    answers = turns[-1].answers if turns[-1] is not model else {}
    missing = [call_id for call_id in model.calls if call_id not in answers]
    if missing:
        where = "the end" if next_index is None else f"message {next_index}"
        raise InvalidRequestError(
            f"tool call(s) {', '.join(map(repr, missing))} have no result before {where}; "
            "Gemini needs every call of a turn answered in the user turn after it "
            "(request.with_repair_interrupted_tool_calls() fills in the missing ones)"
        )


def _last_model(turns: list[_Turn]) -> _Turn | None:
    return next((turn for turn in reversed(turns) if turn.role == "model"), None)


def _add(turns: list[_Turn], role: str, parts: list[_Part | bytes], index: int) -> _Turn:
    last = turns[-1] if turns else None
    if last is not None and last.role == role:
        last.parts.extend(parts)
        return last
    if role == "model" and len(turns) > 1 and turns[-2].calls:
        _close(turns[-2], index, turns)
    turn = _Turn(role, parts)
    turns.append(turn)
    return turn


def _model_parts(
    message: Message, index: int, stored: bytes | None, cache: JSONCache | None, notes: list[str]
) -> list[_Part]:
    if stored is not None:
        return _replayed_parts(message, _stored_parts(stored, index), index, notes)
    if not message.tool_calls:
        encoded = cache.get(message) if cache is not None else encode_message_parts(message)
        return [_Part(encoded)] if encoded else []
    parts = [_Part(_text(message.text))] if message.text else []
    parts.extend(_fresh_call(call) for call in message.tool_calls)
    return parts


def _sign_current_turn(turns: list[_Turn], start: int, notes: list[str]) -> None:
    """The placeholder on each current step whose first call has no signature of its own."""
    for position in range(start, len(turns)):
        turn = turns[position]
        first = next((p for p in turn.parts if type(p) is _Part and p.call), None)
        if turn.role != "model" or first is None or first.signed or first.unsigned_as_received:
            continue
        first.json = first.json[:-1] + b',"thoughtSignature":"' + DUMMY_SIGNATURE.encode() + b'"}'
        first.signed = True
        notes.append(
            f"content {position}: its first function call had no thought signature from "
            f"this model; sent with the documented placeholder {DUMMY_SIGNATURE!r}"
        )


def _turns(
    messages: Sequence[Message], sent: dict[int, bytes], cache: JSONCache | None, notes: list[str]
) -> tuple[list[bytes], list[_Turn], int]:
    """The system parts, the turns, and where in them the current turn begins."""
    turn_start = _model_turn_start(messages)
    system: list[bytes] = []
    turns: list[_Turn] = []
    current = 0
    cached = None
    if cache is not None:
        # What the loop takes from the cache (the condition below), at once and in its
        # order: the misses are encoded together (a first request's whole history).
        wanted = [
            m
            for i, m in enumerate(messages)
            if m.role is Role.USER
            or (m.role is Role.ASSISTANT and not m.tool_calls and i not in sent)
        ]
        cached = iter(cache.get_all(wanted))
    for index, message in enumerate(messages):
        if index == turn_start:
            current = len(turns)
        role = message.role
        if role is Role.USER or (
            role is Role.ASSISTANT and not message.tool_calls and index not in sent
        ):
            # Most of a long history: one cached encoding, no calls to pair, kept as bytes.
            encoded = next(cached) if cached is not None else encode_message_parts(message)
            if encoded:
                wire_role = "user" if role is Role.USER else "model"
                if turns and turns[-1].role == wire_role:
                    turns[-1].parts.append(encoded)
                elif wire_role == "user" or len(turns) < 2 or not turns[-2].calls:
                    turns.append(_Turn(wire_role, [encoded]))
                else:
                    _add(turns, wire_role, [encoded], index)  # checks the calls before
        elif role is Role.SYSTEM:
            system.extend(_user_parts(message))
        elif role is Role.TOOL:
            call_id, part = _tool_answer(message, index, turns)
            _add(turns, "user", [], index).add_answer(call_id, part)
        else:
            parts = _model_parts(message, index, sent.get(index), cache, notes)
            if parts:
                calls = [part for part in parts if part.call]
                turn = _add(turns, "model", list(parts), index)
                for call, part in zip(message.tool_calls, calls, strict=True):
                    turn.add_call(call.id, call.name, part.sends_id)
    if turn_start >= len(messages):
        current = len(turns)
    _close(_last_model(turns), None, turns)
    return system, turns, current


def encode_contents(
    messages: Sequence[Message], *, label: str, cache: JSONCache | None = None
) -> EncodedContents:
    """``messages`` as Gemini's ``systemInstruction`` parts and ``contents``.

    ``label`` (``"gemini:<model>"``) decides whose stored parts are replayed.

    Raises:
        InvalidRequestError: an order Gemini refuses that cannot be repaired
            (see the module), stored parts of the wrong shape, or nothing to send.
    """
    if cache is not None and not cache.serves(messages):
        cache = None
    sent, foreign = replayed(messages, label=label, rules=GEMINI_REPLAY)
    for note in foreign:
        logger.info("%s", note)
    if cache is not None and not sent:
        plain = _plain_contents(messages, cache)
        if plain is not None:
            return plain
    notes: list[str] = []  # what this driver changed to make the transcript sendable
    system, turns, current = _turns(messages, sent, cache, notes)
    if not turns:
        raise InvalidRequestError(
            "the call has no user or model content to send (Gemini needs at least one turn)"
        )
    if turns[0].role == "model":
        turns.insert(0, _Turn("user", [_text(OPENING_TEXT)]))
        current += 1
        notes.append("the transcript began with the model's turn; a short user turn was put first")
    _sign_current_turn(turns, current, notes)
    for note in notes:
        logger.info("%s", note)
    return EncodedContents(system=tuple(system), contents=_array(turns), notes=tuple(notes))


_HEADS: Final = {role: b'{"role":"' + role.encode() + b'","parts":[' for role in ("user", "model")}
_WIRE_HEADS: Final = {Role.USER: _HEADS["user"], Role.ASSISTANT: _HEADS["model"]}
_role_of = attrgetter("role")
_calls_of = attrgetter("tool_calls")


def _plain_contents(messages: Sequence[Message], cache: JSONCache) -> EncodedContents | None:
    """``messages`` as :func:`encode_contents` sends them, in C passes over the cache's
    parts, when they are a conversation's plain history (no tool exchange, nothing
    stored to replay, user and model in turn from a user message on, each with parts);
    else ``None``."""
    if Role.TOOL in map(_role_of, messages) or any(map(_calls_of, messages)):
        return None
    sent = without_system(messages)
    roles = list(map(_role_of, sent))
    if not roles or roles[0] is not Role.USER or any(map(is_, roles[1:], roles[:-1])):
        return None
    parts = cache.get_all(sent)
    if b"" in parts:
        return None
    system = [part for m in messages if m.role is Role.SYSTEM for part in _user_parts(m)]
    turns = map(b"".join, zip(map(_WIRE_HEADS.__getitem__, roles), parts, repeat(b"]}")))
    return EncodedContents(system=tuple(system), contents=b"[" + b",".join(turns) + b"]", notes=())


def _array(turns: list[_Turn]) -> bytes:
    out: list[bytes] = []
    for position, turn in enumerate(turns):
        parts = turn.parts
        if len(parts) == 1 and type(parts[0]) is bytes and not turn.answers:
            joined = parts[0]  # a plain message's turn: most of a long history
        else:
            pieces = [p if isinstance(p, bytes) else p.json for p in parts]
            if turn.answers:
                calls = turns[position - 1].calls
                pieces = [turn.answers[call_id].json for call_id in calls] + pieces
            joined = b",".join(piece for piece in pieces if piece)
        if joined:
            out.append(_HEADS[turn.role] + joined + b"]}")
    return b"[" + b",".join(out) + b"]"
