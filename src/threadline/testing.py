"""Fake models for tests, yours and ours: ``ScriptedDriver`` and ``FunctionDriver``.

Script the replies, run real requests and conversations against it, and
inspect what each call was sent::

    driver = ScriptedDriver(["Hello!", Message.assistant(tool_calls=[...]), "Done."])
    client = Client(driver, default_model=Model("fake", context_size=8192))
    result = await client.request().with_prompt("hi").run()
    assert driver.calls[0].messages[-1].text == "hi"

When the reply depends on what was sent, compute it instead::

    driver = FunctionDriver(lambda call: f"you said {call.messages[-1].text}")
"""

from __future__ import annotations

import inspect
from collections.abc import (
    AsyncGenerator,
    AsyncIterable,
    AsyncIterator,
    Awaitable,
    Callable,
    Generator,
    Iterable,
    Sequence,
)
from contextlib import aclosing, asynccontextmanager
from itertools import chain, compress, count
from operator import is_not
from typing import TypeAlias, TypeVar, overload

import anyio
import anyio.lowlevel
import attrs

from threadline._errors import ThreadlineError
from threadline._messages import Message, Origin, Reasoning, Role, ToolCall, Usage
from threadline._models import Model
from threadline._provider import (
    Driver,
    ProviderCall,
    ProviderResponse,
    ReasoningChunk,
    ResponseDone,
    StreamChunk,
    TextChunk,
    ToolCallChunk,
    chunks_of,
)
from threadline.counting import estimate_message_tokens
from threadline.counting._projection import NO_REPLAY, NoReplay
from threadline.counting._protocol import TokenCounter

__all__ = ["CallLog", "FunctionDriver", "ProviderCall", "ScriptExhaustedError", "ScriptedDriver"]

ScriptedReply = str | Message | BaseException


class ScriptExhaustedError(ThreadlineError):
    """A ``ScriptedDriver`` was called more often than it has replies."""


class ScriptedDriver(Driver):
    """A driver whose replies are scripted by the test.

    Each reply, in order, is a ``str`` (the assistant's text), an assistant
    ``Message`` (possibly with tool calls) or an exception instance to raise.
    ``calls`` records every ``ProviderCall`` it received (a :class:`CallLog`).
    Usage is reported with the cheap ``4 + ceil(bytes / 4)`` estimate so
    usage code paths run; each message is priced once, so a long
    conversation's calls stay as cheap as its first ones (a history cut or
    edited between calls is repriced from the first message that changed).

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
        self.calls = CallLog()
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
        input_tokens = self.calls.record(call)
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
        usage = Usage(input_tokens=input_tokens, output_tokens=estimate_message_tokens(message))
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


FunctionReply: TypeAlias = str | Message | ProviderResponse
StreamDelta: TypeAlias = str | TextChunk | ReasoningChunk | ToolCallChunk | ResponseDone
ReplyFunction: TypeAlias = Callable[[ProviderCall], FunctionReply | Awaitable[FunctionReply]]
StreamFunction: TypeAlias = Callable[
    [ProviderCall], AsyncIterable[StreamDelta] | Iterable[StreamDelta]
]
_T = TypeVar("_T")


class FunctionDriver(Driver):
    """A driver whose replies a function computes from what it was sent.

    ``function`` takes the ``ProviderCall`` and returns (or, when it is
    ``async``, resolves to) the reply: a ``str`` (the assistant's text), an
    assistant ``Message`` (possibly with tool calls and reasoning), or a
    whole ``ProviderResponse``, used as given. A ``stream`` of its reply is
    cut into ``stream_pieces`` text deltas, as ``ScriptedDriver`` does.

    ``stream_function`` takes the call and returns an iterable or async
    iterable (a generator, sync or ``async``) of deltas: ``str`` text pieces
    or ``TextChunk``, ``ReasoningChunk`` and ``ToolCallChunk`` values. The
    driver streams them as they come and ends with a ``ResponseDone`` whose
    response it puts together from them (a tool call without an ``id`` gets
    one); a ``ResponseDone`` the function yields ends the stream with that
    response instead. Give either function or both: ``complete`` uses
    ``function`` when there is one, ``stream`` uses ``stream_function`` when
    there is one, and each falls back on the other.

    ``calls`` records every ``ProviderCall`` received (a :class:`CallLog`). Usage, unless the
    function returns a ``ProviderResponse``, is the cheap
    ``4 + ceil(bytes / 4)`` estimate per message, and a call prices only the
    messages it does not share with the call before it, so a long
    conversation's test does not slow down turn after turn.

    Raises:
        TypeError: at construction, when neither function is given; on a call,
            when a function returns something that is not a reply, a delta
            or an iterable of deltas (the message names what it returned).
        ValueError: a returned ``Message`` that is not an assistant message,
            or a streamed tool call without a name.

    Whatever the functions raise propagates unchanged, so a test can make
    the model fail with a real driver's errors (``RateLimitError``,
    ``ContextLengthExceededError``, ...) and see the run loop handle them.

    Example::

        async def deltas(call: ProviderCall) -> AsyncIterator[str]:
            for word in ("Hello", ", ", call.messages[-1].text):
                yield word

        driver = FunctionDriver(stream_function=deltas)
    """

    name = "function"

    def __init__(
        self,
        function: ReplyFunction | None = None,
        *,
        stream_function: StreamFunction | None = None,
        token_counter: TokenCounter | None = None,
        stream_pieces: int = 3,
    ) -> None:
        if function is None and stream_function is None:
            raise TypeError("FunctionDriver needs a function, a stream_function or both")
        self._function = function
        self._stream_function = stream_function
        self._counter = token_counter
        self._stream_pieces = max(1, stream_pieces)
        self.calls = CallLog()

    def token_counter(self) -> TokenCounter | None:
        return self._counter

    def replay_projection(self, model: Model) -> NoReplay:
        return NO_REPLAY

    async def complete(self, call: ProviderCall) -> ProviderResponse:
        priced = _Priced(call, self.calls.record(call))
        if self._function is not None:
            return await self._reply(self._function, priced)
        response: ProviderResponse | None = None
        async with aclosing(self._chunks(await self._deltas(priced), priced)) as chunks:
            async for chunk in chunks:
                if isinstance(chunk, ResponseDone):
                    response = chunk.response
        assert response is not None, "a FunctionDriver stream always ends with ResponseDone"
        return response

    @asynccontextmanager
    async def stream(self, call: ProviderCall) -> AsyncIterator[AsyncIterator[StreamChunk]]:
        priced = _Priced(call, self.calls.record(call))
        async with aclosing(self._chunks(await self._deltas(priced), priced)) as chunks:
            yield chunks

    async def _reply(self, function: ReplyFunction, priced: _Priced) -> ProviderResponse:
        await anyio.lowlevel.checkpoint()
        reply = function(priced.call)
        if inspect.isawaitable(reply):
            reply = await reply
        if isinstance(reply, ProviderResponse):
            return reply
        if isinstance(reply, str):
            return self._response(Message.assistant(reply), priced)
        if isinstance(reply, Message):
            if reply.role is not Role.ASSISTANT:
                raise ValueError(
                    f"FunctionDriver's function returned a {reply.role} message; "
                    "a reply is an assistant message"
                )
            return self._response(reply, priced)
        raise TypeError(
            "FunctionDriver's function must return a str, an assistant Message or a "
            f"ProviderResponse, not {type(reply).__name__}"
        )

    async def _deltas(self, priced: _Priced) -> AsyncIterable[object] | Iterable[object]:
        """What to stream: the stream function's deltas, or the reply's chunks."""
        if self._stream_function is None:
            assert self._function is not None  # __init__ took one or the other
            reply = await self._reply(self._function, priced)
            return chunks_of(reply, text_pieces=self._stream_pieces)
        deltas: object = self._stream_function(priced.call)
        if isinstance(deltas, str) or not isinstance(deltas, AsyncIterable | Iterable):
            raise TypeError(
                "FunctionDriver's stream_function must return an iterable or async iterable "
                f"of text deltas and stream chunks, not {type(deltas).__name__}"
            )
        return deltas

    async def _chunks(
        self, deltas: AsyncIterable[object] | Iterable[object], priced: _Priced
    ) -> AsyncGenerator[StreamChunk, None]:
        pieces: list[TextChunk | ReasoningChunk | ToolCallChunk] = []
        async with aclosing(_each(deltas)) as each:
            async for delta in each:
                chunk = TextChunk(text=delta) if isinstance(delta, str) else delta
                if not isinstance(chunk, TextChunk | ReasoningChunk | ToolCallChunk | ResponseDone):
                    raise TypeError(
                        "FunctionDriver's stream_function yields str, TextChunk, "
                        f"ReasoningChunk, ToolCallChunk or ResponseDone, not {type(delta).__name__}"
                    )
                await anyio.lowlevel.checkpoint()
                yield chunk
                if isinstance(chunk, ResponseDone):
                    return
                pieces.append(chunk)
        message = _assembled(
            pieces,
            provider=f"{self.name}:{priced.call.model.name}",
            call_id=f"call_{len(self.calls)}",
        )
        yield ResponseDone(response=self._response(message, priced))

    def _response(self, message: Message, priced: _Priced) -> ProviderResponse:
        message = message.with_origin(Origin.TURN)
        usage = Usage(
            input_tokens=priced.input_tokens, output_tokens=estimate_message_tokens(message)
        )
        return ProviderResponse(
            message=message,
            finish_reason="tool_calls" if message.tool_calls else "stop",
            usage=usage,
            model=priced.call.model.name,
        )


@attrs.frozen
class _Priced:
    """A call being answered, and its pretend input tokens (priced as it was logged)."""

    call: ProviderCall
    input_tokens: int


class CallLog(Sequence[ProviderCall]):
    """The calls a test double received, in order: ``driver.calls[i]`` is call ``i``.

    A read-only sequence (it compares equal to a list of the same calls). Each
    call is kept as the messages it added to the one before it: a conversation
    sends its whole history every turn, and a list of the calls would hold a
    transcript per turn, memory (and the collector's work) growing with the
    square of its length. An earlier call is put together again when asked for,
    with the messages the call before it had at each place it shares with it
    (the same objects, or equal ones); the latest is the very call received.

    Each call's pretend input tokens (``4 + ceil(bytes / 4)`` a message) are
    priced on the way in: only the messages it does not share with the call
    before it, so a long conversation's test does not slow down turn after turn.
    """

    def __init__(self) -> None:
        self.clear()

    def clear(self) -> None:
        """Forget every call logged so far."""
        self._bare: list[ProviderCall] = []  # each call with no messages
        self._shared: list[int] = []  # how many messages call i shares with call i - 1
        self._added: list[tuple[Message, ...]] = []  # the messages after those
        self._latest: ProviderCall | None = None
        self._totals = [0]  # _totals[i]: the price of the latest call's first i messages

    def record(self, call: ProviderCall) -> int:
        """Log ``call``; its pretend input tokens."""
        messages, latest = call.messages, self._latest
        sent = () if latest is None else latest.messages
        shared = _shared_start(sent, messages, _vouched(latest, call))
        totals = self._totals
        del totals[shared + 1 :]
        for message in messages[shared:]:
            totals.append(totals[-1] + estimate_message_tokens(message))
        self._bare.append(attrs.evolve(call, messages=()))
        self._shared.append(shared)
        self._added.append(messages[shared:])
        self._latest = call
        return totals[-1]

    def append(self, call: ProviderCall) -> None:
        """Log ``call`` (what a subclass overriding ``complete`` or ``stream`` does)."""
        self.record(call)

    def __len__(self) -> int:
        return len(self._bare)

    @overload
    def __getitem__(self, index: int) -> ProviderCall: ...

    @overload
    def __getitem__(self, index: slice) -> list[ProviderCall]: ...

    def __getitem__(self, index: int | slice) -> ProviderCall | list[ProviderCall]:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        size = len(self._bare)
        position = index + size if index < 0 else index
        if not 0 <= position < size:
            raise IndexError(f"call {index} of {size} calls")
        if position == size - 1 and self._latest is not None:
            return self._latest
        return attrs.evolve(self._bare[position], messages=self._messages_of(position))

    def _messages_of(self, position: int) -> tuple[Message, ...]:
        """Call ``position``'s messages, from what each call before it added: a step
        per call back to the one that added its first message."""
        pieces: list[tuple[Message, ...]] = []
        need = self._shared[position] + len(self._added[position])
        while need:
            shared = self._shared[position]
            if need > shared:
                pieces.append(self._added[position][: need - shared])
                need = shared
            position -= 1
        return tuple(chain.from_iterable(reversed(pieces)))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, CallLog | list | tuple):
            return len(self) == len(other) and list(self) == list(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]  # compared by content, as a list is

    def __repr__(self) -> str:
        return f"CallLog({list(self)!r})"


def _vouched(latest: ProviderCall | None, call: ProviderCall) -> range | None:
    """Where ``call`` holds the very messages ``latest`` held, as the engine vouches
    (a conversation's history sent again, grown at its end): known from the
    history's span, no message compared (``None``: it cannot say)."""
    span = None if latest is None else latest.history
    if span is None or not span.begins(call.history):
        return None
    return range(span.offset, span.offset + span.length)


def _shared_start(
    sent: tuple[Message, ...], messages: tuple[Message, ...], known: range | None = None
) -> int:
    """How many messages ``messages`` starts with that ``sent`` did too (the same
    objects, or equal ones); ``known``: where they are known to hold the same ones,
    so only the few messages around it are compared."""
    end = min(len(sent), len(messages))
    if known is not None and known.stop <= end:
        before = known.start
        if all(map(_alike, sent[:before], messages[:before])):
            start = known.stop
            while start < end and _alike(sent[start], messages[start]):
                start += 1
            return start
    # Usually only the end differs (a turn's messages come back as seed copies):
    # step back over it, then check the rest in one comparison, done in C (two
    # copies of pointers); a call that differs earlier is scanned from the start.
    start = end
    while start and sent[start - 1] is not messages[start - 1]:
        start -= 1
    if messages[:start] == sent[:start]:
        return start
    return next(compress(count(), map(is_not, sent, messages)), end)


def _alike(sent: Message, message: Message) -> bool:
    return sent is message or sent == message


async def _each(items: AsyncIterable[_T] | Iterable[_T]) -> AsyncGenerator[_T, None]:
    """The items of a sync or async iterable; a generator is closed after, even
    when the stream is left early, so its ``finally`` runs now."""
    try:
        if isinstance(items, AsyncIterable):
            async for item in items:
                yield item
        else:
            for item in items:
                yield item
    finally:
        if isinstance(items, AsyncGenerator):
            await items.aclose()
        elif isinstance(items, Generator):
            items.close()


def _assembled(
    pieces: Sequence[TextChunk | ReasoningChunk | ToolCallChunk], *, provider: str, call_id: str
) -> Message:
    """The assistant message that streamed as ``pieces``; a tool call streamed
    without an id is given ``{call_id}_{index}``, unique to the driver's call."""
    reasoning = "".join(p.text for p in pieces if isinstance(p, ReasoningChunk))
    by_index: dict[int, list[ToolCallChunk]] = {}
    for piece in pieces:
        if isinstance(piece, ToolCallChunk):
            by_index.setdefault(piece.index, []).append(piece)
    return Message.assistant(
        "".join(p.text for p in pieces if isinstance(p, TextChunk)),
        tool_calls=[
            _tool_call(parts, default_id=f"{call_id}_{index}")
            for index, parts in sorted(by_index.items())
        ],
        reasoning=Reasoning(text=reasoning, provider=provider) if reasoning else None,
    )


def _tool_call(parts: list[ToolCallChunk], *, default_id: str) -> ToolCall:
    name = next((p.name for p in parts if p.name), None)
    if name is None:
        raise ValueError(
            f"FunctionDriver's stream_function streamed tool call {parts[0].index} without a name"
        )
    return ToolCall(
        id=next((p.id for p in parts if p.id), default_id),
        name=name,
        arguments="".join(p.arguments for p in parts),
    )
