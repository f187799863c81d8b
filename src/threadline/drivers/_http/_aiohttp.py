"""The aiohttp transport: httpx's interface over aiohttp's connection pool.

httpx's own pool (httpcore) spends most of a short request's time on
bookkeeping; at 50 concurrent requests on a small machine it serves several
times fewer requests per second than aiohttp does. ``httpx-aiohttp`` (the
``threadline[aiohttp]`` extra) keeps httpx's requests, responses and
exceptions, so nothing above the transport changes, and sends with aiohttp.

aiohttp runs on asyncio only. On trio the client refuses to send, naming the
cause, rather than failing somewhere inside aiohttp.

This module imports ``httpx_aiohttp`` at its top: :mod:`threadline.drivers._http._client`
imports it only when a driver asks for ``transport="aiohttp"`` (the default
``"auto"`` goes through :mod:`threadline.drivers._http._transport`).
"""

from __future__ import annotations

# Only to ask whether an asyncio loop runs: aiohttp needs one, trio has none.
import asyncio  # noqa: TID251
import contextlib
import ssl
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import httpx
from httpx_aiohttp import AiohttpTransport

from threadline._errors import InvalidRequestError

__all__ = ["AiohttpClient", "SafeAiohttpTransport"]

_NOT_ON_ASYNCIO = (
    "transport='aiohttp' runs only on asyncio (aiohttp is built on it), and no asyncio "
    "event loop is running here (trio?); use transport='httpx' or the default 'auto', "
    "which run on asyncio and trio alike"
)


def _protocol_error(exc: aiohttp.ClientError, request: httpx.Request) -> httpx.RemoteProtocolError:
    # aiohttp's message may quote what the server sent (a line of a malformed
    # body, which may echo the key): only the class of the failure is kept.
    return httpx.RemoteProtocolError(
        f"aiohttp refused the response ({type(exc).__name__})", request=request
    )


class _SafeStream(httpx.AsyncByteStream):
    """A response body whose aiohttp failures arrive as httpx's, like every other.

    Each read waits at most the request's read time-out: aiohttp's parser
    waits forever on a malformed chunk header that arrives after the body began
    (its own read time-out does not fire then), where httpx's fails at once.
    """

    def __init__(self, stream: httpx.AsyncByteStream, request: httpx.Request) -> None:
        self._stream = stream
        self._request = request
        self._read_timeout: float | None = request.extensions.get("timeout", {}).get("read")

    async def __aiter__(self) -> AsyncIterator[bytes]:
        failure: httpx.TransportError | None = None
        chunks = aiter(self._stream)
        try:
            while True:
                async with asyncio.timeout(self._read_timeout):
                    chunk = await anext(chunks, None)
                if chunk is None:
                    break
                yield chunk
        except aiohttp.ClientError as exc:
            failure = _protocol_error(exc, self._request)
        except TimeoutError:
            failure = httpx.ReadTimeout("no data within the read time-out", request=self._request)
        if failure is not None:
            raise failure  # past the except block: aiohttp's exception is not its context

    async def aclose(self) -> None:
        # Closing a body that already failed: its failure was raised.
        with contextlib.suppress(aiohttp.ClientError):
            await self._stream.aclose()


class SafeAiohttpTransport(AiohttpTransport):
    """httpx-aiohttp's transport, with every aiohttp failure raised as an httpx one.

    httpx-aiohttp maps the common failures (a refused connection, a time-out)
    and lets the rest through as aiohttp's own exceptions (a malformed chunk
    header is an ``aiohttp.ClientResponseError`` quoting the bad line); they
    would escape a driver's error mapping, which reads httpx's.
    """

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        failure: httpx.RemoteProtocolError | None = None
        try:
            response = await super().handle_async_request(request)
        except aiohttp.ClientError as exc:
            failure = _protocol_error(exc, request)
        if failure is not None:
            raise failure
        stream = response.stream
        assert isinstance(stream, httpx.AsyncByteStream)  # an async transport's body
        response.stream = _SafeStream(stream, request)
        return response


class AiohttpClient(httpx.AsyncClient):
    """An ``httpx.AsyncClient`` that sends through aiohttp, and says so on trio."""

    def _init_transport(  # type: ignore[override]
        self,
        verify: ssl.SSLContext | str | bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
        **options: Any,
    ) -> httpx.AsyncBaseTransport:
        return transport or SafeAiohttpTransport(verify=verify, **_http1(options))

    def _init_proxy_transport(  # type: ignore[override]
        self, proxy: httpx.Proxy, verify: ssl.SSLContext | str | bool = True, **options: Any
    ) -> httpx.AsyncBaseTransport:
        return SafeAiohttpTransport(verify=verify, proxy=proxy, **_http1(options))

    async def send(self, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise InvalidRequestError(_NOT_ON_ASYNCIO) from None
        return await super().send(request, **kwargs)


def _http1(options: dict[str, Any]) -> dict[str, Any]:
    # aiohttp speaks HTTP/1.1 only, and warns of an "http2" it was given.
    return {**options, "http2": False}
