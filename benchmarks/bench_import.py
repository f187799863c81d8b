"""What ``import threadline`` and the first catalog lookup cost, against httpx and an old tree.

Run it with ``python benchmarks/bench_import.py``. It extracts the source tree
of the last commit before the "one house" layout (``BASELINE``) with
``git archive`` into a temporary directory, then runs, in turn, fresh
interpreters that import each tree with ``-X importtime`` and sums what the
interpreter reports for ``threadline`` (its cumulative column), and the same
for ``import httpx``. Printed: the median of each, the ratios (targets:
``import threadline`` at most 0.5 of the old tree's and at most ``import
httpx``'s), the modules each import loads, and, for reference, what a
program's usual first line (``from threadline import Agent, Conversation,
Model``) costs. Then the first ``Model("gpt-4o-mini")`` of a fresh process,
timed inside it: with the catalog index already built (every process after
the first; target at most 30 ms and no pydantic loaded), and cold, building
the index (once per genai-prices release, for reference). Everything runs
with the same interpreter and installed dependencies, taken in turn, so a
busy machine slows all alike.
"""

from __future__ import annotations

import io
import re
import statistics
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

BASELINE = "66cfc02"  # main before the core stopped importing drivers and stores
TARGET = 0.5
PEER_TARGET = 1.0
LOOKUP_TARGET_MS = 30.0
RUNS = 15
_LOOKUP = (
    "import sys, time\n"
    "from threadline import Model\n"
    "start = time.perf_counter()\n"
    "assert Model('gpt-4o-mini').context_size == 128_000\n"
    "print((time.perf_counter() - start) * 1000, 'pydantic' in sys.modules)"
)
ROOT = Path(__file__).resolve().parents[1]
_CUMULATIVE = re.compile(r"import time:\s+\d+ \|\s+(\d+) \| (\S+)$")


def cumulative_us(src: Path, module: str) -> tuple[int, int]:
    """Microseconds ``import module`` took from ``src``, and how many modules it loaded."""
    code = f"import sys; import {module}; print(len(sys.modules))"
    out = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    total = 0
    for line in out.stderr.splitlines():
        match = _CUMULATIVE.search(line)
        if match and match.group(2) == module:
            total = int(match.group(1))
    return total, int(out.stdout.strip())


def usual_first_line_us(src: Path) -> tuple[int, int]:
    """Microseconds ``from threadline import Agent, Conversation, Model`` took, timed inside
    a fresh process (the names load on first use, after the package's own import line)."""
    code = (
        "import sys, time; start = time.perf_counter(); "
        "from threadline import Agent, Conversation, Model; "
        "print(int((time.perf_counter() - start) * 1e6), len(sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=True,
    )
    elapsed, modules = out.stdout.split()
    return int(elapsed), int(modules)


def baseline_tree(into: Path) -> Path:
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", BASELINE, "src"],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def first_lookup(src: Path, cache: Path) -> tuple[float, bool]:
    """Milliseconds the first ``Model("gpt-4o-mini")`` of a fresh process took, and whether
    pydantic was loaded after it."""
    env = {"PYTHONPATH": str(src), "PATH": "/usr/bin:/bin", "THREADLINE_CACHE_DIR": str(cache)}
    out = subprocess.run(
        [sys.executable, "-c", _LOOKUP], env=env, capture_output=True, text=True, check=True
    )
    elapsed, pydantic = out.stdout.split()
    return float(elapsed), pydantic == "True"


def verdict(met: bool) -> str:
    return "met" if met else "NOT MET"


def imports(old_src: Path, new_src: Path) -> bool:
    old, new, peer, usual = [], [], [], []
    for _ in range(RUNS):
        old.append(cumulative_us(old_src, "threadline"))
        new.append(cumulative_us(new_src, "threadline"))
        peer.append(cumulative_us(new_src, "httpx"))
        usual.append(usual_first_line_us(new_src))
    old_ms, new_ms, peer_ms, usual_ms = (
        statistics.median(t for t, _ in runs) / 1000 for runs in (old, new, peer, usual)
    )
    print(f"import threadline, {BASELINE}:    {old_ms:7.1f} ms, {old[0][1]} modules")
    print(f"import threadline, now:        {new_ms:7.1f} ms, {new[0][1]} modules")
    print(f"import httpx, same run:        {peer_ms:7.1f} ms, {peer[0][1]} modules")
    print(
        f"from threadline import Agent, Conversation, Model (reference): {usual_ms:7.1f} ms, "
        f"{usual[0][1]} modules"
    )
    ratio, peer_ratio = new_ms / old_ms, new_ms / peer_ms
    print(f"now/{BASELINE} = {ratio:.2f} (target <= {TARGET}) {verdict(ratio <= TARGET)}")
    print(
        f"threadline/httpx = {peer_ratio:.2f} (target <= {PEER_TARGET}) "
        f"{verdict(peer_ratio <= PEER_TARGET)}"
    )
    return ratio <= TARGET and peer_ratio <= PEER_TARGET


def lookups(new_src: Path, tmp: Path) -> bool:
    cold = [first_lookup(new_src, tmp / f"cold-{run}") for run in range(5)]
    warm = [first_lookup(new_src, tmp / "cold-0") for _ in range(RUNS)]
    cold_ms = statistics.median(ms for ms, _ in cold)
    warm_ms = statistics.median(ms for ms, _ in warm)
    pydantic = any(loaded for _, loaded in warm)
    print(
        f"first Model('gpt-4o-mini'), index built before: {warm_ms:6.1f} ms, pydantic loaded: "
        f"{pydantic}"
    )
    print(
        f"first Model('gpt-4o-mini'), building the index (once per release, reference): "
        f"{cold_ms:6.1f} ms"
    )
    met = warm_ms <= LOOKUP_TARGET_MS and not pydantic
    print(f"first lookup <= {LOOKUP_TARGET_MS:.0f} ms without pydantic: {verdict(met)}")
    return met


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        old_src, new_src = baseline_tree(Path(tmp)), ROOT / "src"
        met = imports(old_src, new_src)
        met = lookups(new_src, Path(tmp)) and met
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
