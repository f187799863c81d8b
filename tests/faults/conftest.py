"""The fault server, one per test; the fault tests run on asyncio and trio."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .server import FaultServer


@pytest.fixture
def server() -> Iterator[FaultServer]:
    with FaultServer() as running:
        yield running


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    backend: str = request.param
    return backend
