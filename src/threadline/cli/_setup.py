"""Choosing what ``chat`` talks to and where conversations are kept.

Two functions other parts of the command build on: :func:`build_driver` (the
driver, the model and the reply cap, from the flags and the environment) and
:func:`open_store` (the conversation store ``--db`` names).
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from threadline import Model
from threadline._models import catalog_context_size
from threadline._provider import Driver
from threadline._store import ConversationStore
from threadline.cli._discovery import ask_server
from threadline.cli._errors import CliError
from threadline.cli._options import (
    DEFAULT_OPENAI_MODEL,
    DEFAULT_OPENAI_URL,
    LOCAL_CONTEXT,
    LOCAL_MAX_OUTPUT,
    LOCAL_MODEL_NAME,
    StoreUrl,
    default_db_path,
)

__all__ = [
    "NO_LOCAL_MODEL",
    "build_driver",
    "choose_provider",
    "db_path",
    "open_store",
    "provider_url",
    "reply_cap",
]

DEFAULT_GEMINI_MODEL = "gemini-2.5-flash"
GEMINI_CONTEXT = 1_048_576
"""The window of a Gemini model the catalog does not list: the 2.5 and 3 families' own."""

SMALL_WINDOW = 16_384
"""Below this, the reply's default room is a quarter of the window, not 4,096 tokens."""

NO_LOCAL_MODEL = (
    "the local model is not installed; either pip install 'threadline[local]' (it compiles "
    "llama.cpp: a C/C++ compiler and cmake, a few minutes), or set OPENAI_API_KEY, or point "
    "--base-url at an OpenAI-compatible server"
)


def choose_provider(args: argparse.Namespace) -> str:
    """``openai`` or ``local``: from the flags, then the environment, then the local model."""
    if args.provider:
        return str(args.provider)
    if args.base_url:
        return "openai"
    chosen = os.environ.get("THREADLINE_PROVIDER", "").strip().lower()
    if chosen:
        if chosen not in ("openai", "local"):
            raise CliError(f"THREADLINE_PROVIDER must be 'openai' or 'local', not {chosen!r}")
        return chosen
    if os.environ.get("OPENAI_API_KEY") or os.environ.get("OPENAI_BASE_URL"):
        return "openai"
    return "local"


def provider_url(args: argparse.Namespace) -> str | None:
    """The ``/v1`` URL ``chat`` talks to; ``None`` for the local model."""
    if choose_provider(args) == "local":
        return None
    url = (
        args.base_url
        or os.environ.get("THREADLINE_BASE_URL")
        or os.environ.get("OPENAI_BASE_URL")
        or DEFAULT_OPENAI_URL
    )
    return str(url).rstrip("/")


def reply_cap(window: int | None) -> int | None:
    """The default cap on an answer: a quarter of a small window, else the provider's own."""
    if window is not None and window < SMALL_WINDOW:
        return max(1, window // 4)
    return None


def build_driver(args: argparse.Namespace) -> tuple[Driver, Model, int | None]:
    """The driver, the model and the reply cap ``chat`` uses, as :func:`choose_provider` decides.

    Raises:
        CliError: the local model is not installed, a server cannot be reached,
            or a flag's value cannot work.
    """
    provider = choose_provider(args)
    explicit = args.provider or os.environ.get("THREADLINE_PROVIDER", "").strip()
    if provider == "anthropic" or (
        provider == "local" and not explicit and os.environ.get("ANTHROPIC_API_KEY")
    ):
        from threadline.drivers.anthropic import AnthropicDriver

        # Claude models share a 200,000-token window.
        name = args.model or os.environ.get("THREADLINE_MODEL") or "claude-sonnet-4-5"
        model = Model(name, context_size=catalog_context_size(name) or 200_000)
        return AnthropicDriver(base_url=args.base_url), model, args.max_output_tokens
    if provider == "gemini":
        return _gemini_driver(args)
    if provider == "local":
        return _local_driver(args)
    return _openai_driver(args, responses=provider == "openai-responses")


def _gemini_driver(args: argparse.Namespace) -> tuple[Driver, Model, int | None]:
    """The Gemini Developer API: the key from GEMINI_API_KEY (else GOOGLE_API_KEY), the
    root from GEMINI_BASE_URL (``--base-url`` names an OpenAI-compatible server)."""
    from threadline.drivers.gemini import GeminiDriver

    name = args.model or os.environ.get("THREADLINE_MODEL") or DEFAULT_GEMINI_MODEL
    model = Model(name, context_size=catalog_context_size(name) or GEMINI_CONTEXT)
    return GeminiDriver(), model, args.max_output_tokens


def _local_driver(args: argparse.Namespace) -> tuple[Driver, Model, int | None]:
    context = args.max_context_tokens or LOCAL_CONTEXT
    if context < 16:
        raise CliError(
            f"--max-context-tokens {context} is too small for the local model (16 or more)"
        )
    try:
        from threadline.drivers.local import LocalDriver

        driver: Driver = LocalDriver(n_ctx=context)
    except ImportError:
        raise CliError(NO_LOCAL_MODEL) from None
    max_output = args.max_output_tokens or LOCAL_MAX_OUTPUT
    return driver, Model(LOCAL_MODEL_NAME, context_size=context), max_output


def _openai_driver(
    args: argparse.Namespace, *, responses: bool = False
) -> tuple[Driver, Model, int | None]:
    """Chat Completions, or with ``responses`` the Responses API, at the chosen URL."""
    from threadline.drivers.openai_chat import OpenAIChatDriver
    from threadline.drivers.openai_responses import OpenAIResponsesDriver

    base_url = provider_url(args)
    assert base_url is not None
    name = args.model or os.environ.get("THREADLINE_MODEL")
    window = None
    llama_cpp = False
    if base_url != DEFAULT_OPENAI_URL:
        facts = ask_server(base_url, name)
        name = name or facts.model_id
        window = facts.window
        llama_cpp = facts.llama_cpp
    name = name or DEFAULT_OPENAI_MODEL
    if window is None:
        window = catalog_context_size(name)
    # The window is given outright, None included, so an unknown one is reported
    # by chat in its own words rather than by the catalog's warning.
    model = Model(name, context_size=window)
    max_output = args.max_output_tokens or reply_cap(args.max_context_tokens or window)
    driver: Driver
    if responses:
        # Its exact counter is the API's own /responses/input_tokens.
        driver = OpenAIResponsesDriver(base_url)
    else:
        # llama.cpp's own server counts a prompt exactly; limiting asks it near the budget.
        driver = OpenAIChatDriver(
            base_url=base_url, exact_counting="llama.cpp" if llama_cpp else None
        )
    return driver, model, max_output


def db_path(args: argparse.Namespace) -> Path | StoreUrl:
    """The database ``--db`` names, else ``THREADLINE_DB``, else the default file."""
    given: Path | StoreUrl | None = getattr(args, "db", None)
    return given or default_db_path()


def open_store(args: argparse.Namespace, *, read_only: bool = False) -> ConversationStore:
    """The store ``--db`` names. ``read_only`` never creates a file and never writes.

    Raises:
        CliError: a read-only command named a database that does not exist.
    """
    from threadline.stores.sqlite import SQLiteStore

    path = db_path(args)
    if isinstance(path, StoreUrl):  # postgresql://… or redis://…
        from threadline.stores import open_store as open_url

        return open_url(path.url)
    if read_only and not path.exists():
        raise CliError(
            f"no database at {path} (nothing saved there yet; --db or THREADLINE_DB name another)"
        )
    return SQLiteStore(path, read_only=read_only)
