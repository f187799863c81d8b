"""The ``threadline`` command: chat, manage stored conversations, count tokens.

``threadline chat`` holds a conversation persisted in the SQLite store,
streaming each answer and printing a status line after every turn (tokens
sent / prompt budget / reserve, and the units limiting dropped). With no
provider configured it runs the small local model of ``threadline[local]``.

Every failure a user can cause or meet (an unreachable server, a bad key, an
unknown conversation, a corrupt file) ends as one line on stderr and a
non-zero exit, never a traceback.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO

import anyio

from threadline._agent import Agent
from threadline._client import Client
from threadline._conversation import Conversation
from threadline._errors import (
    AuthenticationError,
    ConcurrentModificationError,
    ConversationNotFoundError,
    ProviderUnavailableError,
    ThreadlineError,
)
from threadline._events import FinalResult, TextDelta
from threadline._messages import Message
from threadline._models import Model
from threadline._provider import Driver
from threadline._result import RunResult
from threadline.counting import BuiltinTokenCounter
from threadline.serialization._converter import loads_messages
from threadline.stores.sqlite import SQLiteStore

__all__ = ["main"]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2

LOCAL_MODEL_NAME = "SmolLM2-135M-Instruct"
LOCAL_CONTEXT = 2048
LOCAL_MAX_OUTPUT = 256
DEFAULT_OPENAI_MODEL = "gpt-4o-mini"
DEFAULT_RESERVE = 4096

# Context windows of a few well-known models, so a budget resolves without flags.
KNOWN_CONTEXT_SIZES = {
    "gpt-4o": 128_000,
    "gpt-4o-mini": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-4.1-mini": 1_047_576,
    "gpt-4.1-nano": 1_047_576,
    "o3-mini": 200_000,
    "o4-mini": 200_000,
}

DriverFactory = Callable[["argparse.Namespace"], tuple[Driver, Model, int | None]]
"""Builds the driver, the model and the reply cap for ``chat`` from its arguments."""


class CliError(Exception):
    """A failure the command reports as one line on stderr."""


USER_FACING_ERRORS = (CliError, ThreadlineError, OSError, ValueError)
"""What ends as one line on stderr, never a traceback."""


# -- where things live ---------------------------------------------------------------------


def default_db_path() -> Path:
    """The SQLite file ``chat`` and ``conversations`` use unless ``--db`` or
    ``THREADLINE_DB`` says otherwise: under the user's data directory."""
    override = os.environ.get("THREADLINE_DB")
    if override:
        return Path(override)
    if sys.platform == "win32":
        base = Path(os.environ.get("APPDATA") or Path.home() / "AppData" / "Roaming")
    elif sys.platform == "darwin":
        base = Path.home() / "Library" / "Application Support"
    else:
        base = Path(os.environ.get("XDG_DATA_HOME") or Path.home() / ".local" / "share")
    return base / "threadline" / "conversations.sqlite3"


# -- providers -----------------------------------------------------------------------------


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


def build_driver(args: argparse.Namespace) -> tuple[Driver, Model, int | None]:
    """The driver, model and reply cap ``chat`` uses, as :func:`choose_provider` decides."""
    provider = choose_provider(args)
    explicit = args.provider or os.environ.get("THREADLINE_PROVIDER", "").strip()
    if provider == "anthropic" or (
        provider == "local" and not explicit and os.environ.get("ANTHROPIC_API_KEY")
    ):
        from threadline.drivers.anthropic import AnthropicDriver

        # Claude models share a 200,000-token window.
        name = args.model or os.environ.get("THREADLINE_MODEL") or "claude-sonnet-4-5"
        model = Model(name, context_size=KNOWN_CONTEXT_SIZES.get(name, 200_000))
        return AnthropicDriver(base_url=args.base_url), model, args.max_output_tokens
    if provider == "local":
        try:
            from threadline.drivers.local import LocalDriver
        except ImportError as exc:
            raise CliError(str(exc)) from None
        context = args.max_context_tokens or LOCAL_CONTEXT
        driver: Driver = LocalDriver(n_ctx=context)
        max_output = args.max_output_tokens or LOCAL_MAX_OUTPUT
        return driver, Model(LOCAL_MODEL_NAME, context_size=context), max_output
    from threadline.drivers.openai_chat import OpenAIChatDriver

    base_url = (
        args.base_url
        or os.environ.get("THREADLINE_BASE_URL")
        or os.environ.get("OPENAI_BASE_URL")
        or "https://api.openai.com/v1"
    )
    name = args.model or os.environ.get("THREADLINE_MODEL") or DEFAULT_OPENAI_MODEL
    model = Model(name, context_size=KNOWN_CONTEXT_SIZES.get(name))
    return OpenAIChatDriver(base_url=base_url), model, args.max_output_tokens


# -- chat ----------------------------------------------------------------------------------


def status_line(result: RunResult, conversation: Conversation) -> str:
    """After a turn: tokens sent / prompt budget / reserve, and what limiting dropped."""
    last = result.rounds[-1]
    dropped = sum(len(record.dropped) for record in result.limiting)
    reported = (
        f" (provider: {last.reported_input_tokens})"
        if last.reported_input_tokens is not None
        else ""
    )
    if result.budget is None:
        budget = "no budget"
    else:
        budget = (
            f"{last.estimated_input_tokens}{reported} / {result.budget.prompt_tokens} budget / "
            f"{result.budget.reserve} reserve"
        )
    turns = conversation.turn_count()
    return f"[{budget} · dropped {dropped} unit(s) · {turns} turn(s)]"


def check_text(prompt: str) -> None:
    """Refuse a prompt holding bytes the terminal could not decode."""
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError:
        raise CliError(
            "the prompt holds bytes that are not UTF-8 text; check the terminal's encoding"
        ) from None


async def stream_turn(conversation: Conversation, prompt: str, out: TextIO) -> RunResult | None:
    """Stream one turn's answer to ``out``; ``None`` when it was cancelled."""
    result: RunResult | None = None
    async with conversation.stream(prompt) as events:
        async for event in events:
            if isinstance(event, TextDelta):
                out.write(event.text)
                out.flush()
            elif isinstance(event, FinalResult):
                result = event.result
    return result


async def open_conversation(
    args: argparse.Namespace, agent: Agent, store: SQLiteStore
) -> Conversation:
    """The conversation ``--conversation`` names (created when new), or a new one."""
    settings: dict[str, Any] = {}
    if args.max_context_tokens:
        settings["max_context_tokens"] = args.max_context_tokens
    if args.history_limit:
        settings["history_limit"] = args.history_limit
    if args.conversation:
        try:
            conversation = await Conversation.load(agent, store, args.conversation)
        except ConversationNotFoundError:
            return Conversation(agent, id=args.conversation, store=store, **settings)
        if args.max_context_tokens:
            conversation.max_context_tokens = args.max_context_tokens
        if args.history_limit:
            conversation.history_limit = args.history_limit
        return conversation
    return Conversation(agent, store=store, **settings)


async def chat(args: argparse.Namespace, io: _IO, factory: DriverFactory) -> int:
    driver, model, max_output = factory(args)
    store = SQLiteStore(args.db or default_db_path())
    async with Client(driver, default_model=model) as client, store:
        agent = Agent(
            client,
            model=model,
            instructions=args.system,
            max_output_tokens=max_output,
        )
        conversation = await open_conversation(args, agent, store)
        if args.once is not None:
            prompt = io.stdin.read() if args.once == "-" else args.once
            if not prompt.strip():
                raise CliError("--once needs a prompt (or text on standard input with --once -)")
            check_text(prompt)
            result = await stream_turn(conversation, prompt, io.stdout)
            io.stdout.write("\n")
            io.stdout.flush()
            if result is not None:
                io.stderr.write(status_line(result, conversation) + "\n")
            io.stderr.write(
                f"(conversation {conversation.id}: continue it with "
                f"`threadline chat --conversation {conversation.id}`)\n"
            )
            return EXIT_OK
        return await interactive(conversation, io)


async def interactive(conversation: Conversation, io: _IO) -> int:
    io.stderr.write(
        f"threadline chat · conversation {conversation.id} · "
        f"{conversation.turn_count()} earlier turn(s)\n"
        "Ctrl-C stops an answer, Ctrl-D or /exit quits; /reset /history /budget /save FILE\n"
    )
    answering: list[anyio.CancelScope] = []

    async with anyio.create_task_group() as group:

        async def watch_interrupts() -> None:
            with anyio.open_signal_receiver(signal.SIGINT) as signals:
                async for _ in signals:
                    if answering:
                        answering[-1].cancel()
                    else:
                        io.stderr.write("\n(Ctrl-D or /exit quits)\nyou> ")
                        io.stderr.flush()

        if io.handle_signals:
            group.start_soon(watch_interrupts)
        try:
            while True:
                line = await anyio.to_thread.run_sync(io.read_line, "you> ", abandon_on_cancel=True)
                if not line:
                    io.stderr.write("\n")
                    return EXIT_OK
                prompt = line.strip()
                if not prompt:
                    continue
                try:
                    check_text(prompt)
                except CliError as error:
                    io.stderr.write(f"threadline: error: {error}\n")
                    continue
                if prompt.startswith("/"):
                    try:
                        if await slash_command(prompt, conversation, io):
                            return EXIT_OK
                    except USER_FACING_ERRORS as error:
                        io.stderr.write(f"threadline: error: {describe(error)}\n")
                    continue
                result = None
                with anyio.CancelScope() as scope:
                    answering.append(scope)
                    try:
                        result = await stream_turn(conversation, prompt, io.stdout)
                    except USER_FACING_ERRORS as error:
                        # The turn failed and changed nothing; the chat goes on.
                        io.stdout.write("\n")
                        io.stderr.write(f"threadline: error: {describe(error)}\n")
                        continue
                    finally:
                        answering.pop()
                io.stdout.write("\n")
                io.stdout.flush()
                if scope.cancelled_caught:
                    io.stderr.write("(answer cancelled; the turn was not saved)\n")
                elif result is not None:
                    io.stderr.write(status_line(result, conversation) + "\n")
        finally:
            group.cancel_scope.cancel()
    return EXIT_OK  # pragma: no cover - the loop returns from inside the task group


async def slash_command(command: str, conversation: Conversation, io: _IO) -> bool:
    """Run a slash command; ``True`` when the chat should end."""
    name, _, argument = command.partition(" ")
    argument = argument.strip()
    if name in ("/exit", "/quit"):
        return True
    if name == "/reset":
        await conversation.reset()
        io.stderr.write("(conversation cleared)\n")
    elif name == "/history":
        for message in conversation.events:
            io.stdout.write(format_message(message.message) + "\n")
        if not conversation.events:
            io.stderr.write("(no turns yet)\n")
    elif name == "/budget":
        estimate = conversation.token_estimate()
        available = conversation.available_context_tokens()
        left = "no budget" if available is None else f"{available} tokens left"
        io.stderr.write(f"(history and instructions: {estimate} tokens; {left})\n")
    elif name == "/save":
        if not argument:
            io.stderr.write("(usage: /save FILE)\n")
        else:
            await anyio.Path(argument).write_text(conversation.to_json(indent=2), encoding="utf-8")
            io.stderr.write(f"(saved to {argument})\n")
    else:
        io.stderr.write(f"(unknown command {name}; try /reset /history /budget /save /exit)\n")
    return False


def format_message(message: Message) -> str:
    text = message.text
    if message.tool_calls:
        calls = ", ".join(f"{c.name}({c.arguments})" for c in message.tool_calls)
        text = f"{text} [calls {calls}]".strip()
    return f"{message.role.value}> {text}"


# -- conversations -------------------------------------------------------------------------


async def conversations(args: argparse.Namespace, io: _IO) -> int:
    async with SQLiteStore(args.db or default_db_path()) as store:
        if args.action == "list":
            listing = await store.list()
            if not listing:
                io.stderr.write("no conversations\n")
            for info in listing:
                updated = info.updated_at.isoformat(timespec="seconds") if info.updated_at else "-"
                io.stdout.write(f"{info.id}\t{info.events} message(s)\tupdated {updated}\n")
        elif args.action == "show":
            document = (await store.load(args.id)).document
            for event in document.events:
                pending = " (pending)" if event.pending else ""
                io.stdout.write(format_message(event.message) + pending + "\n")
        elif args.action == "export":
            document = (await store.load(args.id)).document
            text = export_text(document, args.format)
            if args.output:
                await anyio.Path(args.output).write_text(text, encoding="utf-8")
            else:
                io.stdout.write(text)
        elif args.action == "import":
            from threadline.serialization._converter import loads_conversation

            document = loads_conversation(await anyio.Path(args.file).read_bytes())
            try:
                await store.save(document, expected_version=0)
            except ConcurrentModificationError:
                raise CliError(
                    f"a conversation {document.id!r} already exists; delete it first "
                    "or import into another --db"
                ) from None
            io.stderr.write(f"imported conversation {document.id}\n")
        elif args.action == "delete":
            if not await store.delete(args.id):
                raise ConversationNotFoundError(args.id)
            io.stderr.write(f"deleted conversation {args.id}\n")
    return EXIT_OK


def export_text(document: Any, form: str) -> str:
    from threadline.serialization._converter import dumps_conversation

    if form == "json":
        return dumps_conversation(document, indent=2) + "\n"
    lines = [f"# Conversation {document.id}", ""]
    for event in document.events:
        message = event.message
        lines += [f"**{message.role.value}**" + (" (pending)" if event.pending else ""), ""]
        if message.text:
            lines += [message.text, ""]
        for call in message.tool_calls:
            lines += [f"- calls `{call.name}` with `{call.arguments}`", ""]
    return "\n".join(lines)


# -- count ---------------------------------------------------------------------------------


def count(args: argparse.Namespace, io: _IO) -> int:
    messages = loads_messages(Path(args.file).read_bytes())
    counter = BuiltinTokenCounter()
    for index, message in enumerate(messages):
        tokens = counter.message_tokens(message)
        preview = message.text.replace("\n", " ")[:60]
        io.stdout.write(f"{index:>5}  {message.role.value:<9} {tokens:>7}  {preview}\n")
    total = counter.count(messages, ())
    reserve = DEFAULT_RESERVE if args.reserve is None else args.reserve
    io.stdout.write(f"total: {total} tokens in {len(messages)} message(s)\n")
    io.stdout.write(
        f"needs a context of at least {total + reserve} tokens with a {reserve}-token reserve\n"
    )
    context = args.context_size or KNOWN_CONTEXT_SIZES.get(args.model or "")
    if context:
        verdict = "fits" if total + reserve <= context else "does not fit"
        io.stdout.write(f"{verdict} a {context}-token context ({args.model or 'given'})\n")
    return EXIT_OK


# -- the command ---------------------------------------------------------------------------


class _IO:
    def __init__(
        self, stdin: TextIO, stdout: TextIO, stderr: TextIO, *, handle_signals: bool
    ) -> None:
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self.handle_signals = handle_signals
        """True in a real terminal: Ctrl-C is caught, lines are read with editing."""

    def read_line(self, prompt: str) -> str:
        """One line of input with its newline; ``""`` at the end of input (Ctrl-D)."""
        if self.handle_signals:
            # A terminal: input() brings line editing and history (readline).
            try:
                return input(prompt) + "\n"
            except EOFError:
                return ""
        self.stderr.write(prompt)
        self.stderr.flush()
        return self.stdin.readline()


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


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(
        prog="threadline", description="Conversations with LLMs that never overflow the window."
    )
    commands = top.add_subparsers(dest="command", required=True)

    chat_parser = commands.add_parser("chat", help="chat on a persisted conversation")
    chat_parser.add_argument("--conversation", metavar="ID", help="continue (or create) ID")
    chat_parser.add_argument("--model", help="the model name (OpenAI-compatible providers)")
    where = chat_parser.add_mutually_exclusive_group()
    where.add_argument("--base-url", help="an OpenAI-compatible server's /v1 URL")
    where.add_argument("--provider", choices=("openai", "anthropic", "local"))
    chat_parser.add_argument("--max-context-tokens", type=_positive, metavar="N")
    chat_parser.add_argument("--max-output-tokens", type=_positive, metavar="N")
    chat_parser.add_argument("--history-limit", type=_not_negative, metavar="N")
    chat_parser.add_argument("--system", help="the system instructions")
    chat_parser.add_argument("--db", type=Path, metavar="PATH", help="the SQLite file")
    chat_parser.add_argument(
        "--once",
        nargs="?",
        const="-",
        metavar="PROMPT",
        help="answer one prompt (or standard input) and exit",
    )

    conv_parser = commands.add_parser("conversations", help="list, show, export, delete")
    conv_parser.add_argument("--db", type=Path, metavar="PATH", help="the SQLite file")
    actions = conv_parser.add_subparsers(dest="action", required=True)
    actions.add_parser("list", help="every stored conversation")
    actions.add_parser("show", help="a conversation's messages").add_argument("id")
    export_parser = actions.add_parser("export", help="a conversation as JSON or Markdown")
    export_parser.add_argument("id")
    export_parser.add_argument("--format", choices=("json", "markdown"), default="json")
    export_parser.add_argument("--output", "-o", metavar="FILE")
    actions.add_parser("import", help="store a conversation exported as JSON").add_argument("file")
    actions.add_parser("delete", help="delete a conversation").add_argument("id")

    count_parser = commands.add_parser("count", help="count a saved conversation's tokens")
    count_parser.add_argument("file", help="a saved conversation or a JSON message list")
    count_parser.add_argument("--model", help="a model whose context size is known")
    count_parser.add_argument("--context-size", type=_positive, metavar="N")
    count_parser.add_argument("--reserve", type=_not_negative, metavar="N")
    return top


def describe(error: BaseException) -> str:
    """One line for an error a user meets."""
    if isinstance(error, AuthenticationError):
        return f"the provider refused the API key: {error}"
    if isinstance(error, ProviderUnavailableError):
        return f"cannot reach the provider: {error}"
    if isinstance(error, ConversationNotFoundError):
        return str(error)
    if isinstance(error, FileNotFoundError):
        return f"no such file: {error.filename}"
    if isinstance(error, json.JSONDecodeError):
        return f"not valid JSON: {error}"
    if isinstance(error, UnicodeDecodeError):
        return "the file is not UTF-8 text"
    return str(error) or type(error).__name__


def main(
    argv: Sequence[str] | None = None,
    *,
    stdin: TextIO | None = None,
    stdout: TextIO | None = None,
    stderr: TextIO | None = None,
    driver_factory: DriverFactory | None = None,
) -> int:
    """Run the command; returns the exit status.

    ``driver_factory`` replaces provider selection (tests pass a
    ``ScriptedDriver`` through it).
    """
    io = _IO(
        stdin or sys.stdin,
        stdout or sys.stdout,
        stderr or sys.stderr,
        handle_signals=stdin is None and sys.stdin.isatty(),
    )
    if io.handle_signals:
        with contextlib.suppress(ImportError):  # line editing where the platform has it
            import readline  # noqa: F401
    try:
        args = parser().parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    try:
        if args.command == "chat":
            factory = driver_factory or build_driver
            return anyio.run(chat, args, io, factory)
        if args.command == "conversations":
            return anyio.run(conversations, args, io)
        return count(args, io)
    except KeyboardInterrupt:
        io.stderr.write("\n")
        return 130
    except USER_FACING_ERRORS as error:
        io.stderr.write(f"threadline: error: {describe(error)}\n")
        return EXIT_ERROR


def run() -> None:
    """The console script's entry point."""
    sys.exit(main())
