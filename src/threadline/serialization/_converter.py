"""Versioned JSON for message lists and saved conversations.

One cattrs converter of threadline's own turns the value classes of
``_messages`` and ``_documents`` into JSON and back; the classes themselves
know nothing about it.

The format, version 1
---------------------

A message list::

    {"format_version": 1, "messages": [MESSAGE, ...]}

A saved conversation (see :class:`ConversationDocument` for each field)::

    {"format_version": 1, "id": "c1", "history_limit": 0, "next_turn_id": 2,
     "total_usage": USAGE, "settings": {...}, "metadata": {...},
     "created_at": "2025-01-02T03:04:05+00:00", "updated_at": null,
     "events": [{"message": MESSAGE, "turn_id": 0, "usage": USAGE,
                 "pending": true, "model": "...", "finish_reason": "stop"}, ...]}

A message::

    {"role": "assistant",                      system | user | assistant | tool
     "content": "text" or [{"type": "text", "text": "..."},
                           {"type": "image", "url": "...", "detail": "low"}],
     "tool_calls": [{"id": "call_1", "name": "f", "arguments": "{\\"x\\": 1}"}],
     "tool_call_id": "call_1", "name": "...",
     "reasoning": {"text": "...", "provider_reasoning": "<JSON text>",
                   "provider": "anthropic:claude-sonnet-4-5"},
     "origin": "turn"}                         seed | turn

A store may keep a saved conversation in parts: the object above without
``events`` (its header) and one event object per row, read back together by
:func:`loads_conversation_parts` under the header's ``format_version``.

A usage is ``{"input_tokens", "output_tokens", "cached_input_tokens",
"reasoning_tokens"}``, all integers; times are ISO 8601 with a UTC offset.

Decisions that hold for every version:

- Always written: a message's role, content and origin; a tool call's id,
  name and arguments; a part's type, text and url; an event's message and
  turn_id; every field of a usage and of a conversation document. Any other
  field is left out when it holds its default and reads as that default when
  left out: ``tool_calls`` ``[]``; ``pending`` ``false``; reasoning ``text``
  and ``provider_reasoning`` ``""``; every other one ``null``.
- ``provider_reasoning`` is stored as a JSON *string* whose characters are the
  UTF-8 decoding of the bytes. Embedding it as a JSON value would let the
  writer re-space it; as a string the bytes come back exactly. It must be
  empty, blank, ``null`` or valid JSON (no ``NaN``), on save and on load.
- Unknown fields are refused, not ignored. Every change to the format bumps
  ``format_version`` (a newer version is refused outright), so an unknown
  field is a typo or a damaged file, and ignoring it would lose data silently
  the next time the document is saved.
- Messages of origin ``injection`` are never persisted: saving one is
  refused, and ``"injection"`` is not an origin the format knows.
- A bare JSON array of messages is read as version 1 messages.
- Integers are integers: ``"3"`` or ``true`` where a count belongs is refused.
- The output is ASCII (non-ASCII characters are ``\\u`` escaped), so any
  Python string survives any transport, lone surrogates included.

Every problem is reported as a :class:`ConversationFormatError` whose
``path`` says where (``$.events[3].message.role``) and whose ``reason`` says
what. Older versions are brought up to date by the migrations registered with
:func:`register_migration`, one version step at a time.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator
from datetime import datetime
from typing import Any, Final, NoReturn, TypeVar

import attrs
from cattrs.cols import homogenous_tuple_structure_factory, is_sequence
from cattrs.errors import (
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
)
from cattrs.gen import make_dict_structure_fn, make_dict_unstructure_fn, override
from cattrs.preconf.json import JsonConverter, make_converter

from threadline._errors import ConversationFormatError, ThreadlineError
from threadline._messages import (
    ContentPart,
    ImagePart,
    Message,
    Origin,
    Reasoning,
    Role,
    TextPart,
    ToolCall,
    Usage,
    has_provider_reasoning,
)
from threadline.serialization._documents import ConversationDocument, ConversationEvent, member_path

__all__ = [
    "FORMAT_VERSION",
    "ConversationDocument",
    "ConversationEvent",
    "Migration",
    "dumps_conversation",
    "dumps_conversation_header",
    "dumps_event",
    "dumps_messages",
    "loads_conversation",
    "loads_conversation_parts",
    "loads_messages",
    "register_migration",
]

FORMAT_VERSION: Final = 1
"""The version this threadline writes, and the newest it reads."""

Migration = Callable[[dict[str, Any]], dict[str, Any]]
"""Takes a parsed document of one version and returns it in the next version's shape."""

_MIGRATIONS: dict[int, Migration] = {}


def register_migration(from_version: int) -> Callable[[Migration], Migration]:
    """Register the function that turns a ``from_version`` document into the next version.

    Loading applies the registered migrations in sequence, from the
    document's version up to :data:`FORMAT_VERSION`. A migration gets the
    parsed JSON object (its ``format_version`` still the old one) and returns
    the object in the next version's shape; the loader sets the new
    ``format_version``. A migration that finds the document malformed raises
    :class:`ConversationFormatError`; anything else it raises is reported as
    one too.

    Example, when version 2 renames a field::

        @register_migration(1)
        def _rename_history_limit(document):
            document["window"] = document.pop("history_limit")
            return document

    Raises:
        ValueError: ``from_version`` is negative or not older than
            :data:`FORMAT_VERSION`, or already has a migration.
    """
    if not 0 <= from_version < FORMAT_VERSION:
        raise ValueError(
            f"a migration goes from a version older than {FORMAT_VERSION} (and >= 0) to the "
            f"next one, not from {from_version}"
        )
    if from_version in _MIGRATIONS:
        raise ValueError(f"format version {from_version} already has a migration")

    def register(migration: Migration) -> Migration:
        _MIGRATIONS[from_version] = migration
        return migration

    return register


def dumps_messages(messages: Iterable[Message], *, indent: int | None = None) -> str:
    """A message list as a version-1 JSON document.

    Raises:
        ConversationFormatError: a message the format cannot hold (an injected
            message, provider reasoning that is not JSON), with its path.
        TypeError: something in ``messages`` is not a :class:`Message`.
    """
    checked = tuple(messages)
    for index, message in enumerate(checked):
        if not isinstance(message, Message):
            raise TypeError(f"messages[{index}] is a {type(message).__name__}, not a Message")
        _check_persistable(message, f"$.messages[{index}]")
    body = _CONVERTER.unstructure(checked, tuple[Message, ...])
    return _write({"format_version": FORMAT_VERSION, "messages": body}, indent)


def loads_messages(text: str | bytes) -> list[Message]:
    """The messages of a JSON document, migrated from older versions.

    Accepts what :func:`dumps_messages` writes, a bare JSON array of messages
    (read as version 1), and a saved conversation (what
    :func:`dumps_conversation` writes), whose whole transcript it returns in
    order, a pending user message included.

    Raises:
        ConversationFormatError: the text is not such a document; ``path``
            says where, ``reason`` what.
    """
    data = _read(text)
    if isinstance(data, list):
        # Wrapped as version 1, so later versions' migrations apply to it too.
        document = _migrate({"format_version": 1, "messages": data})
        return list(_structure_messages(document, bare=True))
    if not isinstance(data, dict):
        _refuse("expected a JSON object or an array of messages", found=data)
    document = _migrate(data)
    if "events" in document and "messages" not in document:
        return [event.message for event in _structure_conversation(document).events]
    return list(_structure_messages(document, bare=False))


def dumps_conversation(document: ConversationDocument, *, indent: int | None = None) -> str:
    """A saved conversation as a version-1 JSON document.

    Raises:
        ConversationFormatError: a message the format cannot hold, with its path.
        TypeError: ``document`` is not a :class:`ConversationDocument`.
    """
    if not isinstance(document, ConversationDocument):
        raise TypeError(f"expected a ConversationDocument, not {type(document).__name__}")
    for index, event in enumerate(document.events):
        _check_persistable(event.message, f"$.events[{index}].message")
    body = _CONVERTER.unstructure(document, ConversationDocument)
    return _write({"format_version": FORMAT_VERSION, **body}, indent)


def loads_conversation(text: str | bytes) -> ConversationDocument:
    """A saved conversation, migrated from older versions.

    Raises:
        ConversationFormatError: the text is not a saved conversation this
            threadline can read; ``path`` says where, ``reason`` what.
    """
    data = _read(text)
    if not isinstance(data, dict):
        _refuse("expected a saved conversation (a JSON object)", found=data)
    document = _migrate(data)
    if "messages" in document and "events" not in document:
        raise ConversationFormatError(
            "this is a message list, not a saved conversation; load it with loads_messages"
        )
    return _structure_conversation(document)


def dumps_conversation_header(document: ConversationDocument) -> str:
    """A saved conversation without its transcript, for a store that keeps events apart.

    The object :func:`dumps_conversation` writes, ``format_version`` included,
    without the ``events`` field (``document.events`` is ignored). Stored with
    one :func:`dumps_event` text per event, it loads again with
    :func:`loads_conversation_parts`.

    Raises:
        TypeError: ``document`` is not a :class:`ConversationDocument`.
    """
    if not isinstance(document, ConversationDocument):
        raise TypeError(f"expected a ConversationDocument, not {type(document).__name__}")
    body = _CONVERTER.unstructure(document, ConversationDocument)
    del body["events"]
    return _write({"format_version": FORMAT_VERSION, **body}, None)


def dumps_event(event: ConversationEvent) -> str:
    """One transcript event as JSON, the object it is inside a saved conversation's ``events``.

    It carries no ``format_version``: it is read with the version of the
    header it is stored with (see :func:`loads_conversation_parts`).

    Raises:
        ConversationFormatError: a message the format cannot hold, with its path
            (``$.message.reasoning.provider_reasoning``).
        TypeError: ``event`` is not a :class:`ConversationEvent`.
    """
    if not isinstance(event, ConversationEvent):
        raise TypeError(f"expected a ConversationEvent, not {type(event).__name__}")
    _check_persistable(event.message, "$.message")
    return _write(_CONVERTER.unstructure(event, ConversationEvent), None)


def loads_conversation_parts(
    header: str | bytes, events: Iterable[str | bytes]
) -> ConversationDocument:
    """A saved conversation kept as a header and one JSON text per event, put back together.

    ``header`` is what :func:`dumps_conversation_header` wrote and ``events``
    what :func:`dumps_event` wrote, oldest first. The header's
    ``format_version`` is every event's too: the reassembled document is
    migrated and checked as a whole, exactly like :func:`loads_conversation`.

    Raises:
        ConversationFormatError: the parts do not make a saved conversation;
            a problem inside event ``i`` has a ``path`` below ``$.events[i]``.
    """
    try:
        data = _read(header)
    except ConversationFormatError as exc:
        raise ConversationFormatError(f"the header is {exc.reason}") from None
    if not isinstance(data, dict):
        _refuse("expected a saved conversation header (a JSON object)", found=data)
    if "events" in data:
        raise ConversationFormatError(
            "a conversation header holds no events; they are stored apart", path="$.events"
        )
    parsed: list[Any] = []
    for index, text in enumerate(events):
        try:
            parsed.append(_read(text))
        except ConversationFormatError as exc:
            raise ConversationFormatError(exc.reason, path=f"$.events[{index}]") from None
    return _structure_conversation(_migrate({**data, "events": parsed}))


# --- JSON text ---------------------------------------------------------------


def _write(document: dict[str, Any], indent: int | None) -> str:
    return json.dumps(document, ensure_ascii=True, allow_nan=False, indent=indent)


def _read(text: str | bytes) -> Any:
    if not isinstance(text, str | bytes | bytearray):
        raise TypeError(f"expected JSON text as str or bytes, not {type(text).__name__}")
    try:
        return json.loads(text, parse_constant=_refuse_constant, object_pairs_hook=_object)
    except json.JSONDecodeError as exc:
        raise ConversationFormatError(
            f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except UnicodeDecodeError as exc:
        raise ConversationFormatError(f"not UTF-8 text: {exc.reason}") from None
    except RecursionError:
        raise ConversationFormatError("nested too deeply to read") from None
    except _Invalid as exc:
        raise ConversationFormatError(f"not valid JSON: {exc.reason}") from None


def _refuse_constant(name: str) -> NoReturn:
    raise _Invalid(f"{name} is not a JSON number")


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                # Which one a reader keeps is up to the reader: refuse to guess.
                raise _Invalid(f"the key {key!r} appears twice in one object")
            seen.add(key)
    return result


def _describe(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, str):
        shown = value if len(value) <= 40 else value[:37] + "..."
        return f"the string {shown!r}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


def _refuse(expected: str, *, found: object, path: str = "$") -> NoReturn:
    raise ConversationFormatError(f"{expected}, not {_describe(found)}", path=path)


# --- versions ----------------------------------------------------------------


def _migrate(
    document: dict[str, Any],
    *,
    to_version: int = FORMAT_VERSION,
    migrations: dict[int, Migration] | None = None,
) -> dict[str, Any]:
    """Bring a parsed document up to ``to_version``; it comes back without ``format_version``."""
    steps = _MIGRATIONS if migrations is None else migrations
    path = "$.format_version"
    if "format_version" not in document:
        raise ConversationFormatError("the document has no format_version", path=path)
    version = document["format_version"]
    if type(version) is not int:
        _refuse("format_version must be an integer", found=version, path=path)
    if version > to_version:
        raise ConversationFormatError(
            f"format version {version} was written by a newer threadline; this one reads "
            f"versions up to {to_version}",
            path=path,
        )
    while version < to_version:
        migration = steps.get(version)
        if migration is None:
            oldest = to_version
            while oldest - 1 in steps:
                oldest -= 1
            reads = f"{oldest} to {to_version}" if oldest < to_version else f"only {to_version}"
            raise ConversationFormatError(
                f"format version {version} is older than this threadline can read "
                f"(it reads {reads})",
                path=path,
            )
        try:
            document = migration(document)
        except ConversationFormatError:
            raise
        except Exception as exc:
            # The old document was malformed in a way the migration tripped over.
            raise ConversationFormatError(
                f"cannot migrate from format version {version}: {type(exc).__name__}: {exc}"
            ) from exc
        version += 1
        document["format_version"] = version
    return {key: value for key, value in document.items() if key != "format_version"}


# --- structuring, with the path of the first problem ---------------------------


@attrs.frozen(kw_only=True)
class _MessagesBody:
    messages: tuple[Message, ...]


def _structure_messages(document: dict[str, Any], *, bare: bool) -> tuple[Message, ...]:
    if bare:
        # Paths point into the array the caller wrote, not into our wrapper.
        return _structure(document["messages"], tuple[Message, ...], "$")
    return _structure(document, _MessagesBody, "$").messages


def _structure_conversation(document: dict[str, Any]) -> ConversationDocument:
    return _structure(document, ConversationDocument, "$")


_T = TypeVar("_T")


def _structure(data: Any, kind: type[_T], path: str) -> _T:
    try:
        return _CONVERTER.structure(data, kind)
    except Exception as exc:
        problems = list(_problems(exc, path))
        where, reason = problems[0]
        if len(problems) > 1:
            reason += f" (and {len(problems) - 1} more problem(s))"
        raise ConversationFormatError(reason, path=where) from None


def _problems(exc: BaseException, path: str) -> Iterator[tuple[str, str]]:
    """Each leaf of a cattrs error tree as (JSONPath, reason)."""
    if isinstance(exc, IterableValidationError):
        with_index, without = exc.group_exceptions()
        for inner, item in with_index:
            index = item.index
            step = f"[{index}]" if isinstance(index, int) else member_path(index)
            yield from _problems(inner, path + step)
        for inner in without:
            yield from _problems(inner, path)
    elif isinstance(exc, ClassValidationError):
        with_name, without = exc.group_exceptions()
        for inner, attribute in with_name:
            yield from _problems(inner, path + member_path(attribute.name))
        for inner in without:
            yield from _problems(inner, path)
    elif isinstance(exc, ForbiddenExtraKeysError):
        for name in sorted(exc.extra_fields):
            yield (
                path + member_path(name),
                f"unknown field {name!r}: format version {FORMAT_VERSION} has no such field",
            )
    elif isinstance(exc, _Invalid):
        yield path + exc.suffix, exc.reason
    elif isinstance(exc, KeyError):
        yield path, "a required field is missing"
    elif isinstance(exc, ThreadlineError):
        # The class refused the values: a tool message without its call id...
        yield path, str(exc)
    else:
        yield path, f"invalid value ({type(exc).__name__}: {exc})"


class _Invalid(Exception):
    """A problem found while structuring, ``suffix`` the path below the value checked."""

    def __init__(self, reason: str, suffix: str = "") -> None:
        super().__init__(reason)
        self.reason = reason
        self.suffix = suffix


# --- checks before saving --------------------------------------------------------


def _check_persistable(message: Message, path: str) -> None:
    if message.origin is Origin.INJECTION:
        raise ConversationFormatError(
            "injected messages are never persisted; leave them out (keep what "
            "RunResult.new_messages() returns, or filter on origin)",
            path=f"{path}.origin",
        )
    if message.reasoning is not None:
        try:
            text = message.reasoning.provider_reasoning.decode("utf-8")
        except UnicodeDecodeError:
            problem: str | None = "is not UTF-8 text"
        else:
            problem = _provider_reasoning_problem(text)
        if problem is not None:
            raise ConversationFormatError(
                f"provider_reasoning {problem}", path=f"{path}.reasoning.provider_reasoning"
            )


def _provider_reasoning_problem(text: str) -> str | None:
    if not has_provider_reasoning(text.encode("utf-8", "surrogatepass")):
        return None
    try:
        json.loads(text, parse_constant=_refuse_constant)
    except json.JSONDecodeError as exc:
        return f"is not valid JSON ({exc.msg} at position {exc.pos})"
    except _Invalid as exc:
        return f"is not valid JSON ({exc.reason})"
    return None


# --- the converter -----------------------------------------------------------------

_ROLES = ", ".join(role.value for role in Role)
_SAVED_ORIGINS = (Origin.SEED, Origin.TURN)
_PART_TAGS: dict[str, type[TextPart] | type[ImagePart]] = {"text": TextPart, "image": ImagePart}


def _strict(kind: type[Any], expected: str) -> Callable[[Any, Any], Any]:
    # cattrs would call str(5) or int("5"); a saved document gets no such help.
    def structure(value: Any, _: Any) -> Any:
        if type(value) is kind:
            return value
        raise _Invalid(f"expected {expected}, not {_describe(value)}")

    return structure


def _structure_optional_str(value: Any, _: Any) -> str | None:
    if value is None or type(value) is str:
        return value
    raise _Invalid(f"expected a string or null, not {_describe(value)}")


def _structure_role(value: Any, _: Any) -> Role:
    if type(value) is str and value in Role._value2member_map_:
        return Role(value)
    raise _Invalid(f"expected a role ({_ROLES}), not {_describe(value)}")


def _structure_origin(value: Any, _: Any) -> Origin:
    if value == Origin.INJECTION.value:
        raise _Invalid("injected messages are never persisted; 'injection' is not a saved origin")
    if type(value) is str and value in _SAVED_ORIGINS:
        return Origin(value)
    raise _Invalid(f"expected an origin (seed, turn), not {_describe(value)}")


def _structure_provider_reasoning(value: Any, _: Any) -> bytes:
    if type(value) is not str:
        raise _Invalid(f"expected the provider's JSON as a string, not {_describe(value)}")
    problem = _provider_reasoning_problem(value)
    if problem is not None:
        raise _Invalid(f"provider_reasoning {problem}")
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise _Invalid("provider_reasoning holds a lone surrogate, not UTF-8 text") from None


def _unstructure_provider_reasoning(value: bytes) -> str:
    # Checked to be UTF-8 JSON by _check_persistable before any dump.
    return value.decode("utf-8")


def _structure_timestamp(value: Any, _: Any) -> datetime | None:
    if value is None:
        return None
    if type(value) is not str:
        raise _Invalid(f"expected an ISO 8601 time or null, not {_describe(value)}")
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise _Invalid(f"expected an ISO 8601 time, not {_describe(value)}") from None
    if moment.utcoffset() is None:
        raise _Invalid(f"the time {value!r} has no UTC offset")
    return moment


def _unstructure_timestamp(value: datetime | None) -> str | None:
    return None if value is None else value.isoformat()


def _structure_settings(value: Any, _: Any) -> dict[str, Any]:
    if type(value) is not dict:
        raise _Invalid(f"expected an object, not {_describe(value)}")
    # Parsed JSON without NaN is a JsonValue already; nothing else to check.
    return value


def _structure_metadata(value: Any, _: Any) -> dict[str, str]:
    if type(value) is not dict:
        raise _Invalid(f"expected an object, not {_describe(value)}")
    for key, item in value.items():
        if type(item) is not str:
            raise _Invalid(f"expected a string, not {_describe(item)}", member_path(key))
    return value


def _make_converter() -> JsonConverter:
    converter = make_converter(detailed_validation=True, forbid_extra_keys=True)

    for kind, expected in ((str, "a string"), (int, "an integer"), (bool, "true or false")):
        converter.register_structure_hook(kind, _strict(kind, expected))
    converter.register_structure_hook(str | None, _structure_optional_str)
    converter.register_structure_hook(Role, _structure_role)
    converter.register_structure_hook(Origin, _structure_origin)
    converter.register_unstructure_hook(Role, lambda role: role.value)
    converter.register_unstructure_hook(Origin, lambda origin: origin.value)

    tuple_factory = homogenous_tuple_structure_factory

    def strict_tuple_factory(kind: Any, conv: Any) -> Callable[[Any, Any], Any]:
        items = tuple_factory(kind, conv)

        def structure(value: Any, type_: Any) -> Any:
            if type(value) is not list:
                raise _Invalid(f"expected an array, not {_describe(value)}")
            return items(value, type_)

        return structure

    converter.register_structure_hook_factory(is_sequence, strict_tuple_factory)

    def structure_object(cls: type[Any], **fields: Any) -> None:
        generated = make_dict_structure_fn(cls, converter, **fields)

        def structure(value: Any, type_: Any) -> Any:
            if type(value) is not dict:
                raise _Invalid(f"expected an object, not {_describe(value)}")
            return generated(value, type_)

        converter.register_structure_hook(cls, structure)

    def unstructure_object(cls: type[Any], *, omit_defaults: bool, **fields: Any) -> None:
        generated = make_dict_unstructure_fn(
            cls, converter, _cattrs_omit_if_default=omit_defaults, **fields
        )
        order = [field.name for field in attrs.fields(cls)]

        def unstructure(value: Any) -> dict[str, Any]:
            # cattrs puts the always-written fields first; keep the class's order instead.
            written = generated(value)
            return {name: written[name] for name in order if name in written}

        converter.register_unstructure_hook(cls, unstructure)

    always = override(omit_if_default=False)
    # Leaves first: a generated hook captures the hooks of its fields when it is made.
    for cls in (TextPart, ImagePart, ToolCall, Usage):
        structure_object(cls)
    unstructure_object(TextPart, omit_defaults=True)
    unstructure_object(ImagePart, omit_defaults=True)
    unstructure_object(ToolCall, omit_defaults=False)
    unstructure_object(Usage, omit_defaults=False)

    reasoning_bytes = override(
        struct_hook=_structure_provider_reasoning, unstruct_hook=_unstructure_provider_reasoning
    )
    structure_object(Reasoning, provider_reasoning=reasoning_bytes)
    unstructure_object(Reasoning, omit_defaults=True, provider_reasoning=reasoning_bytes)

    def structure_part(value: Any, _: Any) -> ContentPart:
        if type(value) is not dict:
            raise _Invalid(f"expected a content part object, not {_describe(value)}")
        tag = value.get("type")
        if tag not in _PART_TAGS:
            reason = f"expected a part type (text, image), not {_describe(tag)}"
            raise _Invalid("a content part needs a type" if tag is None else reason, ".type")
        fields = {key: item for key, item in value.items() if key != "type"}
        part: ContentPart = converter.structure(fields, _PART_TAGS[tag])
        return part

    def unstructure_part(part: ContentPart) -> dict[str, Any]:
        tag = "text" if isinstance(part, TextPart) else "image"
        return {"type": tag, **converter.unstructure(part, type(part))}

    def structure_content(value: Any, _: Any) -> str | tuple[ContentPart, ...]:
        if type(value) is str:
            return value
        if type(value) is not list:
            raise _Invalid(f"expected a string or an array of parts, not {_describe(value)}")
        parts: tuple[ContentPart, ...] = converter.structure(value, tuple[ContentPart, ...])
        return parts

    def unstructure_content(value: str | tuple[ContentPart, ...]) -> Any:
        if isinstance(value, str):
            return value
        return [unstructure_part(part) for part in value]

    converter.register_structure_hook(ContentPart, structure_part)
    content = override(
        omit_if_default=False, struct_hook=structure_content, unstruct_hook=unstructure_content
    )
    structure_object(Message, content=content)
    unstructure_object(Message, omit_defaults=True, role=always, content=content, origin=always)

    structure_object(_MessagesBody)
    structure_object(ConversationEvent)
    unstructure_object(ConversationEvent, omit_defaults=True)
    timestamp = override(struct_hook=_structure_timestamp, unstruct_hook=_unstructure_timestamp)
    structure_object(
        ConversationDocument,
        settings=override(struct_hook=_structure_settings),
        metadata=override(struct_hook=_structure_metadata),
        created_at=timestamp,
        updated_at=timestamp,
    )
    unstructure_object(
        ConversationDocument, omit_defaults=False, created_at=timestamp, updated_at=timestamp
    )
    return converter


_CONVERTER: Final = _make_converter()
