"""kill -9 between pending and commit while another writer works on the same
conversation: nothing answered is lost, nothing is pending twice, and the
killed prompt is pending once, to be answered later (asyncio and trio)."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import anyio
import pytest

from threadline import Agent, Client, Conversation, Model
from threadline.stores.sqlite import SQLiteStore
from threadline.testing import ScriptedDriver

pytestmark = pytest.mark.anyio

WORKER = Path(__file__).with_name("_crash_worker.py")
TURNS = 4


async def writer(
    database: Path, name: str, point: str, backend: str, codes: dict[str, int]
) -> None:
    done = await anyio.run_process(
        [sys.executable, str(WORKER), str(database), name, str(TURNS), point, backend],
        check=False,
    )
    codes[name] = done.returncode
    assert done.returncode in (0, -signal.SIGKILL), done.stderr.decode()


@pytest.mark.parametrize("point", ["before-model", "before-commit"])
async def test_two_writers_one_killed_between_pending_and_commit_lose_nothing(
    tmp_path: Path, point: str, anyio_backend: str
) -> None:
    database = tmp_path / "shared.db"
    codes: dict[str, int] = {}
    async with anyio.create_task_group() as group:
        group.start_soon(writer, database, "a", point, anyio_backend, codes)
        group.start_soon(writer, database, "b", "none", anyio_backend, codes)
    assert codes == {"a": -signal.SIGKILL, "b": 0}

    killed = f"a-{TURNS - 1}"
    driver = ScriptedDriver([f"answer to {killed}"])
    agent = Agent(Client(driver), model=Model("scripted-model", context_size=1_000_000))
    async with SQLiteStore(database) as store:
        conv = await Conversation.load(agent, store, "shared")
        texts = [e.message.text for e in conv.events]
        prompts = texts[0::2]
        assert texts[1::2] == [f"answer to {p}" for p in prompts]  # every turn whole
        expected = {f"{w}-{t}" for w in "ab" for t in range(TURNS)} - {killed}
        assert sorted(prompts) == sorted(expected)  # each answered exactly once
        assert [m.text for m in conv.pending_messages()] == [killed]

        await conv.run(conv.pending_messages()[0])
        reloaded = await Conversation.load(agent, store, "shared")
    assert reloaded.pending_events == ()
    assert [e.message.text for e in reloaded.events][-2:] == [killed, f"answer to {killed}"]
