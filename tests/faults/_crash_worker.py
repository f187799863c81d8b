"""One writer process on a shared SQLite conversation, for test_crash_writers.py.

python _crash_worker.py DB WRITER TURNS POINT BACKEND
    runs TURNS turns on conversation "shared" (reloading and retrying when
    another writer got in first). With POINT "before-model" or "before-commit"
    the last turn kills its own process with SIGKILL there: after its prompt
    is stored as pending, and before the model answers or before the answered
    turn reaches the store. POINT "none" finishes normally.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Any

import anyio

from threadline import Agent, Client, ConcurrentModificationError, Conversation, Model
from threadline.drivers import ProviderCall, ProviderResponse
from threadline.stores.sqlite import SQLiteStore
from threadline.testing import ScriptedDriver

MODEL = Model("scripted-model", context_size=1_000_000)


def kill_me() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class Answers(ScriptedDriver):
    """Answers every prompt with "answer to <prompt>"; may die before the last one."""

    def __init__(self, dies_on: str | None) -> None:
        super().__init__()
        self.dies_on = dies_on

    async def complete(self, call: ProviderCall) -> ProviderResponse:
        prompt = call.messages[-1].text
        if prompt == self.dies_on:
            kill_me()
        self.add_replies([f"answer to {prompt}"])
        return await super().complete(call)


class DiesBeforeCommit:
    """The store, except that the commit of ``dies_on`` kills the process first."""

    def __init__(self, inner: SQLiteStore) -> None:
        self._inner = inner
        self.dies_on: str | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def append_events(self, conversation_id: str, events: Any, **options: Any) -> int:
        committing = any(not e.pending and e.message.text == self.dies_on for e in events)
        if committing:
            kill_me()
        return await self._inner.append_events(conversation_id, events, **options)


async def main(path: str, writer: str, turns: int, point: str) -> None:
    last = f"{writer}-{turns - 1}"
    driver = Answers(last if point == "before-model" else None)
    agent = Agent(Client(driver), model=MODEL)
    async with SQLiteStore(path, timeout=30) as inner:
        store = DiesBeforeCommit(inner)
        store.dies_on = last if point == "before-commit" else None
        for turn in range(turns):
            prompt = f"{writer}-{turn}"
            while True:
                conversation = await Conversation.open(agent, store, "shared")  # type: ignore[arg-type]
                try:
                    await conversation.run(prompt)
                    break
                except ConcurrentModificationError:
                    continue


if __name__ == "__main__":
    db, name, count, where, backend = sys.argv[1:6]
    anyio.run(main, db, name, int(count), where, backend=backend)
