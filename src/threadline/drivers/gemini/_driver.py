"""``GeminiDriver`` itself: its arguments, sending, counting, and reading answers and streams.

What the driver does with the protocol is described in
:mod:`threadline.drivers.gemini`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Final, Unpack
from urllib.parse import quote

import httpx

from threadline._errors import (
    AuthenticationError,
    BadRequestError,
    ProviderError,
)
from threadline._messages import Message, Reasoning, has_provider_reasoning
from threadline._models import Model
from threadline._provider import (
    OutputConstraint,
    ProviderCall,
    ProviderResponse,
    ResponseDone,
    StreamChunk,
    chunks_of,
)
from threadline._replay import ReplayRules
from threadline._validate import fail
from threadline.counting._protocol import ReplayProjection, TokenCounter
from threadline.drivers._http import (
    ConnectionOptions,
    HTTPConnection,
    HTTPDriver,
    HTTPEndpoint,
    finish_reading,
    read_body,
    request_id_of,
    resolve_base_url,
)
from threadline.drivers._http._connection import connection_of
from threadline.drivers._http._sse import StreamProgress, aiter_sse
from threadline.drivers._http._wire import NOT_JSON, MalformedResponse, loads_or_not
from threadline.drivers.gemini._contents import GEMINI_REPLAY, new_message_cache
from threadline.drivers.gemini._request import (
    ThinkingConfig,
    encode_count_request,
    encode_request,
)
from threadline.drivers.gemini._response import PromptBlocked, StreamAssembler, parse_response
from threadline.tools._tools import Tool

__all__ = ["DEFAULT_BASE_URL", "GeminiDriver", "GeminiReplay", "GeminiTokenCounter"]

DEFAULT_BASE_URL: Final = "https://generativelanguage.googleapis.com/v1beta"
_NAME: Final = "gemini"
_KEY_INVALID: Final = "API_KEY_INVALID"


class GeminiReplay:
    """What of a model turn's stored parts costs tokens when sent back: the thought
    summaries and the signatures (the text and calls are the message's own, counted
    with it)."""

    __slots__ = ()

    def replayed_reasoning(self, reasoning: Reasoning) -> tuple[str, ...]:
        raw = reasoning.provider_reasoning
        parts = loads_or_not(raw) if has_provider_reasoning(raw) else None
        if not isinstance(parts, list):
            return ()
        found: list[str] = []
        for part in parts:
            if not isinstance(part, dict):
                continue
            if part.get("thought") is True and isinstance(part.get("text"), str):
                found.append(part["text"])
            if isinstance(part.get("thoughtSignature"), str):
                found.append(part["thoughtSignature"])
        return tuple(found)

    def __repr__(self) -> str:
        return "GeminiReplay()"


_PROJECTION: Final = GeminiReplay()


class GeminiDriver(HTTPDriver):
    """A driver for the Gemini Developer API (``POST {base_url}/models/{model}:generateContent``).

    Every thought signature Gemini returns is kept on its own part inside the
    message's ``Reasoning`` and sent back exactly there; the transcript is put
    in the order Gemini demands, or refused before anything is sent.

    Args:
        api_key: sent as the ``x-goog-api-key`` header, never in the URL; ``None``
            reads ``GEMINI_API_KEY``, then ``GOOGLE_API_KEY``. It never appears
            in a ``repr``, a log record or an exception.
        base_url: the API root, version included; ``None`` reads
            ``GEMINI_BASE_URL``, else ``https://generativelanguage.googleapis.com/v1beta``.
        connection: where and how to connect (:class:`HTTPConnection`).
            429 (``RESOURCE_EXHAUSTED``, its ``RetryInfo.retryDelay`` honoured)
            and 5xx are retried.
        thinking: ``generationConfig.thinkingConfig`` for every call
            (:class:`ThinkingConfig`); a call's ``extra_body`` may override it.
        **options: any field of :class:`HTTPConnection` as a keyword of its own.

    Raises:
        InvalidRequestError: an argument of the wrong kind, named.
        TypeError: a keyword that is neither the driver's nor a connection's.

    Example::

        async with GeminiDriver() as driver:   # reads GEMINI_API_KEY
            client = Client(driver, default_model=Model("gemini-2.5-flash", context_size=1_048_576))
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        connection: HTTPConnection | None = None,
        thinking: ThinkingConfig | None = None,
        **options: Unpack[ConnectionOptions],
    ) -> None:
        if thinking is not None and not isinstance(thinking, ThinkingConfig):
            fail("thinking", 'a ThinkingConfig (ThinkingConfig(level="low")) or None', thinking)
        self._thinking = thinking
        connection = connection_of(
            "GeminiDriver", connection, base_url=base_url, api_key=api_key, options=options
        )
        root = resolve_base_url(
            connection.base_url, env="GEMINI_BASE_URL", default=DEFAULT_BASE_URL
        )
        self._base_url = root.rstrip("/")
        key_env = "GEMINI_API_KEY" if os.environ.get("GEMINI_API_KEY") else "GOOGLE_API_KEY"
        self._http = HTTPEndpoint(
            _NAME,
            connection,
            base_url=self._base_url,
            api_key_env=key_env,
            key_header="x-goog-api-key",
            headers={"accept": "application/json", "content-type": "application/json"},
        )
        self._errors = self._http.errors
        self._message_json = new_message_cache()
        self._urls: dict[tuple[str, str], httpx.URL] = {}

    @property
    def name(self) -> str:
        """``"gemini"``."""
        return _NAME

    def token_counter(self) -> TokenCounter | None:
        """``None``: the exact counter is a network call, see :meth:`exact_token_counter`."""
        return None

    def exact_token_counter(self, model: Model) -> GeminiTokenCounter:
        """An exact counter for ``model`` backed by ``:countTokens``."""
        return GeminiTokenCounter(self, model)

    def replay_projection(self, model: Model) -> ReplayProjection:
        """Replayed parts cost their thought summaries and signatures (:class:`GeminiReplay`)."""
        return _PROJECTION

    def replay_rules(self, model: Model) -> ReplayRules:
        """This model's stored parts go back every turn; another model's never do."""
        return GEMINI_REPLAY

    def output_constraint(self, model: Model) -> OutputConstraint:
        """``"schema"``: ``responseMimeType`` + ``responseJsonSchema`` constrain the answer."""
        return "schema"

    def _label(self, call: ProviderCall) -> str:
        return f"{_NAME}:{call.model.name}"

    def _url(self, model: str, method: str) -> httpx.URL:
        url = self._urls.get((model, method))
        if url is None:
            name = model.removeprefix("models/")
            url = httpx.URL(f"{self._base_url}/models/{quote(name, safe='-._~')}:{method}")
            if len(self._urls) < 64:
                self._urls[model, method] = url
        return url

    # --- sending -------------------------------------------------------------

    def _request(
        self, call: ProviderCall, *, stream: bool
    ) -> tuple[httpx.Request, tuple[str, ...]]:
        """The request, and what was changed to make the transcript sendable."""
        encoded = encode_request(
            call, label=self._label(call), thinking=self._thinking, cache=self._message_json
        )
        method = "streamGenerateContent?alt=sse" if stream else "generateContent"
        url = self._url(call.model.name, method)
        return self._http.request(url, encoded.body, stream=stream), encoded.notes

    async def _send(self, request: httpx.Request, *, stream: bool = False) -> httpx.Response:
        """``request`` sent with retries; a refused key is an authentication error.

        Gemini answers a bad key with 400 ``INVALID_ARGUMENT`` and the reason
        ``API_KEY_INVALID``, which the status alone would call a bad request.
        """
        failure: ProviderError | None = None
        try:
            return await self._http.send(request, stream=stream)
        except BadRequestError as exc:
            if exc.body is None or _KEY_INVALID not in exc.body:
                raise
            failure = AuthenticationError(
                exc.message,
                status=exc.status,
                body=exc.body,
                request_id=exc.request_id,
                provider=exc.provider,
            )
        raise failure

    # Errors are raised past their except blocks: no __context__ may keep the raw body.

    def _decode(
        self,
        content: bytes | str,
        request_id: str | None,
        *,
        what: str,
        content_type: str | None = None,
    ) -> object:
        payload = loads_or_not(content)
        if payload is NOT_JSON:
            raise self._errors.not_json(
                what, content, content_type=content_type, request_id=request_id
            )
        if isinstance(payload, dict) and payload.get("error") is not None:
            raise self._errors.from_payload(payload, request_id=request_id)
        return payload

    def _blocked(self, blocked: PromptBlocked, request_id: str | None) -> BadRequestError:
        said = f": {blocked.message}" if blocked.message else ""
        return BadRequestError(
            self._errors.redact(
                f"Gemini blocked the prompt (promptFeedback.blockReason {blocked.reason}){said}; "
                "no answer was generated"
            ),
            request_id=request_id,
            provider=_NAME,
        )

    def _parse(
        self, response: httpx.Response, content: bytes, call: ProviderCall
    ) -> ProviderResponse:
        request_id = request_id_of(response.headers)
        content_type = response.headers.get("content-type", "")
        payload = self._decode(
            content, request_id, what="the response body", content_type=content_type
        )
        failure: ProviderError
        try:
            return parse_response(
                payload,
                requested_model=call.model.name,
                provider=self._label(call),
                request_id=request_id,
            )
        except PromptBlocked as exc:
            failure = self._blocked(exc, request_id)
        except MalformedResponse as exc:
            failure = self._errors.malformed(str(exc), request_id=request_id)
        raise failure

    async def complete(self, call: ProviderCall) -> ProviderResponse:
        """Send ``call`` and return the whole answer.

        Raises:
            InvalidRequestError: the call cannot be sent (an order Gemini refuses
                that cannot be repaired, stored parts of the wrong shape, an
                unknown forced tool).
            BadRequestError: the prompt was blocked (``promptFeedback.blockReason``).
            ProviderError: the mapped failure, after retries where they apply.
        """
        request, notes = self._request(call, stream=False)
        response = await self._send(request)
        return self._parse(response, response.content, call).noted(notes)

    async def count_tokens(self, call: ProviderCall) -> int:
        """The input tokens of ``call`` as Gemini counts them (``:countTokens``).

        Raises:
            ProviderError: the mapped failure, or an answer without ``totalTokens``.
        """
        name = call.model.name.removeprefix("models/")
        body = encode_count_request(
            call,
            model_path=f"models/{name}",
            label=self._label(call),
            thinking=self._thinking,
            cache=self._message_json,
        )
        url = self._url(call.model.name, "countTokens")
        response = await self._send(self._http.request(url, body, stream=False))
        request_id = request_id_of(response.headers)
        content_type = response.headers.get("content-type", "")
        payload = self._decode(
            response.content, request_id, what="the response body", content_type=content_type
        )
        tokens = payload.get("totalTokens", 0) if isinstance(payload, dict) else None
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise self._errors.malformed(
                f"countTokens answered without a totalTokens count: {payload!r}",
                request_id=request_id,
            )
        return tokens

    @contextlib.asynccontextmanager
    async def stream(self, call: ProviderCall) -> AsyncIterator[AsyncIterator[StreamChunk]]:
        """Send ``call`` to ``:streamGenerateContent?alt=sse``; yield chunks ending with
        ``ResponseDone``.

        Raises:
            ProviderError: on entry, the mapped failure; while iterating, an error
                chunk, a blocked prompt, a broken connection, or a malformed chunk.
        """
        request, notes = self._request(call, stream=True)
        response = await self._send(request, stream=True)
        chunks = self._chunks(response, call, notes)
        try:
            yield chunks
        finally:
            try:
                await chunks.aclose()
            finally:
                await response.aclose()

    async def _chunks(
        self, response: httpx.Response, call: ProviderCall, notes: tuple[str, ...]
    ) -> AsyncGenerator[StreamChunk, None]:
        request_id = request_id_of(response.headers)
        progress = StreamProgress(response.headers.get("content-type", ""), response.status_code)
        if progress.content_type.startswith("application/json"):
            # A server that answered in one piece.
            content = await read_body(response, self._errors, progress)
            for chunk in chunks_of(self._parse(response, content, call).noted(notes)):
                yield chunk
            return
        assembler = StreamAssembler(requested_model=call.model.name, provider=self._label(call))
        events = aiter_sse(response.aiter_bytes(), progress)
        failure: ProviderError | None = None
        try:
            async for event in events:
                payload = self._decode(event.data, request_id, what="a stream chunk")
                for chunk in assembler.add(payload):
                    yield chunk
            if assembler.complete:
                done = assembler.finish(request_id=request_id)
                yield ResponseDone(response=done.noted(notes))
            else:
                failure = self._errors.stream_ended(
                    progress, "no chunk carried a finishReason", request_id=request_id
                )
        except PromptBlocked as exc:
            failure = self._blocked(exc, request_id)
        except MalformedResponse as exc:
            failure = self._errors.malformed(str(exc), request_id=request_id)
        except httpx.TransportError as exc:
            failure = self._errors.from_transport(exc, progress=progress)
        finally:
            await finish_reading(events, drain=assembler.complete)
        if failure is not None:
            raise failure


class GeminiTokenCounter:
    """The exact input tokens of a transcript, asked of ``models/{model}:countTokens``.

    The whole request goes as a ``generateContentRequest``, so the system
    instruction and the tools are counted too. A network call per count:
    use it where exactness is worth a round trip.

    Example::

        counter = driver.exact_token_counter(model)
        tokens = await counter.count(messages, tools)
    """

    def __init__(self, driver: GeminiDriver, model: Model) -> None:
        self._driver = driver
        self._model = model

    def __repr__(self) -> str:
        return f"GeminiTokenCounter(model={self._model.name!r})"

    async def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        """Gemini's count of ``messages`` sent with ``tools``."""
        call = ProviderCall(model=self._model, messages=tuple(messages), tools=tuple(tools))
        return await self._driver.count_tokens(call)
