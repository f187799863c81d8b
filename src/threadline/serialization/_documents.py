"""What a saved conversation holds: the document a ``Conversation`` saves and restores.

Data only, like ``_messages``: frozen, keyword-only attrs classes. Turning them
into JSON and back is the converter's job (``_converter`` and ``_hooks``). The
document holds the transcript and the conversation's state, never the agent,
API keys or tool handlers.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

import attrs

from threadline._errors import InvalidRequestError
from threadline._messages import Message, Origin, Role, Usage
from threadline.serialization._json import JsonValue, copy_json, json_value_problem, member_path

__all__ = [
    "ConversationDocument",
    "ConversationEvent",
    "DocumentProblem",
    "JsonValue",
    "MessageList",
    "check_turn_order",
    "id_problem",
    "json_value_problem",
    "member_path",
]


class DocumentProblem(InvalidRequestError):
    """A document or an event that cannot be, whatever its fields' types.

    ``suffix`` locates the problem below the value checked (``.pending``,
    ``.events[3].turn_id``), so a loader can name its JSON path; ``reason``
    says what is wrong.
    """

    def __init__(self, reason: str, *, suffix: str, where: str | None = None) -> None:
        super().__init__(f"{where}: {reason}" if where else reason)
        self.reason = reason
        self.suffix = suffix


def id_problem(value: str) -> str | None:
    """Why the string ``value`` cannot be a conversation's id, or ``None`` when it can.

    A lone surrogate (``"\\ud800"``, which JSON's escapes can spell) makes a
    Python str that is no text: no encoder takes it, so the prompt-cache key of
    every turn, and a store, would fail on it.
    """
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"a conversation id is text, and {value!r} holds a lone surrogate at {exc.start}"
    return None


def _to_settings(value: Mapping[str, JsonValue]) -> dict[str, JsonValue]:
    if not isinstance(value, Mapping):
        raise InvalidRequestError(f"settings must be a mapping, not {type(value).__name__}")
    settings = dict(value)
    problem = json_value_problem(settings)
    if problem is not None:
        raise InvalidRequestError(f"settings{problem[0]}: {problem[1]}")
    # A deep copy, so the caller's later edits cannot reach a frozen document.
    copied: dict[str, JsonValue] = copy_json(settings)
    return copied


def _to_metadata(value: Mapping[str, str]) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise InvalidRequestError(f"metadata must be a mapping, not {type(value).__name__}")
    metadata = dict(value)
    for key, item in metadata.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise InvalidRequestError(
                f"metadata maps strings to strings; {key!r}: {item!r} does not"
            )
    return metadata


def _to_events(value: Iterable[ConversationEvent]) -> tuple[ConversationEvent, ...]:
    events = tuple(value)
    for index, event in enumerate(events):
        if not isinstance(event, ConversationEvent):
            raise InvalidRequestError(
                f"event {index} is a {type(event).__name__}, not a ConversationEvent"
            )
    return events


def _check_count(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidRequestError(f"{name} must be an int >= 0, not {value!r}")


def _check_timestamp(name: str, value: object) -> None:
    if value is None:
        return
    if not isinstance(value, datetime):
        raise InvalidRequestError(f"{name} must be a datetime or None, not {value!r}")
    if value.utcoffset() is None:
        # A naive time means different instants on different machines.
        raise InvalidRequestError(f"{name} must be timezone-aware, not {value.isoformat()}")


@attrs.frozen(kw_only=True)
class ConversationEvent:
    """One message of a conversation's transcript, with the state around it.

    ``message``: the message itself. Never of origin ``injection``: injected
    context is not persisted.
    ``turn_id``: the turn the message belongs to. A turn is one submitted
    prompt and everything the run added for it (replies, tool calls, tool
    results); ids are handed out by the conversation in increasing order.
    ``usage``: what the provider reported for the call that produced this
    message (assistant messages), ``None`` otherwise or when unknown.
    ``pending``: a submitted user message persisted before the provider work
    started and not yet committed with its turn; only a user message can be
    pending.
    ``model``: the model that produced an assistant message, when known.
    ``finish_reason``: why the provider stopped (``"stop"``, ``"length"``,
    ``"tool_calls"``...), when known.

    Raises:
        InvalidRequestError: a field of the wrong type, a negative turn id,
            an injected message, or a pending message that is not a user's.
    """

    message: Message = attrs.field(validator=attrs.validators.instance_of(Message))
    turn_id: int
    usage: Usage | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(Usage))
    )
    pending: bool = attrs.field(default=False, validator=attrs.validators.instance_of(bool))
    model: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(str))
    )
    finish_reason: str | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(str))
    )

    def __attrs_post_init__(self) -> None:
        _check_count("turn_id", self.turn_id)
        if self.message.origin is Origin.INJECTION:
            raise InvalidRequestError("injected messages are never persisted")
        if self.pending and self.message.role is not Role.USER:
            raise DocumentProblem(
                "only a user message (a submitted prompt) can be pending; this one's role "
                f"is {self.message.role.value}",
                suffix=".pending",
            )


@attrs.frozen(kw_only=True)
class ConversationDocument:
    """Everything a conversation saves: its transcript and state.

    ``id``: the conversation's id, never empty.
    ``events``: the whole transcript, oldest first, every turn kept (the
    window sent to the model is computed from it and ``history_limit``). The
    answered events of one turn are together and turn ids never go back.
    ``history_limit``: how many messages the model-facing window holds at
    least; 0 sends everything.
    ``next_turn_id``: the id the next turn gets; greater than every event's
    ``turn_id``, so ids keep counting forward after compaction or a reset.
    ``total_usage``: what every provider call of this conversation reported,
    summed.
    ``settings``: the conversation's own options as JSON values
    (``max_context_tokens``, ``output_reserve_tokens``, ...). The keys are the
    conversation's business; this document only keeps them exactly.
    ``metadata``: the caller's own labels, strings to strings.
    ``created_at`` / ``updated_at``: timezone-aware times, or ``None`` when
    unknown.

    ``settings`` and ``metadata`` are copied on construction and do not take
    part in the hash.

    Raises:
        InvalidRequestError: a field that does not fit (an empty id, a negative
            count, an event whose ``turn_id`` is not below ``next_turn_id``,
            turn ids that go back or repeat, a setting JSON cannot hold, a
            naive datetime).
    """

    id: str
    history_limit: int = 0
    next_turn_id: int = 0
    total_usage: Usage = attrs.field(factory=Usage, validator=attrs.validators.instance_of(Usage))
    settings: dict[str, JsonValue] = attrs.field(factory=dict, converter=_to_settings, hash=False)
    metadata: dict[str, str] = attrs.field(factory=dict, converter=_to_metadata, hash=False)
    created_at: datetime | None = None
    updated_at: datetime | None = None
    # Last, so a saved document reads state first and the long transcript after.
    events: tuple[ConversationEvent, ...] = attrs.field(default=(), converter=_to_events)

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.id, str) or not self.id:
            raise InvalidRequestError(f"a conversation id is a non-empty string, not {self.id!r}")
        problem = id_problem(self.id)
        if problem is not None:
            raise InvalidRequestError(problem)
        _check_count("history_limit", self.history_limit)
        _check_count("next_turn_id", self.next_turn_id)
        _check_below_next_turn_id(self.events, self.next_turn_id)
        check_turn_order(self.events)
        _check_timestamp("created_at", self.created_at)
        _check_timestamp("updated_at", self.updated_at)


@attrs.frozen(kw_only=True)
class MessageList:
    """What a message list document holds, its ``format_version`` left out: the messages."""

    messages: tuple[Message, ...]


def _check_below_next_turn_id(events: tuple[ConversationEvent, ...], next_turn_id: int) -> None:
    for index, event in enumerate(events):
        if event.turn_id >= next_turn_id:
            raise DocumentProblem(
                f"turn_id {event.turn_id} is not below next_turn_id {next_turn_id}",
                suffix=f".events[{index}].turn_id",
                where=f"event {index}",
            )


def check_turn_order(events: Sequence[ConversationEvent]) -> None:
    """Refuse an answered turn id that goes back, so comes again after another turn.

    Pending events are left out of the order: a crashed writer's prompt stays
    pending, in place, while later turns are answered after it.

    Raises:
        DocumentProblem: the first event out of order, ``suffix`` its path.
    """
    previous: ConversationEvent | None = None
    previous_index = 0
    for index, event in enumerate(events):
        if event.pending:
            continue
        if previous is not None and event.turn_id < previous.turn_id:
            raise DocumentProblem(
                f"turn_id {event.turn_id} goes back: event {previous_index} before it is of "
                f"turn {previous.turn_id}, and a turn's events are together",
                suffix=f".events[{index}].turn_id",
                where=f"event {index}",
            )
        previous, previous_index = event, index
