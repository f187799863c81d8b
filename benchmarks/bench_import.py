"""What ``import threadline`` costs, against the layout before the core stopped importing adapters.

Run it with ``python benchmarks/bench_import.py``. It extracts the source tree
of the last commit before the "one house" layout (``BASELINE``) with
``git archive`` into a temporary directory, then runs, in turn, fresh
interpreters that import each tree with ``-X importtime`` and sums what the
interpreter reports for ``threadline`` (its cumulative column). Printed: the
median of each, their ratio (target: at most 0.5), the modules each import
loads, and ``httpx`` alone for reference. Both trees run with the same
interpreter and the same installed dependencies, taken in turn, so a busy
machine slows both alike.
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
RUNS = 15
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


def baseline_tree(into: Path) -> Path:
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", BASELINE, "src"],
        capture_output=True,
        check=True,
    ).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(into, filter="data")
    return into / "src"


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        old_src, new_src = baseline_tree(Path(tmp)), ROOT / "src"
        old, new, peer = [], [], []
        for _ in range(RUNS):
            old.append(cumulative_us(old_src, "threadline"))
            new.append(cumulative_us(new_src, "threadline"))
            peer.append(cumulative_us(new_src, "httpx"))
    old_ms = statistics.median(t for t, _ in old) / 1000
    new_ms = statistics.median(t for t, _ in new) / 1000
    peer_ms = statistics.median(t for t, _ in peer) / 1000
    ratio = new_ms / old_ms
    print(f"import threadline, {BASELINE}: {old_ms:7.1f} ms, {old[0][1]} modules")
    print(f"import threadline, now:     {new_ms:7.1f} ms, {new[0][1]} modules")
    print(f"import httpx (reference):   {peer_ms:7.1f} ms")
    met = ratio <= TARGET
    print(f"now/{BASELINE} = {ratio:.2f} (target <= {TARGET}) {'met' if met else 'NOT MET'}")
    return 0 if met else 1


if __name__ == "__main__":
    raise SystemExit(main())
