"""Shared test configuration.

Async tests use anyio's pytest plugin (``@pytest.mark.anyio``). They run on
asyncio by default; a test that must also prove trio works parametrizes
``anyio_backend`` with ``["asyncio", "trio"]``.
"""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
