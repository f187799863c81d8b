"""benchmarks/bench_cache.py's tool-heavy rows: a run cut short keeps what it measured.

Each turn is appended to the ``--rows`` file as it ends, and the file reads
back as the same runs, so a long run on a real server that is stopped still
has its table. An empty answer counts as the turn's answer sent as it was.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

import pytest

from benchmark_modules import load_benchmark
from threadline import Message, ToolCall

pytestmark = pytest.mark.anyio


def bench_module() -> ModuleType:
    return load_benchmark("bench_cache")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_the_rows_file_holds_every_turn_and_reads_back_as_the_runs(tmp_path: Path) -> None:
    bench = bench_module()
    rows = tmp_path / "rows.jsonl"
    runs = await bench.measure_tool_heavy(
        None,
        turns=12,
        policies=("cache-stable", "clear+cache-stable"),
        budget=6_000,
        keep=1,
        rows=rows,
    )
    assert len(rows.read_text().splitlines()) == 24  # written turn by turn
    loaded = bench.load_rows(rows)
    assert [run.row() for run in loaded] == [run.row() for run in runs]
    clear = loaded[1].row()
    assert clear["turns"] == 12
    assert clear["malformed"] == 0
    assert 0 < clear["cached_pressure"] <= clear["cache_ceiling"] < 1
    # Cut short: the lines of the turns that ended are a run of their own.
    rows.write_text("\n".join(rows.read_text().splitlines()[:5]) + "\n")
    [partial] = bench.load_rows(rows)
    assert partial.row()["turns"] == 5


def test_an_empty_answer_is_still_the_turns_answer() -> None:
    bench = bench_module()
    call = ToolCall(id="c0", name="read_file", arguments="{}")
    turn = [
        Message.user("Step 0: read notes/0.txt"),
        Message.assistant(tool_calls=[call]),
        Message.tool("c0", "words"),
        Message.assistant(""),
    ]
    later = [Message.user("Step 1: read notes/1.txt")]
    assert bench._verbatim_turns([*turn, *later], [*turn, *later]) == 1
    assert bench._verbatim_turns(later, [*turn, *later]) == 0
