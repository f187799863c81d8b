"""``threadline conversations [list|show|export|import|delete]`` (no action lists).

``list``, ``show`` and ``export`` only read: they open the database read-only,
so they never create one and work where the file cannot be written. "Updated"
is the conversation's own time of its last turn (a failed turn leaves it as
it was), not the store's time of its last write.
"""

from __future__ import annotations

import argparse
from datetime import datetime

import anyio

from threadline import ConcurrentModificationError, ConversationNotFoundError, Message
from threadline._store import ConversationStore
from threadline.cli._errors import CliError
from threadline.cli._io import IO
from threadline.cli._setup import db_path, open_store
from threadline.serialization import (
    ConversationDocument,
    dumps_conversation,
    loads_conversation,
)

__all__ = ["conversations", "export_text", "format_message", "latest_conversation", "listing"]

_READ_ONLY = ("list", "show", "export")


def _updated(document: ConversationDocument) -> datetime | None:
    return document.updated_at or document.created_at


async def listing(store: ConversationStore) -> list[tuple[ConversationDocument, int]]:
    """Every conversation and its message count, the most recently updated first."""
    found: list[tuple[ConversationDocument, int]] = []
    for info in await store.list():
        try:
            document = (await store.load(info.id)).document
        except ConversationNotFoundError:
            continue  # deleted by someone else since the listing
        found.append((document, info.events))

    def when(item: tuple[ConversationDocument, int]) -> float:
        moment = _updated(item[0])
        return moment.timestamp() if moment is not None else float("-inf")

    return sorted(found, key=when, reverse=True)


async def latest_conversation(store: ConversationStore) -> str | None:
    """The id of the most recently updated conversation, ``None`` when there is none."""
    found = await listing(store)
    return found[0][0].id if found else None


def _format_time(moment: datetime | None) -> str:
    return moment.isoformat(timespec="seconds") if moment is not None else "-"


def format_message(message: Message) -> str:
    """One line for ``message``: its role, its text and the tools it calls."""
    text = message.text
    if message.tool_calls:
        calls = ", ".join(f"{c.name}({c.arguments})" for c in message.tool_calls)
        text = f"{text} [calls {calls}]".strip()
    return f"{message.role.value}> {text}"


async def _list(store: ConversationStore, io: IO) -> None:
    found = await listing(store)
    if not found:
        io.note("no conversations")
    for document, events in found:
        noun = "message" if events == 1 else "messages"
        io.stdout.write(
            f"{document.id}\t{events} {noun}\tupdated {_format_time(_updated(document))}\n"
        )


async def _show(store: ConversationStore, args: argparse.Namespace, io: IO) -> None:
    document = (await store.load(args.id)).document
    for event in document.events:
        pending = " (pending)" if event.pending else ""
        io.stdout.write(format_message(event.message) + pending + "\n")


async def _export(store: ConversationStore, args: argparse.Namespace, io: IO) -> None:
    document = (await store.load(args.id)).document
    text = export_text(document, args.format)
    if args.output:
        await anyio.Path(args.output).write_text(text, encoding="utf-8")
    else:
        io.stdout.write(text)


async def _import(store: ConversationStore, args: argparse.Namespace, io: IO) -> None:
    data = await anyio.Path(args.file).read_bytes()
    if not data.lstrip().startswith((b"{", b"[")):
        raise CliError(
            f"{args.file} is not JSON; only conversations exported as JSON import "
            "(conversations export ID, or /save FILE in the chat)"
        )
    document = loads_conversation(data)
    try:
        await store.save(document, expected_version=0)
    except ConcurrentModificationError:
        raise CliError(
            f"a conversation {document.id!r} already exists in {db_path(args)}; delete it "
            "first or import into another --db"
        ) from None
    io.note(f"imported conversation {document.id}")


async def conversations(args: argparse.Namespace, io: IO) -> int:
    """Run one ``conversations`` action; returns the exit status."""
    read_only = args.action in _READ_ONLY
    if args.action == "list" and not db_path(args).exists():
        io.note(f"no conversations (there is no database at {db_path(args)} yet)")
        return 0
    if args.action == "delete" and not db_path(args).exists():
        raise CliError(f"no database at {db_path(args)}, so no conversation {args.id!r}")
    store = open_store(args, read_only=read_only)
    try:
        if args.action == "list":
            await _list(store, io)
        elif args.action == "show":
            await _show(store, args, io)
        elif args.action == "export":
            await _export(store, args, io)
        elif args.action == "import":
            await _import(store, args, io)
        elif args.action == "delete":
            if not await store.delete(args.id):
                raise ConversationNotFoundError(args.id)
            io.note(f"deleted conversation {args.id}")
    finally:
        await store.aclose()
    return 0


def export_text(document: ConversationDocument, form: str) -> str:
    """The conversation as versioned JSON or as Markdown for reading."""
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
