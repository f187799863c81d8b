"""Replay rules: which stored reasoning goes back to a model, checked by an allow-list.

``Reasoning.provider_reasoning`` is a provider's opaque replay state, JSON
bytes kept as the provider sent them. A driver that sends it back declares
:class:`ReplayRules`: the block types it replays (an allow-list: Anthropic's
``thinking`` and ``redacted_thinking``, OpenAI Responses' ``reasoning``
items, Gemini's thought signatures) and where in the transcript (every
assistant turn, or only the tool-use cycle still open). One set of rules
serves everyone who needs it, so they cannot drift apart:

- the run loop (``threadline.engine._replay``) hands each call only what the
  rules send, and counts exactly that;
- a driver called directly (``driver.complete(call)``) asks :func:`replayed`
  before it puts stored state into a body, so nothing the rules refuse, and
  no malformed bytes, can reach the wire whoever calls it;
- counting prices what is sent: the rules are the driver's replay projection.

Some state is also a boundary (``ReplayRules.boundary``): OpenAI Responses'
``compaction`` items and Anthropic's ``compaction`` blocks carry everything
before them. The latest message whose
sent state holds one opens the window: the messages before it (system
messages apart) are not sent, and so not counted, while the transcript keeps
them (:func:`window_start`).

``Reasoning.provider`` names who produced the state (``"<driver>:<model>"``,
see :func:`label_of`). State is only meaningful to the provider and model
that made it (a signature is checked against the model), so state from
anyone else, or from no one named, is left out, never refused.
"""

from __future__ import annotations

import enum
import functools
import json
from collections.abc import Iterable, Sequence
from typing import Any, Final

import attrs

from threadline._errors import InvalidRequestError
from threadline._messages import Message, Origin, Reasoning, Role, has_provider_reasoning
from threadline._validate import fail
from threadline.counting._projection import payload_strings

__all__ = [
    "ANY_REPLAY",
    "Replay",
    "ReplayRules",
    "ReplayScope",
    "block_types",
    "check_provider_reasoning",
    "cycle_of",
    "label_of",
    "open_tool_cycle",
    "reaches",
    "replay_of",
    "replayed",
    "window_start",
]


def label_of(driver_name: str, model_name: str) -> str:
    """What a driver writes into ``Reasoning.provider`` for replies of ``model_name``."""
    return f"{driver_name}:{model_name}"


class ReplayScope(enum.StrEnum):
    """Where in a transcript a driver sends replay state back."""

    EVERY_TURN = "every turn"
    """The state of every assistant message the provider and model made."""
    OPEN_TOOL_CYCLE = "open tool-use cycle"
    """Only the state of the tool-use cycle still open (see :func:`open_tool_cycle`):
    the model needs it to go on from its tool results; earlier turns' is not sent."""


def _blocks(value: Any) -> frozenset[str] | None:
    if value is None:
        return None
    if isinstance(value, str) or not isinstance(value, Iterable):
        fail("blocks", 'a set of block types ({"thinking"}) or None', value)
    found = frozenset(value)
    if not found or not all(isinstance(kind, str) and kind for kind in found):
        fail("blocks", "a non-empty set of non-empty str, or None", value)
    return found


def _boundary(value: Any) -> frozenset[str]:
    if isinstance(value, str) or not isinstance(value, Iterable):
        fail("boundary", 'a set of block types ({"compaction"})', value)
    found = frozenset(value)
    if not all(isinstance(kind, str) and kind for kind in found):
        fail("boundary", "a set of non-empty str", value)
    return found


def _scope(value: Any) -> ReplayScope:
    try:
        return ReplayScope(value)
    except ValueError:
        fail("scope", "one of " + ", ".join(repr(scope.value) for scope in ReplayScope), value)


@attrs.frozen
class ReplayRules:
    """What a driver sends back of ``Reasoning.provider_reasoning``, and where.

    Stored state is one block (a JSON object whose ``"type"`` names it) or a
    list of blocks. ``blocks`` is the allow-list: state the rules would send
    that holds a block of any other type (or anything but blocks) is refused
    with ``InvalidRequestError`` naming the message, before anything is sent.
    ``None`` declares no allow-list (:data:`ANY_REPLAY`, what a driver that
    declares nothing gets): any valid JSON is handed to the driver, except a
    ``{"type": "text"}`` block, which the model would read as the assistant's
    own words. ``scope`` says which messages' state is sent. ``boundary``
    names block types that carry everything before them (OpenAI Responses'
    ``compaction`` items, Anthropic's ``compaction`` blocks): a message
    whose sent state holds one opens the window, and nothing before it but
    system messages is sent (:func:`window_start`); they must be in
    ``blocks`` too.

    The rules are a replay projection too (``replayed_reasoning``): counting
    prices the strings of the blocks they send, not the envelope.

    Raises:
        InvalidRequestError: ``blocks`` is not a non-empty set of str,
            ``scope`` is not a :class:`ReplayScope`, or ``boundary`` names a
            block type ``blocks`` does not send.

    Example::

        ReplayRules({"thinking", "redacted_thinking"}, scope=ReplayScope.OPEN_TOOL_CYCLE)
        ReplayRules({"reasoning"})  # OpenAI Responses reasoning items, every turn
    """

    blocks: frozenset[str] | None = attrs.field(default=None, converter=_blocks)
    scope: ReplayScope = attrs.field(default=ReplayScope.EVERY_TURN, converter=_scope)
    boundary: frozenset[str] = attrs.field(default=frozenset(), converter=_boundary)
    kept: frozenset[str] = attrs.field(default=frozenset(), converter=_boundary)
    """Block types sent back every turn whatever ``scope`` says (Anthropic's
    ``compaction`` blocks, which stand for the turns before them): a message
    whose state holds one is in scope; they must be in ``blocks`` too."""

    @boundary.validator
    def _sent_too(self, _: object, value: frozenset[str]) -> None:
        if value and (self.blocks is None or not value <= self.blocks):
            fail("boundary", "block types that blocks sends too", sorted(value))

    @kept.validator
    def _kept_sent_too(self, _: object, value: frozenset[str]) -> None:
        if value and (self.blocks is None or not value <= self.blocks):
            fail("kept", "block types that blocks sends too", sorted(value))

    def opens_window(self, raw: bytes) -> bool:
        """Whether ``raw``, state these rules send, holds a boundary block that
        carries something (see :func:`window_start`). State that is not JSON holds
        none. A boundary block with nothing in it (Anthropic returns a
        ``compaction`` block whose ``content`` is null when the summary failed,
        and round-trips it as a no-op) stands for nothing: the window does not
        open there, or the turns before it would reach the model as nothing."""
        return bool(self.boundary) and _opens(self.boundary, raw)

    def check(self, raw: bytes, *, index: int) -> None:
        """Refuse ``raw`` unless it is state these rules may send (``index``: the
        message's position, for the error).

        Raises:
            InvalidRequestError: naming the message and what is wrong.
        """
        document = _document(raw, index)
        listed = document if isinstance(document, list) else [document]
        allowed = self.blocks
        if allowed is None:
            _refuse_text_blocks(listed, index)
            return
        for position, block in enumerate(listed):
            kind = _block_type(block)
            if kind not in allowed:
                shown = (
                    f'a {{"type": {json.dumps(kind[:40])}}} block'
                    if kind is not None
                    else f"a {_json_kind(block)}"
                )
                where = f" at position {position}" if isinstance(document, list) else ""
                raise InvalidRequestError(
                    f"message {index}: its reasoning's provider_reasoning holds {shown}{where}; "
                    f"only {' and '.join(sorted(map(json.dumps, allowed)))} blocks are replayed, "
                    "so it cannot be sent back"
                )

    def replayed_reasoning(self, reasoning: Reasoning) -> tuple[str, ...]:
        """The strings of ``reasoning``'s state that go back to the model (and cost tokens).

        Blocks these rules do not send are left out; state that is not JSON is
        counted as its raw text (it is refused before it could be sent).
        """
        raw = reasoning.provider_reasoning
        if not has_provider_reasoning(raw):
            return ()
        try:
            document = _loads(raw)
        except (ValueError, RecursionError):
            return (raw.decode("utf-8", errors="replace"),)
        if self.blocks is not None:
            listed = document if isinstance(document, list) else [document]
            document = [block for block in listed if _block_type(block) in self.blocks]
        return tuple(payload_strings(document))


ANY_REPLAY: Final = ReplayRules()
"""No allow-list, every turn: what a driver that declares no rules of its own gets."""


def _loads(raw: bytes) -> Any:
    # Strict: UTF-8 only, and NaN or Infinity refused, so what is checked is
    # JSON that any provider parses, and spliced bytes keep a body JSON.
    return json.loads(raw.decode("utf-8"), parse_constant=_not_json)


def _not_json(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON value")


def _document(raw: bytes, index: int) -> Any:
    try:
        return _loads(raw)
    except (ValueError, RecursionError) as exc:
        if isinstance(exc, json.JSONDecodeError):
            reason = f"{exc.msg} at position {exc.pos}"
        elif isinstance(exc, RecursionError):
            reason = "nested too deeply"
        else:
            reason = str(exc)
        raise InvalidRequestError(
            f"message {index}: its reasoning's provider_reasoning is not valid JSON ({reason}); "
            "it must be the provider's replay state exactly as the provider sent it"
        ) from None


_UNREADABLE: Final = object()


def _readable(raw: bytes) -> Any:
    """``raw`` parsed, or ``_UNREADABLE`` when it holds no replay state or is not JSON."""
    if not has_provider_reasoning(raw):
        return _UNREADABLE
    try:
        return _loads(raw)
    except (ValueError, RecursionError):
        return _UNREADABLE


@functools.lru_cache(maxsize=4096)
def _holds(kinds: frozenset[str], raw: bytes) -> bool:
    """Whether ``raw`` holds a block of one of ``kinds``; each distinct state parsed once."""
    document = _readable(raw)
    return document is not _UNREADABLE and not kinds.isdisjoint(block_types(document))


_ENVELOPE: Final = frozenset({"type", "id", "cache_control"})
"""A block's fields that name or place it; the rest is what it carries."""


@functools.lru_cache(maxsize=4096)
def _opens(kinds: frozenset[str], raw: bytes) -> bool:
    """Whether ``raw`` holds a block of one of ``kinds`` that carries something:
    a field besides its envelope that is neither null nor empty (nor only spaces);
    each distinct state parsed once, as :func:`_holds` does."""
    document = _readable(raw)
    if document is _UNREADABLE:
        return False
    listed = document if isinstance(document, list) else [document]
    return any(
        _block_type(block) in kinds and _carries(block)
        for block in listed
        if isinstance(block, dict)
    )


def _carries(block: dict[str, Any]) -> bool:
    return any(not _empty(value) for key, value in block.items() if key not in _ENVELOPE)


def _empty(value: object) -> bool:
    if isinstance(value, str):
        return not value.strip()
    return value is None or (isinstance(value, list | dict) and not value)


def block_types(document: object) -> list[str | None]:
    """The ``"type"`` of each block of a parsed state (one block, or a list of them)."""
    listed = document if isinstance(document, list) else [document]
    return [_block_type(block) for block in listed]


def _block_type(block: object) -> str | None:
    kind = block.get("type") if isinstance(block, dict) else None
    return kind if isinstance(kind, str) else None


def _json_kind(value: object) -> str:
    if isinstance(value, dict):
        return "block without a type"
    return {str: "string", bool: "boolean", list: "list", type(None): "null"}.get(
        type(value), "number"
    )


def _refuse_text_blocks(blocks: Sequence[Any], index: int) -> None:
    if any(_block_type(block) == "text" for block in blocks):
        raise InvalidRequestError(
            f'message {index}: its reasoning\'s provider_reasoning holds a {{"type": "text"}} '
            "block, which the model would read as the assistant's own words; keep display "
            "text in Reasoning.text"
        )


def check_provider_reasoning(raw: bytes, *, index: int) -> None:
    """Refuse replay state no driver may be handed, whoever made it.

    Raises:
        InvalidRequestError: ``raw`` is not valid JSON, or it is (or holds, at
            its top level) a ``{"type": "text"}`` block.
    """
    if has_provider_reasoning(raw):
        ANY_REPLAY.check(raw, index=index)


def open_tool_cycle(messages: Sequence[Message]) -> int | None:
    """The index of the assistant message whose tool-use cycle is still open, or ``None``.

    That is the last assistant message, when it called tools and only tool
    results and injected context come after it.
    """
    for index in range(len(messages) - 1, -1, -1):
        message = messages[index]
        if message.role is Role.ASSISTANT:
            return index if message.tool_calls else None
        if message.role is not Role.TOOL and message.origin is not Origin.INJECTION:
            return None
    return None


class Replay(enum.Enum):
    """What becomes of one message's replay state in a call."""

    NONE = "none"
    """There is none (no reasoning, or empty, blank or ``null`` state)."""
    SENT = "sent"
    """Sent back as stored: it passed the rules' check."""
    FOREIGN = "foreign"
    """Left out: another provider or model made it (or no one named)."""
    OUT_OF_SCOPE = "out of scope"
    """Left out: the rules send no state of this message (an earlier turn's)."""


def replay_of(
    reasoning: Reasoning | None, *, index: int, label: str, rules: ReplayRules, in_scope: bool
) -> Replay:
    """What becomes of ``reasoning``'s state in a call to ``label`` under ``rules``.

    ``in_scope`` says whether ``rules.scope`` reaches the message at ``index``.
    State that would be sent is checked first.

    Raises:
        InvalidRequestError: the state would be sent and the rules refuse it.
    """
    if reasoning is None or not reasoning.has_provider_reasoning():
        return Replay.NONE
    if reasoning.provider != label:
        return Replay.FOREIGN
    if not in_scope:
        return Replay.OUT_OF_SCOPE
    rules.check(reasoning.provider_reasoning, index=index)
    return Replay.SENT


def cycle_of(rules: ReplayRules, messages: Sequence[Message]) -> int | None:
    """Where the open tool-use cycle of ``messages`` stands, when ``rules`` send only
    its state; ``None`` otherwise (see :func:`reaches`)."""
    return open_tool_cycle(messages) if rules.scope is ReplayScope.OPEN_TOOL_CYCLE else None


def reaches(rules: ReplayRules, cycle: int | None, index: int, raw: bytes = b"") -> bool:
    """Whether ``rules`` send the state of message ``index`` (``raw``), ``cycle`` being
    :func:`cycle_of` its transcript: every turn's, the open cycle's, or any that
    holds a block the rules keep every turn (``ReplayRules.kept``)."""
    return (
        rules.scope is ReplayScope.EVERY_TURN
        or index == cycle
        or (bool(rules.kept) and _holds(rules.kept, raw))
    )


def replayed(
    messages: Sequence[Message], *, label: str, rules: ReplayRules
) -> tuple[dict[int, bytes], list[str]]:
    """What a driver sends back of ``messages``' state: ``{index: state}`` (each one
    checked, exactly as stored) and a note for each message whose state another
    provider or model made (left out, for the driver to log).

    The one check every driver makes before replay state goes into a body.

    Raises:
        InvalidRequestError: naming the first message whose state would be
            sent and that the rules refuse.
    """
    cycle = cycle_of(rules, messages)
    sent: dict[int, bytes] = {}
    foreign: list[str] = []
    for index, message in enumerate(messages):
        reasoning = message.reasoning
        if reasoning is None:
            continue
        verdict = replay_of(
            reasoning,
            index=index,
            label=label,
            rules=rules,
            in_scope=reaches(rules, cycle, index, reasoning.provider_reasoning),
        )
        if verdict is Replay.SENT:
            sent[index] = reasoning.provider_reasoning
        elif verdict is Replay.FOREIGN:
            foreign.append(
                f"message {index}: reasoning from {reasoning.provider or 'an unnamed provider'} "
                f"was not sent to {label} (another provider or model)"
            )
    return sent, foreign


def window_start(sent: dict[int, bytes], rules: ReplayRules) -> int:
    """Where the sent window of a transcript opens: the index of the latest message
    whose sent state (``sent``, as :func:`replayed` returns it) holds a boundary
    block of ``rules``, or 0.

    The messages before it, system messages apart, are not sent: the boundary
    block carries them (OpenAI bills and shows what precedes a compaction item
    again if it is sent; Anthropic ignores what precedes a compaction block).
    The transcript still holds them.
    """
    if not rules.boundary:
        return 0
    for index in sorted(sent, reverse=True):
        if rules.opens_window(sent[index]):
            return index
    return 0
