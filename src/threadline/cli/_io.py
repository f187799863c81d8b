"""The command's standard streams, and reading a line the way a terminal user expects."""

from __future__ import annotations

from typing import TextIO

__all__ = ["IO"]


class IO:
    """Standard input, output and error, and whether they are a real terminal."""

    def __init__(
        self, stdin: TextIO, stdout: TextIO, stderr: TextIO, *, handle_signals: bool
    ) -> None:
        self.stdin = stdin
        self.stdout = stdout
        self.stderr = stderr
        self.handle_signals = handle_signals
        """True in a real terminal: Ctrl-C is caught, lines are read with editing."""

    def note(self, text: str) -> None:
        """A line for the user on stderr (never mixed into an answer on stdout)."""
        self.stderr.write(text + "\n")
        self.stderr.flush()

    def error(self, text: str) -> None:
        self.note(f"threadline: error: {text}")

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
