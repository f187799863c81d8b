"""Format versions and the migration hook.

Version 1 is the first released format, so threadline ships no migration yet.
These tests exercise the hook with migrations registered by the tests
themselves, from a *synthetic* version 0 made up here (reasoning stored inline
on the message as ``reasoning_text``); no such version was ever written.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from threadline import ConversationFormatError, Message, Reasoning
from threadline.serialization import FORMAT_VERSION, loads_conversation, loads_messages

# Migrations are the converter's private room: these tests register and run them.
from threadline.serialization import _converter as _serialization
from threadline.serialization._converter import Migration, _migrate, register_migration


@pytest.fixture
def migrations(monkeypatch: pytest.MonkeyPatch) -> dict[int, Migration]:
    """A registry of the test's own, so no test leaves a migration behind."""
    registry: dict[int, Migration] = {}
    monkeypatch.setattr(_serialization, "_MIGRATIONS", registry)
    return registry


def _inline_reasoning_to_v1(document: dict[str, Any]) -> dict[str, Any]:
    for message in document["messages"]:
        if "reasoning_text" in message:
            message["reasoning"] = {"text": message.pop("reasoning_text")}
    return document


def test_format_version_is_1() -> None:
    assert FORMAT_VERSION == 1


def test_a_registered_migration_brings_an_older_document_up_to_date(
    migrations: dict[int, Migration],
) -> None:
    register_migration(0)(_inline_reasoning_to_v1)
    synthetic_v0 = {
        "format_version": 0,
        "messages": [
            {"role": "user", "content": "2 + 2?"},
            {"role": "assistant", "content": "4", "reasoning_text": "easy"},
        ],
    }

    loaded = loads_messages(json.dumps(synthetic_v0))

    assert migrations == {0: _inline_reasoning_to_v1}
    assert loaded == [
        Message.user("2 + 2?"),
        Message.assistant("4", reasoning=Reasoning(text="easy")),
    ]


def test_without_a_migration_an_older_version_is_refused(migrations: dict[int, Migration]) -> None:
    with pytest.raises(ConversationFormatError) as caught:
        loads_conversation('{"format_version": 0, "id": "c", "next_turn_id": 0, "events": []}')

    assert caught.value.path == "$.format_version"
    assert "older than this threadline can read (it reads only 1)" in caught.value.reason


def test_what_a_migration_leaves_malformed_is_refused_like_any_document(
    migrations: dict[int, Migration],
) -> None:
    register_migration(0)(lambda document: document)  # forgets to rename reasoning_text

    with pytest.raises(ConversationFormatError) as caught:
        loads_messages(
            '{"format_version": 0, "messages": [{"role": "assistant", "reasoning_text": "x"}]}'
        )

    assert caught.value.path == "$.messages[0].reasoning_text"
    assert "unknown field" in caught.value.reason


def test_a_migration_that_trips_over_a_malformed_old_document_is_reported(
    migrations: dict[int, Migration],
) -> None:
    register_migration(0)(_inline_reasoning_to_v1)

    with pytest.raises(
        ConversationFormatError, match="cannot migrate from format version 0"
    ) as caught:
        loads_messages('{"format_version": 0, "msgs": []}')

    assert isinstance(caught.value.__cause__, KeyError)


def test_a_migration_may_refuse_with_its_own_path(migrations: dict[int, Migration]) -> None:
    def refuse(document: dict[str, Any]) -> dict[str, Any]:
        raise ConversationFormatError("version 0 stored no roles", path="$.messages[0]")

    register_migration(0)(refuse)

    with pytest.raises(ConversationFormatError) as caught:
        loads_messages('{"format_version": 0, "messages": [{}]}')

    assert caught.value.path == "$.messages[0]"


def test_migrations_run_in_order_one_version_at_a_time() -> None:
    seen: list[tuple[int, list[str]]] = []

    def step(name: str) -> Migration:
        def migrate(document: dict[str, Any]) -> dict[str, Any]:
            seen.append((document["format_version"], list(document["applied"])))
            document["applied"].append(name)
            return document

        return migrate

    steps = {0: step("0->1"), 1: step("1->2"), 2: step("2->3")}

    migrated = _migrate({"format_version": 1, "applied": []}, to_version=3, migrations=steps)

    assert seen == [(1, []), (2, ["1->2"])]
    assert migrated == {"applied": ["1->2", "2->3"]}


def test_a_gap_in_the_chain_names_the_version_that_cannot_be_read() -> None:
    steps: dict[int, Migration] = {0: lambda d: d, 2: lambda d: d}

    with pytest.raises(ConversationFormatError) as caught:
        _migrate({"format_version": 0}, to_version=3, migrations=steps)

    assert caught.value.reason == (
        "format version 1 is older than this threadline can read (it reads 2 to 3)"
    )


def test_a_migration_is_registered_only_from_an_older_version(
    migrations: dict[int, Migration],
) -> None:
    with pytest.raises(ValueError, match="not from 1"):
        register_migration(FORMAT_VERSION)
    with pytest.raises(ValueError, match="not from -1"):
        register_migration(-1)


def test_a_version_has_one_migration(migrations: dict[int, Migration]) -> None:
    register_migration(0)(_inline_reasoning_to_v1)

    with pytest.raises(ValueError, match="already has a migration"):
        register_migration(0)
    assert migrations == {0: _inline_reasoning_to_v1}


def test_threadline_ships_no_migration_while_version_1_is_the_first() -> None:
    # When version 2 arrives, its migration from 1 is registered here and this test changes.
    assert _serialization._MIGRATIONS == {}
