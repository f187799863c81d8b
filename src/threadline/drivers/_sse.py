"""A server-sent events parser over raw bytes.

It follows the WHATWG event-stream rules: lines end in CR LF, LF or CR (and
only those, so a raw U+2028 inside JSON stays inside its line, which a
``str.splitlines``-based reader such as ``httpx.Response.aiter_lines`` would
break); ``:`` starts a comment; ``data`` lines accumulate, joined by newlines;
a blank line dispatches the event. Events, lines and even UTF-8 characters may
be split across reads in any way.

One leniency: when the stream ends, a pending event with data is dispatched
even without its closing blank line, since some servers close the connection
right after the last ``data:`` line. A truncated event then fails where its
data is decoded, rather than vanishing.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, AsyncIterable

import attrs

__all__ = ["SSEDecoder", "ServerSentEvent", "aiter_sse"]

_BOM = "\ufeff"


@attrs.frozen(kw_only=True, slots=True)
class ServerSentEvent:
    """One dispatched event: its type, its data (lines joined with ``\\n``) and id."""

    data: str
    event: str = "message"
    id: str | None = None
    retry: int | None = None


class SSEDecoder:
    """Incremental decoder: feed it bytes as they arrive, get whole events back.

    Example::

        decoder = SSEDecoder()
        for chunk in chunks:
            for event in decoder.feed(chunk):
                ...
        events_left = decoder.flush()
    """

    __slots__ = ("_at_start", "_data", "_event", "_last_id", "_partial", "_retry", "_skip_lf")

    def __init__(self) -> None:
        self._partial = b""
        self._skip_lf = False
        self._at_start = True
        self._data: list[str] = []
        self._event: str | None = None
        self._last_id: str | None = None
        self._retry: int | None = None

    def feed(self, chunk: bytes) -> list[ServerSentEvent]:
        """Take the next bytes of the stream; return the events they complete."""
        if self._skip_lf and chunk[:1] == b"\n":
            chunk = chunk[1:]
        self._skip_lf = False
        if not chunk:
            return []
        buffer = self._partial + chunk if self._partial else chunk
        # bytes.splitlines breaks on exactly CR LF, LF and CR: the SSE line endings.
        lines = buffer.splitlines(keepends=True)
        last = lines[-1]
        if last.endswith(b"\r"):
            # The LF of a CR LF may still be on its way in the next read.
            self._skip_lf = True
            self._partial = b""
        elif last.endswith(b"\n"):
            self._partial = b""
        else:
            self._partial = lines.pop()
        events: list[ServerSentEvent] = []
        for raw in lines:
            event = self._line(raw.rstrip(b"\r\n").decode("utf-8", errors="replace"))
            if event is not None:
                events.append(event)
        return events

    def flush(self) -> list[ServerSentEvent]:
        """End of stream: process an unterminated last line and any pending event."""
        events: list[ServerSentEvent] = []
        if self._partial:
            event = self._line(self._partial.decode("utf-8", errors="replace"))
            self._partial = b""
            if event is not None:
                events.append(event)
        event = self._dispatch()
        if event is not None:
            events.append(event)
        return events

    def _line(self, line: str) -> ServerSentEvent | None:
        if self._at_start:
            self._at_start = False
            if line.startswith(_BOM):
                line = line[1:]
        if not line:
            return self._dispatch()
        if line[0] == ":":
            return None
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
        return None

    def _dispatch(self) -> ServerSentEvent | None:
        data, event, retry = self._data, self._event, self._retry
        self._data, self._event, self._retry = [], None, None
        if not data:
            return None
        return ServerSentEvent(
            data="\n".join(data), event=event or "message", id=self._last_id, retry=retry
        )


async def aiter_sse(chunks: AsyncIterable[bytes]) -> AsyncGenerator[ServerSentEvent, None]:
    """The events of a byte stream (e.g. ``response.aiter_bytes()``), in order.

    Closing this generator (``contextlib.aclosing``) closes ``chunks`` too, so
    a reader that stops at ``[DONE]`` leaves no generator for the garbage
    collector to finalize (which trio warns about).
    """
    decoder = SSEDecoder()
    source = aiter(chunks)
    try:
        async for chunk in source:
            for event in decoder.feed(chunk):
                yield event
        for event in decoder.flush():
            yield event
    finally:
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            await aclose()
