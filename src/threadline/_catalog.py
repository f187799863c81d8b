"""The context windows of genai-prices' catalog, looked up without building its pydantic models.

genai-prices ships its catalog as Python source (``genai_prices/data.py``)
that builds pydantic dataclasses: importing it costs ~300 ms and ~200
modules, which every process paid on its first ``Model(name)``. Only the
name matching and the windows are needed for that, so they are written once
to a compact JSON index beside the user's other caches, keyed on the size
and modification time of the installed ``data.py``: a new genai-prices release (or
an edited file) gets a new index, built from genai-prices itself, which
stays the only source of truth. Later processes read the index (a few
milliseconds) and match names the way genai-prices does (a test checks
every model of the installed catalog gives the same window both ways).

When the cache directory cannot be written the index is kept in the process
only; when the installed genai-prices is laid out differently from the one
this was written against, :func:`context_window` raises
:class:`IndexUnavailable` and the caller asks genai-prices directly.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import threading
from importlib.util import find_spec
from pathlib import Path
from typing import Any

__all__ = ["IndexUnavailable", "cache_dir", "context_window", "index_path"]

_FORMAT = 1  # bump when the index's layout changes
_lock = threading.Lock()
_loaded: list[Any] | None = None
_COMPACT_DATE = re.compile(r"(-)(20\d{2})(0[1-9]|1[0-2])(0[1-9]|[12]\d|3[01])(?=-|:|$)")


def cache_dir() -> Path:
    """Where the index is kept: ``$THREADLINE_CACHE_DIR``, else the user's cache directory."""
    explicit = os.environ.get("THREADLINE_CACHE_DIR")
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or os.environ.get("LOCALAPPDATA")
    return (Path(base) if base else Path.home() / ".cache") / "threadline"


def _data_file() -> Path | None:
    # find_spec on a top-level package locates it without importing it.
    spec = find_spec("genai_prices")
    if spec is None or not spec.submodule_search_locations:
        return None
    data = Path(next(iter(spec.submodule_search_locations))) / "data.py"
    return data if data.is_file() else None


def index_path() -> Path | None:
    """The index file for the installed catalog (``None`` when genai-prices' data is not found)."""
    data = _data_file()
    if data is None:
        return None
    # Its size and modification time, not a checksum: reading 1.6 MB on every
    # start would cost more than the rest of the lookup. A new release or an
    # edit changes the time (pip writes each file it installs anew).
    stat = data.stat()
    return cache_dir() / f"genai-prices-{_FORMAT}-{stat.st_size}-{stat.st_mtime_ns}.json"


def _clause(clause: Any) -> Any:
    """A genai-prices match clause as ``[kind, value]``; plain strings lowered, as it compares."""
    import dataclasses

    field = dataclasses.fields(clause)[0].name
    value = getattr(clause, field)
    kind = field.rstrip("_")
    if kind in ("or", "and"):
        return [kind, [_clause(inner) for inner in value]]
    return [kind, value if kind == "regex" else value.lower()]


def _build() -> list[Any]:
    from genai_prices.data import providers

    return [
        [
            provider.id,
            None if provider.model_match is None else _clause(provider.model_match),
            list(provider.fallback_model_providers or ()),
            [[_clause(model.match), model.context_window] for model in provider.models],
        ]
        for provider in providers
    ]


def _write(path: Path, index: list[Any]) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            json.dump(index, out, separators=(",", ":"))
        os.replace(temporary, path)  # atomic: a reader sees the old file or the whole new one
    except OSError:
        pass  # a read-only home: the index lives in this process only


def _index() -> list[Any] | None:
    global _loaded
    with _lock:
        if _loaded is not None:
            return _loaded
        path = index_path()
        if path is None:
            return None
        try:
            _loaded = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            try:
                _loaded = _build()
            except (ImportError, AttributeError, TypeError, IndexError):
                return None  # a genai-prices laid out differently: the caller asks it directly
            _write(path, _loaded)
        return _loaded


def _matches(clause: list[Any], text: str) -> bool:
    kind, value = clause
    if kind == "starts_with":
        return text.startswith(value)
    if kind == "ends_with":
        return text.endswith(value)
    if kind == "contains":
        return value in text
    if kind == "equals":
        return bool(text == value)
    if kind == "regex":
        return re.search(value, text) is not None
    if kind == "or":
        return any(_matches(inner, text) for inner in value)
    if kind == "and":
        return all(_matches(inner, text) for inner in value)
    raise ValueError(f"unknown catalog clause {kind!r}")


def _model(provider: list[Any], ref: str, providers: list[Any] | None) -> list[Any] | None:
    for model in provider[3]:
        if _matches(model[0], ref):
            return model  # type: ignore[no-any-return]
    for fallback_id in provider[2] if providers else ():
        fallback = next((p for p in providers or () if p[0] == fallback_id), None)
        # One step of fallback only, as genai-prices does.
        if fallback is not None and (model := _model(fallback, ref, None)) is not None:
            return model
    return None


def _dashed_dates(ref: str) -> str:
    # A compact date suffix (gpt-5.2-20251211) retried in the dashed form the data uses.
    def dashed(match: re.Match[str]) -> str:
        import datetime

        year, month, day = (int(match.group(i)) for i in range(2, 5))
        try:
            datetime.date(year, month, day)
        except ValueError:
            return match.group(0)
        return f"-{year:04d}-{month:02d}-{day:02d}"

    return _COMPACT_DATE.sub(dashed, ref)


class IndexUnavailable(Exception):
    """The index cannot be had (genai-prices' data not found, or laid out differently)."""


def context_window(name: str) -> int | None:
    """The catalog's window for ``name`` (``None`` when unknown or it has none).

    Raises:
        IndexUnavailable: ask genai-prices itself.
    """
    providers = _index()
    if providers is None:
        raise IndexUnavailable(name)
    ref = name.lower()
    provider = next((p for p in providers if p[1] is not None and _matches(p[1], ref)), None)
    if provider is None:
        return None
    model = _model(provider, ref, providers)
    if model is None and (dashed := _dashed_dates(ref)) != ref:
        model = _model(provider, dashed, providers)
    if model is None:
        return None
    window = model[1]
    return window if isinstance(window, int) and window > 0 else None
