"""Conversations across processes: restored from JSON, and after a crash mid-turn."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from threadline import Agent, Client, Conversation, Model
from threadline.stores.sqlite import SQLiteStore
from threadline.testing import ScriptedDriver

pytestmark = pytest.mark.anyio

MODEL = Model("scripted-model", context_size=8192)

CONTINUE_FROM_JSON = """
import json, sys
import anyio
from threadline import Agent
from threadline import Client
from threadline import Conversation
from threadline import Model
from threadline.testing import ScriptedDriver

saved, replies, prompt, backend = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]

async def main():
    driver = ScriptedDriver(replies)
    agent = Agent(Client(driver), model=Model("scripted-model", context_size=8192))
    with open(saved) as file:
        conv = Conversation.from_json(agent, file.read())
    result = await conv.run(prompt)
    print(json.dumps({
        "answer": result.text,
        "sent": [[m.role.value, m.text] for m in driver.calls[0].messages],
        "saved": conv.to_json(),
    }))

anyio.run(main, backend=backend)
"""

CRASH_MID_TURN = """
import os, sys
import anyio
from threadline import Agent
from threadline import Client
from threadline import Conversation
from threadline import Model
from threadline.stores.sqlite import SQLiteStore
from threadline.testing import ScriptedDriver

class DiesOnSecondCall(ScriptedDriver):
    async def complete(self, call):
        if self.calls:
            os._exit(17)  # the process is killed after "pending", before "commit"
        return await super().complete(call)

async def main():
    agent = Agent(Client(DiesOnSecondCall(["Hello."])), model=Model("m", context_size=8192))
    store = SQLiteStore(sys.argv[1])
    conv = Conversation(agent, id="crashy", store=store)
    await conv.run("Hi.")
    await conv.run("Are you there?")

anyio.run(main)
"""

RESEND_AND_CRASH = """
import os, sys
import anyio
from threadline import Agent
from threadline import Client
from threadline import Conversation
from threadline import Model
from threadline.stores.sqlite import SQLiteStore
from threadline.testing import ScriptedDriver

class Dies(ScriptedDriver):
    async def complete(self, call):
        os._exit(17)  # killed while answering the pending prompt again

async def main():
    agent = Agent(Client(Dies()), model=Model("m", context_size=8192))
    async with SQLiteStore(sys.argv[1]) as store:
        conv = await Conversation.load(agent, store, "crashy")
        await conv.run(conv.pending_messages()[0])

anyio.run(main)
"""


async def python(script: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    return await anyio.run_process([sys.executable, str(script), *args], check=False)


@pytest.mark.parametrize("child_backend", ["asyncio", "trio"])
async def test_a_conversation_restored_in_a_new_process_continues_the_same_way(
    tmp_path: Path, child_backend: str
) -> None:
    conv = Conversation(Agent(Client(ScriptedDriver(["Hi Ada.", "Noted."])), model=MODEL))
    await conv.run("My name is Ada.")
    await conv.run("I like tea.")
    saved = tmp_path / "conversation.json"
    saved.write_text(conv.to_json())
    script = tmp_path / "continue.py"
    script.write_text(CONTINUE_FROM_JSON)
    replies = ["Ada, who likes tea."]

    # The same continuation here, for comparison.
    here_driver = ScriptedDriver(replies)
    here = Conversation.from_json(Agent(Client(here_driver), model=MODEL), saved.read_text())
    here_result = await here.run("Who am I?")

    finished = await python(script, str(saved), json.dumps(replies), "Who am I?", child_backend)
    assert finished.returncode == 0, finished.stderr.decode()
    there = json.loads(finished.stdout)

    assert there["answer"] == here_result.text == "Ada, who likes tea."
    assert there["sent"] == [[m.role.value, m.text] for m in here_driver.calls[0].messages]
    restored = Conversation.from_json(here.agent, there["saved"])
    assert restored.events == here.events
    assert restored.total_usage == here.total_usage


async def test_a_process_killed_between_pending_and_commit_leaves_a_store_that_continues(
    tmp_path: Path,
) -> None:
    database = tmp_path / "threads.db"
    script = tmp_path / "crash.py"
    script.write_text(CRASH_MID_TURN)

    finished = await python(script, str(database))
    assert finished.returncode == 17, finished.stderr.decode()

    driver = ScriptedDriver(["Yes.", "I am here."])
    async with SQLiteStore(database) as store:
        conv = await Conversation.load(Agent(Client(driver), model=MODEL), store, "crashy")
        assert [e.message.text for e in conv.events] == ["Hi.", "Hello."]
        assert [m.text for m in conv.pending_messages()] == ["Are you there?"]

        await conv.run("Still there?")
        assert [m.text for m in driver.calls[0].messages] == ["Hi.", "Hello.", "Still there?"]

        await conv.run(conv.pending_messages()[0])
        reloaded = await Conversation.load(conv.agent, store, "crashy")
        assert [e.message.text for e in reloaded.events] == [
            "Hi.",
            "Hello.",
            "Still there?",
            "Yes.",
            "Are you there?",
            "I am here.",
        ]
        assert reloaded.pending_events == ()
        assert [t.id for t in reloaded.turns] == [0, 2, 3]


async def test_a_process_killed_while_sending_a_pending_prompt_again_leaves_one_copy(
    tmp_path: Path,
) -> None:
    database = tmp_path / "threads.db"
    crash, resend = tmp_path / "crash.py", tmp_path / "resend.py"
    crash.write_text(CRASH_MID_TURN)
    resend.write_text(RESEND_AND_CRASH)
    assert (await python(crash, str(database))).returncode == 17

    finished = await python(resend, str(database))
    assert finished.returncode == 17, finished.stderr.decode()

    driver = ScriptedDriver(["I am here."])
    async with SQLiteStore(database) as store:
        conv = await Conversation.load(Agent(Client(driver), model=MODEL), store, "crashy")
        assert [m.text for m in conv.pending_messages()] == ["Are you there?"]
        await conv.run(conv.pending_messages()[0])
        reloaded = await Conversation.load(conv.agent, store, "crashy")
        assert [e.message.text for e in reloaded.events] == [
            "Hi.",
            "Hello.",
            "Are you there?",
            "I am here.",
        ]
        assert reloaded.pending_events == ()
