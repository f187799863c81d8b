"""benchmarks/bench_cache.py in CI: the cache-stable policy's targets on the real server.

A shorter conversation than the benchmark's 200 turns (80, under a budget of
a quarter of the transcript again), so CI measures the same thing in a few
minutes: the cache-stable policy gets at least 80% of its prompt tokens from
llama.cpp's KV cache while keeping at least 60% of the budget as history, and
the sliding window (on 30 turns: each of its turns under pressure is processed
afresh) gets less than half. LangChain's figures need the ``bench`` extra and
stay in the benchmark.
"""

from __future__ import annotations

from types import ModuleType

import pytest

from benchmark_modules import load_benchmark

pytestmark = [pytest.mark.integration, pytest.mark.anyio]

TURNS = 80
SLIDING_TURNS = 30


def bench_module() -> ModuleType:
    return load_benchmark("bench_cache")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_the_cache_stable_policy_meets_its_targets_on_the_real_server(
    llama_server_upstream: str,
) -> None:
    bench = bench_module()
    report = await bench.measure(llama_server_upstream, turns=TURNS, policies=("cache-stable",))
    print(report.table())
    [row] = report.rows()

    assert report.settings.budget * 3 < report.transcript_tokens < report.settings.budget * 5
    assert row["cuts"] >= 2
    assert row["cached_pressure"] >= bench.CACHE_TARGET
    assert row["history_share"] >= bench.HISTORY_TARGET
    # The server's own count agrees with what the driver reported.
    assert abs(row["cache_n_pressure"] - row["cached_pressure"]) < 0.02


async def test_the_sliding_window_loses_the_cache_once_over_budget(
    llama_server_upstream: str,
) -> None:
    # Shorter: every turn under pressure is processed afresh, which is what costs.
    bench = bench_module()
    report = await bench.measure(
        llama_server_upstream, turns=SLIDING_TURNS, policies=("slide-by-one",)
    )
    print(report.table())
    [row] = report.rows()
    assert row["cuts"] >= SLIDING_TURNS // 2
    assert row["cached_pressure"] < 0.5
