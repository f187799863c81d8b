"""``threadline chat``: open the conversation, check the window, answer ``--once`` or chat.

Budget flags are saved with the conversation: ``--max-context-tokens`` and
``--reserve`` in the settings the core keeps (``max_context_tokens``,
``output_reserve_tokens``), ``--max-output-tokens`` as ``max_output_tokens``
beside them (a key the core carries through unchanged). A resumed
conversation gets them back unless a flag says otherwise; defaults are never
saved, so they keep following the server.
"""

from __future__ import annotations

import argparse
import contextlib
import shlex
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

import anyio
import attrs

from threadline import (
    Agent,
    Client,
    Conversation,
    ConversationNotFoundError,
    Model,
)
from threadline._provider import Driver
from threadline._store import ConversationStore
from threadline.cli._conversations import latest_conversation
from threadline.cli._errors import USER_FACING_ERRORS, CliError, describe
from threadline.cli._interactive import interactive
from threadline.cli._io import IO
from threadline.cli._options import LOCAL_REPEAT_PENALTY
from threadline.cli._schema import output_type_of
from threadline.cli._session import ChatSession
from threadline.cli._setup import NO_LOCAL_MODEL, db_path, open_store, provider_url
from threadline.counting import TokenCalibration
from threadline.serialization import ConversationDocument
from threadline.tools import MCPServer

__all__ = ["DriverFactory", "chat"]

DriverFactory = Callable[[argparse.Namespace], tuple[Driver, Model, int | None]]
"""Builds the driver, the model and the reply cap for ``chat`` from its arguments."""

# (flag, key in the conversation's saved settings, smallest value)
_SAVED = (
    ("max_context_tokens", "max_context_tokens", 1),
    ("reserve", "output_reserve_tokens", 0),
    ("max_output_tokens", "max_output_tokens", 1),
)
_SYSTEM_KEY = "instructions"
"""Where ``--system`` is saved among a conversation's settings, so a resume keeps it."""


def _saved_value(document: ConversationDocument, key: str, least: int) -> int | None:
    value = document.settings.get(key)
    if isinstance(value, int) and not isinstance(value, bool) and value >= least:
        return value
    return None


def with_saved_settings(
    args: argparse.Namespace, document: ConversationDocument | None
) -> argparse.Namespace:
    """The flags, with what the conversation saved filling the ones not given."""
    effective = argparse.Namespace(**vars(args))
    if document is None:
        return effective
    for flag, key, least in _SAVED:
        if getattr(args, flag) is None:
            setattr(effective, flag, _saved_value(document, key, least))
    if args.history_limit is None:
        effective.history_limit = document.history_limit
    saved_system = document.settings.get(_SYSTEM_KEY)
    if args.system is None and isinstance(saved_system, str):
        effective.system = saved_system
    return effective


async def _stored_document(
    args: argparse.Namespace, store: ConversationStore | None, io: IO
) -> tuple[ConversationDocument | None, int]:
    """The saved conversation ``--conversation`` or ``--continue`` names, and its version."""
    if store is None:
        return None, 0
    if args.resume_last:
        latest = await latest_conversation(store)
        if latest is None:
            io.note(f"(no earlier conversation in {db_path(args)}; starting a new one)")
            return None, 0
        stored = await store.load(latest)
    elif args.conversation:
        try:
            stored = await store.load(args.conversation)
        except ConversationNotFoundError:
            return None, 0
    else:
        return None, 0
    return stored.document, stored.version


def _conversation(
    agent: Agent,
    effective: argparse.Namespace,
    document: ConversationDocument | None,
    *,
    store: ConversationStore | None,
    version: int,
) -> Conversation:
    if document is None:
        document = ConversationDocument(
            id=effective.conversation or uuid.uuid4().hex, created_at=datetime.now(UTC)
        )
        version = 0
    settings: dict[str, Any] = dict(document.settings)
    for flag, key, _ in _SAVED:
        value = getattr(effective, flag)
        if value is not None:
            settings[key] = value
    if effective.system is not None:
        settings[_SYSTEM_KEY] = effective.system
    document = attrs.evolve(document, settings=settings, history_limit=effective.history_limit or 0)
    return Conversation.from_document(agent, document, store=store, version=version)


async def _mcp_servers(
    args: argparse.Namespace, stack: contextlib.AsyncExitStack
) -> list[MCPServer]:
    """Each ``--mcp COMMAND``, started and entered on ``stack``."""
    servers = []
    for command in args.mcp:
        words = shlex.split(command)
        if not words:
            raise CliError("--mcp needs a command, like --mcp 'python server.py'")
        servers.append(await stack.enter_async_context(MCPServer.stdio(words[0], words[1:])))
    return servers


def _agent(
    client: Client,
    driver: Driver,
    model: Model,
    max_output: int | None,
    args: argparse.Namespace,
    tools: Sequence[MCPServer] = (),
) -> Agent:
    penalty = args.repeat_penalty
    if penalty is None and driver.name == "local":
        penalty = LOCAL_REPEAT_PENALTY
    return Agent(
        client,
        model=model,
        instructions=args.system,
        tools=tools,
        max_output_tokens=max_output,
        temperature=args.temperature,
        extra_body={} if penalty is None else {"repeat_penalty": penalty},
    )


async def _load_model(driver: Driver, io: IO) -> None:
    # Every driver may load (most have nothing to); only the local model takes
    # long enough to be worth a note.
    if driver.name == "local":
        io.note("(loading the local model… this takes a few seconds)")
    try:
        await driver.load()
    except ImportError:
        raise CliError(NO_LOCAL_MODEL) from None


async def chat(args: argparse.Namespace, io: IO, factory: DriverFactory) -> int:
    """Run ``threadline chat``; a failure a user can meet ends as one :class:`CliError`."""
    url: str | None = None
    try:
        async with contextlib.AsyncExitStack() as stack:
            output_type = None if args.schema is None else output_type_of(args.schema)
            store: ConversationStore | None = None
            reading = args.no_save and (args.conversation or args.resume_last)
            if not args.no_save or (reading and db_path(args).exists()):
                store = open_store(args, read_only=args.no_save)
                stack.push_async_callback(store.aclose)
            document, version = await _stored_document(args, store, io)
            effective = with_saved_settings(args, document)
            driver, model, max_output = factory(effective)
            url = provider_url(effective) if driver.name != "local" else None
            # Calibrated, so the estimate learns from the server's counts; a saved
            # conversation brings back what it learned.
            client = await stack.enter_async_context(
                Client(driver, default_model=model, calibration=TokenCalibration())
            )
            servers = await _mcp_servers(args, stack)
            agent = _agent(client, driver, model, max_output, effective, servers)
            conversation = _conversation(
                agent,
                effective,
                document,
                store=None if args.no_save else store,
                version=version,
            )
            session = ChatSession(
                conversation=conversation,
                model=model,
                url=url,
                io=io,
                args=args,
                saving=not args.no_save,
                output_type=output_type,
            )
            if session.window() is None:
                io.note(_unknown_window(session))
            await _load_model(driver, io)
            if args.once is not None:
                return await once(session, args.once)
            return await interactive(session)
    except CliError:
        raise
    except USER_FACING_ERRORS as error:
        raise CliError(describe(error, url=url)) from None


def _unknown_window(session: ChatSession) -> str:
    return (
        f"(the window of {session.where()} is unknown: the server does not report it and "
        "the model catalog does not list the name, so nothing is limited; set "
        "--max-context-tokens N to the server's window)"
    )


async def once(session: ChatSession, given: str) -> int:
    """``--once``: answer one prompt, print the status line and the way back, exit."""
    io = session.io
    prompt = await anyio.to_thread.run_sync(io.stdin.read) if given == "-" else given
    if not prompt.strip():
        raise CliError("--once needs a prompt (or text on standard input with --once -)")
    result = await session.turn(prompt)
    io.stdout.write("\n")
    io.stdout.flush()
    if result is not None:
        io.note(session.status(result))
    io.note(session.hint())
    return 0
