"""Memory per conversation as conversations grow: 20, 40 and 200 turns.

Run it with ``python benchmarks/bench_memory.py`` (``--quick`` for fewer
conversations). It runs the concurrent conversations of
``bench_conversation.py`` (``OpenAIChatDriver`` against its local mock server,
in a process of its own) under ``tracemalloc`` for each length, and prints
the memory the conversations keep per conversation over the floor: the
messages' own size (each message object and what only it holds, by
``sys.getsizeof``). Target: at most 1.3 times the floor at every length.

Two ratios are printed:

- **kept / floor**: all traced memory kept after the run (client, driver,
  caches and pool included) over the floor, as ``bench_conversation.py``
  prints it for 20 turns;
- **per conversation**: the same difference taken between a run of ``n``
  conversations and one of ``n / 2``, so what a driver or a cache holds once
  (not per conversation) cancels out. The target holds for both.

The driver keeps each message's JSON for long histories (64 messages and up)
so a history re-sent every round is encoded once; that cache is bounded in
bytes per driver (``threadline.drivers._http._wire.DEFAULT_CACHE_BYTES``, 1 MiB),
so it does not grow with the conversations. Until it is full it does: with
``--quick`` (50 conversations of 40 turns, 10 of 200) it is not full in the run
of ``n / 2``, so at 40 and 200 turns both ratios measure the cache filling
(about 2.0) rather than the conversations; the full run fills it in both.
"""

from __future__ import annotations

import argparse
import gc
import subprocess
import sys
import tracemalloc
from pathlib import Path

import anyio
from bench_conversation import many_conversations, messages_floor

TARGET = 1.3
TURNS = (20, 40, 200)
IN_FLIGHT = 32


def kept(base_url: str, conversations: int, turns: int) -> tuple[int, int]:
    """Traced memory kept by ``conversations`` of ``turns`` turns, and their floor."""
    gc.collect()
    tracemalloc.start()
    baseline = tracemalloc.get_traced_memory()[0]
    threads = anyio.run(many_conversations, base_url, conversations, turns, IN_FLIGHT)
    gc.collect()
    retained = tracemalloc.get_traced_memory()[0] - baseline
    tracemalloc.stop()
    floor = messages_floor(threads)
    del threads
    return retained, floor


def report(base_url: str, conversations: int, turns: int) -> bool:
    big, big_floor = kept(base_url, conversations, turns)
    small, small_floor = kept(base_url, conversations // 2, turns)
    total = big / big_floor
    marginal = (big - small) / (big_floor - small_floor)
    met = total <= TARGET and marginal <= TARGET
    per = 1024 * conversations
    print(
        f"{turns:>4} turns, {conversations:>5,} conversations: kept {big / per:7.1f} KiB, "
        f"floor {big_floor / per:7.1f} KiB a conversation; kept / floor {total:4.2f}, "
        f"per conversation {marginal:4.2f} (target <= {TARGET}: {'met' if met else 'MISSED'})"
    )
    return met


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a tenth of the conversations")
    args = parser.parse_args()
    serve = Path(__file__).with_name("bench_conversation.py")
    server = subprocess.Popen(
        [sys.executable, str(serve), "--serve"], stdout=subprocess.PIPE, text=True
    )
    met = True
    try:
        assert server.stdout is not None
        base_url = f"http://127.0.0.1:{int(server.stdout.readline())}/v1"
        anyio.run(many_conversations, base_url, 10, 1, IN_FLIGHT)  # warm up: imports, caches
        print(
            "traced memory the conversations keep (conversations alive), over the floor "
            "(the messages' own size)"
        )
        for turns in TURNS:
            # About the same number of turns at every length, so each run takes as long.
            conversations = max(20, 20_000 // turns) // (10 if args.quick else 1)
            met &= report(base_url, conversations, turns)
    finally:
        server.terminate()
        server.wait()
    print("all targets met" if met else "some targets MISSED")


if __name__ == "__main__":
    main()
