"""Shared test configuration.

Async tests use anyio's pytest plugin (``@pytest.mark.anyio``). They run on
asyncio by default; a test that must also prove trio works parametrizes
``anyio_backend`` with ``["asyncio", "trio"]``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator

import pytest

from servers import PostgresServer, RedisServer, require_or_skip


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


# --- real PostgreSQL and Redis servers, one of each per session (tests/servers.py) ---------


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """A PostgreSQL cluster of this session's own; skipped (failed in CI) when absent."""
    bindir = PostgresServer.find()
    if bindir is None:
        require_or_skip("PostgreSQL is not installed here (apt-get install postgresql)")
    if importlib.util.find_spec("psycopg") is None:
        require_or_skip("psycopg is not installed: pip install -e '.[postgres]'")
    assert bindir is not None
    server = PostgresServer(bindir)
    try:
        server.init()
        server.start()
        yield server
    finally:
        server.remove()


@pytest.fixture(scope="session")
def redis_server() -> Iterator[RedisServer]:
    """A Redis server of this session's own; skipped (failed in CI) when absent."""
    binary = RedisServer.find()
    if binary is None:
        require_or_skip("Redis is not installed here (apt-get install redis-server)")
    if importlib.util.find_spec("redis") is None:
        require_or_skip("redis-py is not installed: pip install -e '.[redis]'")
    assert binary is not None
    server = RedisServer(binary)
    try:
        server.start()
        yield server
    finally:
        server.remove()
