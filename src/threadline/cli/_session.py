"""``ChatSession``: one conversation being chatted on, for ``--once`` and the prompt loop.

``chat`` (``_chat``) opens it; ``--once`` and the interactive loop
(``_interactive``) answer through it.
"""

from __future__ import annotations

import argparse
from typing import Any

import attrs

from threadline import Conversation, FinalResult, Model, RunResult, TextDelta
from threadline.cli._errors import CliError, describe
from threadline.cli._io import IO
from threadline.cli._schema import validated_json
from threadline.cli._status import check_prompt_fits, check_window, status_line
from threadline.limiting import Budget

__all__ = ["ChatSession", "check_text"]


def check_text(prompt: str) -> None:
    """Refuse a prompt holding bytes the terminal could not decode."""
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError:
        raise CliError(
            "the prompt holds bytes that are not UTF-8 text; check the terminal's encoding"
        ) from None


@attrs.define(kw_only=True)
class ChatSession:
    """One conversation being chatted on, and how to tell the user about it."""

    conversation: Conversation
    model: Model
    url: str | None
    io: IO
    args: argparse.Namespace
    saving: bool
    muted: bool = False
    """Set when Ctrl-C stops an answer: nothing more of it is printed."""
    last_result: RunResult | None = None
    """The last answered turn, whose counts ``/budget`` explains."""
    output_type: Any = None
    """``--schema``'s type: each answer is validated as one and printed as its JSON."""

    def where(self) -> str:
        return f"{self.model.name} at {self.url}" if self.url else f"{self.model.name} (local)"

    def hint(self) -> str:
        """How to come back to this conversation."""
        if not self.saving:
            return "(nothing was saved: --no-save)"
        conversation_id = self.conversation.id
        db = f" --db {self.args.db}" if getattr(self.args, "db", None) else ""
        return (
            f"(conversation {conversation_id}: continue it with "
            f"`threadline chat --conversation {conversation_id}{db}`)"
        )

    def window(self) -> Budget | None:
        return check_window(self.conversation)

    async def turn(self, prompt: str) -> RunResult | None:
        """Stream one answer to stdout; ``None`` when it was stopped.

        Raises:
            CliError: the prompt alone does not fit the window.
        """
        check_text(prompt)
        check_prompt_fits(self.conversation, prompt, self.window())
        self.muted = False
        result: RunResult | None = None
        out = self.io.stdout
        structured = self.output_type is not None
        async with self.conversation.stream(prompt, output_type=self.output_type) as events:
            async for event in events:
                # A structured answer is printed once validated, not as it streams.
                if isinstance(event, TextDelta) and not structured:
                    if not self.muted:
                        out.write(event.text)
                        out.flush()
                elif isinstance(event, FinalResult):
                    result = event.result
        if structured and result is not None:
            out.write(validated_json(result.output))
            out.flush()
        return result

    def status(self, result: RunResult) -> str:
        return status_line(result, self.conversation, model=self.model, url=self.url)

    def describe(self, error: BaseException) -> str:
        return describe(error, url=self.url)
