"""The interactive chat: the prompt loop, Ctrl-C and the slash commands.

Ctrl-C while an answer streams stops it: from the moment the signal arrives
nothing more of the answer is printed (a Python-level signal handler sets the
session's ``muted`` flag at once, before the event loop gets round to
cancelling), and the turn is not saved. Ctrl-C at the prompt only says how to
quit; Ctrl-D and ``/exit`` quit with the way back to the conversation.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import anyio

from threadline.cli._conversations import format_message
from threadline.cli._errors import USER_FACING_ERRORS
from threadline.cli._session import ChatSession, check_text
from threadline.cli._status import budget_words

__all__ = ["interactive"]

HELP = """\
/help         these commands
/history      the conversation so far
/budget       what the history takes of the window, and what is left
/reset        forget the turns (the id and the saved settings stay)
/save FILE    write the conversation as JSON (conversations import reads it)
/exit         quit (Ctrl-D too); Ctrl-C stops an answer"""


@contextmanager
def _mute_on_interrupt(session: ChatSession, answering: list[anyio.CancelScope]) -> Iterator[None]:
    """Chain a Python-level SIGINT handler in front of the event loop's own."""
    previous: Any = signal.getsignal(signal.SIGINT)

    def handler(signum: int, frame: FrameType | None) -> None:
        if answering:
            session.muted = True
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGINT, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


async def _watch_interrupts(session: ChatSession, answering: list[anyio.CancelScope]) -> None:
    # The loop's receiver first, so the muting handler is chained in front of it.
    with (
        anyio.open_signal_receiver(signal.SIGINT) as signals,
        _mute_on_interrupt(session, answering),
    ):
        async for _ in signals:
            if answering:
                answering[-1].cancel()
            else:
                session.io.stderr.write("\n(Ctrl-D or /exit quits)\nyou> ")
                session.io.stderr.flush()


async def _answer(session: ChatSession, prompt: str, answering: list[anyio.CancelScope]) -> None:
    io = session.io
    result = None
    with anyio.CancelScope() as scope:
        answering.append(scope)
        try:
            result = await session.turn(prompt)
        except USER_FACING_ERRORS as error:
            # The turn failed and changed nothing; the chat goes on.
            io.stdout.write("\n")
            io.error(session.describe(error))
            return
        finally:
            answering.pop()
    io.stdout.write("\n")
    io.stdout.flush()
    if scope.cancelled_caught:
        io.note("(answer stopped; the turn was not saved)")
    elif result is not None:
        session.last_result = result
        io.note(session.status(result))


def _banner(session: ChatSession) -> str:
    conversation = session.conversation
    window = conversation.max_context_tokens or session.model.context_size
    size = f" · window {window:,}" if window else " · window unknown"
    earlier = conversation.turn_count()
    turns = f"{earlier} earlier turn" + ("" if earlier == 1 else "s")
    return (
        f"threadline chat · {session.where()}{size} · conversation {conversation.id} · {turns}\n"
        "Type /help for commands; Ctrl-C stops an answer, Ctrl-D or /exit quits."
    )


async def interactive(session: ChatSession) -> int:
    """The prompt loop; returns the exit status."""
    io = session.io
    io.note(_banner(session))
    answering: list[anyio.CancelScope] = []
    async with anyio.create_task_group() as group:
        if io.handle_signals:
            group.start_soon(_watch_interrupts, session, answering)
        try:
            while True:
                line = await anyio.to_thread.run_sync(io.read_line, "you> ", abandon_on_cancel=True)
                if not line:
                    io.stderr.write("\n")
                    io.note(session.hint())
                    return 0
                prompt = line.strip()
                if not prompt:
                    continue
                if prompt.startswith("/"):
                    if await _command_reporting_errors(prompt, session):
                        io.note(session.hint())
                        return 0
                    continue
                await _answer(session, prompt, answering)
        finally:
            group.cancel_scope.cancel()
    return 0  # pragma: no cover - the loop returns from inside the task group


async def _command_reporting_errors(command: str, session: ChatSession) -> bool:
    try:
        check_text(command)
        return await slash_command(command, session)
    except USER_FACING_ERRORS as error:
        session.io.error(session.describe(error))
        return False


async def _save(session: ChatSession, argument: str) -> None:
    if not argument:
        session.io.note("(usage: /save FILE)")
        return
    text = session.conversation.to_json(indent=2)
    await anyio.Path(argument).write_text(text, encoding="utf-8")
    session.io.note(f"(saved to {argument})")


async def _reset(session: ChatSession, argument: str) -> None:
    await session.conversation.reset()
    session.io.note("(conversation cleared)")


async def _history(session: ChatSession, argument: str) -> None:
    for event in session.conversation.events:
        session.io.stdout.write(format_message(event.message) + "\n")
    if not session.conversation.events:
        session.io.note("(no turns yet)")


async def _budget(session: ChatSession, argument: str) -> None:
    session.io.note(f"({budget_words(session.conversation, session.last_result)})")


async def _help(session: ChatSession, argument: str) -> None:
    session.io.note(HELP)


_COMMANDS: dict[str, Callable[[ChatSession, str], Any]] = {
    "/help": _help,
    "/history": _history,
    "/budget": _budget,
    "/reset": _reset,
    "/save": _save,
}


async def slash_command(command: str, session: ChatSession) -> bool:
    """Run a slash command; ``True`` when the chat should end."""
    name, _, argument = command.partition(" ")
    if name in ("/exit", "/quit"):
        return True
    run = _COMMANDS.get(name)
    if run is None:
        session.io.note(f"(unknown command {name}; /help lists them)")
        return False
    await run(session, argument.strip())
    return False
