"""``HTTPConnection``: where and how an HTTP driver connects, as one value.

Every HTTP driver speaks its protocol to an endpoint reached the same way: a
base URL, an API key, an ``httpx.AsyncClient`` (the driver's own or the
caller's) on a transport, a time-out, a retry policy, extra headers and a
clock. Those nine are one frozen value, checked once where it is made, that
every HTTP driver takes as ``connection=``; a driver also takes each of them
as a keyword of its own (a shortcut), which overrides that field of the
connection. What differs by provider (the environment variables, the default
URL, the header the key travels in) the driver says when it resolves the
connection (see ``_endpoint``).

Every argument is checked with a message naming it; a bad one never surfaces
later as a raw ``httpx.InvalidURL`` or ``TypeError``. No message and no
``repr`` shows an API key, a credential-like header's value or a URL's
user-info.
"""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any, NoReturn, TypedDict

import attrs
import httpx

from threadline._errors import InvalidRequestError
from threadline._sentinel import NOT_GIVEN, NotGiven
from threadline._validate import fail, non_negative_int
from threadline.drivers._http._client import (
    SECRET_HEADER_WORDS,
    Clock,
    RetryPolicy,
    Secret,
    SystemClock,
    Transport,
    check_transport,
)

__all__ = [
    "ConnectionOptions",
    "HTTPConnection",
    "TimeoutArg",
    "connection_of",
    "resolve_base_url",
    "shown_url",
]

TimeoutArg = float | httpx.Timeout | NotGiven | None
"""A connection's ``timeout``: seconds, an ``httpx.Timeout``, ``None`` (none) or not given."""

_USER_INFO = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*://)?.*@")
_FORBIDDEN_IN_HEADERS = ("\r", "\n", "\0")


class ConnectionOptions(TypedDict, total=False):
    """The connection's fields an HTTP driver also takes as keywords of its own.

    ``base_url`` and ``api_key`` are named in each driver's signature; these
    seven come through ``**options``, declared here once for every driver.
    """

    http_client: httpx.AsyncClient | None
    transport: Transport
    timeout: float | httpx.Timeout | NotGiven | None
    max_retries: int | None
    retry_policy: RetryPolicy | None
    default_headers: Mapping[str, str] | None
    clock: Clock | None


def _refuse(message: str) -> NoReturn:
    raise InvalidRequestError(message)


def shown_url(text: str) -> str:
    """``text`` without user-info (a password), query or fragment: safe to print."""
    return _USER_INFO.sub(r"\1***@", text).partition("?")[0].partition("#")[0]


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


def _check_url(base_url: object, name: str) -> str:
    if not isinstance(base_url, str):
        _refuse(f"base_url must be a str URL or None, not {type(base_url).__name__}")
    reason = _url_problem(base_url)
    if reason is not None:
        _refuse(
            f"{name} must be an http:// or https:// URL such as 'http://127.0.0.1:8080/v1', "
            f"not {shown_url(base_url)!r}: {reason}"
        )
    return base_url


def resolve_base_url(base_url: object, *, env: str, default: str) -> str:
    """The API root: ``base_url``, else ``$env`` (when set and not empty), else ``default``.

    Raises:
        InvalidRequestError: the URL is not ``http://`` or ``https://`` with a
            host, or cannot be parsed; the message names the argument or the
            environment variable it came from.
    """
    if base_url is None:
        from_env = os.environ.get(env, "").strip()
        return _check_url(from_env, env).rstrip("/") if from_env else default.rstrip("/")
    return _check_url(base_url, "base_url").rstrip("/")


def _check_api_key(value: object) -> Secret | None:
    # The value itself is never shown: a wrong type may still be the key.
    if value is None or isinstance(value, Secret):
        return value
    if not isinstance(value, str):
        _refuse(f"api_key must be a str or None, not {type(value).__name__}")
    return Secret(value)


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


def _shown_base_url(base_url: str | None) -> str:
    return repr(None if base_url is None else shown_url(base_url))


def _shown_headers(headers: Mapping[str, str]) -> str:
    shown = {
        name: "<hidden>" if any(word in name for word in SECRET_HEADER_WORDS) else value
        for name, value in headers.items()
    }
    return repr(shown)


@attrs.frozen(init=False)
class HTTPConnection:
    """Where and how an HTTP driver connects: one value every HTTP driver takes.

    Args:
        base_url: the API root; ``None`` leaves it to the driver, which reads
            its environment variable (``OPENAI_BASE_URL``,
            ``ANTHROPIC_BASE_URL``) and else uses the provider's own.
        api_key: the credential; ``None`` leaves it to the driver, which reads
            its environment variable (``OPENAI_API_KEY``, ``ANTHROPIC_API_KEY``)
            and else sends none. Kept as a ``Secret``: it never appears in a
            ``repr``, a log record or an exception.
        http_client: an ``httpx.AsyncClient`` to send with, on any transport.
            A driver does not close a client it was given, so drivers may
            share one. ``None``: each driver builds a pooled one of its own,
            which its ``aclose()`` closes.
        transport: the connection pool of a driver's own client: ``"auto"``
            (default: aiohttp's on asyncio when ``threadline[aiohttp]`` is
            installed, several times the requests per second of httpx's; else
            httpx's), ``"httpx"`` (httpx's always; asyncio and trio) or
            ``"aiohttp"`` (aiohttp's always; asyncio only). ``"aiohttp"`` is
            not taken with ``http_client``, which sends as it is.
        timeout: per-request time-out: seconds, an ``httpx.Timeout``, or
            ``None`` for none. Not given, a driver's own client uses
            ``DEFAULT_TIMEOUT`` (600 s read, 5 s connect) and a given client
            keeps its own.
        max_retries: retries after the first attempt; overrides
            ``retry_policy.max_retries`` (default 2).
        retry_policy: the waits between retries (``RetryPolicy``).
        default_headers: extra headers on every request (names are lowered).
        clock: what retries wait on; tests pass a fake one.

    Raises:
        InvalidRequestError: an argument of the wrong kind, named: a base URL
            that is not ``http(s)://host...``, a ``RetryPolicy`` class instead
            of an instance, a negative or NaN time-out, a header that is not text.

    A driver's own keywords override the fields of the connection it is
    given, and ``attrs.evolve(connection, timeout=5.0)`` is a copy with one
    field changed (checked again).

    Example::

        shared = HTTPConnection(timeout=30.0, max_retries=5)
        chat = OpenAIChatDriver("http://127.0.0.1:8080/v1", connection=shared)
        claude = AnthropicDriver(connection=shared)          # reads ANTHROPIC_API_KEY
    """

    base_url: str | None = attrs.field(repr=_shown_base_url)
    api_key: Secret | None
    http_client: httpx.AsyncClient | None
    transport: Transport
    timeout: TimeoutArg = attrs.field(hash=False)
    retry_policy: RetryPolicy
    default_headers: Mapping[str, str] = attrs.field(hash=False, repr=_shown_headers)
    clock: Clock

    def __init__(
        self,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        http_client: httpx.AsyncClient | None = None,
        transport: Transport = "auto",
        timeout: float | httpx.Timeout | NotGiven | None = NOT_GIVEN,
        max_retries: int | None = None,
        retry_policy: RetryPolicy | None = None,
        default_headers: Mapping[str, str] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self.__attrs_init__(
            base_url=None if base_url is None else _check_url(base_url, "base_url"),
            api_key=_check_api_key(api_key),
            retry_policy=_check_policy(retry_policy, max_retries),
            clock=_check_clock(clock),
            default_headers=MappingProxyType(_check_headers(default_headers)),
            timeout=_check_timeout(timeout),
            http_client=_check_client(http_client, transport),
            transport=transport,
        )


def connection_of(
    driver: str,
    connection: object,
    *,
    base_url: object,
    api_key: object,
    options: Mapping[str, Any],
) -> HTTPConnection:
    """The connection a driver was given, with its shortcut keywords applied over it.

    Raises:
        InvalidRequestError: ``connection`` is not an ``HTTPConnection``, or a
            shortcut is of the wrong kind, named.
        TypeError: a keyword ``driver`` does not take.
    """
    if connection is not None and not isinstance(connection, HTTPConnection):
        fail("connection", "an HTTPConnection or None", connection)
    unknown = sorted(set(options) - set(ConnectionOptions.__annotations__))
    if unknown:
        raise TypeError(f"{driver}() got an unexpected keyword argument {unknown[0]!r}")
    given = dict(options)
    # None is "not given" for these two: the driver then reads its environment.
    if base_url is not None:
        given["base_url"] = base_url
    if api_key is not None:
        given["api_key"] = api_key
    base = connection or _DEFAULT
    # evolve passes every field back through __init__, so each is checked again
    # and max_retries lands in the retry policy, as it does at construction.
    return attrs.evolve(base, **given) if given else base


_DEFAULT = HTTPConnection()
