"""A server-sent events parser over raw bytes.

It follows the WHATWG event-stream rules: lines end in CR LF, LF or CR (and
only those, so a raw U+2028 inside JSON stays inside its line, which a
``str.splitlines``-based reader such as ``httpx.Response.aiter_lines`` would
break); ``:`` starts a comment; ``data`` lines accumulate, joined by newlines;
a blank line dispatches the event. Events, lines and even UTF-8 characters may
be split across reads in any way. A UTF-8 byte order mark is dropped at the
start of the stream only (arriving alone, or split across reads); anywhere else
it is part of the line it stands in.

One leniency: when the stream ends, a pending event with data is dispatched
even without its closing blank line, since some servers close the connection
right after the last ``data:`` line. A truncated event then fails where its
data is decoded, rather than vanishing.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable
from typing import NamedTuple

__all__ = ["SSEDecoder", "ServerSentEvent", "StreamProgress", "aiter_sse"]

_BOM = b"\xef\xbb\xbf"


class ServerSentEvent(NamedTuple):
    """One dispatched event: its data (lines joined with ``\\n``), type, id and retry.

    A named tuple rather than an attrs class: one is built per streamed token,
    and a tuple is the cheapest immutable value Python builds.
    """

    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None


_make = ServerSentEvent._make


class StreamProgress:
    """How much of a stream's body arrived: bytes, events and its first bytes.

    :func:`aiter_sse` keeps it up to date, so that a stream that breaks off or
    ends short can say how far it got, and a body that was never an event
    stream (an HTML page from a proxy) can be shown by its start.
    """

    __slots__ = ("bytes", "content_type", "events", "head", "status")

    HEAD_BYTES = 1024
    """How much of the body's start is kept."""

    def __init__(self, content_type: str = "", status: int = 200) -> None:
        self.content_type = content_type
        self.status = status
        self.bytes = 0
        self.events = 0
        self.head = b""

    @property
    def is_event_stream(self) -> bool:
        """Whether the response said it is ``text/event-stream``."""
        return self.content_type.split(";")[0].strip().lower() == "text/event-stream"

    def describe(self) -> str:
        """``"3 events (1,204 bytes)"``."""
        events = "1 event" if self.events == 1 else f"{self.events:,} events"
        return f"{events} ({self.bytes:,} bytes)"

    def add(self, chunk: bytes) -> None:
        """Count ``chunk``, a read of the body."""
        self.bytes += len(chunk)
        if len(self.head) < self.HEAD_BYTES:
            self.head += chunk[: self.HEAD_BYTES - len(self.head)]


class SSEDecoder:
    """Incremental decoder: feed it bytes as they arrive, get whole events back.

    ``progress``, when given, counts the bytes fed and the events returned.
    A driver that reads many small events can loop over the body's reads and
    feed them here itself, one async step fewer per event than :func:`aiter_sse`.

    Example::

        decoder = SSEDecoder()
        for chunk in chunks:
            for event in decoder.feed(chunk):
                ...
        events_left = decoder.flush()
    """

    __slots__ = (
        "_at_start",
        "_data",
        "_event",
        "_last_id",
        "_partial",
        "_progress",
        "_retry",
        "_skip_lf",
    )

    def __init__(self, progress: StreamProgress | None = None) -> None:
        self._progress = progress
        self._partial = b""
        self._skip_lf = False
        self._at_start = True
        self._data: list[str] = []
        self._event: str | None = None
        self._last_id: str | None = None
        self._retry: int | None = None

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """Take the next bytes of the stream; return the events they complete."""
        if chunk[-1:] == b"\n" and not (self._partial or self._at_start or self._skip_lf):
            # Whole lines, as servers write them: decoded at once (a line ending never
            # splits a UTF-8 character), and split on LF alone when there is no CR.
            if b"\r" in chunk:
                lines = [line.decode("utf-8", "replace") for line in chunk.splitlines()]
            else:
                lines = chunk.decode("utf-8", "replace").split("\n")
                lines.pop()  # the empty text after the last LF
        else:
            lines = self._lines(chunk)
        events = self._take(lines)
        progress = self._progress
        if progress is not None:
            progress.add(chunk)
            progress.events += len(events)
        return events

    def _lines(self, chunk: bytes) -> list[str]:
        """The whole lines ``chunk`` completes; the rest is kept for the next read."""
        if self._skip_lf and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._skip_lf = False
        if not chunk:
            return []
        buffer = self._partial + chunk if self._partial else chunk
        if self._at_start:
            if len(buffer) < len(_BOM) and _BOM.startswith(buffer):
                self._partial = buffer  # maybe the start of a byte order mark
                return []
            self._at_start = False
            buffer = buffer.removeprefix(_BOM)
            if not buffer:  # the mark alone: nothing of the stream yet
                self._partial = b""
                return []
        # bytes.splitlines breaks on exactly CR LF, LF and CR: the SSE line endings.
        lines = buffer.splitlines()
        last = buffer[-1:]
        if last == b"\r":
            # The LF of a CR LF may still be on its way in the next read.
            self._skip_lf = True
            self._partial = b""
        elif last == b"\n":
            self._partial = b""
        else:
            self._partial = lines.pop()
        return [line.decode("utf-8", "replace") for line in lines]

    def _take(self, lines: list[str]) -> list[ServerSentEvent]:
        """Apply whole lines; return the events they dispatch."""
        events: list[ServerSentEvent] = []
        data = self._data
        for line in lines:
            if line[:6] == "data: ":  # nearly every line: the fast path
                data.append(line[6:])
            elif not line:
                if len(data) == 1:  # the event of one data line, made here: once per token
                    events.append(
                        _make((data[0], self._event or "message", self._last_id, self._retry))
                    )
                    data = self._data = []
                    self._event = self._retry = None
                elif data:
                    events.append(self._dispatch())
                    data = self._data
                else:
                    self._event = self._retry = None
            elif line[:7] == "event: ":  # before each data line, for some providers
                self._event = line[7:]
            else:
                self._field(line)
        return events

    def flush(self) -> list[ServerSentEvent]:
        """End of stream: process an unterminated last line and any pending event."""
        events: list[ServerSentEvent] = []
        if self._partial and not self._at_start:
            self._field(self._partial.decode("utf-8", "replace"))
        # At the start, what is kept can only be part of a byte order mark: dropped.
        self._partial = b""
        if self._data:
            events.append(self._dispatch())
        if self._progress is not None:
            self._progress.events += len(events)
        return events

    def _field(self, line: str) -> None:
        if line[:1] == ":":
            return  # a comment
        name, colon, value = line.partition(":")
        if colon and value[:1] == " ":
            value = value[1:]
        if name == "data":
            self._data.append(value)
        elif name == "event":
            self._event = value
        elif name == "id":
            if "\0" not in value:
                self._last_id = value
        elif name == "retry" and value.isascii() and value.isdigit():
            self._retry = int(value)

    def _dispatch(self) -> ServerSentEvent:
        data = self._data
        event = ServerSentEvent._make(
            (
                data[0] if len(data) == 1 else "\n".join(data),
                self._event or "message",
                self._last_id,
                self._retry,
            )
        )
        self._data, self._event, self._retry = [], None, None
        return event


async def aiter_sse(
    chunks: AsyncIterable[bytes], progress: StreamProgress | None = None
) -> AsyncGenerator[ServerSentEvent, None]:
    """The events of a byte stream (e.g. ``response.aiter_bytes()``), in order.

    ``progress``, when given, counts the bytes and events as they come.
    Closing this generator (``contextlib.aclosing``) closes ``chunks`` too, so
    a reader that stops at ``[DONE]`` leaves no generator for the garbage
    collector to finalize (which trio warns about).
    """
    decoder = SSEDecoder(progress)
    source = aiter(chunks)
    try:
        async for chunk in source:
            for event in decoder.feed(chunk):
                yield event
        for event in decoder.flush():
            yield event
    finally:
        # The source is any async iterable of bytes; httpx's is a generator
        # that must be closed, a plain iterable (a test's) has nothing to close.
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            await aclose()
