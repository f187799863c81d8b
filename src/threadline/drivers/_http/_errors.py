"""Turning a provider's failure into threadline's error tree.

Every HTTP driver maps failures the same way: the HTTP status picks the class,
the provider's own message becomes the exception message, and a context-length
refusal is recognised by its code or its wording, whichever server sent it, with
the numbers it reported parsed out. The body, the message and the request id
travel with the error; the API key never does, because errors are built from the
response alone and any echo of a secret in the body is redacted.

Nothing raw is reachable from a raised error either: a transport failure's
cause is a copy of httpx's exception with the redacted message and without
the request (whose headers hold the key), and drivers raise outside their
``except`` blocks, so no ``__context__`` keeps an unredacted body (a
``JSONDecodeError.doc``, say). Messages are bounded like bodies: a megabyte
of error text makes a short ``str(exc)``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from typing import Any

import attrs
import httpx

from threadline._errors import (
    AuthenticationError,
    BadRequestError,
    ContextLengthExceededError,
    ProviderError,
    ProviderResponseError,
    ProviderUnavailableError,
    RateLimitError,
)
from threadline.drivers._http._sse import StreamProgress

__all__ = [
    "MAX_BODY_CHARS",
    "MAX_MESSAGE_CHARS",
    "ContextLengthDetails",
    "ErrorMapper",
    "ProviderErrorDetails",
    "context_length_details",
    "parse_error_body",
    "retry_info_seconds",
    "snippet",
]

MAX_BODY_CHARS = 4096
"""How much of an error body an exception keeps; the rest is cut, with a note."""

MAX_MESSAGE_CHARS = 1000
"""How much of the provider's message an exception's text keeps; the body keeps more."""

_SNIPPET = 200
_REDACTED = "[redacted]"
_MIN_SECRET_LENGTH = 8
"""Shorter "keys" (``"x"``, ``"ollama"``) guard nothing and would garble bodies."""


@attrs.frozen(kw_only=True)
class ProviderErrorDetails:
    """What an error body says, in the shapes OpenAI-compatible servers use.

    ``{"error": {"message", "type", "code"}}`` (OpenAI, llama.cpp, newer vLLM),
    ``{"object": "error", "message", ...}`` (older vLLM) and ``{"error": "text"}``
    (Ollama) are all understood. ``extra`` keeps the error object's other fields
    (llama.cpp's ``n_prompt_tokens`` and ``n_ctx``).
    """

    message: str | None = None
    type: str | None = None
    code: str | int | None = None
    extra: Mapping[str, Any] = attrs.field(factory=dict)


def parse_error_body(body: str) -> ProviderErrorDetails:
    """Read the provider's message, type and code from an error body (any text)."""
    try:
        payload = json.loads(body)
    except ValueError:
        return ProviderErrorDetails()
    return details_from_payload(payload)


def details_from_payload(payload: object) -> ProviderErrorDetails:
    """Like :func:`parse_error_body`, for an already decoded JSON value."""
    if not isinstance(payload, dict):
        return ProviderErrorDetails()
    error = payload.get("error")
    if isinstance(error, str):
        return ProviderErrorDetails(message=error)
    if isinstance(error, dict):
        obj: dict[str, Any] = error
    elif isinstance(payload.get("message"), str):
        obj = payload
    else:
        return ProviderErrorDetails()
    message = obj.get("message")
    kind = obj.get("type")
    code = obj.get("code")
    return ProviderErrorDetails(
        message=message if isinstance(message, str) else None,
        type=kind if isinstance(kind, str) else None,
        code=code if isinstance(code, str | int) and not isinstance(code, bool) else None,
        extra={k: v for k, v in obj.items() if k not in ("message", "type", "code")},
    )


@attrs.frozen(kw_only=True)
class ContextLengthDetails:
    """A context-length refusal and the numbers the provider gave, when it gave them."""

    prompt_tokens: int | None = None
    context_limit: int | None = None


_NUMBER = r"(\d[\d,]*)"
# Phrases that mean "the prompt does not fit", across OpenAI, vLLM, llama.cpp,
# llama-cpp-python, LM Studio, TGI, Ollama and Anthropic-style servers.
_CONTEXT_PHRASES = (
    "context_length_exceeded",
    "maximum context length",
    "context length exceeded",
    "exceeds the available context size",
    "exceed context window",
    "exceeds the context window",
    "exceeds maximum context length",
    "exceeds the maximum context length",
    "context length of only",
    "prompt is too long",
    "exceed context limit",
    "input length exceeds",
    "`max_new_tokens` must be <=",
    "exceeds the maximum number of tokens allowed",
)
_CONTEXT_CODES = frozenset({"context_length_exceeded", "exceed_context_size_error"})
_LIMIT_PATTERNS = (
    re.compile(r"maximum context length is " + _NUMBER),
    re.compile(r"available context size \(" + _NUMBER + r" tokens\)"),
    re.compile(r"exceed context window of " + _NUMBER),
    re.compile(r"context length of only " + _NUMBER),
    re.compile(r" tokens > " + _NUMBER + r" maximum"),
    re.compile(r"must be <= " + _NUMBER),
    re.compile(r"exceed context limit: \d[\d,]* \+ \d[\d,]* > " + _NUMBER),
    re.compile(r"maximum number of tokens allowed \(?" + _NUMBER),
)
_PROMPT_PATTERNS = (
    re.compile(r"\(" + _NUMBER + r" in the messages"),
    re.compile(r"\(" + _NUMBER + r" in your prompt"),
    re.compile(r"messages resulted in " + _NUMBER + r" tokens"),
    re.compile(r"request has " + _NUMBER + r" input tokens"),
    re.compile(r"request \(" + _NUMBER + r" tokens\) exceeds"),
    re.compile(r"requested tokens \(" + _NUMBER + r"\) exceed"),
    re.compile(r"keep the first " + _NUMBER + r" tokens"),
    re.compile(r"prompt is too long: " + _NUMBER + r" tokens"),
    re.compile(r"given: " + _NUMBER + r" `inputs` tokens"),
    re.compile(r"exceed context limit: " + _NUMBER + r" \+"),
    re.compile(r"input token count \(?" + _NUMBER),
)


def _first_number(patterns: Iterable[re.Pattern[str]], text: str) -> int | None:
    for pattern in patterns:
        match = pattern.search(text)
        if match:
            return int(match.group(1).replace(",", ""))
    return None


def _int_field(extra: Mapping[str, Any], name: str) -> int | None:
    value = extra.get(name)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def context_length_details(details: ProviderErrorDetails) -> ContextLengthDetails | None:
    """``None`` unless ``details`` describe a prompt too big for the context window."""
    text = (details.message or "").lower()
    code = details.code if isinstance(details.code, str) else None
    by_code = code in _CONTEXT_CODES or details.type in _CONTEXT_CODES
    if not by_code and not any(phrase in text for phrase in _CONTEXT_PHRASES):
        return None
    prompt_tokens = _int_field(details.extra, "n_prompt_tokens")
    context_limit = _int_field(details.extra, "n_ctx")
    if prompt_tokens is None:
        prompt_tokens = _first_number(_PROMPT_PATTERNS, text)
    if context_limit is None:
        context_limit = _first_number(_LIMIT_PATTERNS, text)
    return ContextLengthDetails(prompt_tokens=prompt_tokens, context_limit=context_limit)


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)s$")


def retry_info_seconds(body: str) -> float | None:
    """The wait a ``google.rpc.RetryInfo`` in an error body asks for (Gemini's 429s:
    ``{"error": {"details": [{"@type": ".../google.rpc.RetryInfo", "retryDelay": "23s"}]}}``),
    or ``None``."""
    if "retryDelay" not in body:
        return None
    details = parse_error_body(body).extra.get("details")
    for detail in details if isinstance(details, list) else ():
        delay = detail.get("retryDelay") if isinstance(detail, dict) else None
        match = _DURATION.match(delay) if isinstance(delay, str) else None
        if match:
            return float(match.group(1))
    return None


def _body_request_id(body: str) -> str | None:
    if '"request_id"' not in body:
        return None
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    value = payload.get("request_id") if isinstance(payload, dict) else None
    return value if isinstance(value, str) and value else None


def snippet(text: str) -> str:
    """The start of ``text``, for an error message about a malformed response."""
    return text if len(text) <= _SNIPPET else f"{text[:_SNIPPET]}..."


def _cut(text: str, limit: int) -> str:
    if len(text) <= limit:
        return text
    return f"{text[:limit]}... [{len(text) - limit} more characters cut]"


def _truncate(text: str) -> str:
    return _cut(text, MAX_BODY_CHARS)


def _bounded(message: str) -> str:
    return _cut(message, MAX_MESSAGE_CHARS)


def _shown_type(content_type: str) -> str:
    return content_type.split(";")[0].strip() or "no content type"


def _safe_cause(exc: httpx.TransportError, detail: str) -> httpx.TransportError:
    """``exc`` again, of its own class, with the redacted ``detail`` and no request.

    httpx's exception keeps the request, whose headers carry the API key, and
    its message may quote what a server echoed; neither may be reachable.
    """
    try:
        return type(exc)(detail)
    except TypeError:  # a subclass with another constructor
        return httpx.TransportError(detail)


def _context_refusal(
    details: ProviderErrorDetails, message: str, common: Mapping[str, Any]
) -> ContextLengthExceededError | None:
    """The context-length error ``details`` describe, with the numbers; ``None`` if not one."""
    context = context_length_details(details)
    if context is None:
        return None
    return ContextLengthExceededError(
        message,
        prompt_tokens=context.prompt_tokens,
        context_limit=context.context_limit,
        **common,
    )


_STREAM_ERROR_KINDS: tuple[tuple[tuple[str, ...], type[ProviderError]], ...] = (
    (("auth", "permission", "api_key"), AuthenticationError),
    (("rate_limit", "quota", "too_many_requests"), RateLimitError),
    (
        ("invalid_request", "bad_request", "not_found", "validation", "request_too_large"),
        BadRequestError,
    ),
)
_RATE_LIMIT_HEADER_PREFIXES = ("x-ratelimit-", "anthropic-ratelimit-")


def _rate_limit_note(headers: Mapping[str, str] | None) -> str:
    """The rate-limit headers a 429 came with, as ``"; name=value, ..."`` (or nothing)."""
    if not headers:
        return ""
    shown = [
        f"{name.lower()}={value}"
        for name, value in headers.items()
        if name.lower().startswith(_RATE_LIMIT_HEADER_PREFIXES) or name.lower() == "retry-after"
    ]
    return f" [{', '.join(shown)}]" if shown else ""


class ErrorMapper:
    """Builds threadline errors for one driver, scrubbing the secrets it is given.

    ``provider`` names the driver in every error; ``secrets`` (the API key) are
    replaced by ``[redacted]`` wherever a server echoes them back.
    """

    def __init__(self, provider: str, *, secrets: Iterable[str] = ()) -> None:
        self.provider = provider
        self._secrets = tuple(s for s in secrets if len(s) >= _MIN_SECRET_LENGTH)

    def __repr__(self) -> str:
        return f"ErrorMapper(provider={self.provider!r})"

    def redact(self, text: str) -> str:
        """``text`` with every secret replaced by ``[redacted]``."""
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, _REDACTED)
        return text

    def from_response(
        self,
        status: int,
        body: str,
        *,
        request_id: str | None = None,
        reason: str = "",
        headers: Mapping[str, str] | None = None,
    ) -> ProviderError:
        """The error for a non-success HTTP response, chosen by status and body.

        A 429's message ends with the rate-limit headers it came with
        (``retry-after``, ``x-ratelimit-*``, ``anthropic-ratelimit-*``); a body
        that names its ``request_id`` (Anthropic's do) supplies one the headers lacked.
        """
        body = self.redact(body)
        details = parse_error_body(body)
        message = details.message or f"HTTP {status} {reason}".strip()
        message = _bounded(self.redact(message))
        if status == 429:
            message += self.redact(_rate_limit_note(headers))
        if request_id is None:
            request_id = _body_request_id(body)
        common: dict[str, Any] = {
            "status": status,
            "body": _truncate(body),
            "request_id": request_id,
            "provider": self.provider,
        }
        if status in (400, 404, 413, 422) or status >= 500:
            refusal = _context_refusal(details, message, common)
            if refusal is not None:
                return refusal
        cls: type[ProviderError]
        if status in (401, 403):
            cls = AuthenticationError
        elif status == 429:
            cls = RateLimitError
        elif status in (408, 409) or status >= 500:
            cls = ProviderUnavailableError
        elif 400 <= status < 500:
            cls = BadRequestError
        else:
            cls = ProviderResponseError
        return cls(message, **common)

    def from_payload(self, payload: object, *, request_id: str | None = None) -> ProviderError:
        """The error for an ``{"error": ...}`` event that arrived inside a stream.

        The HTTP status was already 200, so the class comes from the error's
        numeric code or its type; an unrecognised kind is the provider failing
        mid-answer (``ProviderUnavailableError``).
        """
        details = details_from_payload(payload)
        raw = self.redact(json.dumps(payload, ensure_ascii=False, default=str))
        if isinstance(details.code, int) and 400 <= details.code < 600:
            return self.from_response(details.code, raw, request_id=request_id)
        message = _bounded(
            self.redact(details.message or "the provider reported an error mid-stream")
        )
        common: dict[str, Any] = {
            "body": _truncate(raw),
            "request_id": request_id,
            "provider": self.provider,
        }
        refusal = _context_refusal(details, message, common)
        if refusal is not None:
            return refusal
        kind = f"{details.type or ''} {details.code or ''}".lower()
        for words, cls in _STREAM_ERROR_KINDS:
            if any(word in kind for word in words):
                return cls(message, **common)
        return ProviderUnavailableError(message, **common)

    def from_transport(
        self, exc: httpx.TransportError, *, progress: StreamProgress | None = None
    ) -> ProviderError:
        """The error for a request that got no response, or a stream that broke off or
        timed out.

        Without ``progress`` no response came back: connection refused, reset,
        or a time-out. With it, a stream had begun (status 2xx) and failed
        after what ``progress`` counted; a stall says it timed out, wherever it
        came, as one before the response does. Either way it is a
        ``ProviderUnavailableError`` naming httpx's exception class, and its
        ``__cause__`` is a sanitized copy of ``exc`` (see :func:`_safe_cause`).
        Raise it outside the ``except`` block that caught ``exc``.
        """
        kind = type(exc).__name__
        detail = self.redact(str(exc)).strip()
        said = f"{kind}: {detail}" if detail and detail != kind else kind
        timed_out = isinstance(exc, httpx.TimeoutException)
        status: int | None = None
        if progress is not None:
            status = progress.status
            ended = "timed out" if timed_out else "broke off"
            if progress.bytes == 0:
                what = f"the response {ended} while its body was read"
            else:
                what = f"the stream {ended} after {progress.describe()}"
            if timed_out:
                what += ": nothing more came within the read time-out"
            message = f"{what} ({said})"
        elif timed_out:
            message = f"the request to the provider timed out ({said})"
        else:
            message = f"could not reach the provider ({said})"
        error = ProviderUnavailableError(_bounded(message), status=status, provider=self.provider)
        error.__cause__ = _safe_cause(exc, _bounded(detail))
        return error

    def malformed(self, reason: str, *, request_id: str | None = None) -> ProviderResponseError:
        """The error for a response that breaks the protocol's promises."""
        return ProviderResponseError(
            _bounded(self.redact(reason)), request_id=request_id, provider=self.provider
        )

    def not_json(
        self,
        what: str,
        content: bytes | str,
        *,
        content_type: str | None = None,
        request_id: str | None = None,
    ) -> ProviderResponseError:
        """The error for ``what`` ("the response body") that should be JSON and is not.

        It names the response's content type, when given, and shows the start
        of the text, redacted before it is cut (so no part of a key is left).
        """
        kind = "" if content_type is None else f" ({_shown_type(content_type)})"
        return self.malformed(
            f"{what}{kind} is not JSON: {self._start_of(content)!r}", request_id=request_id
        )

    def _start_of(self, content: bytes | str) -> str:
        text = content.decode("utf-8", "replace") if isinstance(content, bytes) else content
        return snippet(self.redact(text))

    def stream_ended(
        self, progress: StreamProgress, missing: str, *, request_id: str | None
    ) -> ProviderResponseError:
        """The error for a stream that ended before its response was complete.

        A body that was no event stream at all (an HTML page with status 200)
        is named by its content type and shown by its start, as a non-stream
        body that is not JSON is.
        """
        if progress.events == 0 and not progress.is_event_stream:
            return self.malformed(
                f"the stream request was answered with {_shown_type(progress.content_type)}, "
                f"not an event stream: {self._start_of(progress.head)!r}",
                request_id=request_id,
            )
        return self.malformed(
            f"the stream ended before the response was complete ({missing}), "
            f"after {progress.describe()}",
            request_id=request_id,
        )
