"""What threadline costs on top of raw httpx, per request, against a local mock server.

Run it with ``python benchmarks/bench_request.py`` (``--quick`` for a short
run). It starts a small HTTP/1.1 server in a subprocess on 127.0.0.1 (plain
asyncio streams, keep-alive, canned answers: a short completion, or a
200-chunk event stream sent one chunk per write with chunked encoding, as
model servers stream), then times each case through three clients in one run:

- threadline: ``OpenAIChatDriver`` + ``Client.request()...run()`` / ``.stream()``,
  as shipped (its default transport: aiohttp's pool on asyncio, where
  httpx-aiohttp is installed), with a ``Model`` that has a ``context_size``, so
  budgets are resolved and the transcript is counted; "threadline httpx" is
  the same on httpx's own pool (what trio, or an install without
  ``threadline[aiohttp]``, gets);
- raw httpx: one ``httpx.AsyncClient()`` with httpx's own defaults posting the
  same JSON bodies (``json.dumps`` each time) and decoding the answer with
  ``json.loads``; for the stream, ``aiter_lines`` plus ``json.loads`` per event;
- the official ``openai`` client on its own default stack (no ``http_client``
  given, as its docs recommend), when it is installed.

Then the same cases again for ``AnthropicDriver`` on the Messages API (the
mock serves it under ``/anthropic``; a 200-delta event stream), against raw
httpx and the official ``anthropic`` client on its default stack
(``benchmarks/_bench_anthropic.py``), and for ``OpenAIResponsesDriver`` on the
Responses API (under ``/responses-api``; a 200-delta event stream), against raw
httpx and the official ``openai`` client's ``responses``
(``benchmarks/_bench_responses.py``), and for ``GeminiDriver`` on
``generateContent`` (under ``/gemini``; a 200-chunk stream), against raw httpx
(``benchmarks/_bench_gemini.py``). A driver's case is a ``_Family``: a new
HTTP driver plugs in with its own helper module and one more entry.

Cases and targets (ratio to raw httpx, paired per repetition):

- batches of 300 small non-streamed requests, 50 at a time: CPU <= 1.10, and
  threadline's throughput at least the official client's;
- one request carrying a 1,000-message history (~400 KB of JSON), median of
  repeated runs: warm (the same messages sent again, as a run re-sends its
  history every round) <= 1.00; "cold" (new message objects, never counted
  nor encoded, and a new JSON cache: a first request) <= 2.0;
- consuming a 200-chunk stream, median of repeated runs: <= 1.10.

Why a ratio moved between runs, as measured on the shared 2-core machine:

- Not the server: it is its own process and spends 30-60 ms of CPU per
  300-request batch, where the client side spends 0.5-2.5 s.
- Raw httpx at 50 concurrent is bound by its own CPU (httpcore's pool checks
  every connection for every request: ~3,000 ``is_idle`` calls each, 2-8 ms
  of CPU per request), and at a load average of 4-6 a batch's wall time is
  2-2.5 times its CPU time, a factor that moves over seconds with the other
  processes. Medians taken separately per client compare different
  stretches of that load, so each ratio is taken between neighbours: every
  repetition times every client once, back to back, in an order turned
  every other repetition, and the target holds for the median of those
  paired ratios (quartiles and the CPU ratio printed beside it, a load
  average above the core count flagged).
- The pool's past: httpx's CPU per request grows with the connections its
  pool holds (a batch cost 2.2 s of CPU on a pool of 50, 1.1 s on one the
  previous batch had left at 12), and that number depends on what the pool
  went through: bursts that opened connections, keep-alives that expired
  while the other clients were timed. A client timed twice in a row (the
  last of one repetition, the first of the next) ran at half the CPU. So
  every timed batch starts on new pools, after an untimed wave of 50
  requests has opened their connections.
- The garbage collector walking the set-up's objects (the 1,000-message
  histories, the clients, the modules) in whichever batch ran a full
  collection: they are frozen out of its sight while timing.
- Spans nobody records: the official ``anthropic`` client imports
  ``opentelemetry.trace``, and threadline took that as tracing on and made
  (no-op) spans every run; it now makes spans only when a tracer provider is
  configured.

- The warm case's cache: the cold case gave the warm driver a new JSON cache
  for each first request, so the warm request after it re-encoded its whole
  history; first requests now run on a driver of their own.

"raw httpx again" times raw httpx on a second pool as if it were another
client: its ratio is 1.00 but for the noise left, which its quartiles show.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any

import _bench_anthropic
import _bench_gemini
import _bench_responses
import anyio
import httpx
from _bench_threadline import ThreadlineCalls
from httpx_aiohttp import HttpxAiohttpClient

from threadline import Client, Message, Model
from threadline.drivers import OpenAIChatDriver, ProviderCall
from threadline.drivers.openai_chat._wire import MessageJSONCache, request_body

try:
    import openai
except ImportError:  # the reference client is optional
    openai = None  # type: ignore[assignment]

MODEL_NAME = "bench-model"
API_KEY = "bench-key"
STREAM_CHUNKS = 200
HISTORY_MESSAGES = 1000
PROTOCOLS = ("openai", "anthropic", "openai-responses", "gemini")
CASES = ("small", "history", "stream")
SHOW_TIMES = False

# --- the mock server (runs in its own process) -------------------------------


def _completion(text: str) -> bytes:
    return json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": 1700000000,
            "model": MODEL_NAME,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17},
        },
        separators=(",", ":"),
    ).encode()


def _stream_events() -> list[bytes]:
    def event(payload: dict[str, Any]) -> bytes:
        return b"data: " + json.dumps(payload, separators=(",", ":")).encode() + b"\n\n"

    base = {"id": "chatcmpl-bench", "object": "chat.completion.chunk", "created": 1700000000}
    events = [
        event(
            {
                **base,
                "model": MODEL_NAME,
                "choices": [{"index": 0, "delta": {"content": f"tok{i} "}, "finish_reason": None}],
            }
        )
        for i in range(STREAM_CHUNKS)
    ]
    events.append(
        event(
            {
                **base,
                "model": MODEL_NAME,
                "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}],
            }
        )
    )
    events.append(
        event(
            {
                **base,
                "model": MODEL_NAME,
                "choices": [],
                "usage": {"prompt_tokens": 12, "completion_tokens": 200, "total_tokens": 212},
            }
        )
    )
    events.append(b"data: [DONE]\n\n")
    return [b"%x\r\n%s\r\n" % (len(e), e) for e in events] + [b"0\r\n\r\n"]


def _http_response(body: bytes, content_type: bytes) -> bytes:
    return (
        b"HTTP/1.1 200 OK\r\ncontent-type: "
        + content_type
        + b"\r\ncontent-length: %d\r\n\r\n" % len(body)
        + body
    )


class _CannedServer(asyncio.Protocol):
    """One connection of the mock server: HTTP/1.1 keep-alive, canned answers.

    A protocol rather than asyncio streams: it parses and answers in
    ``data_received`` without a task or a buffer copy per request, so the
    server spends as little of the shared cores as it can, and what is timed
    is the client's side.
    """

    def __init__(self, answers: dict[tuple[bool, str], list[bytes]]) -> None:
        self._answers = answers
        self._buffer = bytearray()
        self._transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self._transport = transport

    def data_received(self, data: bytes) -> None:
        buffer = self._buffer
        buffer += data
        while True:
            end = buffer.find(b"\r\n\r\n")
            if end < 0:
                return
            head = bytes(buffer[:end])
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            if len(buffer) < end + 4 + length:
                return  # the body is still on its way
            del buffer[: end + 4 + length]
            path = head.split(b" ", 2)[1]
            api = "anthropic" if b"/anthropic/" in path else "openai"
            if b"/responses-api/" in path:
                api = "responses"
            if b"/gemini/" in path:
                api = "gemini"
            answer = self._answers[(path.startswith(b"/stream/"), api)]
            assert self._transport is not None
            # One write per piece: a stream goes out one event per write, as model
            # servers send it (each write is its own TCP segment: no Nagle delay).
            for piece in answer:
                self._transport.write(piece)


async def _serve() -> None:
    stream_head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
        b"transfer-encoding: chunked\r\ncache-control: no-cache\r\n\r\n"
    )
    # (streamed, which API) -> what is written, piece by piece.
    answers = {
        (False, "openai"): [
            _http_response(_completion("Hello from the mock server."), b"application/json")
        ],
        (False, "anthropic"): [
            _http_response(
                _bench_anthropic.message_body("Hello from the mock server."), b"application/json"
            )
        ],
        (False, "responses"): [
            _http_response(
                _bench_responses.response_body("Hello from the mock server."), b"application/json"
            )
        ],
        (True, "openai"): [stream_head, *_stream_events()],
        (True, "anthropic"): [stream_head, *_bench_anthropic.stream_events(STREAM_CHUNKS)],
        (True, "responses"): [stream_head, *_bench_responses.stream_events(STREAM_CHUNKS)],
        (False, "gemini"): [
            _http_response(
                _bench_gemini.response_body("Hello from the mock server."), b"application/json"
            )
        ],
        (True, "gemini"): [stream_head, *_bench_gemini.stream_events(STREAM_CHUNKS)],
    }
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _CannedServer(answers), "127.0.0.1", 0, backlog=1024)
    port = server.sockets[0].getsockname()[1]
    print(port, flush=True)
    async with server:
        await server.serve_forever()


# --- the clients ---------------------------------------------------------------


def _history() -> list[Message]:
    # ~400 bytes of JSON per message: a thousand make ~400 KB.
    sentence = "The committee reviewed the quarterly figures and agreed on next steps. "
    messages = []
    for index in range(HISTORY_MESSAGES):
        text = f"[{index}] " + sentence * 5
        messages.append(Message.user(text) if index % 2 == 0 else Message.assistant(text))
    return messages


def _wire(messages: list[Message]) -> list[dict[str, Any]]:
    return [{"role": m.role.value, "content": m.text} for m in messages]


class Clients(ThreadlineCalls):
    """The three clients, each with its own connection pool to the same server."""

    new_message_cache = MessageJSONCache

    def __init__(self, port: int) -> None:
        self.base = f"http://127.0.0.1:{port}/v1"
        self.stream_base = f"http://127.0.0.1:{port}/stream/v1"
        self.model = Model(MODEL_NAME, context_size=1_000_000)
        self._open()

    def _open(self) -> None:
        """Every client, each with a new pool."""
        self.driver = OpenAIChatDriver(self.base, api_key=API_KEY, max_retries=0)
        self.threadline = Client(self.driver, default_model=self.model)
        # First requests get a driver of their own: their new JSON cache must not
        # empty the warm one's (the warm case then re-encoded its whole history).
        self.cold_driver = OpenAIChatDriver(self.base, api_key=API_KEY, max_retries=0)
        self.threadline_cold = Client(self.cold_driver, default_model=self.model)
        self.threadline_stream = Client(
            OpenAIChatDriver(self.stream_base, api_key=API_KEY, max_retries=0),
            default_model=self.model,
        )
        self.threadline_httpx = Client(
            OpenAIChatDriver(self.base, api_key=API_KEY, max_retries=0, transport="httpx"),
            default_model=self.model,
        )
        self.http = httpx.AsyncClient(timeout=60.0)
        # raw httpx once more, on a pool of its own: the control (see _family).
        self.raw_clients = {
            "httpx": self.http,
            "again": httpx.AsyncClient(timeout=60.0),
            "aiohttp": HttpxAiohttpClient(timeout=60.0),
        }
        self.headers = {
            "accept": "application/json",
            "content-type": "application/json",
            "authorization": f"Bearer {API_KEY}",
        }
        self.openai: Any = None
        self.openai_stream: Any = None
        if openai is not None:
            # Its own default stack, as its docs recommend: no http_client of ours.
            self.openai = openai.AsyncOpenAI(base_url=self.base, api_key=API_KEY, max_retries=0)
            self.openai_stream = openai.AsyncOpenAI(
                base_url=self.stream_base, api_key=API_KEY, max_retries=0
            )

    async def renew(self) -> None:
        """Close every pool and open new ones: each timed batch starts from the same state.

        httpx's CPU per request at 50 concurrent grows with the connections in
        its pool (every request scans them all), and how many a pool holds
        depends on its past: how many requests once arrived together, and which
        connections passed their 5 s keep-alive while other clients were timed.
        """
        await self.aclose()
        self._open()

    async def aclose(self) -> None:
        await self.threadline.aclose()
        await self.threadline_cold.aclose()
        await self.threadline_stream.aclose()
        await self.threadline_httpx.aclose()
        for raw in self.raw_clients.values():
            await raw.aclose()
        for client in (self.openai, self.openai_stream):
            if client is not None:
                await client.close()

    # raw httpx ------------------------------------------------------------------

    async def raw_complete(self, body: dict[str, Any], *, via: str = "httpx") -> str:
        response = await self.raw_clients[via].post(
            f"{self.base}/chat/completions", content=json.dumps(body).encode(), headers=self.headers
        )
        response.raise_for_status()
        text: str = json.loads(response.content)["choices"][0]["message"]["content"]
        return text

    async def raw_stream(self, body: dict[str, Any], *, via: str = "httpx") -> str:
        pieces = []
        headers = {**self.headers, "accept": "text/event-stream"}
        async with self.raw_clients[via].stream(
            "POST",
            f"{self.stream_base}/chat/completions",
            content=json.dumps(body).encode(),
            headers=headers,
        ) as response:
            response.raise_for_status()
            async for line in response.aiter_lines():
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    break
                event = json.loads(data)
                for choice in event["choices"]:
                    content = choice["delta"].get("content")
                    if content:
                        pieces.append(content)
        return "".join(pieces)

    # threadline: ThreadlineCalls, as for every protocol

    # openai ---------------------------------------------------------------------------

    async def openai_complete(self, messages: list[dict[str, Any]]) -> str:
        completion = await self.openai.chat.completions.create(model=MODEL_NAME, messages=messages)
        text: str = completion.choices[0].message.content
        return text

    async def openai_consume_stream(self, messages: list[dict[str, Any]]) -> str:
        pieces = []
        stream = await self.openai_stream.chat.completions.create(
            model=MODEL_NAME,
            messages=messages,
            stream=True,
            stream_options={"include_usage": True},
        )
        async for chunk in stream:
            for choice in chunk.choices:
                if choice.delta.content:
                    pieces.append(choice.delta.content)
        return "".join(pieces)


def _fresh(history: list[Message]) -> list[Message]:
    """Equal messages, never counted nor encoded: what a first request carries."""
    return [Message(role=m.role, content=m.content) for m in history]


def _same_body(history: list[Message], prompt: str, *, stream: bool) -> dict[str, Any]:
    """The body threadline sends, built by its own wire code, to post raw."""
    messages = (*history, Message.user(prompt))
    call = ProviderCall(
        model=Model(MODEL_NAME),
        messages=messages,
        tools=(),
        tool_choice=None,
        max_output_tokens=None,
    )
    return request_body(call, stream=stream)


# --- timing ----------------------------------------------------------------------

Case = Callable[[], Awaitable[object]]


async def _concurrently(work: Case, total: int, concurrency: int) -> float:
    remaining = total

    async def worker() -> None:
        nonlocal remaining
        while remaining > 0:
            remaining -= 1
            await work()

    started = time.perf_counter()
    async with anyio.create_task_group() as group:
        for _ in range(concurrency):
            group.start_soon(worker)
    return time.perf_counter() - started


async def _once(work: Case) -> float:
    started = time.perf_counter()
    await work()
    return time.perf_counter() - started


class Timings:
    """Each case's times, one per repetition, wall clock and this process's CPU."""

    def __init__(self, names: list[str]) -> None:
        self.wall: dict[str, list[float]] = {name: [] for name in names}
        self.cpu: dict[str, list[float]] = {name: [] for name in names}

    def ratios(self, name: str, times: dict[str, list[float]] | None = None) -> list[float]:
        """``name``'s time over raw httpx's, paired within each repetition."""
        times = self.wall if times is None else times
        return [own / raw for own, raw in zip(times[name], times["raw httpx"], strict=True)]


async def _compare(
    cases: dict[str, Case],
    repetitions: int,
    timer: Callable[[Case], Awaitable[float]],
    warm: Callable[[Case], Awaitable[float]] | None = None,
) -> Timings:
    """Time every case once per repetition, back to back, the order turned every other time.

    On a shared machine the load of other processes comes and goes over
    seconds; a case timed just after raw httpx (and, next repetition, just
    before it) meets the same load, so their ratio within a repetition does
    not move with it, where the ratio of separately taken medians does.

    ``warm`` runs (untimed) just before each timed batch, to start it from
    the same state as every other (see ``Clients.renew``). What is left over
    from the set-up (the history, the clients, the modules) is frozen out of
    the garbage collector's sight, so a collection costs what the timed
    requests' own objects cost.
    """
    names = list(cases)
    for work in cases.values():  # warm up: connections, caches, imports
        await timer(work)
    gc.collect()
    gc.freeze()
    timings = Timings(names)
    try:
        for repetition in range(repetitions):
            for name in names if repetition % 2 == 0 else names[::-1]:
                if warm is not None:
                    await warm(cases[name])
                gc.collect()
                cpu = time.process_time()
                timings.wall[name].append(await timer(cases[name]))
                timings.cpu[name].append(time.process_time() - cpu)
    finally:
        gc.unfreeze()
    return timings


# case -> ("time", most time over raw httpx) or ("throughput", least requests/s over raw httpx)
Targets = dict[str, tuple[str, float]]
_NOTES = {
    "raw httpx again": "(raw httpx on a second pool: the control, 1.00 but for noise)",
    "  cold": "(threadline, a first request: nothing counted or encoded before)",
    "raw aiohttp": "(raw httpx posting through httpx-aiohttp: the transport's own speed)",
    "threadline httpx": "(threadline on httpx's pool: trio, or without threadline[aiohttp])",
}


def _quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) < 2:
        return values[0], values[0], values[0]
    low, middle, high = statistics.quantiles(values, n=4, method="inclusive")
    return low, middle, high


def _report(title: str, targets: Targets, timings: Timings, unit: str) -> bool:
    if SHOW_TIMES:
        for name, wall in timings.wall.items():
            cpu = timings.cpu[name]
            print(f"  {name}: wall ms {[round(t * 1000) for t in wall]}")
            print(f"  {' ' * len(name)}   CPU ms {[round(t * 1000) for t in cpu]}")
    print(f"\n{title}")
    print(
        f"  {'':<18} {'median':>10}       time ratio to raw httpx, paired per repetition:"
        " median [quartiles]; CPU ratio"
    )
    met = True
    for name, times in timings.wall.items():
        low, ratio, high = _quartiles(timings.ratios(name))
        cpu = statistics.median(timings.ratios(name, timings.cpu))
        kind, target = targets.get(name, ("", 0.0))
        if kind == "time":
            ok = ratio <= target
            note = f"target <= {target:.2f}: {'met' if ok else 'MISSED'}"
        elif kind == "cpu":
            ok = cpu <= target
            note = f"CPU target <= {target:.2f}: {'met' if ok else 'MISSED'}"
        elif kind == "slower than":
            # A reference's time over threadline's: threadline's throughput is at least its.
            ok = ratio / statistics.median(timings.ratios("threadline")) >= target
            note = f"threadline's throughput >= this client's: {'met' if ok else 'MISSED'}"
        elif kind == "throughput":
            ok = 1 / ratio >= target
            note = f"throughput {1 / ratio:.1f}x raw httpx, target >= {target:.0f}x: " + (
                "met" if ok else "MISSED"
            )
        else:
            ok, note = True, _NOTES.get(name, "(reference)")
        met &= ok
        print(
            f"  {name:<18} {statistics.median(times) * 1000:9.2f} ms{unit}  ratio {ratio:5.2f} "
            f"[{low:4.2f}-{high:4.2f}]  cpu {cpu:5.2f}  {note if name != 'raw httpx' else ''}"
        )
    return met


async def _bench(port: int, options: argparse.Namespace) -> bool:
    history = _history()
    prompt = "What did the committee agree on?"
    clients = Clients(port)
    small_body = _same_body([], "Hello", stream=False)
    big_body = _same_body(history, prompt, stream=False)
    stream_body = _same_body([], "Stream me a story", stream=True)
    print(f"history body: {len(json.dumps(big_body)) / 1000:.0f} KB, {len(history) + 1} messages")
    load = os.getloadavg()[0]
    print(f"load average {load:.1f} on {os.cpu_count()} cores", end="")
    print(": a busy machine, expect wide quartiles" if load > (os.cpu_count() or 1) else "")
    print(
        "Each target holds for the median of the paired ratios (a client's time over raw\n"
        "httpx's in the same repetition); the quartiles, and 'raw httpx again' (raw httpx\n"
        "on a second pool, 1.00 but for noise), show how far one run can be trusted."
    )
    assert big_body["messages"] == _wire([*history, Message.user(prompt)])
    met = True
    if "openai" in options.protocol:
        met &= await _openai(clients, (small_body, big_body, stream_body), history, prompt, options)
    if "anthropic" in options.protocol:
        met &= await _anthropic(port, history, prompt, options)
    if "openai-responses" in options.protocol:
        met &= await _responses(port, history, prompt, options)
    if "gemini" in options.protocol:
        met &= await _bench_gemini.bench(port, history, prompt, options, _family, _Family)
    return met


async def _openai(
    clients: Clients,
    bodies: tuple[dict[str, Any], dict[str, Any], dict[str, Any]],
    history: list[Message],
    prompt: str,
    options: argparse.Namespace,
) -> bool:
    try:
        met = await _family(
            "OpenAI Chat Completions",
            _Family(
                raw_complete=clients.raw_complete,
                raw_stream=clients.raw_stream,
                complete=clients.threadline_complete,
                complete_uncached=clients.threadline_complete_uncached,
                consume_stream=clients.threadline_consume_stream,
                reference="openai" if clients.openai is not None else None,
                reference_complete=clients.openai_complete,
                reference_stream=clients.openai_consume_stream,
                renew=clients.renew,
            ),
            bodies,
            history,
            prompt,
            options,
        )
    finally:
        await clients.aclose()
    if clients.openai is None:
        print("\n(openai is not installed: pip install openai to print its ratios too)")
    return met


async def _anthropic(
    port: int, history: list[Message], prompt: str, options: argparse.Namespace
) -> bool:
    messages_api = _bench_anthropic.AnthropicClients(port)
    bodies = (
        _bench_anthropic.same_body([], "Hello", stream=False),
        _bench_anthropic.same_body(history, prompt, stream=False),
        _bench_anthropic.same_body([], "Stream me a story", stream=True),
    )
    try:
        met = await _family(
            "Anthropic Messages",
            _Family(
                raw_complete=messages_api.raw_complete,
                raw_stream=messages_api.raw_stream,
                complete=messages_api.threadline_complete,
                complete_uncached=messages_api.threadline_complete_uncached,
                consume_stream=messages_api.threadline_consume_stream,
                reference="anthropic" if messages_api.reference is not None else None,
                reference_complete=messages_api.reference_complete,
                reference_stream=messages_api.reference_consume_stream,
                renew=messages_api.renew,
            ),
            bodies,
            history,
            prompt,
            options,
        )
    finally:
        await messages_api.aclose()
    if messages_api.reference is None:
        print("\n(anthropic is not installed: pip install anthropic to print its ratios too)")
    return met


async def _responses(
    port: int, history: list[Message], prompt: str, options: argparse.Namespace
) -> bool:
    responses_api = _bench_responses.ResponsesClients(port)
    bodies = (
        _bench_responses.same_body([], "Hello", stream=False),
        _bench_responses.same_body(history, prompt, stream=False),
        _bench_responses.same_body([], "Stream me a story", stream=True),
    )
    try:
        met = await _family(
            "OpenAI Responses",
            _Family(
                raw_complete=responses_api.raw_complete,
                raw_stream=responses_api.raw_stream,
                complete=responses_api.threadline_complete,
                complete_uncached=responses_api.threadline_complete_uncached,
                consume_stream=responses_api.threadline_consume_stream,
                reference="openai" if responses_api.reference is not None else None,
                reference_complete=responses_api.reference_complete,
                reference_stream=responses_api.reference_consume_stream,
                renew=responses_api.renew,
                items="input",
            ),
            bodies,
            history,
            prompt,
            options,
        )
    finally:
        await responses_api.aclose()
    if responses_api.reference is None:
        print("\n(openai is not installed: pip install openai to print its ratios too)")
    return met


class _Family:
    """One protocol's clients, as the cases call them."""

    def __init__(self, **calls: Any) -> None:
        self.raw_complete: Callable[..., Awaitable[str]] = calls["raw_complete"]
        self.raw_stream: Callable[..., Awaitable[str]] = calls["raw_stream"]
        self.complete: Callable[..., Awaitable[str]] = calls["complete"]
        self.complete_uncached: Callable[[list[Message], str], Awaitable[str]] = calls[
            "complete_uncached"
        ]
        self.consume_stream: Callable[[str], Awaitable[str]] = calls["consume_stream"]
        self.reference: str | None = calls["reference"]
        self.reference_complete: Callable[[Any], Awaitable[str]] = calls["reference_complete"]
        self.reference_stream: Callable[[Any], Awaitable[str]] = calls["reference_stream"]
        self.renew: Callable[[], Awaitable[None]] = calls["renew"]
        # The body's field the reference client takes the transcript from.
        self.items: str = calls.get("items", "messages")


async def _family(
    protocol: str,
    family: _Family,
    bodies: tuple[dict[str, Any], dict[str, Any], dict[str, Any]],
    history: list[Message],
    prompt: str,
    options: argparse.Namespace,
) -> bool:
    small_body, big_body, stream_body = bodies
    quick = options.quick
    print(f"\n=== {protocol} ===")
    # The answers must be the same through every client before timing them.
    assert await family.complete([], "Hello") == await family.raw_complete(small_body)
    streamed = await family.raw_stream(stream_body)
    assert await family.consume_stream("Stream me a story") == streamed
    if family.reference is not None:
        assert await family.reference_stream(stream_body[family.items]) == streamed
    results = []

    if "small" in options.case:
        # Short batches, many of them: each ratio is taken between neighbours in time.
        requests, concurrency = 300, 50
        assert await family.complete([], "Hello", httpx_pool=True) == await family.raw_complete(
            small_body, via="aiohttp"
        )
        small: dict[str, Case] = {
            "raw httpx": lambda: family.raw_complete(small_body),
            "threadline": lambda: family.complete([], "Hello"),
            "raw httpx again": lambda: family.raw_complete(small_body, via="again"),
            "threadline httpx": lambda: family.complete([], "Hello", httpx_pool=True),
            "raw aiohttp": lambda: family.raw_complete(small_body, via="aiohttp"),
        }
        if family.reference is not None:
            small[family.reference] = lambda: family.reference_complete(small_body[family.items])

        async def fresh_pools(work: Case) -> float:
            # New pools, then one wave of requests to open their connections.
            await family.renew()
            return await _concurrently(work, concurrency, concurrency)

        timings = await _compare(
            small,
            9 if quick else 21,
            lambda work: _concurrently(work, requests, concurrency),
            warm=fresh_pools,
        )
        results.append(
            _report(
                f"{requests:,} small requests, {concurrency} at a time (total time of a batch)",
                {
                    "threadline": ("cpu", 1.1),
                    **({family.reference: ("slower than", 1.0)} if family.reference else {}),
                },
                timings,
                " total",
            )
        )

    if "history" in options.case:
        repetitions = 9 if quick else 25
        # A first request: messages never counted or encoded (new objects: a message's
        # count is kept on it), through a new JSON cache; one per timed run and warm-up.
        fresh = iter([_fresh(history) for _ in range(repetitions + 2)])
        big: dict[str, Case] = {
            "raw httpx": lambda: family.raw_complete(big_body),
            "threadline": lambda: family.complete(history, prompt),
            "raw httpx again": lambda: family.raw_complete(big_body, via="again"),
            "  cold": lambda: family.complete_uncached(next(fresh), prompt),
        }
        if family.reference is not None:
            big[family.reference] = lambda: family.reference_complete(big_body[family.items])
        timings = await _compare(big, repetitions, _once)
        results.append(
            _report(
                f"one request with a {HISTORY_MESSAGES:,}-message history",
                {"threadline": ("time", 1.0), "  cold": ("time", 2.0)},
                timings,
                "      ",
            )
        )

    if "stream" in options.case:
        stream: dict[str, Case] = {
            "raw httpx": lambda: family.raw_stream(stream_body),
            "threadline": lambda: family.consume_stream("Stream me a story"),
            "raw httpx again": lambda: family.raw_stream(stream_body, via="again"),
        }
        if family.reference is not None:
            stream[family.reference] = lambda: family.reference_stream(stream_body[family.items])
        timings = await _compare(stream, 15 if quick else 41, _once)
        results.append(
            _report(
                f"consuming a {STREAM_CHUNKS}-chunk stream",
                {"threadline": ("time", 1.1)},
                timings,
                "      ",
            )
        )
    return all(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument(
        "--protocol",
        action="append",
        choices=PROTOCOLS,
        help="time only this protocol (repeatable; default: all)",
    )
    parser.add_argument(
        "--case", action="append", choices=CASES, help="time only this case (repeatable)"
    )
    parser.add_argument("--times", action="store_true", help="print every repetition's times")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(_serve())
        return
    server = subprocess.Popen(
        [sys.executable, __file__, "--serve"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        global SHOW_TIMES
        SHOW_TIMES = args.times
        args.protocol = args.protocol or list(PROTOCOLS)
        args.case = args.case or list(CASES)
        met = anyio.run(_bench, port, args)
    finally:
        server.terminate()
        server.wait(10)
    print("\nall targets met" if met else "\nsome targets MISSED")


if __name__ == "__main__":
    main()
