"""Shared test configuration.

The tests are arranged like the source: one folder per room (``engine/``,
``conversation/``, ``limiting/``, ...); a folder's ``conftest.py`` holds the
fixtures its modules share.

Async tests use anyio's pytest plugin (``@pytest.mark.anyio``). They run on
asyncio by default; a test that must also prove trio works parametrizes
``anyio_backend`` with ``["asyncio", "trio"]``, and a module whose every async
test must is marked ``both_backends`` (``pytestmark``). A folder that runs all
its async tests on both says so in its own ``conftest.py``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest
import respx.mocks
from hypothesis import settings

from needs import require_or_skip
from servers import PostgresServer, RedisServer

BACKENDS = ("asyncio", "trio")

# respx's default mocker patches httpcore's pool, which a driver's default transport
# bypasses on asyncio (it sends through aiohttp's pool where httpx-aiohttp is
# installed); httpx's mocker answers at the client, whatever its transport. The
# docs (drivers.md, "Testing with respx") tell users the same.
respx.mocks.DEFAULT_MOCKER = "httpx"

# Property tests check what an example does, not how fast: hypothesis's default
# 200 ms deadline per example fails them on a loaded machine (CI's is shared).
settings.register_profile("threadline", deadline=None)
settings.load_profile("threadline")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.hookimpl(tryfirst=True)
def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    # ``both_backends`` runs on each backend every test that takes ``anyio_backend``,
    # directly or through a fixture (an async store, say), as a fixture with
    # ``params=BACKENDS`` in the module would; run first, so that ids name the
    # backend first as that fixture's did (``[asyncio-memory]``).
    marked = metafunc.definition.get_closest_marker("both_backends") is not None
    if marked and "anyio_backend" in metafunc.fixturenames:
        metafunc.parametrize("anyio_backend", BACKENDS)


# --- real PostgreSQL and Redis servers, one of each per session (tests/servers.py) ---------


def _serve(
    kind: type[PostgresServer] | type[RedisServer], package: str, module: str
) -> Iterator[Any]:
    """Start a server of ``kind`` for the session; skip (fail in CI) when it cannot be."""
    found = kind.find()
    if found is None:
        require_or_skip(f"{kind.__name__}: not installed here (apt-get install {package})")
    extra = "postgres" if module == "psycopg" else "redis"
    if importlib.util.find_spec(module) is None:
        require_or_skip(f"{module} is not installed: pip install -e '.[{extra}]'")
    server = kind(found)  # type: ignore[arg-type]
    try:
        server.start()
        yield server
    finally:
        server.remove()


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL cluster of this session's own; skipped (failed in CI) when absent."""
    yield from _serve(PostgresServer, "postgresql", "psycopg")


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A Redis server of this session's own; skipped (failed in CI) when absent."""
    yield from _serve(RedisServer, "redis-server", "redis")
