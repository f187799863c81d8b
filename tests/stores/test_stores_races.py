"""Many processes on one conversation through each server store, and a process
killed between its pending prompt and its commit.

The workers are ``tests/stores/_store_worker.py``, half of them on asyncio and half
on trio.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from threadline import Agent, Client, Conversation, Model, Role
from threadline.serialization import ConversationDocument
from threadline.stores import ConversationStore
from threadline.stores.postgres import PostgresStore
from threadline.stores.redis import RedisStore
from threadline.testing import ScriptedDriver

pytestmark = [pytest.mark.anyio, pytest.mark.integration]

WORKER = Path(__file__).with_name("_store_worker.py")
PROCESSES = 8
TURNS = 50


@pytest.fixture(params=["postgres", "redis"])
def server_store(request: pytest.FixtureRequest) -> Iterator[tuple[str, str]]:
    """(URL, key prefix) of a fresh, empty place on a real server."""
    if request.param == "postgres":
        yield request.getfixturevalue("postgres_server").create_database(), ""
    else:
        yield request.getfixturevalue("redis_server").url(), f"race-{uuid.uuid4().hex}:"


def open_it(url: str, prefix: str) -> ConversationStore:
    if url.startswith("redis"):
        return RedisStore(url, prefix=prefix)
    return PostgresStore(url)


async def test_eight_processes_on_one_conversation_lose_nothing_and_leave_nothing_pending(
    server_store: tuple[str, str],
) -> None:
    url, prefix = server_store
    async with open_it(url, prefix) as store:
        await store.save(ConversationDocument(id="race"), expected_version=0)

    reports: list[dict[str, Any]] = []

    async def worker(index: int) -> None:
        backend = "trio" if index % 2 else "asyncio"
        argv = [sys.executable, str(WORKER), "race", url, prefix, str(index), str(TURNS), backend]
        done = await anyio.run_process(argv, check=False)
        assert done.returncode == 0, done.stderr.decode()[-3000:]
        reports.append(json.loads(done.stdout.decode().splitlines()[-1]))

    with anyio.fail_after(600):
        async with anyio.create_task_group() as group:
            for index in range(PROCESSES):
                group.start_soon(worker, index)

    async with open_it(url, prefix) as store:
        stored = await store.load("race")
    events = stored.document.events
    assert not any(event.pending for event in events), "a prompt stayed pending"
    assert stored.pending_markers == ()
    # Well formed: prompt, answer, prompt, answer... each answer to its own prompt.
    assert len(events) == 2 * PROCESSES * TURNS
    prompts = [event.message.text for event in events[0::2]]
    answers = [event.message.text for event in events[1::2]]
    assert all(event.message.role is Role.USER for event in events[0::2])
    assert all(event.message.role is Role.ASSISTANT for event in events[1::2])
    assert answers == [f"answer to {prompt}" for prompt in prompts]
    # Every committed turn exactly once, and each process's turns in its order.
    assert sorted(prompts) == sorted(f"w{w}-t{t}" for w in range(PROCESSES) for t in range(TURNS))
    for w in range(PROCESSES):
        own = [int(p.split("-t")[1]) for p in prompts if p.startswith(f"w{w}-")]
        assert own == list(range(TURNS))
    assert [event.turn_id for event in events[0::2]] == sorted(e.turn_id for e in events[0::2])
    # Every refused writer was told, and kept its answer when the model had run.
    assert sum(report["answers_lost"] for report in reports) == 0
    refused = sum(report["before_model"] + report["after_model"] for report in reports)
    print(
        f"\n{url.split(':')[0]}: {PROCESSES * TURNS} turns committed, {refused} refusals "
        f"({sum(r['after_model'] for r in reports)} after the model answered)"
    )
    assert refused > 0, "the processes never contended: the test proved nothing"


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
async def test_a_process_killed_between_pending_and_commit_leaves_its_prompt_recoverable(
    server_store: tuple[str, str], backend: str
) -> None:
    url, prefix = server_store
    async with open_it(url, prefix) as store:
        await store.save(ConversationDocument(id="crashy"), expected_version=0)

    argv = [sys.executable, str(WORKER), "crash", url, prefix, backend]
    process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # noqa: ASYNC220 - its stdout is read line by line in a thread
    try:
        assert process.stdout is not None
        line = await anyio.to_thread.run_sync(process.stdout.readline)
        assert line.strip() == b"PENDING", process.stderr.read() if process.stderr else b""
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=60)
        for stream in (process.stdout, process.stderr):
            if stream is not None:
                stream.close()
    assert process.returncode == -signal.SIGKILL

    async with open_it(url, prefix) as store:
        driver = ScriptedDriver(["Yes, here."])
        agent = Agent(Client(driver), model=Model("scripted-model", context_size=8192))
        conversation = await Conversation.load(agent, store, "crashy")
        assert [m.text for m in conversation.pending_messages()] == ["Are you still there?"]

        await conversation.run(conversation.pending_messages()[0])

        stored = await store.load("crashy")
        assert [(e.message.text, e.pending) for e in stored.document.events] == [
            ("Are you still there?", False),
            ("Yes, here.", False),
        ]
