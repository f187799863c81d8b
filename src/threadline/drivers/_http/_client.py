"""HTTP plumbing shared by every HTTP driver: the client, the retry policy, sending.

One retry policy serves every driver, and it is small enough to read at once:

- retried: HTTP 408, 409, 429 and 5xx, and failures that produced no response
  (connection refused or reset, time-outs);
- not retried: everything else (a 400 or a 401 will not get better), and a
  5xx whose body says the prompt is too long for the context window;
- the wait before retry ``n`` (1-based) is ``initial_delay * 2 ** (n - 1)``
  capped at ``max_delay``, less up to ``jitter`` of it at random, so clients
  that failed together do not return together;
- a server's ``retry-after-ms`` or ``retry-after`` (seconds, or an HTTP date)
  replaces that wait, clamped to ``[0, max_retry_after]``;
- a server's ``x-should-retry: true`` or ``false`` (Anthropic sends it) overrides
  the status rule, though never the retry count or a context-length refusal.

A stream is retried only before any of its body has been read: once the first
byte is consumed, a failure is raised, never replayed. Waiting goes through a
:class:`Clock`, so tests pass a fake one and nothing really sleeps.
"""

from __future__ import annotations

import email.utils
import hmac
import logging
import math
import random
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from typing import Any, Literal, Protocol, get_args, runtime_checkable

import anyio
import attrs
import httpx

from threadline._errors import InvalidRequestError
from threadline.drivers._http._errors import (
    ErrorMapper,
    context_length_details,
    parse_error_body,
    retry_info_seconds,
)
from threadline.drivers._http._sse import StreamProgress

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_TIMEOUT",
    "SECRET_HEADER_WORDS",
    "Clock",
    "RetryPolicy",
    "Secret",
    "SystemClock",
    "Transport",
    "build_http_client",
    "check_transport",
    "finish_reading",
    "header_secrets",
    "is_retryable_status",
    "read_body",
    "request_id_of",
    "retry_after_seconds",
    "send_with_retries",
]

logger = logging.getLogger("threadline.http")

DEFAULT_TIMEOUT = httpx.Timeout(600.0, connect=5.0)
"""A long read time-out (a model may think for minutes), a short connect time-out."""

DEFAULT_LIMITS = httpx.Limits(max_connections=100, max_keepalive_connections=20)
"""httpx's own limits. On httpx's pool they cost a third of the CPU of a larger
one (1.6 ms against 4.4 ms a request at 50 concurrent with 100 kept alive,
``benchmarks/bench_request.py``): httpcore scans every connection for every
request. aiohttp's pool (the default on asyncio) is capped at 100 connections."""

_RETRYABLE_TRANSPORT_ERRORS = (
    httpx.TimeoutException,
    httpx.NetworkError,
    httpx.RemoteProtocolError,
)
"""No response came back, and sending again may work. A bad URL scheme or a
local protocol error will not improve, so those are raised at once."""


Transport = Literal["auto", "httpx", "aiohttp"]
"""Which connection pool sends: ``"auto"`` (the default) aiohttp's on asyncio
when ``threadline[aiohttp]`` is installed, else httpx's; ``"httpx"`` httpx's own
always (asyncio and trio; what respx's default mocker patches); ``"aiohttp"``
aiohttp's always (asyncio only; an error on trio or without the package)."""

_AIOHTTP_MISSING = (
    "transport='aiohttp' needs the httpx-aiohttp package: pip install 'threadline[aiohttp]'"
)

SECRET_HEADER_WORDS = ("auth", "key", "token", "secret")
_DRAIN_SECONDS = 1.0


class Secret:
    """A credential that prints as ``'<hidden>'`` everywhere but the wire."""

    __slots__ = ("_value",)

    def __init__(self, value: str) -> None:
        self._value = value

    def reveal(self) -> str:
        return self._value

    def __repr__(self) -> str:
        return "'<hidden>'"

    __str__ = __repr__

    # Equal secrets make equal connections (HTTPConnection is a value);
    # compared in constant time, as credentials are.
    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Secret):
            return NotImplemented
        return hmac.compare_digest(self._value.encode(), other._value.encode())

    def __hash__(self) -> int:
        return hash((Secret, self._value))


def header_secrets(headers: Mapping[str, str]) -> list[str]:
    """The values of credential-like headers, for an ``ErrorMapper`` to redact.

    "Bearer sk-..." and "Basic ..." carry the secret as their last word; a
    server that echoes the key echoes that word alone, so both are returned.
    """
    found: list[str] = []
    for name, value in headers.items():
        if any(word in name.lower() for word in SECRET_HEADER_WORDS) and value.strip():
            found += {value, value.split()[-1]}
    return found


async def finish_reading(events: AsyncGenerator[Any, None], *, drain: bool) -> None:
    """Bring a stream's reader (and httpx's generators under it) to an end, never abandon it.

    An async generator dropped mid-iteration is finalized by the garbage
    collector, which trio reports as a ``ResourceWarning``; httpx's byte
    iterators nest several. Reading on under a cancel scope ends them all:
    after the stream's last event briefly, to reach the end of the body so the
    connection goes back to the pool; otherwise (an error, a caller who left
    early) at the next read, which cancellation interrupts at once.
    """
    with anyio.move_on_after(_DRAIN_SECONDS if drain else 0):
        async for _ in events:
            pass
    await events.aclose()


async def read_body(
    response: httpx.Response, errors: ErrorMapper, progress: StreamProgress
) -> bytes:
    """The rest of a streamed ``response``'s body; a broken connection is the mapped error."""
    try:
        return await response.aread()
    except httpx.TransportError as exc:
        failure = errors.from_transport(exc, progress=progress)
    raise failure  # past the except block: httpx's exception holds the request's headers


def build_http_client(
    *,
    timeout: httpx.Timeout | float | None = DEFAULT_TIMEOUT,
    limits: httpx.Limits = DEFAULT_LIMITS,
    headers: Mapping[str, str] | None = None,
    transport: Transport = "auto",
) -> httpx.AsyncClient:
    """A pooled ``httpx.AsyncClient`` with timeouts and limits fit for model calls.

    ``transport="auto"`` sends through aiohttp's pool on asyncio when it is
    installed and through httpx's otherwise (see
    :mod:`threadline.drivers._http._transport`); ``"aiohttp"`` always through
    aiohttp's (:mod:`threadline.drivers._http._aiohttp`), ``"httpx"`` always
    through httpx's. The client is the same ``httpx`` interface either way.
    Redirects are not followed: an API endpoint that redirects is
    misconfigured, and following it would resend the credentials elsewhere.

    Raises:
        InvalidRequestError: ``transport`` is not ``"auto"``, ``"httpx"`` or ``"aiohttp"``.
        ImportError: ``"aiohttp"`` without httpx-aiohttp installed; the message
            names the ``pip install``.
    """
    check_transport(transport, None)
    client_class: type[httpx.AsyncClient] = httpx.AsyncClient
    if transport == "auto":
        from threadline.drivers._http._transport import AutoClient

        client_class = AutoClient
    elif transport == "aiohttp":
        try:
            from threadline.drivers._http._aiohttp import AiohttpClient
        except ImportError as exc:
            raise ImportError(_AIOHTTP_MISSING, name=exc.name) from exc
        client_class = AiohttpClient
    return client_class(
        timeout=timeout,
        limits=limits,
        headers=headers,
        follow_redirects=False,
    )


def check_transport(transport: Transport, http_client: httpx.AsyncClient | None) -> None:
    """Refuse an unknown ``transport``, or a choice next to a client of the caller's own.

    Raises:
        InvalidRequestError: ``transport`` is not ``"auto"``, ``"httpx"`` or
            ``"aiohttp"``, or both an ``http_client`` and ``transport="aiohttp"``
            were given.
    """
    if transport not in get_args(Transport):
        raise InvalidRequestError(
            f"transport must be 'auto', 'httpx' or 'aiohttp', not {transport!r}"
        )
    if http_client is not None and transport == "aiohttp":
        raise InvalidRequestError(
            f"transport={transport!r} chooses the pool of the driver's own client; with "
            "http_client= the given client sends as it is (build it on the transport you want)"
        )


@runtime_checkable
class Clock(Protocol):
    """What retrying needs of time: the wall clock, and a way to wait."""

    def now(self) -> float:
        """Seconds since the epoch (to read ``retry-after`` HTTP dates)."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds``."""
        ...


@attrs.frozen
class SystemClock:
    """The real clock: ``time.time`` and ``anyio.sleep``; every instance is equal."""

    def now(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await anyio.sleep(seconds)

    def __repr__(self) -> str:
        return "SystemClock()"


def is_retryable_status(status: int) -> bool:
    """True for the statuses worth sending again: 408, 409, 429 and 5xx."""
    return status in (408, 409, 429) or 500 <= status < 600


def request_id_of(headers: Mapping[str, str]) -> str | None:
    """The id the provider gave the request: ``x-request-id`` or (Anthropic) ``request-id``."""
    return headers.get("x-request-id") or headers.get("request-id")


def _should_retry(status: int, headers: Mapping[str, str]) -> bool:
    asked = headers.get("x-should-retry", "").strip().lower()
    if asked in ("true", "false"):
        return asked == "true"
    return is_retryable_status(status)


def _parse_seconds(value: str) -> float | None:
    try:
        seconds = float(value)
    except ValueError:
        return None
    return seconds if math.isfinite(seconds) else None


def retry_after_seconds(headers: Mapping[str, str], *, now: float) -> float | None:
    """How long the server asked us to wait, or ``None`` when it did not say.

    ``retry-after-ms`` (milliseconds) wins over ``retry-after`` (seconds, or an
    HTTP date read against ``now``). The result may be negative (a date in the
    past); :meth:`RetryPolicy.delay` clamps it.
    """
    millis = headers.get("retry-after-ms")
    if millis is not None:
        parsed = _parse_seconds(millis)
        if parsed is not None:
            return parsed / 1000.0
    value = headers.get("retry-after")
    if value is None:
        return None
    seconds = _parse_seconds(value)
    if seconds is not None:
        return seconds
    try:
        moment = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    return moment.timestamp() - now


def _non_negative(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
        raise InvalidRequestError(f"RetryPolicy.{attribute.name} must be >= 0, not {value!r}")


def _fraction(instance: object, attribute: attrs.Attribute[float], value: float) -> None:
    _non_negative(instance, attribute, value)
    if value > 1:
        raise InvalidRequestError(f"RetryPolicy.{attribute.name} must be <= 1, not {value!r}")


def _retry_count(instance: object, attribute: attrs.Attribute[int], value: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidRequestError(
            f"RetryPolicy.{attribute.name} must be an int >= 0, not {value!r}"
        )


@attrs.frozen(kw_only=True)
class RetryPolicy:
    """When and how long to wait before sending a failed request again.

    Example::

        RetryPolicy(max_retries=5, max_delay=30.0)   # patient
        RetryPolicy(max_retries=0)                   # fail at once

    Raises:
        InvalidRequestError: a negative count or delay, or a jitter above 1.
    """

    max_retries: int = attrs.field(default=2, validator=_retry_count)
    """Retries after the first attempt (so ``max_retries + 1`` attempts at most)."""
    initial_delay: float = attrs.field(default=0.5, validator=_non_negative)
    """The wait before the first retry, in seconds."""
    max_delay: float = attrs.field(default=8.0, validator=_non_negative)
    """The longest computed wait, in seconds."""
    jitter: float = attrs.field(default=0.25, validator=_fraction)
    """The share of each computed wait taken off at random (0 for exact waits)."""
    max_retry_after: float = attrs.field(default=60.0, validator=_non_negative)
    """The longest wait a server's ``retry-after`` may impose, in seconds."""

    def backoff(self, retry: int, *, random_value: float) -> float:
        """The computed wait before retry number ``retry`` (1-based).

        ``random_value`` in ``[0, 1)`` picks the jitter; the result lies in
        ``[base * (1 - jitter), base]`` where ``base`` is the capped exponential.
        """
        base = min(self.initial_delay * 2.0 ** max(retry - 1, 0), self.max_delay)
        return base * (1.0 - self.jitter * random_value)

    def delay(
        self,
        retry: int,
        *,
        headers: Mapping[str, str] | None = None,
        now: float,
        random_value: float,
    ) -> float:
        """The wait before retry ``retry``: the server's ask if any, else :meth:`backoff`."""
        if headers is not None:
            asked = retry_after_seconds(headers, now=now)
            if asked is not None:
                return min(max(asked, 0.0), self.max_retry_after)
        return self.backoff(retry, random_value=random_value)


def _where(request: httpx.Request) -> str:
    # Scheme, host and path only: a query string or user-info may carry a secret.
    url = request.url
    port = f":{url.port}" if url.port else ""
    return f"{request.method} {url.scheme}://{url.host}{port}{url.path}"


async def _read_error_body(response: httpx.Response) -> str:
    try:
        await response.aread()
    except httpx.HTTPError:
        return ""
    finally:
        await response.aclose()
    return response.text


async def send_with_retries(
    client: httpx.AsyncClient,
    request: httpx.Request,
    *,
    policy: RetryPolicy,
    errors: ErrorMapper,
    clock: Clock | None = None,
    stream: bool = False,
    random_value: Callable[[], float] = random.random,
) -> httpx.Response:
    """Send ``request`` until it succeeds or the policy gives up.

    With ``stream=True`` the successful response is returned unread (the caller
    must close it); only failures seen before its body was read are retried.

    Returns:
        A 2xx response.

    Raises:
        ProviderError: the mapped error of the last attempt (see ``ErrorMapper``).
    """
    clock = clock or SystemClock()
    retry = 0
    while True:
        failure: httpx.TransportError | None = None
        try:
            response = await client.send(request, stream=stream)
        except httpx.TransportError as exc:
            failure = exc
        # Raised here, past the except block: httpx's exception (its request's
        # headers hold the key) must not become the error's __context__.
        if failure is not None:
            if not isinstance(failure, _RETRYABLE_TRANSPORT_ERRORS) or retry >= policy.max_retries:
                raise errors.from_transport(failure)
            retry += 1
            wait = policy.delay(retry, now=clock.now(), random_value=random_value())
            _log_retry(request, retry, policy, wait, f"{type(failure).__name__}", None)
            await clock.sleep(wait)
            continue

        if response.is_success:
            return response
        body = await _read_error_body(response) if stream else response.text
        request_id = request_id_of(response.headers)
        status = response.status_code
        if (
            retry < policy.max_retries
            and _should_retry(status, response.headers)
            and context_length_details(parse_error_body(body)) is None
        ):
            retry += 1
            wait = policy.delay(
                retry,
                headers=_asked(response.headers, body),
                now=clock.now(),
                random_value=random_value(),
            )
            _log_retry(request, retry, policy, wait, f"status {status}", request_id)
            await clock.sleep(wait)
            continue
        raise errors.from_response(
            status,
            body,
            request_id=request_id,
            reason=response.reason_phrase,
            headers=response.headers,
        )


def _asked(headers: Mapping[str, str], body: str) -> Mapping[str, str]:
    """The headers a wait is read from: the response's, or, when they name none, the
    ``RetryInfo.retryDelay`` of a google.rpc error body (Gemini's) as a ``retry-after``."""
    if "retry-after" in headers or "retry-after-ms" in headers:
        return headers
    seconds = retry_info_seconds(body)
    return headers if seconds is None else {"retry-after": str(seconds)}


def _log_retry(
    request: httpx.Request,
    retry: int,
    policy: RetryPolicy,
    wait: float,
    cause: str,
    request_id: str | None,
) -> None:
    logger.info(
        "retrying %s in %.3fs (retry %d of %d) after %s%s",
        _where(request),
        wait,
        retry,
        policy.max_retries,
        cause,
        f", request id {request_id}" if request_id else "",
    )
