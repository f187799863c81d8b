"""The catalog index: the windows genai-prices gives, read without importing genai-prices."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from genai_prices.data import providers

from threadline import _catalog
from threadline._models import _catalog_entry


@pytest.fixture
def fresh_index(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache directory and no index loaded in this process."""
    monkeypatch.setenv("THREADLINE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(_catalog, "_loaded", None)
    return tmp_path / "cache"


def _genai_window(name: str) -> int | None:
    entry = _catalog_entry(name)
    if entry is None:
        return None
    window = entry.model.context_window
    return window if isinstance(window, int) and window > 0 else None


def _names() -> list[str]:
    names = {model.id for provider in providers for model in provider.models}
    names |= {name.upper() for name in list(names)[:50]}
    # Unknown names, a provider prefix with no model, and compact dated refs.
    names |= {"no-such-model", "claude-unknown-9", "gpt-4o-20240806", "gpt-4o-20241399", ""}
    return sorted(names)


def test_every_model_of_the_installed_catalog_gets_the_window_genai_prices_gives(
    fresh_index: Path,
) -> None:
    names = _names()
    assert len(names) > 500
    differ = [
        (name, ours, theirs)
        for name in names
        if name.strip()
        and (ours := _catalog.context_window(name)) != (theirs := _genai_window(name))
    ]
    assert differ == []


def test_the_index_is_written_once_and_read_by_the_next_process(fresh_index: Path) -> None:
    assert _catalog.context_window("gpt-4o-mini") == 128_000
    [written] = fresh_index.iterdir()
    code = (
        "import sys\nfrom threadline import Model\n"
        "print(Model('gpt-4o-mini').context_size, 'pydantic' in sys.modules, "
        "'genai_prices' in sys.modules)"
    )
    env = {**os.environ, "THREADLINE_CACHE_DIR": str(fresh_index)}
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env
    )
    assert out.stdout.split() == ["128000", "False", "False"]
    assert list(fresh_index.iterdir()) == [written]


def test_a_changed_catalog_file_gets_an_index_of_its_own(
    fresh_index: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    installed = _catalog.index_path()
    original = _catalog._data_file()
    assert installed is not None
    assert original is not None
    edited = tmp_path / "data.py"
    shutil.copyfile(original, edited)
    with edited.open("a", encoding="utf-8") as out:
        out.write("\n# a new release\n")
    monkeypatch.setattr(_catalog, "_data_file", lambda: edited)
    assert _catalog.index_path() not in (None, installed)


def test_a_damaged_index_is_rebuilt(fresh_index: Path) -> None:
    path = _catalog.index_path()
    assert path is not None
    path.parent.mkdir(parents=True)
    path.write_text('[["openai", ["contains"', encoding="utf-8")
    assert _catalog.context_window("gpt-4o-mini") == 128_000
    assert path.read_text(encoding="utf-8").startswith("[[")
    assert len(path.read_text(encoding="utf-8")) > 10_000


def test_a_cache_directory_that_cannot_be_written_still_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory", encoding="utf-8")
    monkeypatch.setenv("THREADLINE_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(_catalog, "_loaded", None)
    assert _catalog.context_window("gpt-4o-mini") == 128_000


def test_without_the_data_file_the_models_window_comes_from_genai_prices(
    fresh_index: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_catalog, "_data_file", lambda: None)
    with pytest.raises(_catalog.IndexUnavailable):
        _catalog.context_window("gpt-4o-mini")
    from threadline import Model

    assert Model("gpt-4o-mini").context_size == 128_000


def test_the_cache_directory_follows_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("THREADLINE_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "/somewhere")
    assert _catalog.cache_dir() == Path("/somewhere/threadline")
