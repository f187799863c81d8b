"""Versioned JSON for message lists and saved conversations.

One cattrs converter of threadline's own (its hooks are registered in
``_hooks``) turns the value classes of ``_messages`` and ``_documents`` into
JSON and back; the classes themselves know nothing about it. This module holds
the format: reading and writing the text, versions, and the paths of problems.

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
- Every field of a saved conversation is required: one left out is refused,
  naming it. Read as its default it would load another conversation (no
  events beside their usage, usage 0 beside events that carry some, turn ids
  counted anew). A message keeps its defaults: message lists come from
  elsewhere too.
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
- Only what a conversation can write is read: a pending event is a user
  message; the answered events of a turn are together and their turn ids
  never go back (pending events may sit anywhere); every ``turn_id`` is below
  ``next_turn_id``; ``format_version`` is never negative.
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
from typing import Any, Final, NoReturn, TypeVar

from cattrs.errors import (
    ClassValidationError,
    ForbiddenExtraKeysError,
    IterableValidationError,
)

from threadline._errors import ConversationFormatError, ThreadlineError
from threadline._messages import Message, Origin
from threadline.serialization._documents import (
    ConversationDocument,
    ConversationEvent,
    DocumentProblem,
    MessageList,
)
from threadline.serialization._hooks import (
    Invalid,
    make_document_converter,
    provider_reasoning_problem,
)
from threadline.serialization._json import describe, member_path, path_to

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
    "messages_from_value",
    "messages_value",
    "register_migration",
]

FORMAT_VERSION: Final = 1
"""The version this threadline writes, and the newest it reads."""

Migration = Callable[[dict[str, Any]], dict[str, Any]]
"""Takes a parsed document of one version and returns it in the next version's shape."""

_MIGRATIONS: dict[int, Migration] = {}

_CONVERTER: Final = make_document_converter()
_CONSTANT: Final = object()  # what a NaN or Infinity is read as, to find where it is


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


def messages_value(messages: Iterable[Message], path: str) -> list[Any]:
    """Messages as the JSON value a document embeds (what ``dumps_messages`` writes
    under ``"messages"``), for state a conversation keeps beside its events.

    Raises:
        ConversationFormatError: a message the format cannot hold, with ``path``.
    """
    checked = tuple(messages)
    for index, message in enumerate(checked):
        _check_persistable(message, f"{path}[{index}]")
    body: list[Any] = _CONVERTER.unstructure(checked, tuple[Message, ...])
    return body


def messages_from_value(value: object, path: str) -> tuple[Message, ...]:
    """The messages of a JSON value :func:`messages_value` made.

    Raises:
        ConversationFormatError: a value that is not such a list, its ``path`` under ``path``.
    """
    return _structure(value, tuple[Message, ...], path)


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
        raise ConversationFormatError(f"the header is {exc.reason}", path=exc.path) from None
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
            path = f"$.events[{index}]{exc.path[1:]}"
            raise ConversationFormatError(exc.reason, path=path) from None
    return _structure_conversation(_migrate({**data, "events": parsed}))


# --- JSON text ---------------------------------------------------------------


# Made once: json.dumps with any option builds a new encoder per call, which cost
# as much as the encoding of an event (a store encodes several a turn).
_ENCODER: Final = json.JSONEncoder(ensure_ascii=True, allow_nan=False)


def _write(document: dict[str, Any], indent: int | None) -> str:
    if indent is None:
        return _ENCODER.encode(document)
    return json.dumps(document, ensure_ascii=True, allow_nan=False, indent=indent)


def _read(text: str | bytes) -> Any:
    if not isinstance(text, str | bytes | bytearray):
        raise TypeError(f"expected JSON text as str or bytes, not {type(text).__name__}")
    # NaN and Infinity are read as a marker and refused below, where their path is known.
    constants: list[str] = []

    def constant(name: str) -> object:
        constants.append(name)
        return _CONSTANT

    try:
        value = json.loads(text, parse_constant=constant, object_pairs_hook=_object)
    except json.JSONDecodeError as exc:
        raise ConversationFormatError(
            f"not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except UnicodeDecodeError as exc:
        raise ConversationFormatError(f"not UTF-8 text: {exc.reason}") from None
    except RecursionError:
        raise ConversationFormatError("nested too deeply to read") from None
    except Invalid as exc:
        raise ConversationFormatError(f"not valid JSON: {exc.reason}") from None
    except ValueError:
        # json reads digits into an int, which Python caps at 4,300 digits.
        raise ConversationFormatError("a number too long to read") from None
    if constants:
        path = "$" + (path_to(value, _CONSTANT) or "")
        raise ConversationFormatError(
            f"not valid JSON: {constants[0]} is not a JSON number", path=path
        )
    return value


def _object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                # Which one a reader keeps is up to the reader: refuse to guess.
                raise Invalid(f"the key {key!r} appears twice in one object")
            seen.add(key)
    return result


def _refuse(expected: str, *, found: object, path: str = "$") -> NoReturn:
    raise ConversationFormatError(f"{expected}, not {describe(found)}", path=path)


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
    if version < 0:
        raise ConversationFormatError(
            f"format version {version} is not a version: versions are never negative", path=path
        )
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


def _structure_messages(document: dict[str, Any], *, bare: bool) -> tuple[Message, ...]:
    if bare:
        # Paths point into the array the caller wrote, not into our wrapper.
        return _structure(document["messages"], tuple[Message, ...], "$")
    return _structure(document, MessageList, "$").messages


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
    elif isinstance(exc, Invalid):
        yield path + exc.suffix, exc.reason
    elif isinstance(exc, KeyError):
        yield path, "a required field is missing"
    elif isinstance(exc, DocumentProblem):
        # A document that cannot be: turn ids that go back, a pending reply...
        yield path + exc.suffix, exc.reason
    elif isinstance(exc, ThreadlineError):
        # The class refused the values: a tool message without its call id...
        yield path, str(exc)
    else:
        yield path, f"invalid value ({type(exc).__name__}: {exc})"


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
            problem = provider_reasoning_problem(text)
        if problem is not None:
            raise ConversationFormatError(
                f"provider_reasoning {problem}", path=f"{path}.reasoning.provider_reasoning"
            )
