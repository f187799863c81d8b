"""``threadline count FILE``: the tokens of a saved conversation or message list."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from threadline import ConversationFormatError, Message
from threadline._models import catalog_context_size
from threadline.cli._errors import CliError
from threadline.cli._io import IO
from threadline.counting import BuiltinTokenCounter
from threadline.limiting._budget import DEFAULT_OUTPUT_RESERVE_TOKENS
from threadline.serialization import loads_messages

__all__ = ["count"]

_WHAT_COUNTS = "a saved conversation (/save, conversations export) or a JSON message list"


def _read(path: Path) -> bytes:
    if path.is_dir():
        raise CliError(f"{path} is a directory; count takes {_WHAT_COUNTS}")
    data = path.read_bytes()
    if not data.strip():
        raise CliError(f"{path} is empty; count takes {_WHAT_COUNTS}")
    return data


def _messages(path: Path) -> list[Message]:
    data = _read(path)
    try:
        json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise CliError(f"{path} is not UTF-8 text; count takes {_WHAT_COUNTS}") from None
    except ValueError as exc:
        raise CliError(f"{path} is not valid JSON ({exc}); count takes {_WHAT_COUNTS}") from None
    try:
        return loads_messages(data)
    except ConversationFormatError as exc:
        where = "" if exc.path in ("", "$") else f" at {exc.path}"
        raise CliError(
            f"{path} is JSON but neither a saved conversation nor a message list "
            f"({exc.reason}{where})"
        ) from None


def _context(args: argparse.Namespace) -> tuple[int | None, str]:
    if args.context_size:
        return args.context_size, "given"
    if not args.model:
        return None, ""
    window = catalog_context_size(args.model)
    if window is None:
        raise CliError(
            f"the model {args.model!r} is unknown to the model catalog; give its window "
            "with --context-size N"
        )
    return window, args.model


def count(args: argparse.Namespace, io: IO) -> int:
    """Print each message's tokens, the total and the context it needs."""
    path = Path(args.file)
    context, source = _context(args)
    messages = _messages(path)
    counter = BuiltinTokenCounter()
    for index, message in enumerate(messages):
        tokens = counter.message_tokens(message)
        preview = message.text.replace("\n", " ")[:60]
        io.stdout.write(f"{index:>5}  {message.role.value:<9} {tokens:>7}  {preview}\n")
    total = counter.count(messages, ())
    reserve = DEFAULT_OUTPUT_RESERVE_TOKENS if args.reserve is None else args.reserve
    io.stdout.write(f"total: {total} tokens in {len(messages)} message(s)\n")
    io.stdout.write(
        f"needs a context of at least {total + reserve} tokens with a {reserve}-token reserve\n"
    )
    if context:
        verdict = "fits" if total + reserve <= context else "does not fit"
        io.stdout.write(f"{verdict} a {context}-token context ({source})\n")
    return 0
