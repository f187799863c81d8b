"""How ``RedisStore`` sends its calls on asyncio (``ScriptCalls``), on a real server:
calls made together go out in one write, each still answered (or refused) on its
own; scripts the server lost are loaded again; a batch whose connection is lost
is sent again once; a call whose task stopped waiting before its batch went is
never sent, and the calls that were to go with it still are."""

from __future__ import annotations

import time
import uuid
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import anyio.lowlevel
import anyio.to_thread
import pytest
import redis
import redis.asyncio

from servers import RedisServer, paused_script_client
from threadline.stores.redis._calls import ScriptCalls

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

SCRIPTS = {
    "echo": "return ARGV[1]",
    "count": "return redis.call('INCR', KEYS[1])",
    "refuse": "return redis.error_reply('refused ' .. ARGV[1])",
}


class CountingConnection(redis.asyncio.Connection):
    """A connection that counts its writes of script calls (one per batch it sends)."""

    writes = 0

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        if any(b"EVALSHA" in part for part in command):  # not the login when connecting
            CountingConnection.writes += 1
        await super().send_packed_command(command, check_health)


def calls_for(
    server: RedisServer, *, max_connections: int = 4, name: str | None = None
) -> ScriptCalls:
    pool = redis.asyncio.ConnectionPool.from_url(
        server.url(),
        decode_responses=True,
        connection_class=CountingConnection,
        client_name=name,
    )
    return ScriptCalls(pool, SCRIPTS, max_connections=max_connections, timeout=10.0)


@pytest.fixture
async def calls(redis_server: RedisServer) -> AsyncIterator[ScriptCalls]:
    made = calls_for(redis_server)
    yield made
    await made.aclose()


@pytest.fixture
def admin(redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_server.url(), decode_responses=True)
    yield client
    client.execute_command("CLIENT", "UNPAUSE")
    client.close()


async def test_calls_made_together_go_out_in_one_write_each_with_its_own_answer(
    calls: ScriptCalls,
) -> None:
    assert await calls.call("echo", [], ["warm"]) == "warm"  # connected, script loaded
    answers: dict[int, object] = {}

    async def echo(index: int) -> None:
        answers[index] = await calls.call("echo", [], [f"answer {index}"])

    before = CountingConnection.writes
    async with anyio.create_task_group() as group:
        for index in range(16):
            group.start_soon(echo, index)
    assert answers == {index: f"answer {index}" for index in range(16)}
    # The first call goes alone (nothing else was in flight); the others wait one
    # round of the event loop and go together.
    assert CountingConnection.writes - before <= 3


async def test_a_refused_call_fails_alone_and_the_rest_of_its_batch_is_answered(
    calls: ScriptCalls,
) -> None:
    outcomes: dict[int, object] = {}

    async def one(index: int) -> None:
        try:
            outcomes[index] = await calls.call(
                "refuse" if index % 3 == 0 else "echo", [], [str(index)]
            )
        except redis.exceptions.ResponseError as exc:
            outcomes[index] = exc

    async with anyio.create_task_group() as group:
        for index in range(12):
            group.start_soon(one, index)
    for index, outcome in outcomes.items():
        if index % 3 == 0:
            assert isinstance(outcome, redis.exceptions.ResponseError)
            assert str(outcome) == f"refused {index}"
        else:
            assert outcome == str(index)
    assert len(outcomes) == 12


async def test_scripts_the_server_lost_are_loaded_again(
    calls: ScriptCalls, admin: redis.Redis
) -> None:
    key = f"lost-{uuid.uuid4().hex}"
    assert await calls.call("count", [key], []) == 1
    admin.script_flush()
    answers: list[object] = []

    async def one(script: str) -> None:
        answers.append(await calls.call(script, [key], ["again"]))

    async with anyio.create_task_group() as group:
        for script in ("count", "echo", "count", "echo"):
            group.start_soon(one, script)
    assert sorted(map(str, answers)) == ["2", "3", "again", "again"]


async def test_a_batch_whose_connection_is_lost_is_sent_again_and_applied_once(
    calls: ScriptCalls, admin: redis.Redis
) -> None:
    keys = [f"retried-{uuid.uuid4().hex}" for _ in range(6)]
    await calls.call("echo", [], ["warm"])
    answers: dict[str, object] = {}

    async def count(key: str) -> None:
        answers[key] = await calls.call("count", [key], [])

    admin.execute_command("CLIENT", "PAUSE", 30_000, "WRITE")
    try:
        async with anyio.create_task_group() as group:
            for key in keys:
                group.start_soon(count, key)
            first = await anyio.to_thread.run_sync(paused_script_client, admin)
            admin.client_kill_filter(_id=first)
            # Sent again on a fresh connection; let it through.
            await anyio.to_thread.run_sync(paused_script_client, admin, first)
            admin.execute_command("CLIENT", "UNPAUSE")
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
    assert answers == dict.fromkeys(keys, 1)
    assert [admin.get(key) for key in keys] == ["1"] * 6


@pytest.mark.parametrize("gives_up", ["the call that sends the batch", "a call that joined it"])
async def test_a_call_given_up_before_its_batch_went_is_never_sent_and_the_rest_still_go(
    redis_server: RedisServer, admin: redis.Redis, gives_up: str
) -> None:
    calls = calls_for(redis_server, max_connections=1)
    first, given_up, joined = (f"{name}-{uuid.uuid4().hex}" for name in ("a", "b", "c"))
    answers: dict[str, object] = {}

    async def count(key: str) -> None:
        answers[key] = await calls.call("count", [key], [])

    gone = anyio.Event()

    async def give_up(key: str) -> None:
        with anyio.move_on_after(0.3) as scope:
            await count(key)
        assert scope.cancelled_caught
        gone.set()

    try:
        await calls.call("echo", [], ["warm"])
        admin.execute_command("CLIENT", "PAUSE", 30_000, "WRITE")
        async with anyio.create_task_group() as group:
            group.start_soon(count, first)  # holds the only connection
            await anyio.to_thread.run_sync(paused_script_client, admin)
            # A batch of two waits for the connection; one of them gives up.
            if gives_up == "the call that sends the batch":
                group.start_soon(give_up, given_up)
                group.start_soon(count, joined)
            else:
                group.start_soon(count, joined)
                group.start_soon(give_up, given_up)
            await gone.wait()
            admin.execute_command("CLIENT", "UNPAUSE")
    finally:
        admin.execute_command("CLIENT", "UNPAUSE")
        await calls.aclose()
    assert answers == {first: 1, joined: 1}
    assert admin.get(given_up) is None  # never sent
    assert admin.get(joined) == "1"


async def test_a_closed_one_makes_no_connection(redis_server: RedisServer) -> None:
    calls = calls_for(redis_server)
    await calls.call("echo", [], ["once"])
    await calls.aclose()
    with pytest.raises(redis.exceptions.ConnectionError, match="closed"):
        await calls.call("echo", [], ["again"])


async def test_closing_with_calls_in_flight_leaves_no_connection_open(
    redis_server: RedisServer, admin: redis.Redis
) -> None:
    name = f"closing-{uuid.uuid4().hex}"
    calls = calls_for(redis_server, name=name)
    await calls.call("echo", [], ["warm"])
    outcomes: list[object] = []

    async def one() -> None:
        try:
            outcomes.append(await calls.call("echo", [], ["late"]))
        except redis.exceptions.ConnectionError as exc:
            outcomes.append(exc)

    async with anyio.create_task_group() as group:
        for _ in range(4):
            group.start_soon(one)
        await anyio.lowlevel.checkpoint()  # the calls are on their way
        await calls.aclose()
    assert len(outcomes) == 4
    # Answered before the close or refused; either way no connection is left behind.
    assert all(o == "late" or isinstance(o, redis.exceptions.ConnectionError) for o in outcomes)
    deadline = time.monotonic() + 10
    while any(client["name"] == name for client in admin.client_list()):
        assert time.monotonic() < deadline, "a connection was left open"
        await anyio.sleep(0.02)
