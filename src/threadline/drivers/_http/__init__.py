"""The HTTP layer every HTTP driver shares: one room, so a new driver only says its protocol.

- ``_connection``: :class:`HTTPConnection`, the one value of where and how a
  driver connects (base URL, key, client, transport, time-out, retries,
  headers, clock), checked once;
- ``_endpoint``: that connection resolved for one provider, building and
  sending requests (:class:`HTTPEndpoint`), and :class:`HTTPDriver`, what
  every HTTP driver is beside its protocol;
- ``_client``: the pooled ``httpx.AsyncClient``, the retry policy and
  sending with it;
- ``_errors``: a provider's failure mapped to threadline's error tree;
- ``_sse``: the server-sent events decoder;
- ``_wire``: JSON on the wire (encoding once, untrusted decoding);
- ``_transport``: the default transport, aiohttp's pool on asyncio where
  it is installed, httpx's elsewhere;
- ``_aiohttp``: the aiohttp-only client, imported only when asked for;
- ``_openai``: what the two OpenAI drivers share (endpoint, account headers,
  the cache-key rule).

A driver imports the connection, the endpoint and sending from here, and
the wire, SSE and error pieces from their modules; the modules above import
each other by their own paths.
"""

from threadline.drivers._http._client import (
    DEFAULT_LIMITS,
    DEFAULT_TIMEOUT,
    Clock,
    RetryPolicy,
    Secret,
    SystemClock,
    Transport,
    build_http_client,
    finish_reading,
    is_retryable_status,
    read_body,
    request_id_of,
    retry_after_seconds,
    send_with_retries,
)
from threadline.drivers._http._connection import (
    ConnectionOptions,
    HTTPConnection,
    resolve_base_url,
)
from threadline.drivers._http._endpoint import (
    HTTPDriver,
    HTTPEndpoint,
    check_bool,
    check_optional_str,
)

__all__ = [
    "DEFAULT_LIMITS",
    "DEFAULT_TIMEOUT",
    "Clock",
    "ConnectionOptions",
    "HTTPConnection",
    "HTTPDriver",
    "HTTPEndpoint",
    "RetryPolicy",
    "Secret",
    "SystemClock",
    "Transport",
    "build_http_client",
    "check_bool",
    "check_optional_str",
    "finish_reading",
    "is_retryable_status",
    "read_body",
    "request_id_of",
    "resolve_base_url",
    "retry_after_seconds",
    "send_with_retries",
]
