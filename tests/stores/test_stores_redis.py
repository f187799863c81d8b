"""What is particular to ``RedisStore``, on a real server (the contract suite
covers the rest): errors that name the store and never the password, the key
prefix, expiry, paged listing without KEYS, lost connections and restarts."""

from __future__ import annotations

import functools
import io
import logging
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest
import redis

from servers import (
    PASSWORD,
    RedisServer,
    assert_no_password,
    free_port,
    paused_script_client,
    user_document,
)
from threadline import (
    Agent,
    Client,
    Conversation,
    ConversationFormatError,
    ConversationNotFoundError,
    InvalidRequestError,
    Message,
    Model,
    Origin,
    StoreError,
)
from threadline.serialization import ConversationEvent
from threadline.stores import open_store
from threadline.stores.redis import SCHEMA_VERSION, RedisStore
from threadline.testing import ScriptedDriver

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends, pytest.mark.integration]


@pytest.fixture
def prefix() -> str:
    return f"test-{uuid.uuid4().hex}:"


@pytest.fixture
async def store(
    redis_server: RedisServer, prefix: str, anyio_backend: str
) -> AsyncIterator[RedisStore]:
    async with RedisStore(redis_server.url(), prefix=prefix) as opened:
        yield opened


@pytest.fixture
def admin(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url(), decode_responses=True)
    yield client
    client.close()


doc = user_document


# --- errors name the store, never the password ----------------------------------------


def test_the_repr_and_open_store_hide_the_password(redis_server: RedisServer) -> None:
    store = open_store(redis_server.url())
    assert isinstance(store, RedisStore)
    assert PASSWORD not in repr(store)
    assert ":***@127.0.0.1" in repr(store)
    assert store.prefix == "threadline:"


async def test_a_refused_password_is_a_store_error_without_the_password(
    redis_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    wrong = "Wr0ng-Secret-4711"
    caplog.set_level(logging.DEBUG)
    async with RedisStore(redis_server.url(password=wrong), timeout=5) as store:
        with pytest.raises(StoreError, match="RedisStore") as caught:
            await store.load("c1")
    assert "refused the login" in str(caught.value)
    assert caught.value.__cause__ is None
    assert caught.value.__context__ is None
    assert_no_password(caught.value, caplog.text, password=wrong)


async def test_a_server_that_is_down_is_a_store_error_saying_what_to_do(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    async with RedisStore(f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0", timeout=2) as store:
        with pytest.raises(StoreError, match="cannot reach the server") as caught:
            await store.list()
    assert "check that it runs" in str(caught.value)
    assert_no_password(caught.value, caplog.text)


@pytest.mark.parametrize("options", [{"ttl": 0}, {"ttl": -1.0}, {"prefix": 3}, {"timeout": 0}])
def test_options_it_cannot_use_are_refused_when_built(
    redis_server: RedisServer, options: dict[str, Any]
) -> None:
    with pytest.raises(InvalidRequestError):
        RedisStore(redis_server.url(), **options)


def test_a_url_of_another_scheme_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="redis://"):
        RedisStore("http://127.0.0.1:6379")


# --- the schema and the keys -----------------------------------------------------------


async def test_keys_written_by_a_newer_threadline_are_refused_clearly(
    redis_server: RedisServer, prefix: str, admin: redis.Redis
) -> None:
    admin.set(f"{prefix}schema", SCHEMA_VERSION + 1)
    async with RedisStore(redis_server.url(), prefix=prefix) as store:
        with pytest.raises(ConversationFormatError, match="newer threadline"):
            await store.load("c1")


async def test_keys_of_another_program_under_the_prefix_are_a_store_error(
    store: RedisStore, prefix: str, admin: redis.Redis
) -> None:
    admin.set(f"{prefix}c:c1", "not a hash")
    with pytest.raises(StoreError, match="not this store's"):
        await store.save(doc(), expected_version=0)


async def test_stores_with_different_prefixes_do_not_see_each_other(
    redis_server: RedisServer, store: RedisStore
) -> None:
    await store.save(doc("mine"), expected_version=0)
    async with RedisStore(redis_server.url(), prefix=f"other-{uuid.uuid4().hex}:") as other:
        assert await other.list() == []
        with pytest.raises(ConversationNotFoundError):
            await other.load("mine")
        await other.save(doc("mine"), expected_version=0)  # no conflict: a separate space
    assert [info.id for info in await store.list()] == ["mine"]


async def test_every_write_sets_the_expiry_and_an_expired_conversation_is_gone(
    redis_server: RedisServer, prefix: str, admin: redis.Redis
) -> None:
    async with RedisStore(redis_server.url(), prefix=prefix, ttl=3600) as store:
        await store.append_events(
            "c1",
            [ConversationEvent(message=Message.user("hi"), turn_id=0, pending=True)],
            header=doc(),
            expected_version=0,
            pending_marker="w1",
        )
        await store.save(doc("c2"), expected_version=0)
        for kind in ("c", "e", "p"):
            assert 3_590_000 < admin.pttl(f"{prefix}{kind}:c1") <= 3_600_000
        admin.pexpire(f"{prefix}c:c1", 5000)
        await store.save(doc(), expected_version=1)
        assert admin.pttl(f"{prefix}c:c1") > 3_590_000  # renewed by the write

        # What Redis does when the time is up: the keys go.
        admin.delete(*(f"{prefix}{kind}:c1" for kind in ("c", "e", "p")))
        with pytest.raises(ConversationNotFoundError):
            await store.load("c1")
        assert [info.id for info in await store.list()] == ["c2"]
        assert admin.zrange(f"{prefix}index", 0, -1) == ["c2"]  # the listing cleaned up
    async with RedisStore(redis_server.url(), prefix=f"{prefix}none:") as forever:
        await forever.save(doc(), expected_version=0)
        assert admin.pttl(f"{prefix}none:c:c1") == -1


async def test_listing_pages_through_a_sorted_index_and_never_uses_keys(
    store: RedisStore, admin: redis.Redis
) -> None:
    for index in range(1200):
        await store.save(doc(f"c{index:04}"), expected_version=0)
    admin.config_resetstat()

    seen: list[str] = []
    cursor = None
    while True:
        page = await store.list_page(limit=250, cursor=cursor)
        seen += [info.id for info in page.conversations]
        if page.next_cursor is None:
            break
        cursor = page.next_cursor

    assert seen == [f"c{index:04}" for index in reversed(range(1200))]
    stats = admin.info("commandstats")
    assert "cmdstat_keys" not in stats
    assert "cmdstat_scan" not in stats


# --- lost connections and restarts ------------------------------------------------------


async def test_a_connection_dropped_during_a_write_is_retried_and_applied_once(
    store: RedisStore, admin: redis.Redis
) -> None:
    version = await store.save(doc("c1", "one"), expected_version=0)
    outcome: list[int] = []

    async def write() -> None:
        outcome.append(await store.save(doc("c1", "one", "two"), expected_version=version))

    admin.execute_command("CLIENT", "PAUSE", 30_000, "WRITE")
    try:
        async with anyio.create_task_group() as group:
            group.start_soon(write)
            first = await anyio.to_thread.run_sync(paused_script_client, admin)
            admin.client_kill_filter(_id=first)
            await anyio.to_thread.run_sync(paused_script_client, admin, first)
            admin.execute_command("CLIENT", "UNPAUSE")
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")

    assert outcome == [version + 1]
    stored = await store.load("c1")
    assert stored.version == version + 1
    assert [event.message.text for event in stored.document.events] == ["one", "two"]


async def test_a_retried_write_that_was_applied_is_not_refused_as_a_conflict(
    store: RedisStore,
) -> None:
    # Private room: the Write a retry sends again is the base's, not public API.
    from threadline.serialization._converter import dumps_conversation_header, dumps_event
    from threadline.stores._base import EventRecord, Write

    version = await store.save(doc(), expected_version=0)
    event = ConversationEvent(message=Message.user("once", origin=Origin.TURN), turn_id=0)
    write = Write(
        conversation_id="c1",
        header=doc(),
        header_text=dumps_conversation_header(doc()),
        records=(EventRecord(event, dumps_event(event)),),
        expected_version=version,
        replace=False,
    )
    assert await store._write(write) == version + 1
    assert await store._write(write) == version + 1  # the answer was "lost": sent again
    stored = await store.load("c1")
    assert [e.message.text for e in stored.document.events] == ["once"]


async def test_the_next_turn_works_after_the_server_restarts(anyio_backend: str) -> None:
    binary = RedisServer.find()
    assert binary is not None
    # A server of its own that keeps its data on disk, as a production one would.
    durable = RedisServer(binary, "--appendonly", "yes", "--appendfsync", "always")
    durable.start()
    try:
        async with RedisStore(durable.url(), prefix="restart:") as store:
            driver = ScriptedDriver(["one", "two"])
            agent = Agent(Client(driver), model=Model("m", context_size=8192))
            conversation = Conversation(agent, store=store)
            await conversation.run("first")
            await anyio.to_thread.run_sync(durable.restart)
            await conversation.run("second")
            stored = await store.load(conversation.id)
        assert [e.message.text for e in stored.document.events] == [
            "first",
            "one",
            "second",
            "two",
        ]
        assert not any(e.pending for e in stored.document.events)
    finally:
        durable.remove()


async def test_more_calls_than_connections_wait_for_a_free_one(redis_server: RedisServer) -> None:
    async with RedisStore(
        redis_server.url(), prefix=f"small-{uuid.uuid4().hex}:", max_connections=2
    ) as store:
        async with anyio.create_task_group() as group:
            for index in range(30):
                group.start_soon(
                    functools.partial(store.save, doc(f"c{index}"), expected_version=0)
                )
        assert len(await store.list()) == 30


def test_the_command_line_reads_a_store_by_url_and_never_prints_the_password(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    from threadline.cli import main

    conversation_id = f"cli-{uuid.uuid4().hex}"

    async def save() -> None:
        async with RedisStore(redis_server.url()) as store:  # the default prefix, as the CLI's
            await store.save(doc(conversation_id, "Hello from the CLI test."), expected_version=0)

    anyio.run(save)
    for env in ({}, {"THREADLINE_DB": redis_server.url()}):
        for key, value in env.items():
            monkeypatch.setenv(key, value)
        argv = (
            ["conversations", "list"]
            if env
            else ["conversations", "--db", redis_server.url(), "list"]
        )
        out, err = io.StringIO(), io.StringIO()
        assert main(argv, stdout=out, stderr=err) == 0, err.getvalue()
        assert conversation_id in out.getvalue()
        assert PASSWORD not in out.getvalue() + err.getvalue()

    out, err = io.StringIO(), io.StringIO()
    nowhere = f"redis://:{PASSWORD}@127.0.0.1:{free_port()}/0"
    assert main(["conversations", "--db", nowhere, "list"], stdout=out, stderr=err) != 0
    assert "RedisStore" in err.getvalue()
    assert PASSWORD not in out.getvalue() + err.getvalue()
