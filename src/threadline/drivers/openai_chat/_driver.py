"""``OpenAIChatDriver`` itself: its arguments, sending, and reading answers and streams.

What the protocol is and what the driver does with it is described in
:mod:`threadline.drivers.openai_chat`.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Literal, Unpack

import httpx

from threadline._errors import ProviderError
from threadline._models import Model
from threadline._provider import (
    OutputConstraint,
    ProviderCall,
    ProviderResponse,
    ResponseDone,
    StreamChunk,
    chunks_of,
)
from threadline._validate import fail
from threadline.counting._projection import NO_REPLAY
from threadline.counting._protocol import AsyncTokenCounter, ReplayProjection, TokenCounter
from threadline.drivers._http import (
    ConnectionOptions,
    HTTPConnection,
    HTTPDriver,
    check_bool,
    finish_reading,
    read_body,
)
from threadline.drivers._http._connection import connection_of
from threadline.drivers._http._openai import (
    OPENAI_BASE_URL,
    openai_endpoint,
    sends_cache_key,
    with_cache_key,
)
from threadline.drivers._http._sse import ServerSentEvent, StreamProgress, aiter_sse
from threadline.drivers._http._wire import NOT_JSON, loads_or_not
from threadline.drivers.openai_chat._llama_cpp_counting import LlamaCppTokenCounter, server_root
from threadline.drivers.openai_chat._wire import (
    OUTPUT_STYLES,
    MalformedResponse,
    MessageJSONCache,
    OutputStyle,
    StreamAssembler,
    encode_request,
    parse_completion,
)

logger = logging.getLogger("threadline.drivers.openai_chat")

__all__ = ["DEFAULT_BASE_URL", "OpenAIChatDriver"]

DEFAULT_BASE_URL = OPENAI_BASE_URL
_NAME = "openai-chat"


class OpenAIChatDriver(HTTPDriver):
    """A driver for the Chat Completions API (``POST {base_url}/chat/completions``).

    Args:
        base_url: the API root, ``/v1`` included (``"http://127.0.0.1:8080/v1"``
            for a local llama.cpp server); ``None`` reads ``OPENAI_BASE_URL``,
            else ``https://api.openai.com/v1``, as the official client does.
        api_key: the bearer token; ``None`` reads ``OPENAI_API_KEY``, and when
            that is unset too no ``Authorization`` header is sent (fine for
            most local servers). It never appears in a ``repr``, a log record
            or an exception.
        connection: where and how to connect (:class:`HTTPConnection`): the
            client, transport, time-out, retries, headers and clock, which
            drivers may share. ``None``: the defaults.
        **options: any field of :class:`HTTPConnection` (``http_client``,
            ``transport``, ``timeout``, ``max_retries``, ``retry_policy``,
            ``default_headers``, ``clock``) as a keyword of its own; it
            overrides that field of ``connection``, as ``base_url`` and
            ``api_key`` do when not ``None``.
        organization: sent as ``OpenAI-Organization``.
        project: sent as ``OpenAI-Project``.
        max_tokens_field: the body field ``max_output_tokens`` goes to.
            ``"max_tokens"`` is what OpenAI-compatible servers understand;
            OpenAI's reasoning models (o-series, gpt-5) require
            ``"max_completion_tokens"``.
        stream_usage: ask for usage at the end of a stream
            (``stream_options.include_usage``); turn off for servers that
            reject ``stream_options``.
        send_cache_key: send a call's ``cache_key`` (a conversation's, see
            ``Request.with_cache_key``) as ``prompt_cache_key``, which routes
            OpenAI's prompt cache. ``None`` sends it to OpenAI's own API only:
            some compatible servers refuse fields they do not know.
        structured_output: how an ``output_type``'s schema goes to the server:
            ``"json_schema"`` (``response_format`` of that type, strict where
            the schema allows; OpenAI, ``llama-server``, vLLM), ``"json_object"``
            (``{"type": "json_object", "schema": ...}``, the only form
            llama-cpp-python's server takes; ``llama-server`` takes it too) or
            ``"prompt"`` (for servers that refuse ``response_format``: the run
            asks in the system message instead).
        exact_counting: ``"llama.cpp"`` for the upstream llama.cpp server
            (``llama-server``): :meth:`exact_token_counter` then asks the
            server itself (``/apply-template``, ``/tokenize``), and limiting
            does so near the budget. ``None``: no exact counter.

    Raises:
        InvalidRequestError: an argument of the wrong kind, named: a base URL
            that is not ``http(s)://host...``, a ``RetryPolicy`` class instead
            of an instance, a negative or NaN time-out, a header that is not text.
        TypeError: a keyword that is neither the driver's nor a connection's.

    Example::

        async with OpenAIChatDriver("http://127.0.0.1:8080/v1") as driver:
            client = Client(driver, default_model=Model("local", context_size=8192))
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        connection: HTTPConnection | None = None,
        organization: str | None = None,
        project: str | None = None,
        max_tokens_field: Literal["max_tokens", "max_completion_tokens"] = "max_tokens",
        stream_usage: bool = True,
        send_cache_key: bool | None = None,
        exact_counting: Literal["llama.cpp"] | None = None,
        structured_output: OutputStyle = "json_schema",
        **options: Unpack[ConnectionOptions],
    ) -> None:
        if structured_output not in OUTPUT_STYLES:
            fail("structured_output", "'json_schema', 'json_object' or 'prompt'", structured_output)
        self._output_style: OutputStyle = structured_output
        if exact_counting not in (None, "llama.cpp"):
            fail("exact_counting", "'llama.cpp' or None", exact_counting)
        if max_tokens_field not in ("max_tokens", "max_completion_tokens"):
            fail("max_tokens_field", "'max_tokens' or 'max_completion_tokens'", max_tokens_field)
        self._exact_counting = exact_counting
        self._server_cannot_count = False
        self._max_tokens_field = max_tokens_field
        self._stream_usage = check_bool("stream_usage", stream_usage)
        connection = connection_of(
            "OpenAIChatDriver", connection, base_url=base_url, api_key=api_key, options=options
        )
        self._http = openai_endpoint(_NAME, connection, organization=organization, project=project)
        self._base_url = self._http.base_url
        self._url = httpx.URL(f"{self._base_url}/chat/completions")
        self._send_cache_key = sends_cache_key(self._base_url, send_cache_key)
        self._client = self._http.client
        self._errors = self._http.errors
        # Each message's JSON, encoded once: a run re-sends its history every round.
        self._message_json = MessageJSONCache()

    @property
    def name(self) -> str:
        """``"openai-chat"``."""
        return _NAME

    def token_counter(self) -> TokenCounter | None:
        """``None``: Chat Completions has no token counting endpoint."""
        return None

    def exact_token_counter(self, model: Model) -> AsyncTokenCounter | None:
        """The server's own count, with ``exact_counting="llama.cpp"``; otherwise ``None``."""
        if self._exact_counting is None or self._server_cannot_count:
            return None
        return LlamaCppTokenCounter(
            self._post_to_root, self._body, self._errors, model, self._cannot_count
        )

    def _cannot_count(self) -> None:
        if not self._server_cannot_count:
            self._server_cannot_count = True
            logger.warning(
                "the server has no /apply-template or /tokenize (not the upstream llama.cpp "
                "server?): exact counting is off for this driver; limiting decides on the estimate"
            )

    def output_constraint(self, model: Model) -> OutputConstraint:
        """``"schema"``: the server constrains the answer (``response_format``); with
        ``structured_output="prompt"``, ``"prompt"``."""
        return "prompt" if self._output_style == "prompt" else "schema"

    def replay_projection(self, model: Model) -> ReplayProjection:
        """Nothing is replayed: ``reasoning_content`` never goes back to the model."""
        return NO_REPLAY

    # --- sending -------------------------------------------------------------

    def _body(self, call: ProviderCall, *, stream: bool = False) -> bytes:
        return encode_request(
            call,
            stream=stream,
            max_tokens_field=self._max_tokens_field,
            stream_usage=self._stream_usage,
            cache=self._message_json,
            output_style=self._output_style,
        )

    def _request(self, call: ProviderCall, *, stream: bool) -> httpx.Request:
        call = with_cache_key(call, self._send_cache_key)
        return self._http.request(self._url, self._body(call, stream=stream), stream=stream)

    async def _post_to_root(self, path: str, content: bytes) -> httpx.Response:
        """``content`` POSTed to ``path`` at the server's root, with retries."""
        url = httpx.URL(server_root(self._base_url) + path)
        return await self._http.send(self._http.request(url, content, stream=False))

    def _reasoning_label(self, call: ProviderCall) -> str:
        return f"{_NAME}:{call.model.name}"

    def _parse(
        self, response: httpx.Response, content: bytes, call: ProviderCall
    ) -> ProviderResponse:
        # Errors are raised past their except blocks: no __context__ may keep the raw body.
        request_id = response.headers.get("x-request-id")
        payload = loads_or_not(content)
        if payload is NOT_JSON:
            raise self._errors.not_json(
                "the response body",
                content,
                content_type=response.headers.get("content-type", ""),
                request_id=request_id,
            )
        if isinstance(payload, dict) and payload.get("error") is not None:
            raise self._errors.from_payload(payload, request_id=request_id)
        try:
            return parse_completion(
                payload,
                requested_model=call.model.name,
                provider=self._reasoning_label(call),
                request_id=request_id,
            )
        except MalformedResponse as exc:
            reason = str(exc)
        raise self._errors.malformed(reason, request_id=request_id)

    async def complete(self, call: ProviderCall) -> ProviderResponse:
        """Send ``call`` and return the whole answer.

        Raises:
            InvalidRequestError: the call cannot be sent (refused reasoning
                replay state, an unknown forced tool, a value JSON cannot hold).
            ProviderError: the mapped failure, after retries where they apply.
        """
        response = await self._http.send(self._request(call, stream=False))
        return self._parse(response, response.content, call)

    @contextlib.asynccontextmanager
    async def stream(self, call: ProviderCall) -> AsyncIterator[AsyncIterator[StreamChunk]]:
        """Send ``call`` with ``stream: true``; yield chunks ending with ``ResponseDone``.

        The request is sent (and retried) on entering the context; leaving it
        early closes the connection.

        Raises:
            ProviderError: on entry, the mapped failure; while iterating, an
                error event the server sent, a broken connection
                (``ProviderUnavailableError``, never retried once the body
                started) or a malformed event (``ProviderResponseError``).
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
        request_id = response.headers.get("x-request-id")
        progress = StreamProgress(response.headers.get("content-type", ""), response.status_code)
        if progress.content_type.startswith("application/json"):
            # A server that ignored "stream": true and answered in one piece.
            whole = self._parse(response, await read_body(response, self._errors, progress), call)
            # Stream consumers still see the text: as one delta of each kind.
            for chunk in chunks_of(whole):
                yield chunk
            return
        assembler = StreamAssembler(
            requested_model=call.model.name, provider=self._reasoning_label(call)
        )
        events = aiter_sse(response.aiter_bytes(), progress)
        done = False
        failure: ProviderError | None = None
        try:
            async for event in events:
                if event.data == "[DONE]":
                    done = True
                    break
                for chunk in assembler.add(self._event_payload(event, request_id)):
                    yield chunk
            if done or assembler.finish_reason is not None:
                yield ResponseDone(response=assembler.finish(request_id=request_id))
            else:
                failure = self._errors.stream_ended(
                    progress, "no finish_reason and no [DONE]", request_id=request_id
                )
        except MalformedResponse as exc:
            failure = self._errors.malformed(str(exc), request_id=request_id)
        except httpx.TransportError as exc:
            failure = self._errors.from_transport(exc, progress=progress)
        finally:
            await finish_reading(events, drain=done)
        if failure is not None:
            raise failure  # past the except blocks: see _parse

    def _event_payload(self, event: ServerSentEvent, request_id: str | None) -> object:
        """The decoded JSON of a data event; an error event raises its mapped error."""
        payload = loads_or_not(event.data)
        if payload is NOT_JSON:
            if event.event == "error":
                raise self._errors.from_payload(
                    {"error": {"message": event.data}}, request_id=request_id
                )
            raise self._errors.not_json("a stream event", event.data, request_id=request_id)
        if event.event == "error" or (
            isinstance(payload, dict) and payload.get("error") is not None
        ):
            raise self._errors.from_payload(payload, request_id=request_id)
        return payload
