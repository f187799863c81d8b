"""What every test of the command line starts from: no provider chosen by the
environment, and a database path of its own."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def no_provider_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (
        "OPENAI_API_KEY",
        "OPENAI_BASE_URL",
        "ANTHROPIC_API_KEY",
        "THREADLINE_PROVIDER",
        "THREADLINE_DB",
        "THREADLINE_BASE_URL",
        "THREADLINE_MODEL",
    ):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "conversations.sqlite3"
