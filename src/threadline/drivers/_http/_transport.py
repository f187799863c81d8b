"""The default transport: aiohttp's pool on asyncio where it is installed, httpx's elsewhere.

Measured with ``benchmarks/bench_request.py`` (300 small requests, 50 at a
time, against a local server, on a shared 2-core machine), httpx's own pool
(httpcore) spends 1.6 ms of CPU a request with httpx's default limits and
4.4 ms with a pool of 100 kept-alive connections, scanning every connection
for every request; aiohttp's pool spends about 0.25 ms. So the driver's own
client sends through aiohttp when it can, and through httpx when it cannot:

- on trio (aiohttp runs on asyncio only), decided per request, so one driver
  serves either backend;
- when ``httpx-aiohttp`` (the ``threadline[aiohttp]`` extra) is not installed.

aiohttp is imported at the first request on asyncio, not when the driver is
built: it takes ~200 ms to import, which a driver built and never used (a
CLI's ``--help``, a test) should not pay. Each pool is built on first use,
and both share one TLS context.
"""

from __future__ import annotations

# Only to ask whether an asyncio loop runs: aiohttp needs one, trio has none.
import asyncio  # noqa: TID251
import ssl
from typing import Any

import httpx

__all__ = ["AutoClient", "AutoTransport", "aiohttp_available"]


def _on_asyncio() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


def aiohttp_available() -> bool:
    """Whether ``httpx-aiohttp`` (and aiohttp under it) can be imported here."""
    try:
        import httpx_aiohttp  # noqa: F401
    except ImportError:
        return False
    return True


class AutoTransport(httpx.AsyncBaseTransport):
    """Sends through aiohttp's pool on asyncio when it is installed, else httpx's own.

    ``options`` are what httpx gives a transport (limits, http1/http2, a
    proxy); TLS is set up once, in ``ssl_context``, for both pools.
    """

    def __init__(self, ssl_context: ssl.SSLContext, **options: Any) -> None:
        self._options = {**options, "verify": ssl_context}
        self._aiohttp: httpx.AsyncBaseTransport | None = None
        self._httpx: httpx.AsyncBaseTransport | None = None
        self._aiohttp_missing: bool | None = None

    def pool(self) -> httpx.AsyncBaseTransport:
        """The pool the next request goes through, built on first use."""
        if _on_asyncio() and not self._aiohttp_missing:
            if self._aiohttp is not None:
                return self._aiohttp
            if self._aiohttp_missing is None:
                self._aiohttp_missing = not aiohttp_available()
            if not self._aiohttp_missing:
                from threadline.drivers._http._aiohttp import SafeAiohttpTransport

                # aiohttp speaks HTTP/1.1 only, and warns of an "http2" it was given.
                self._aiohttp = SafeAiohttpTransport(**{**self._options, "http2": False})
                return self._aiohttp
        if self._httpx is None:
            self._httpx = httpx.AsyncHTTPTransport(**self._options)
        return self._httpx

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        return await self.pool().handle_async_request(request)

    async def aclose(self) -> None:
        for pool in (self._aiohttp, self._httpx):
            if pool is not None:
                await pool.aclose()


class AutoClient(httpx.AsyncClient):
    """An ``httpx.AsyncClient`` on :class:`AutoTransport`, proxies from the environment too.

    httpx builds its transports in these two hooks (as ``httpx-aiohttp`` does
    for its own client); passing ``transport=`` instead would turn off the
    proxies httpx reads from ``HTTPS_PROXY`` and its kin.
    """

    def _init_transport(  # type: ignore[override]
        self,
        verify: ssl.SSLContext | str | bool = True,
        cert: Any = None,
        trust_env: bool = True,
        transport: httpx.AsyncBaseTransport | None = None,
        **options: Any,
    ) -> httpx.AsyncBaseTransport:
        if transport is not None:
            return transport
        context = httpx.create_ssl_context(verify=verify, cert=cert, trust_env=trust_env)
        return AutoTransport(context, trust_env=trust_env, **options)

    def _init_proxy_transport(  # type: ignore[override]
        self,
        proxy: httpx.Proxy,
        verify: ssl.SSLContext | str | bool = True,
        cert: Any = None,
        trust_env: bool = True,
        **options: Any,
    ) -> httpx.AsyncBaseTransport:
        context = httpx.create_ssl_context(verify=verify, cert=cert, trust_env=trust_env)
        return AutoTransport(context, trust_env=trust_env, proxy=proxy, **options)
