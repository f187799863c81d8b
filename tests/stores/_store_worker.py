"""A process of its own on a server store, for tests/stores/test_stores_races.py.

python _store_worker.py race URL PREFIX WORKER TURNS BACKEND
    runs TURNS turns on conversation "race", reloading and retrying on
    ConcurrentModificationError; prints one JSON line of what happened.
python _store_worker.py crash URL PREFIX BACKEND
    writes the prompt of a turn on conversation "crashy", prints PENDING
    and waits inside the model call until it is killed.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import anyio

from threadline import Agent, Client, ConcurrentModificationError, Conversation, Model
from threadline.stores import ConversationStore, open_store
from threadline.stores.redis import RedisStore
from threadline.testing import ScriptedDriver

MODEL = Model("scripted-model", context_size=1_000_000)


def store_for(url: str, prefix: str) -> ConversationStore:
    if url.startswith("redis"):
        return RedisStore(url, prefix=prefix)
    return open_store(url)


async def race(url: str, prefix: str, worker: int, turns: int) -> dict[str, Any]:
    driver = ScriptedDriver()
    agent = Agent(Client(driver), model=MODEL)
    report: dict[str, Any] = {"before_model": 0, "after_model": 0, "answers_lost": 0}
    async with store_for(url, prefix) as store:
        for turn in range(turns):
            prompt = f"w{worker}-t{turn}"
            while True:
                if driver.remaining == 0:
                    driver.add_replies([f"answer to {prompt}"])
                calls = len(driver.calls)
                conversation = await Conversation.load(agent, store, "race")
                try:
                    await conversation.run(prompt)
                    break
                except ConcurrentModificationError as exc:
                    if len(driver.calls) == calls:
                        report["before_model"] += 1
                    else:
                        report["after_model"] += 1
                        kept = exc.unsaved_result
                        if kept is None or kept.text != f"answer to {prompt}":
                            report["answers_lost"] += 1
    return report


class StallsInTheModel(ScriptedDriver):
    """Says the prompt is stored, then never answers: the parent kills the process."""

    async def complete(self, call: Any) -> Any:
        print("PENDING", flush=True)
        await anyio.sleep_forever()


async def crash(url: str, prefix: str) -> None:
    async with store_for(url, prefix) as store:
        agent = Agent(Client(StallsInTheModel()), model=MODEL)
        conversation = await Conversation.load(agent, store, "crashy")
        await conversation.run("Are you still there?")


def main(argv: list[str]) -> None:
    mode, url, prefix = argv[1], argv[2], argv[3]
    if mode == "race":
        worker, turns, backend = int(argv[4]), int(argv[5]), argv[6]
        report = anyio.run(race, url, prefix, worker, turns, backend=backend)
        print(json.dumps(report), flush=True)
    else:
        anyio.run(crash, url, prefix, backend=argv[4])


if __name__ == "__main__":
    main(sys.argv)
