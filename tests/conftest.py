"""Shared test configuration.

Async tests use anyio's pytest plugin (``@pytest.mark.anyio``). They run on
asyncio by default; a test that must also prove trio works parametrizes
``anyio_backend`` with ``["asyncio", "trio"]``.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest

from servers import PostgresServer, RedisServer, require_or_skip


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


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
