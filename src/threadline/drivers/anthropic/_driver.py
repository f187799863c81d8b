"""``AnthropicDriver`` itself: its arguments, sending, counting, and reading answers and streams.

What the driver does with the protocol is described in
:mod:`threadline.drivers.anthropic`.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Final, Unpack

import httpx

from threadline._errors import ProviderError
from threadline._messages import Message
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
from threadline._validate import fail, positive_int
from threadline.counting._protocol import ReplayProjection, TokenCounter
from threadline.drivers._http import (
    ConnectionOptions,
    HTTPConnection,
    HTTPDriver,
    HTTPEndpoint,
    check_bool,
    finish_reading,
    read_body,
    request_id_of,
    resolve_base_url,
)
from threadline.drivers._http._connection import connection_of
from threadline.drivers._http._sse import StreamProgress, aiter_sse
from threadline.drivers._http._wire import NOT_JSON, MalformedResponse, loads_or_not
from threadline.drivers.anthropic._request import (
    THINKING_REPLAY,
    Thinking,
    encode_count_request,
    encode_request,
    new_message_cache,
)
from threadline.drivers.anthropic._response import STREAM_EVENTS, StreamAssembler, parse_message
from threadline.tools._tools import Tool

__all__ = [
    "ANTHROPIC_VERSION",
    "CACHE_DIAGNOSIS_BETA",
    "DEFAULT_BASE_URL",
    "DEFAULT_MAX_TOKENS",
    "AnthropicDriver",
    "AnthropicTokenCounter",
]

DEFAULT_BASE_URL: Final = "https://api.anthropic.com"
ANTHROPIC_VERSION: Final = "2023-06-01"
CACHE_DIAGNOSIS_BETA: Final = "cache-diagnosis-2026-04-07"
"""The beta header cache diagnosis was introduced under; sent with it (the API
accepts it still where the feature no longer needs it)."""
DEFAULT_MAX_TOKENS: Final = 4096
"""``max_tokens`` when a request sets no ``max_output_tokens`` (the API requires one);
the same as the default output reserve, so the budget keeps room for it."""
_NAME: Final = "anthropic"


class AnthropicDriver(HTTPDriver):
    """A driver for the Messages API (``POST {base_url}/v1/messages``).

    Args:
        api_key: sent as ``x-api-key``; ``None`` reads ``ANTHROPIC_API_KEY``, and
            when that is unset too no key is sent (fine for a local server). It
            never appears in a ``repr``, a log record or an exception.
        base_url: the API root without ``/v1``; ``None`` reads
            ``ANTHROPIC_BASE_URL``, else ``https://api.anthropic.com``.
        connection: where and how to connect (:class:`HTTPConnection`): the
            client, transport, time-out, retries, headers and clock, which
            drivers may share. ``None``: the defaults. 429, 5xx and 529
            (overloaded) are retried, and ``x-should-retry`` is obeyed.
        **options: any field of :class:`HTTPConnection` (``http_client``,
            ``transport``, ``timeout``, ``max_retries``, ``retry_policy``,
            ``default_headers``, ``clock``) as a keyword of its own; it
            overrides that field of ``connection``, as ``base_url`` and
            ``api_key`` do when not ``None``.
        default_max_tokens: ``max_tokens`` for calls that set no
            ``max_output_tokens`` (the API requires it).
        thinking: extended thinking for every call (``Thinking.enabled(2048)``);
            a request's ``extra_body={"thinking": ...}`` overrides it.
        anthropic_version: the ``anthropic-version`` header.
        betas: sent as ``anthropic-beta``.
        prompt_caching: place ``cache_control`` breakpoints on every call: at
            the end of the tools and system prompt, at the end of the history
            before the current prompt, and at the end of the request (three
            of the four the API allows), so a conversation's stable prefix is
            read from the prompt cache. ``False`` sends none.
        cache_diagnosis: ask the API why its prompt cache missed: every call
            carries ``diagnostics.previous_message_id`` (the previous
            response's id, ``null`` on a first call) and the
            ``cache-diagnosis-2026-04-07`` beta, and the answer's
            ``diagnostics.cache_miss_reason`` becomes
            ``ProviderResponse.cache_diagnosis`` (the round's
            ``RoundRecord.cache``). Off by default: the API keeps a
            fingerprint (hashes and token counts) of each request that asks.

    Raises:
        InvalidRequestError: an argument of the wrong kind, named: a base URL
            that is not ``http(s)://host...``, a ``RetryPolicy`` class instead
            of an instance, a negative or NaN time-out, a header that is not text.
        TypeError: a keyword that is neither the driver's nor a connection's.

    Example::

        async with AnthropicDriver() as driver:   # reads ANTHROPIC_API_KEY
            client = Client(driver, default_model=Model("claude-sonnet-4-5", context_size=200_000))
    """

    def __init__(
        self,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        connection: HTTPConnection | None = None,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        thinking: Thinking | None = None,
        anthropic_version: str = ANTHROPIC_VERSION,
        betas: Sequence[str] = (),
        prompt_caching: bool = True,
        cache_diagnosis: bool = False,
        **options: Unpack[ConnectionOptions],
    ) -> None:
        self._default_max_tokens = positive_int("default_max_tokens", default_max_tokens)
        if thinking is not None and not isinstance(thinking, Thinking):
            fail("thinking", "a Thinking (Thinking.enabled(2048)) or None", thinking)
        self._thinking = thinking
        self._prompt_caching = check_bool("prompt_caching", prompt_caching)
        self._diagnosis = check_bool("cache_diagnosis", cache_diagnosis)
        connection = connection_of(
            "AnthropicDriver", connection, base_url=base_url, api_key=api_key, options=options
        )
        root = resolve_base_url(
            connection.base_url, env="ANTHROPIC_BASE_URL", default=DEFAULT_BASE_URL
        )
        self._base_url = root.removesuffix("/v1")
        self._url = httpx.URL(f"{self._base_url}/v1/messages")
        self._count_url = httpx.URL(f"{self._base_url}/v1/messages/count_tokens")
        if not isinstance(anthropic_version, str) or not anthropic_version:
            fail("anthropic_version", "a non-empty str", anthropic_version)
        headers = {
            "accept": "application/json",
            "content-type": "application/json",
            "anthropic-version": anthropic_version,
        }
        if isinstance(betas, str) or not all(isinstance(beta, str) for beta in betas):
            fail("betas", "a sequence of str (a list, not one str)", betas)
        sent = list(betas)
        if self._diagnosis and CACHE_DIAGNOSIS_BETA not in sent:
            sent.append(CACHE_DIAGNOSIS_BETA)
        if sent:
            headers["anthropic-beta"] = ",".join(sent)
        self._http = HTTPEndpoint(
            _NAME,
            connection,
            base_url=self._base_url,
            api_key_env="ANTHROPIC_API_KEY",
            key_header="x-api-key",
            headers=headers,
        )
        self._client = self._http.client
        self._errors = self._http.errors
        self._message_json = new_message_cache()

    @property
    def name(self) -> str:
        """``"anthropic"``."""
        return _NAME

    def token_counter(self) -> TokenCounter | None:
        """``None``: the exact counter is a network call, see :meth:`exact_token_counter`."""
        return None

    def exact_token_counter(self, model: Model) -> AnthropicTokenCounter:
        """An exact counter for ``model`` backed by ``/v1/messages/count_tokens``."""
        return AnthropicTokenCounter(self, model)

    def output_constraint(self, model: Model) -> OutputConstraint:
        """``"schema"``: the answer is constrained by the Messages API's native
        structured output (``output_config.format``, a JSON schema)."""
        return "schema"

    def tool_result_images(self, model: Model) -> bool:
        """``True``: a ``tool_result`` block carries image blocks beside its text."""
        return True

    def replay_projection(self, model: Model) -> ReplayProjection:
        """Reasoning is counted as it is sent: :meth:`replay_rules` price what they send.

        That is the thinking of the tool-use cycle still open, which the API
        counts too; the run loop hands the driver no other (the API would strip
        earlier turns' thinking and not count it, and other providers' is never
        sent), so none other is counted.
        """
        return THINKING_REPLAY

    def replay_rules(self, model: Model) -> ReplayRules:
        """Only the ``thinking`` and ``redacted_thinking`` blocks of the open tool-use
        cycle go back (:data:`~threadline.drivers.anthropic.THINKING_REPLAY`), and every
        ``compaction`` block, the latest of which opens the sent window; any other
        stored block is refused with ``InvalidRequestError`` before sending."""
        return THINKING_REPLAY

    def _label(self, call: ProviderCall) -> str:
        return f"{_NAME}:{call.model.name}"

    # --- sending -------------------------------------------------------------

    def _request(self, call: ProviderCall, *, stream: bool) -> httpx.Request:
        encoded = encode_request(
            call,
            stream=stream,
            label=self._label(call),
            default_max_tokens=self._default_max_tokens,
            thinking=self._thinking,
            cache=self._message_json,
            breakpoints=self._prompt_caching,
            diagnostics=self._diagnosis,
        )
        return self._http.request(self._url, encoded.body, stream=stream)

    # Errors are raised past their except blocks: no __context__ may keep the raw body.

    def _decode(
        self,
        content: bytes | str,
        request_id: str | None,
        *,
        event: str | None = None,
        content_type: str | None = None,
    ) -> object:
        payload = loads_or_not(content)
        if payload is NOT_JSON:
            if event == "error":
                text = content.decode("utf-8", "replace") if isinstance(content, bytes) else content
                raise self._errors.from_payload({"error": {"message": text}}, request_id=request_id)
            what = "the response body" if event is None else "a stream event"
            raise self._errors.not_json(
                what, content, content_type=content_type, request_id=request_id
            )
        if isinstance(payload, dict) and (
            payload.get("type") == "error" or payload.get("error") is not None
        ):
            raise self._errors.from_payload(payload, request_id=request_id)
        return payload

    def _parse(
        self, response: httpx.Response, content: bytes, call: ProviderCall
    ) -> ProviderResponse:
        request_id = request_id_of(response.headers)
        content_type = response.headers.get("content-type", "")
        payload = self._decode(content, request_id, content_type=content_type)
        try:
            return parse_message(
                payload,
                requested_model=call.model.name,
                provider=self._label(call),
                request_id=request_id,
            )
        except MalformedResponse as exc:
            reason = str(exc)
        raise self._errors.malformed(reason, request_id=request_id)

    async def complete(self, call: ProviderCall) -> ProviderResponse:
        """Send ``call`` and return the whole answer.

        Raises:
            InvalidRequestError: the call cannot be sent (refused reasoning
                replay state, an unknown forced tool, a thinking budget that
                does not fit).
            ProviderError: the mapped failure, after retries where they apply.
        """
        response = await self._http.send(self._request(call, stream=False))
        return self._parse(response, response.content, call)

    async def count_tokens(self, call: ProviderCall) -> int:
        """The input tokens of ``call`` as the server counts them (``count_tokens``).

        Raises:
            ProviderError: the mapped failure, or an answer without ``input_tokens``.
        """
        body = encode_count_request(
            call, label=self._label(call), thinking=self._thinking, cache=self._message_json
        )
        response = await self._http.send(self._http.request(self._count_url, body, stream=False))
        request_id = request_id_of(response.headers)
        content_type = response.headers.get("content-type", "")
        payload = self._decode(response.content, request_id, content_type=content_type)
        tokens = payload.get("input_tokens") if isinstance(payload, dict) else None
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise self._errors.malformed(
                f"count_tokens answered without an input_tokens count: {payload!r}",
                request_id=request_id,
            )
        return tokens

    @contextlib.asynccontextmanager
    async def stream(self, call: ProviderCall) -> AsyncIterator[AsyncIterator[StreamChunk]]:
        """Send ``call`` with ``stream: true``; yield chunks ending with ``ResponseDone``.

        Raises:
            ProviderError: on entry, the mapped failure; while iterating, an
                ``error`` event (``overloaded_error`` is
                ``ProviderUnavailableError``), a broken connection, or a
                malformed event (``ProviderResponseError``).
        """
        response = await self._http.send(self._request(call, stream=True), stream=True)
        chunks = self._chunks(response, call)
        try:
            yield chunks
        finally:
            try:
                await chunks.aclose()
            finally:
                await response.aclose()

    async def _chunks(
        self, response: httpx.Response, call: ProviderCall
    ) -> AsyncGenerator[StreamChunk, None]:
        request_id = request_id_of(response.headers)
        progress = StreamProgress(response.headers.get("content-type", ""), response.status_code)
        if progress.content_type.startswith("application/json"):
            # A server that ignored "stream": true and answered in one piece.
            content = await read_body(response, self._errors, progress)
            for chunk in chunks_of(self._parse(response, content, call)):
                yield chunk
            return
        assembler = StreamAssembler(requested_model=call.model.name, provider=self._label(call))
        events = aiter_sse(response.aiter_bytes(), progress)
        failure: ProviderError | None = None
        try:
            async for event in events:
                if event.event not in STREAM_EVENTS:
                    continue  # ping, or a type added since: its data need not be JSON
                payload = self._decode(event.data, request_id, event=event.event)
                for chunk in assembler.add(payload, event.event):
                    yield chunk
                if assembler.finished:
                    break
            if assembler.complete:
                yield ResponseDone(response=assembler.finish(request_id=request_id))
            else:
                failure = self._errors.stream_ended(
                    progress, "no message_stop", request_id=request_id
                )
        except MalformedResponse as exc:
            failure = self._errors.malformed(str(exc), request_id=request_id)
        except httpx.TransportError as exc:
            failure = self._errors.from_transport(exc, progress=progress)
        finally:
            await finish_reading(events, drain=assembler.finished)
        if failure is not None:
            raise failure


class AnthropicTokenCounter:
    """The exact input tokens of a transcript, asked of ``/v1/messages/count_tokens``.

    A network call per count, so it is async: use it where exactness is worth
    a round trip (near the budget's edge), not for every estimate.

    Example::

        counter = driver.exact_token_counter(model)
        tokens = await counter.count(messages, tools)
    """

    def __init__(self, driver: AnthropicDriver, model: Model) -> None:
        self._driver = driver
        self._model = model

    def __repr__(self) -> str:
        return f"AnthropicTokenCounter(model={self._model.name!r})"

    async def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        """The server's count of ``messages`` sent with ``tools``."""
        call = ProviderCall(model=self._model, messages=tuple(messages), tools=tuple(tools))
        return await self._driver.count_tokens(call)
