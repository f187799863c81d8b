"""``ScriptedDriver``: a fake model for tests, yours and ours.

Script the replies, run real requests and conversations against it, and
inspect what each call was sent::

    driver = ScriptedDriver(["Hello!", Message.assistant(tool_calls=[...]), "Done."])
    client = Client(driver, default_model=Model("fake", context_size=8192))
    result = await client.request().with_prompt("hi").run()
    assert driver.calls[0].messages[-1].text == "hi"
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from contextlib import aclosing, asynccontextmanager

import anyio
import anyio.lowlevel

from threadline._errors import ThreadlineError
from threadline._messages import Message, Origin, Role, Usage
from threadline._models import Model
from threadline._provider import (
    Driver,
    ProviderCall,
    ProviderResponse,
    StreamChunk,
    TextChunk,
    chunks_of,
)
from threadline.counting import estimate_message_tokens
from threadline.counting._projection import NO_REPLAY, NoReplay
from threadline.counting._protocol import TokenCounter

__all__ = ["ProviderCall", "ScriptExhaustedError", "ScriptedDriver"]

ScriptedReply = str | Message | BaseException


class ScriptExhaustedError(ThreadlineError):
    """A ``ScriptedDriver`` was called more often than it has replies."""


class ScriptedDriver(Driver):
    """A driver whose replies are scripted by the test.

    Each reply, in order, is a ``str`` (the assistant's text), an assistant
    ``Message`` (possibly with tool calls) or an exception instance to raise.
    ``calls`` records every ``ProviderCall`` it received. Usage is reported
    with the cheap ``4 + ceil(bytes / 4)`` estimate so usage code paths run.

    Raises:
        ScriptExhaustedError: when called after the last reply.
        InvalidRequestError: a scripted ``Message`` that is not an assistant message.
    """

    name = "scripted"

    def __init__(
        self,
        replies: Iterable[ScriptedReply] = (),
        *,
        token_counter: TokenCounter | None = None,
        stream_pieces: int = 3,
    ) -> None:
        self._replies: list[ScriptedReply] = []
        self.calls: list[ProviderCall] = []
        self._counter = token_counter
        self._stream_pieces = max(1, stream_pieces)
        self.add_replies(replies)

    def add_replies(self, replies: Iterable[ScriptedReply]) -> None:
        """Append more replies to the script."""
        for reply in replies:
            if isinstance(reply, Message) and reply.role is not Role.ASSISTANT:
                raise ThreadlineError(
                    f"a scripted reply must be an assistant message, not a {reply.role} message"
                )
            if not isinstance(reply, str | Message | BaseException):
                raise TypeError(
                    f"a scripted reply is a str, an assistant Message or an exception, "
                    f"not {type(reply).__name__}"
                )
            self._replies.append(reply)

    @property
    def remaining(self) -> int:
        """How many scripted replies are left."""
        return len(self._replies)

    def token_counter(self) -> TokenCounter | None:
        return self._counter

    def replay_projection(self, model: Model) -> NoReplay:
        return NO_REPLAY

    async def aclose(self) -> None:
        """Nothing to close; here so ScriptedDriver stands in for a real driver."""

    def _next(self, call: ProviderCall) -> ProviderResponse:
        self.calls.append(call)
        if not self._replies:
            raise ScriptExhaustedError(
                f"ScriptedDriver ran out of replies at call {len(self.calls)}; "
                "script one more reply for it"
            )
        reply = self._replies.pop(0)
        if isinstance(reply, BaseException):
            raise reply
        message = Message.assistant(reply) if isinstance(reply, str) else reply
        message = message.with_origin(Origin.TURN)
        usage = Usage(
            input_tokens=sum(estimate_message_tokens(m) for m in call.messages),
            output_tokens=estimate_message_tokens(message),
        )
        return ProviderResponse(
            message=message,
            finish_reason="tool_calls" if message.tool_calls else "stop",
            usage=usage,
            model=call.model.name,
        )

    async def complete(self, call: ProviderCall) -> ProviderResponse:
        await anyio.lowlevel.checkpoint()
        return self._next(call)

    @asynccontextmanager
    async def stream(self, call: ProviderCall) -> AsyncIterator[AsyncIterator[StreamChunk]]:
        response = self._next(call)
        async with aclosing(self._chunks(response)) as chunks:
            yield chunks

    async def _chunks(self, response: ProviderResponse) -> AsyncGenerator[StreamChunk, None]:
        for chunk in chunks_of(response, text_pieces=self._stream_pieces):
            if isinstance(chunk, TextChunk):
                await anyio.lowlevel.checkpoint()
            yield chunk
