"""The ``threadline`` command's entry point: parse, dispatch, report failures in one line.

``threadline chat`` holds a conversation saved in SQLite, streaming each
answer and printing a status line after every turn; with no provider
configured it runs the small local model of ``threadline[local]``.
``threadline conversations`` manages the saved ones and ``threadline count``
counts a saved file's tokens.

Every failure a user can cause or meet (an unreachable server, a bad key, an
unknown conversation, a corrupt file) ends as one line on stderr and a
non-zero exit, never a traceback. The library's own warnings (on the
``threadline`` loggers) are shown the same way, one line each.
"""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterator, Sequence
from typing import TextIO

import anyio

from threadline.cli._chat import DriverFactory, chat
from threadline.cli._conversations import conversations
from threadline.cli._count import count
from threadline.cli._errors import USER_FACING_ERRORS, describe
from threadline.cli._io import IO
from threadline.cli._options import parser
from threadline.cli._setup import build_driver

__all__ = ["main", "run"]

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


class _OneLine(logging.Handler):
    def __init__(self, stream: TextIO) -> None:
        super().__init__(logging.WARNING)
        self._stream = stream

    def emit(self, record: logging.LogRecord) -> None:
        text = " ".join(record.getMessage().split())
        self._stream.write(f"threadline: warning: {text}\n")
        self._stream.flush()


@contextlib.contextmanager
def _warnings_to(stream: TextIO) -> Iterator[None]:
    """The library's warnings as one line each on ``stream``, while the command runs."""
    logger = logging.getLogger("threadline")
    handler = _OneLine(stream)
    logger.addHandler(handler)
    propagate = logger.propagate
    logger.propagate = False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def _dispatch(argv: Sequence[str] | None, io: IO, factory: DriverFactory | None) -> int:
    try:
        # argparse prints --help, --version and usage errors itself.
        with contextlib.redirect_stdout(io.stdout), contextlib.redirect_stderr(io.stderr):
            args = parser().parse_args(argv)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    if args.command == "chat":
        return anyio.run(chat, args, io, factory or build_driver)
    if args.command == "conversations":
        return anyio.run(conversations, args, io)
    return count(args, io)


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
    io = IO(
        stdin or sys.stdin,
        stdout or sys.stdout,
        stderr or sys.stderr,
        handle_signals=stdin is None and sys.stdin.isatty(),
    )
    if io.handle_signals:
        with contextlib.suppress(ImportError):  # line editing where the platform has it
            import readline  # noqa: F401
    with _warnings_to(io.stderr):
        try:
            return _dispatch(argv, io, driver_factory)
        except KeyboardInterrupt:
            io.stderr.write("\n")
            return EXIT_INTERRUPTED
        except USER_FACING_ERRORS as error:
            io.error(describe(error))
            return EXIT_ERROR


def run() -> None:
    """The console script's entry point."""
    sys.exit(main())
