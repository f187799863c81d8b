"""What an OpenAI-compatible server says about itself: its model and its window.

Servers differ in where they say it. llama.cpp's server gives the window it
allocated per request slot as ``n_ctx`` in ``GET /props``
(``default_generation_settings``) and, in newer builds, in each ``/v1/models``
entry's ``meta``; vLLM gives ``max_model_len``; LM Studio and OpenRouter a
``context_length``. ``meta.n_ctx_train`` is only the window the model was
trained for: a server may allocate far less, so it is never taken as the
window (it is reported, as a hint). A ``meta`` entry or a ``/props`` answer
also says the server is llama.cpp's own, which can count a prompt exactly
(``OpenAIChatDriver(exact_counting="llama.cpp")``). Nothing here is fatal but an unreachable
server or a refused key: a server that says nothing leaves the window unknown.
"""

from __future__ import annotations

import os
from typing import Any

import attrs
import httpx

from threadline.cli._errors import CliError

__all__ = ["ServerFacts", "ask_server"]

_TIMEOUT = httpx.Timeout(10.0, connect=5.0)
# Keys of a /v1/models entry that name the window a request may use.
_WINDOW_KEYS = ("max_model_len", "context_length", "context_window", "max_context_length")


@attrs.frozen(kw_only=True)
class ServerFacts:
    """What the server said: its first model's id, its window and where that came from,
    and whether it is the upstream llama.cpp server (which counts prompts)."""

    model_id: str | None = None
    window: int | None = None
    source: str | None = None
    trained_window: int | None = None
    llama_cpp: bool = False


def _positive_int(value: Any) -> int | None:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    return None


def _get(http: httpx.Client, url: str) -> Any:
    """The JSON body of ``GET url``; ``None`` when the server has no such endpoint."""
    try:
        response = http.get(url)
    except httpx.TimeoutException:
        return None
    except httpx.TransportError as exc:
        detail = str(exc) or type(exc).__name__
        raise CliError(
            f"cannot reach {url} ({type(exc).__name__}: {detail}); is the server running?"
        ) from None
    if response.status_code in (401, 403):
        raise CliError(
            f"{url} refused the API key ($OPENAI_API_KEY): status {response.status_code}"
        )
    if response.status_code != 200:
        return None
    try:
        return response.json()
    except ValueError:
        return None


def _entry_window(entry: dict[str, Any]) -> tuple[int | None, int | None]:
    """The window a /v1/models entry gives, and the trained window, when it says."""
    found = entry.get("meta")
    meta: dict[str, Any] = found if isinstance(found, dict) else {}
    window = _positive_int(meta.get("n_ctx"))
    for key in _WINDOW_KEYS:
        window = window or _positive_int(entry.get(key))
    return window, _positive_int(meta.get("n_ctx_train"))


def _pick(entries: list[Any], model_name: str | None) -> dict[str, Any] | None:
    named = [e for e in entries if isinstance(e, dict) and isinstance(e.get("id"), str)]
    if model_name is not None:
        return next((e for e in named if e["id"] == model_name), None)
    return named[0] if named else None


def _props_window(http: httpx.Client, base_url: str) -> tuple[int | None, bool]:
    """The window ``/props`` gives, and whether it answered as llama.cpp's server does."""
    root = base_url.rstrip("/").removesuffix("/v1")
    props = _get(http, f"{root}/props")
    if not isinstance(props, dict):
        return None, False
    settings = props.get("default_generation_settings")
    if isinstance(settings, dict) and _positive_int(settings.get("n_ctx")):
        return _positive_int(settings.get("n_ctx")), True
    return _positive_int(props.get("n_ctx")), isinstance(settings, dict)


def ask_server(
    base_url: str, model_name: str | None, *, transport: httpx.BaseTransport | None = None
) -> ServerFacts:
    """Ask ``base_url`` (a ``/v1`` URL) for its models and its window.

    Raises:
        CliError: the server cannot be reached, or refuses the API key.
    """
    key = os.environ.get("OPENAI_API_KEY")
    headers = {"authorization": f"Bearer {key}"} if key else {}
    with httpx.Client(timeout=_TIMEOUT, headers=headers, transport=transport) as http:
        listing = _get(http, f"{base_url.rstrip('/')}/models")
        entries = listing.get("data") if isinstance(listing, dict) else None
        entry = _pick(entries, model_name) if isinstance(entries, list) else None
        window, trained = _entry_window(entry) if entry is not None else (None, None)
        model_id = entry["id"] if entry is not None else None
        has_meta = entry is not None and isinstance(entry.get("meta"), dict)
        if window is not None:
            return ServerFacts(
                model_id=model_id,
                window=window,
                source="/v1/models",
                trained_window=trained,
                llama_cpp=has_meta,
            )
        window, answered = _props_window(http, base_url)
    return ServerFacts(
        model_id=model_id,
        window=window,
        source="/props" if window is not None else None,
        trained_window=trained,
        llama_cpp=has_meta or answered,
    )
