"""Damaged rows and keys in SQLite, PostgreSQL and Redis: every shape is refused
with ``ConversationFormatError`` (or ``StoreError``) naming the conversation,
never a raw ``ValueError``, and never handed on for the next turn to blame
the caller for.

A version is a count of writes, 1 or more; a Redis event item is an event's
JSON or a pending item (``p<seq>\\t<marker>\\t<JSON>``); a Redis counter is a
number. Each is broken behind the store's back with the server's own client.
"""

from __future__ import annotations

import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import redis

from servers import PostgresServer, RedisServer, user_document
from threadline import (
    Agent,
    Client,
    Conversation,
    ConversationFormatError,
    Message,
    Model,
    StoreError,
)
from threadline.serialization import ConversationEvent
from threadline.stores.postgres import PostgresStore
from threadline.stores.redis import RedisStore
from threadline.stores.sqlite import SQLiteStore
from threadline.testing import ScriptedDriver

pytestmark = pytest.mark.anyio

doc = user_document
Store = SQLiteStore | PostgresStore | RedisStore
SetVersion = Callable[[object], None]


# --- a store of each kind and a way to break its version behind its back -------------------


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgres", marks=pytest.mark.integration),
        pytest.param("redis", marks=pytest.mark.integration),
    ]
)
def kind(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture
def admin(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url(), decode_responses=True)
    yield client
    client.close()


@pytest.fixture
async def store(
    request: pytest.FixtureRequest, kind: str, tmp_path: Path
) -> AsyncIterator[tuple[Store, SetVersion]]:
    """A store holding conversation ``c1`` (version 1) and how to overwrite its version."""
    opened: Store
    if kind == "sqlite":
        path = tmp_path / "damaged.db"
        opened = SQLiteStore(path)

        def set_version(value: object) -> None:
            with sqlite3.connect(path) as connection:
                connection.execute(
                    "UPDATE threadline_conversations SET version = ? WHERE id = 'c1'", (value,)
                )
            connection.close()

    elif kind == "postgres":
        server: PostgresServer = request.getfixturevalue("postgres_server")
        url = server.create_database()
        opened = PostgresStore(url)

        def set_version(value: object) -> None:
            with psycopg.connect(url, autocommit=True) as connection:
                connection.execute(
                    "UPDATE threadline_conversations SET version = %s WHERE id = 'c1'", (value,)
                )

    else:
        prefix = f"damage-{uuid.uuid4().hex}:"
        opened = RedisStore(request.getfixturevalue("redis_server").url(), prefix=prefix)
        client: redis.Redis = request.getfixturevalue("admin")

        def set_version(value: object) -> None:
            client.hset(f"{prefix}c:c1", "version", str(value))

    async with opened:
        await opened.save(doc("c1", "one"), expected_version=0)
        yield opened, set_version


def names_c1(error: BaseException) -> bool:
    return "'c1'" in str(error)


# --- versions ---------------------------------------------------------------------------


@pytest.mark.parametrize("version", [-3, 0])
async def test_a_stored_version_below_one_is_refused_on_load_naming_the_conversation(
    store: tuple[Store, SetVersion], version: int
) -> None:
    opened, set_version = store
    set_version(version)
    with pytest.raises(ConversationFormatError, match="version") as caught:
        await opened.load("c1")
    assert names_c1(caught.value)
    with pytest.raises(ConversationFormatError, match="version") as listed:
        await opened.list()
    assert names_c1(listed.value)


async def test_a_damaged_version_fails_the_load_not_the_next_turn(
    store: tuple[Store, SetVersion],
) -> None:
    opened, set_version = store
    set_version(-3)
    agent = Agent(Client(ScriptedDriver(["two"])), model=Model("m", context_size=8192))
    with pytest.raises(ConversationFormatError) as caught:
        await Conversation.load(agent, opened, "c1")
    assert names_c1(caught.value)


async def test_a_damaged_version_refuses_a_checked_delete_but_not_a_plain_one(
    store: tuple[Store, SetVersion],
) -> None:
    opened, set_version = store
    set_version(-3)
    with pytest.raises(ConversationFormatError, match="version") as caught:
        await opened.delete("c1", expected_version=1)
    assert names_c1(caught.value)
    assert await opened.delete("c1") is True  # how damage is cleared away
    assert await opened.delete("c1") is False


@pytest.mark.parametrize("kind", ["sqlite", pytest.param("redis", marks=pytest.mark.integration)])
async def test_a_version_that_is_not_a_number_is_refused_naming_the_conversation(
    store: tuple[Store, SetVersion],
) -> None:
    opened, set_version = store
    set_version("abc")
    with pytest.raises(ConversationFormatError, match="version") as caught:
        await opened.load("c1")
    assert names_c1(caught.value)
    with pytest.raises(ConversationFormatError, match="version") as listed:
        await opened.list()
    assert names_c1(listed.value)


# --- Redis: event items, counters, and deleting what is damaged ------------------------------


@pytest.fixture
async def redis_store(
    redis_server: RedisServer, admin: redis.Redis
) -> AsyncIterator[tuple[RedisStore, str]]:
    prefix = f"damage-{uuid.uuid4().hex}:"
    async with RedisStore(redis_server.url(), prefix=prefix) as opened:
        await opened.save(doc("c1", "one"), expected_version=0)
        yield opened, prefix


@pytest.mark.integration
@pytest.mark.parametrize(
    "item",
    ["garbage", "p3\tonly-one-tab", "p4\tm1\tnot json", "[1, 2]", ""],
    ids=["neither", "pending-cut-short", "pending-not-json", "json-not-an-event", "empty"],
)
async def test_a_damaged_event_item_is_refused_naming_the_conversation(
    redis_store: tuple[RedisStore, str], admin: redis.Redis, item: str
) -> None:
    opened, prefix = redis_store
    admin.rpush(f"{prefix}e:c1", item)
    with pytest.raises(ConversationFormatError) as caught:
        await opened.load("c1")
    assert names_c1(caught.value)
    assert "event seq 1" in str(caught.value)


@pytest.mark.integration
async def test_pending_items_that_disagree_with_their_events_are_refused(
    redis_store: tuple[RedisStore, str], admin: redis.Redis
) -> None:
    # A pending item holding an answered event: the markers would fit no event.
    opened, prefix = redis_store
    answered = admin.lindex(f"{prefix}e:c1", 0)
    admin.rpush(f"{prefix}e:c1", f"p9\tm1\t{answered}")
    with pytest.raises(ConversationFormatError, match="pending") as caught:
        await opened.load("c1")
    assert names_c1(caught.value)


@pytest.mark.integration
@pytest.mark.parametrize(
    ("field", "value"),
    [("count", "many"), ("updated_at", "yesterday"), ("version", "2.5")],
)
async def test_a_listing_refuses_a_damaged_counter_naming_the_conversation(
    redis_store: tuple[RedisStore, str], admin: redis.Redis, field: str, value: str
) -> None:
    opened, prefix = redis_store
    admin.hset(f"{prefix}c:c1", field, value)
    with pytest.raises(ConversationFormatError, match=field) as caught:
        await opened.list()
    assert names_c1(caught.value)


@pytest.mark.integration
async def test_deleting_a_conversation_whose_version_is_damaged_deletes_it_and_says_so(
    redis_store: tuple[RedisStore, str], admin: redis.Redis
) -> None:
    opened, prefix = redis_store
    admin.hset(f"{prefix}c:c1", "version", "abc")
    assert await opened.delete("c1") is True
    assert admin.exists(f"{prefix}c:c1", f"{prefix}e:c1") == 0
    assert await opened.list() == []


@pytest.mark.integration
async def test_a_checked_delete_of_a_damaged_version_is_refused_and_deletes_nothing(
    redis_store: tuple[RedisStore, str], admin: redis.Redis
) -> None:
    opened, prefix = redis_store
    admin.hset(f"{prefix}c:c1", "version", "abc")
    with pytest.raises(ConversationFormatError, match="version") as caught:
        await opened.delete("c1", expected_version=1)
    assert names_c1(caught.value)
    assert admin.exists(f"{prefix}c:c1") == 1


@pytest.mark.integration
@pytest.mark.parametrize("field", ["version", "count", "seq", "max_turn"])
async def test_a_write_on_a_damaged_counter_is_refused_naming_the_conversation(
    redis_store: tuple[RedisStore, str], admin: redis.Redis, field: str
) -> None:
    opened, prefix = redis_store
    admin.hset(f"{prefix}c:c1", field, "x")
    event = ConversationEvent(message=Message.user("two"), turn_id=1, pending=True)
    write: Any = opened.append_events(
        "c1", [event], header=doc("c1", "one", "two"), expected_version=1, pending_marker="w1"
    )
    with pytest.raises((ConversationFormatError, StoreError)) as caught:
        await write
    assert names_c1(caught.value)
    assert field in str(caught.value)


@pytest.mark.integration
async def test_taking_back_a_prompt_from_damaged_keys_is_a_store_error_naming_it(
    redis_store: tuple[RedisStore, str], admin: redis.Redis
) -> None:
    opened, prefix = redis_store
    admin.hset(f"{prefix}p:c1", "p1\tm1\t{}", "no tab here")
    with pytest.raises((ConversationFormatError, StoreError)) as caught:
        await opened.remove_pending("c1", "m1")
    assert names_c1(caught.value)
