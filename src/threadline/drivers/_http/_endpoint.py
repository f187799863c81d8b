"""What every HTTP driver's constructor sets up from its connection, in one place.

An HTTP driver is a wire protocol (its own folder) spoken to an endpoint
reached through an :class:`~threadline.drivers.HTTPConnection`.
:class:`HTTPEndpoint` resolves the connection with what the driver says of
its provider (the base URL it settled on, the environment variable the key
is read from, the header it travels in, the driver's own fixed headers) and
builds and sends the requests, so ``OpenAIChatDriver`` and
``AnthropicDriver`` differ only in what they say. :class:`HTTPDriver` is
what such a driver is beside its protocol: its ``repr``, its connection and
its closing.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import httpx

from threadline._closing import AsyncClosing
from threadline._provider import Driver
from threadline._sentinel import NOT_GIVEN, NotGiven
from threadline._validate import fail
from threadline.drivers._http._client import (
    DEFAULT_TIMEOUT,
    RetryPolicy,
    Secret,
    build_http_client,
    header_secrets,
    send_with_retries,
)
from threadline.drivers._http._connection import HTTPConnection, TimeoutArg
from threadline.drivers._http._errors import ErrorMapper

__all__ = [
    "HTTPDriver",
    "HTTPEndpoint",
    "check_bool",
    "check_optional_str",
]


def check_optional_str(name: str, value: object) -> str | None:
    """``value`` when it is ``None`` or a str."""
    if value is not None and not isinstance(value, str):
        fail(name, "a str or None", value)
    return value


def check_bool(name: str, value: object) -> bool:
    """``value`` when it is ``True`` or ``False``."""
    if not isinstance(value, bool):
        fail(name, "True or False", value)
    return value


class HTTPEndpoint:
    """One HTTP driver's endpoint: its connection resolved for the driver's provider.

    ``base_url`` is the root the driver settled on (its argument, else its
    environment variable, else the provider's own); the key is the
    connection's, else ``$api_key_env``. ``key_header`` and ``key_prefix``
    say how the key travels (``authorization: Bearer <key>``, or
    ``x-api-key: <key>``); ``headers`` are the driver's own fixed headers,
    which the connection's ``default_headers`` may override. The key (and any
    credential-like header) is redacted from every error.

    Raises:
        ImportError: ``transport="aiohttp"`` without httpx-aiohttp.
    """

    def __init__(
        self,
        provider: str,
        connection: HTTPConnection,
        *,
        base_url: str,
        api_key_env: str,
        key_header: str,
        key_prefix: str = "",
        headers: Mapping[str, str],
    ) -> None:
        key = connection.api_key
        if key is None:
            from_env = os.environ.get(api_key_env)
            key = Secret(from_env) if from_env else None
        self.connection = connection
        self.base_url = base_url
        self.api_key = key if key is not None and key.reveal() else None
        self.retry_policy = connection.retry_policy
        self.clock = connection.clock
        self.headers = {**headers, **connection.default_headers}
        secrets = [self.api_key.reveal()] if self.api_key is not None else []
        self.errors = ErrorMapper(provider, secrets=[*secrets, *header_secrets(self.headers)])
        self._key_header = key_header
        self._key_prefix = key_prefix
        given = connection.http_client
        self.owns_client = given is None
        # The driver's own client carries the time-out; a given one keeps its
        # own unless the connection sets one, which then goes on each request.
        self._timeout: TimeoutArg = NOT_GIVEN if given is None else connection.timeout
        if given is None:
            timeout = connection.timeout
            own = DEFAULT_TIMEOUT if isinstance(timeout, NotGiven) else timeout
            given = build_http_client(timeout=own, transport=connection.transport)
        self.client = given

    def describe(self, driver: str) -> str:
        """``Driver(base_url='scheme://host:port/path', api_key=<set>)``: no secret, no query."""
        url = httpx.URL(self.base_url)
        port = f":{url.port}" if url.port else ""
        shown = f"{url.scheme}://{url.host}{port}{url.path}"
        key = "set" if self.api_key else "unset"
        return f"{driver}(base_url={shown!r}, api_key=<{key}>)"

    def request(self, url: httpx.URL | str, content: bytes, *, stream: bool) -> httpx.Request:
        """A POST of ``content`` to ``url`` with the headers, the key and the time-out."""
        headers = dict(self.headers)
        if stream:
            headers["accept"] = "text/event-stream"
        if self.api_key is not None:
            headers[self._key_header] = f"{self._key_prefix}{self.api_key.reveal()}"
        extra: dict[str, Any] = {}
        if not isinstance(self._timeout, NotGiven):
            extra["timeout"] = self._timeout
        return self.client.build_request("POST", url, content=content, headers=headers, **extra)

    async def send(self, request: httpx.Request, *, stream: bool = False) -> httpx.Response:
        """``request`` sent with the retry policy; a 2xx response, or the mapped error."""
        return await send_with_retries(
            self.client,
            request,
            policy=self.retry_policy,
            errors=self.errors,
            clock=self.clock,
            stream=stream,
        )

    async def aclose(self) -> None:
        """Close the client, when the endpoint built it."""
        if self.owns_client:
            await self.client.aclose()


class HTTPDriver(AsyncClosing, Driver):
    """What an HTTP driver is beside its protocol: its repr, its connection and its closing.

    A subclass sets ``self._http`` to its :class:`HTTPEndpoint` in ``__init__``
    and implements the rest of :class:`~threadline.drivers.Driver`.
    """

    _http: HTTPEndpoint

    def __repr__(self) -> str:
        return self._http.describe(type(self).__name__)

    @property
    def connection(self) -> HTTPConnection:
        """The connection the driver was built with, its keyword arguments applied."""
        return self._http.connection

    @property
    def retry_policy(self) -> RetryPolicy:
        """The retry policy in force."""
        return self._http.retry_policy

    async def aclose(self) -> None:
        """Close the HTTP client, when the driver built it; a client given to it stays open."""
        await self._http.aclose()
