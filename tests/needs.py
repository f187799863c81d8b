"""What a test does when a piece it needs (a server binary, an optional package) is
missing: skip on a developer's machine, fail in CI (``THREADLINE_REQUIRE_INTEGRATION=1``).
Kept apart from servers.py, which the benchmarks import without pytest."""

from __future__ import annotations

import os

import pytest


def require_or_skip(reason: str) -> None:
    """Skip the test, or fail it when CI requires the integration servers."""
    if os.environ.get("THREADLINE_REQUIRE_INTEGRATION") == "1":
        pytest.fail(f"{reason} (THREADLINE_REQUIRE_INTEGRATION=1: a missing server is a failure)")
    pytest.skip(reason)
