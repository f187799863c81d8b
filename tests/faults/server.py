"""A small fault-injection HTTP server of the project's own, on 127.0.0.1.

Real providers fail in ways a mock transport cannot show: a connection reset
half-way through a stream, a server that trickles SSE comments forever, a
byte-order mark in its own TCP segment, a UTF-8 character split across two
writes, an HTML error page from a proxy. This server runs in a thread of the
test process, speaks just enough HTTP/1.1 to answer one request per
connection, and plays the scripted :class:`Act` for each request in turn, so
the same scenarios run under asyncio and trio alike.

    with FaultServer() as server:
        server.script(Status(429, headers={"retry-after": "0"}), Json({"ok": True}))
        driver = OpenAIChatDriver(server.url, api_key="sk-...")

Every request the server read is kept in ``server.requests``.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "Act",
    "FaultServer",
    "Html",
    "Json",
    "Raw",
    "Reset",
    "Sse",
    "Stall",
    "Status",
    "Trickle",
    "chunked",
    "response_head",
    "sse_event",
]


@dataclass
class Received:
    """One request as the server read it."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body)


class Act:
    """What the server does with one request."""

    def play(self, conn: socket.socket) -> None:
        raise NotImplementedError


def _head(status: int, headers: dict[str, str], length: int | None) -> bytes:
    lines = [f"HTTP/1.1 {status} Scripted"]
    merged = {"connection": "close", **{k.lower(): v for k, v in headers.items()}}
    if length is not None:
        merged["content-length"] = str(length)
    lines += [f"{name}: {value}" for name, value in merged.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _reset(conn: socket.socket) -> None:
    # SO_LINGER with a zero timeout makes close() send RST instead of FIN.
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    conn.close()


@dataclass
class Status(Act):
    """A complete response: ``status``, ``headers`` and ``body`` (bytes or text)."""

    status: int
    body: bytes | str = b""
    headers: dict[str, str] = field(default_factory=dict)

    def play(self, conn: socket.socket) -> None:
        body = self.body.encode() if isinstance(self.body, str) else self.body
        conn.sendall(_head(self.status, self.headers, len(body)) + body)


def Json(payload: Any, status: int = 200, headers: dict[str, str] | None = None) -> Status:
    """A JSON response."""
    merged = {"content-type": "application/json", **(headers or {})}
    return Status(status, json.dumps(payload), merged)


def Html(body: str, status: int = 200) -> Status:
    """An HTML page (a proxy's login or error page), ``200`` unless told."""
    return Status(status, body, {"content-type": "text/html; charset=utf-8"})


def response_head(status: int = 200, headers: dict[str, str] | None = None) -> bytes:
    """A status line and headers with no length: the body runs to the connection's close."""
    return _head(status, headers or {}, None)


def chunked(*pieces: bytes) -> bytes:
    """``pieces`` in HTTP/1.1 chunked transfer coding, ending with the last chunk."""
    return b"".join(b"%x\r\n%s\r\n" % (len(piece), piece) for piece in pieces) + b"0\r\n\r\n"


@dataclass
class Raw(Act):
    """Bytes written as they are, in separate writes, ``pause`` seconds apart (a split UTF-8)."""

    pieces: Sequence[bytes]
    pause: float = 0.01

    def play(self, conn: socket.socket) -> None:
        for piece in self.pieces:
            conn.sendall(piece)
            time.sleep(self.pause)


@dataclass
class Reset(Act):
    """A connection reset, after writing ``before`` (nothing: a reset before any response)."""

    before: bytes = b""

    def play(self, conn: socket.socket) -> None:
        if self.before:
            conn.sendall(self.before)
            time.sleep(0.05)
        _reset(conn)


@dataclass
class Stall(Act):
    """Read the request, then say nothing for ``seconds`` (a hung upstream)."""

    seconds: float

    def play(self, conn: socket.socket) -> None:
        time.sleep(self.seconds)


def sse_event(data: Any, event: str | None = None) -> bytes:
    """One SSE event: ``data`` as JSON (or text, as given) and an optional ``event:`` line."""
    text = data if isinstance(data, str) else json.dumps(data)
    head = f"event: {event}\n" if event else ""
    return f"{head}data: {text}\n\n".encode()


@dataclass
class Sse(Act):
    """A 200 event stream of ``events``; then a clean end, or a reset when ``reset_after``."""

    events: Iterable[bytes]
    reset_after: bool = False
    pause: float = 0.0
    content_type: str = "text/event-stream"

    def play(self, conn: socket.socket) -> None:
        head = _head(200, {"content-type": self.content_type}, None)
        conn.sendall(head)
        for chunk in self.events:
            conn.sendall(chunk)
            if self.pause:
                time.sleep(self.pause)
        if self.reset_after:
            time.sleep(0.05)
            _reset(conn)


@dataclass
class Trickle(Act):
    """A 200 event stream that sends ``first`` (events of a reply begun), then an SSE
    comment every ``every`` seconds for ``seconds``: never a read timeout, never an end."""

    every: float
    seconds: float
    first: Sequence[bytes] = ()

    def play(self, conn: socket.socket) -> None:
        conn.sendall(_head(200, {"content-type": "text/event-stream"}, None))
        for event in self.first:
            conn.sendall(event)
        deadline = time.monotonic() + self.seconds
        while time.monotonic() < deadline:
            try:
                conn.sendall(b": keep-alive\n\n")
            except OSError:
                return  # the client gave up: what the test wants to see
            time.sleep(self.every)


class FaultServer:
    """An HTTP server on 127.0.0.1 playing scripted acts, one per request, in order.

    When the script runs out, requests get a 500 that says so, which a test
    notices as an unexpected extra request.
    """

    def __init__(self) -> None:
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.port: int = self._listener.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/v1"
        self.requests: list[Received] = []
        self._acts: deque[Act] = deque()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="fault-server", daemon=True)

    def script(self, *acts: Act) -> None:
        """Queue ``acts``: the next requests get them in order."""
        with self._lock:
            self._acts.extend(acts)

    def __enter__(self) -> FaultServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._closed.set()
        # shutdown() wakes the accept() blocked in the server thread; close() alone does not.
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        self._thread.join(timeout=5)

    def _serve(self) -> None:
        while not self._closed.is_set():
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._handle, args=(conn,), daemon=True).start()

    def _handle(self, conn: socket.socket) -> None:
        try:
            received = self._read_request(conn)
            if received is None:
                conn.close()
                return
            with self._lock:
                self.requests.append(received)
                act = self._acts.popleft() if self._acts else Status(500, "script ran out")
            act.play(conn)
            conn.close()
        except OSError:
            conn.close()

    @staticmethod
    def _read_request(conn: socket.socket) -> Received | None:
        data = b""
        while b"\r\n\r\n" not in data:
            piece = conn.recv(65536)
            if not piece:
                return None
            data += piece
        head, _, body = data.partition(b"\r\n\r\n")
        request_line, *header_lines = head.decode("latin-1").split("\r\n")
        method, path, _ = request_line.split(" ", 2)
        headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        while len(body) < length:
            piece = conn.recv(65536)
            if not piece:
                break
            body += piece
        return Received(method, path, headers, body)
