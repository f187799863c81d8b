"""The aiohttp transport: httpx's interface over aiohttp's connection pool.

httpx's own pool (httpcore) spends most of a short request's time on
bookkeeping; at 50 concurrent requests on a small machine it serves several
times fewer requests per second than aiohttp does. ``httpx-aiohttp`` (the
``threadline[aiohttp]`` extra) keeps httpx's requests, responses and
exceptions, so nothing above the transport changes, and sends with aiohttp.

aiohttp runs on asyncio only. On trio the client refuses to send, naming the
cause, rather than failing somewhere inside aiohttp.

This module imports ``httpx_aiohttp`` at its top: :mod:`threadline.drivers._http._client`
imports it only when a driver asks for ``transport="aiohttp"``.
"""

from __future__ import annotations

# Only to ask whether an asyncio loop runs: aiohttp needs one, trio has none.
import asyncio  # noqa: TID251
from typing import Any

import httpx
from httpx_aiohttp import HttpxAiohttpClient

from threadline._errors import InvalidRequestError

__all__ = ["AiohttpClient"]

_NOT_ON_ASYNCIO = (
    "transport='aiohttp' runs only on asyncio (aiohttp is built on it), and no asyncio "
    "event loop is running here (trio?); use the default transport='httpx', which runs "
    "on asyncio and trio alike"
)


class AiohttpClient(HttpxAiohttpClient):
    """An ``httpx.AsyncClient`` that sends through aiohttp, and says so on trio."""

    async def send(self, request: httpx.Request, **kwargs: Any) -> httpx.Response:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            raise InvalidRequestError(_NOT_ON_ASYNCIO) from None
        return await super().send(request, **kwargs)
