"""What every HTTP driver's constructor sets up, checked once, in one place.

An HTTP driver is a wire protocol (its own module) spoken to an endpoint:
a base URL (the argument, else an environment variable, else the provider's
own), an API key (the argument, else an environment variable) sent in one
header, fixed and extra headers, a pooled ``httpx.AsyncClient`` (the
driver's own or the caller's), a time-out, a retry policy and a clock.
:class:`HTTPEndpoint` holds all of it and builds and sends the requests, so
``OpenAIChatDriver`` and ``AnthropicDriver`` differ only in what they say.

Every argument is checked at construction, with a message naming it; a bad
one never surfaces later as a raw ``httpx.InvalidURL`` or ``TypeError``. No
message shows an API key, a header's value or a URL's user-info.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from typing import Any, NoReturn

import attrs
import httpx

from threadline._closing import AsyncClosing
from threadline._errors import InvalidRequestError
from threadline._sentinel import NOT_GIVEN, NotGiven
from threadline._validate import fail, non_negative_int
from threadline.drivers._http import (
    DEFAULT_TIMEOUT,
    Clock,
    RetryPolicy,
    Secret,
    SystemClock,
    Transport,
    build_http_client,
    check_transport,
    header_secrets,
    send_with_retries,
)
from threadline.drivers._http_errors import ErrorMapper

__all__ = [
    "HTTPDriver",
    "HTTPEndpoint",
    "check_bool",
    "check_optional_str",
    "resolve_base_url",
]

TimeoutArg = float | httpx.Timeout | NotGiven | None
"""A driver's ``timeout=``: seconds, an ``httpx.Timeout``, ``None`` (no time-out) or not given."""

_USER_INFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)?.*@")
_FORBIDDEN_IN_HEADERS = ("\r", "\n", "\0")


def _refuse(message: str) -> NoReturn:
    raise InvalidRequestError(message)


def _shown_url(text: str) -> str:
    """``text`` without user-info (a password), query or fragment: safe to print."""
    return _USER_INFO.sub(r"\1***@", text).partition("?")[0].partition("#")[0]


def resolve_base_url(base_url: object, *, env: str, default: str) -> str:
    """The API root: ``base_url``, else ``$env`` (when set and not empty), else ``default``.

    Raises:
        InvalidRequestError: the URL is not ``http://`` or ``https://`` with a
            host, or cannot be parsed; the message names the argument or the
            environment variable it came from.
    """
    name = "base_url"
    if base_url is None:
        from_env = os.environ.get(env, "").strip()
        base_url, name = (from_env, env) if from_env else (default, "base_url")
    if not isinstance(base_url, str):
        _refuse(f"base_url must be a str URL or None, not {type(base_url).__name__}")
    reason = _url_problem(base_url)
    if reason is not None:
        _refuse(
            f"{name} must be an http:// or https:// URL such as 'http://127.0.0.1:8080/v1', "
            f"not {_shown_url(base_url)!r}: {reason}"
        )
    return base_url.rstrip("/")


def _url_problem(text: str) -> str | None:
    try:
        url = httpx.URL(text)
    except httpx.InvalidURL as exc:
        return str(exc)  # httpx names the part: "Invalid port: ':1'"
    if url.scheme not in ("http", "https"):
        return f"the scheme is {url.scheme!r}" if url.scheme else "there is no scheme"
    if not url.host:
        return "there is no host"
    if url.port is not None and not 0 < url.port < 65536:
        return f"port {url.port} is out of range"
    return None


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


def _check_api_key(value: object) -> str | None:
    # The value itself is never shown: a wrong type may still be the key.
    if value is not None and not isinstance(value, str):
        _refuse(f"api_key must be a str or None, not {type(value).__name__}")
    return value


def _seconds(value: object) -> float | None:
    """``value`` as seconds when it is a finite number above 0, else ``None``."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if math.isfinite(value) and value > 0 else None


def _check_timeout(value: object) -> TimeoutArg:
    if value is None or isinstance(value, NotGiven):
        return value
    if isinstance(value, httpx.Timeout):
        parts = (value.connect, value.read, value.write, value.pool)
        if not all(part is None or _seconds(part) is not None for part in parts):
            fail("timeout", "an httpx.Timeout whose parts are None or positive seconds", value)
        return value
    seconds = _seconds(value)
    if seconds is None:
        fail("timeout", "a positive number of seconds, an httpx.Timeout or None", value)
    return seconds


def _check_policy(retry_policy: object, max_retries: object) -> RetryPolicy:
    if retry_policy is RetryPolicy:
        _refuse(
            "retry_policy must be a RetryPolicy instance such as RetryPolicy(max_retries=3), "
            "not the RetryPolicy class itself"
        )
    if retry_policy is not None and not isinstance(retry_policy, RetryPolicy):
        fail("retry_policy", "a RetryPolicy or None", retry_policy)
    policy = retry_policy or RetryPolicy()
    if max_retries is not None:
        policy = attrs.evolve(policy, max_retries=non_negative_int("max_retries", max_retries))
    return policy


def _check_clock(clock: object) -> Clock:
    if clock is None:
        return SystemClock()
    if not isinstance(clock, Clock):
        fail("clock", "None or an object with now() and async sleep(seconds)", clock)
    return clock


def _check_headers(default_headers: object) -> dict[str, str]:
    if default_headers is None:
        return {}
    if not isinstance(default_headers, Mapping):
        _refuse(
            "default_headers must be a mapping of str to str or None, "
            f"not {type(default_headers).__name__}"
        )
    checked: dict[str, str] = {}
    for name, value in default_headers.items():
        if not isinstance(name, str) or not name.strip():
            _refuse(f"default_headers: a header name must be a non-empty str, not {name!r}")
        # A header's value is never shown: it may be a credential.
        if not isinstance(value, str):
            _refuse(f"default_headers[{name!r}] must be a str, not {type(value).__name__}")
        if any(char in name + value for char in _FORBIDDEN_IN_HEADERS):
            _refuse(f"default_headers[{name!r}]: a header cannot hold CR, LF or NUL")
        checked[name.lower()] = value
    return checked


def _check_client(http_client: object, transport: Transport) -> httpx.AsyncClient | None:
    if http_client is not None and not isinstance(http_client, httpx.AsyncClient):
        hint = " (an httpx.Client is synchronous)" if isinstance(http_client, httpx.Client) else ""
        _refuse(
            f"http_client must be an httpx.AsyncClient or None, "
            f"not {type(http_client).__name__}{hint}"
        )
    check_transport(transport, http_client)
    return http_client


class HTTPEndpoint:
    """One HTTP driver's endpoint: base URL, key, headers, client, time-out, retries.

    ``key_header`` and ``key_prefix`` say how the key travels
    (``authorization: Bearer <key>``, or ``x-api-key: <key>``); ``headers`` are
    the driver's own fixed headers, which ``default_headers`` may override.
    The key (and any credential-like header) is redacted from every error.

    Raises:
        InvalidRequestError: any argument of the wrong kind, named.
        ImportError: ``transport="aiohttp"`` without httpx-aiohttp.
    """

    def __init__(
        self,
        provider: str,
        *,
        base_url: str,
        api_key: object,
        api_key_env: str,
        key_header: str,
        key_prefix: str = "",
        headers: Mapping[str, str],
        default_headers: object,
        http_client: object,
        transport: Transport,
        timeout: object,
        max_retries: object,
        retry_policy: object,
        clock: object,
    ) -> None:
        key = _check_api_key(api_key)
        if key is None:
            key = os.environ.get(api_key_env)
        self.base_url = base_url
        self.api_key = Secret(key) if key else None
        self.retry_policy = _check_policy(retry_policy, max_retries)
        self.clock = _check_clock(clock)
        self.headers = {**headers, **_check_headers(default_headers)}
        self.errors = ErrorMapper(
            provider, secrets=[*([key] if key else []), *header_secrets(self.headers)]
        )
        self._key_header = key_header
        self._key_prefix = key_prefix
        checked_timeout = _check_timeout(timeout)
        given = _check_client(http_client, transport)
        self.owns_client = given is None
        # The driver's own client carries the time-out; a given one keeps its
        # own unless the caller set one here, which then goes on each request.
        self._timeout: TimeoutArg = NOT_GIVEN if given is None else checked_timeout
        if given is None:
            own = DEFAULT_TIMEOUT if isinstance(checked_timeout, NotGiven) else checked_timeout
            given = build_http_client(timeout=own, transport=transport)
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


class HTTPDriver(AsyncClosing):
    """What an HTTP driver does beside its protocol: its repr, retry policy and closing.

    A subclass sets ``self._http`` to its :class:`HTTPEndpoint` in ``__init__``.
    """

    _http: HTTPEndpoint

    def __repr__(self) -> str:
        return self._http.describe(type(self).__name__)

    @property
    def retry_policy(self) -> RetryPolicy:
        """The retry policy in force."""
        return self._http.retry_policy

    async def aclose(self) -> None:
        """Close the HTTP client, when the driver built it; a client given to it stays open."""
        await self._http.aclose()
