"""What is particular to ``PostgresStore``, on a real server (the contract suite
covers the rest): errors that name the store and never the password, the
schema and its migrations, lost connections, restarts and long listings."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import psycopg
import pytest

from servers import PASSWORD, PostgresServer, assert_no_password, free_port, user_document
from threadline import (
    Agent,
    Client,
    ConversationFormatError,
    InvalidRequestError,
    Message,
    Model,
    Origin,
    StoreError,
)
from threadline import Conversation as Conv
from threadline.serialization import ConversationEvent
from threadline.stores import open_store
from threadline.stores.postgres import SCHEMA_VERSION, PostgresStore
from threadline.testing import ScriptedDriver

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends, pytest.mark.integration]


@pytest.fixture
def url(postgres_server: PostgresServer) -> str:
    return postgres_server.create_database()


@pytest.fixture
async def store(url: str, anyio_backend: str) -> AsyncIterator[PostgresStore]:
    async with PostgresStore(url) as opened:
        yield opened


doc = user_document


def raw(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


# --- errors name the store, never the password ----------------------------------------


def test_the_repr_and_open_store_hide_the_password(url: str) -> None:
    store = open_store(url)
    assert isinstance(store, PostgresStore)
    assert PASSWORD not in repr(store)
    assert "threadline:***@127.0.0.1" in repr(store)


async def test_a_refused_login_is_a_store_error_without_the_password(
    postgres_server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "Wr0ng-Secret-4711"
    caplog.set_level(logging.DEBUG)
    async with PostgresStore(postgres_server.url(password=wrong), timeout=5) as store:
        with pytest.raises(StoreError, match="PostgresStore") as caught:
            await store.load("c1")
    assert "password authentication failed" in str(caught.value)
    assert "the URL's user and password" in str(caught.value)
    assert caught.value.__cause__ is None
    assert caught.value.__context__ is None
    assert_no_password(caught.value, caplog.text, password=wrong)


async def test_a_server_that_is_down_is_a_store_error_saying_what_to_do(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    nowhere = f"postgresql://threadline:{PASSWORD}@127.0.0.1:{free_port()}/postgres"
    async with PostgresStore(nowhere, timeout=2) as store:
        with pytest.raises(StoreError, match="cannot connect") as caught:
            await store.list()
    assert "check that the server runs" in str(caught.value)
    assert_no_password(caught.value, caplog.text)


@pytest.mark.parametrize(
    "url_text", ["", "mysql://x@y/z", "postgresql://h:notaport/db", 7], ids=repr
)
def test_a_url_it_cannot_use_is_refused_when_built(url_text: Any) -> None:
    with pytest.raises(InvalidRequestError, match="PostgresStore"):
        PostgresStore(url_text)


# --- the schema -------------------------------------------------------------------------


async def test_opening_creates_the_schema_once_even_for_concurrent_openers(url: str) -> None:
    stores = [PostgresStore(url) for _ in range(5)]
    async with anyio.create_task_group() as group:
        for index, store in enumerate(stores):
            group.start_soon(functools.partial(store.save, doc(f"c{index}"), expected_version=0))
    for store in stores:
        await store.aclose()
    with raw(url) as connection:
        rows = connection.execute("SELECT version FROM threadline_schema").fetchall()
    assert rows == [(SCHEMA_VERSION,)]


async def test_a_database_of_a_newer_schema_is_refused_clearly(url: str) -> None:
    async with PostgresStore(url) as store:
        await store.save(doc(), expected_version=0)
    with raw(url) as connection:
        connection.execute("UPDATE threadline_schema SET version = %s", (SCHEMA_VERSION + 1,))
    async with PostgresStore(url) as store:
        with pytest.raises(ConversationFormatError, match="newer threadline") as caught:
            await store.load("c1")
    assert f"schema version {SCHEMA_VERSION + 1}" in str(caught.value)
    assert "upgrade threadline" in str(caught.value)


@pytest.mark.parametrize(
    ("damage", "load_fails"),
    [
        ("DROP TABLE threadline_events", True),
        ("ALTER TABLE threadline_conversations DROP COLUMN generation CASCADE", True),
        ("DROP FUNCTION threadline_write", False),
    ],
)
async def test_a_dropped_table_or_a_changed_layout_is_a_store_error(
    store: PostgresStore, url: str, damage: str, load_fails: bool
) -> None:
    await store.save(doc(), expected_version=0)
    with raw(url) as connection:
        connection.execute(damage)
    calls = [store.save(doc(), expected_version=1)]
    if load_fails:
        calls.append(store.load("c1"))
    for call in calls:
        with pytest.raises(StoreError, match="tables are missing or of another layout") as caught:
            await call
        assert_no_password(caught.value)


# --- lost connections and restarts ------------------------------------------------------


def _waiting_writer(url: str, but_not: int | None = None) -> int:
    """The pid of the store's connection once its write waits on the row lock."""
    deadline = time.monotonic() + 30
    with raw(url) as watcher:
        while time.monotonic() < deadline:
            row = watcher.execute(
                "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE '%%threadline_write%%' AND pid <> %s",
                (but_not or 0,),
            ).fetchone()
            if row is not None:
                return int(row[0])
            time.sleep(0.02)
    raise AssertionError("the write never reached the database")


async def test_a_connection_dropped_during_a_write_is_retried_and_applied_once(
    store: PostgresStore, url: str
) -> None:
    version = await store.save(doc("c1", "one"), expected_version=0)
    blocker = psycopg.connect(url)
    blocker.execute("SELECT 1 FROM threadline_conversations WHERE id = 'c1' FOR UPDATE")
    outcome: list[int] = []

    async def write() -> None:
        outcome.append(await store.save(doc("c1", "one", "two"), expected_version=version))

    async with anyio.create_task_group() as group:
        group.start_soon(write)
        first = await anyio.to_thread.run_sync(_waiting_writer, url)
        with raw(url) as killer:
            killer.execute("SELECT pg_terminate_backend(%s)", (first,))
        # The store reconnects and waits on the lock again; then the lock goes.
        await anyio.to_thread.run_sync(_waiting_writer, url, first)
        blocker.rollback()
    blocker.close()

    assert outcome == [version + 1]
    stored = await store.load("c1")
    assert stored.version == version + 1
    assert [event.message.text for event in stored.document.events] == ["one", "two"]


async def test_a_retried_write_that_was_applied_is_not_refused_as_a_conflict(
    store: PostgresStore,
) -> None:
    # Private room: the Write a retry sends again is the base's, not public API.
    from threadline.serialization._converter import dumps_conversation_header, dumps_event
    from threadline.stores._base import EventRecord, Write

    version = await store.save(doc(), expected_version=0)
    event = ConversationEvent(message=Message.user("once", origin=Origin.TURN), turn_id=0)
    header = doc()
    write = Write(
        conversation_id="c1",
        header=header,
        header_text=dumps_conversation_header(header),
        records=(EventRecord(event, dumps_event(event)),),
        expected_version=version,
        replace=False,
    )
    assert await store._write(write) == version + 1
    assert await store._write(write) == version + 1  # the answer was "lost": sent again
    stored = await store.load("c1")
    assert [e.message.text for e in stored.document.events] == ["once"]


async def test_the_next_turn_works_after_the_server_restarts(
    store: PostgresStore, postgres_server: PostgresServer
) -> None:
    driver = ScriptedDriver(["one", "two"])
    conversation = Conv(Agent(Client(driver), model=Model("m", context_size=8192)), store=store)
    await conversation.run("first")
    await anyio.to_thread.run_sync(postgres_server.restart)
    await conversation.run("second")
    stored = await store.load(conversation.id)
    assert [e.message.text for e in stored.document.events] == ["first", "one", "second", "two"]
    assert not any(e.pending for e in stored.document.events)


# --- listing ---------------------------------------------------------------------------


async def test_listing_stays_fast_and_indexed_with_100000_conversations(
    store: PostgresStore, url: str
) -> None:
    await store.save(doc("real"), expected_version=0)
    with raw(url) as connection:
        connection.execute(
            "INSERT INTO threadline_conversations SELECT 'bulk-' || g, 'gen', 1, 1, '{}', "
            "'{}', 0, 0, '', now(), now(), nextval('threadline_touched') "
            "FROM generate_series(1, 100000) AS g"
        )
        connection.execute("ANALYZE threadline_conversations")
        plan = connection.execute(
            "EXPLAIN SELECT id FROM threadline_conversations WHERE touched < 50000 "
            "ORDER BY touched DESC LIMIT 100"
        ).fetchall()
    plan_text = "\n".join(row[0] for row in plan)
    assert "Index Scan Backward" in plan_text
    assert "Sort" not in plan_text
    assert "Seq Scan" not in plan_text

    started = time.perf_counter()
    first = await store.list_page(limit=100)
    deep = await store.list_page(limit=100, cursor="50000")
    elapsed = time.perf_counter() - started

    assert [info.id for info in first.conversations][:2] == ["bulk-100000", "bulk-99999"]
    assert len(deep.conversations) == 100
    assert elapsed < 1.0, f"two pages of 100 took {elapsed:.3f} s"
