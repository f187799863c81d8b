"""``OpenAIResponsesDriver`` itself: its arguments, sending, counting, and reading answers.

What the driver does with the protocol is described in
:mod:`threadline.drivers.openai_responses`.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import AsyncGenerator, AsyncIterator, Sequence
from typing import Final, Literal, Unpack, cast

import httpx

from threadline._errors import BadRequestError, ProviderError
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
from threadline._validate import fail
from threadline.counting._protocol import ReplayProjection, TokenCounter
from threadline.drivers._http import (
    ConnectionOptions,
    HTTPConnection,
    HTTPDriver,
    check_bool,
    finish_reading,
    read_body,
    request_id_of,
)
from threadline.drivers._http._connection import connection_of
from threadline.drivers._http._openai import (
    OPENAI_BASE_URL,
    openai_endpoint,
    sends_cache_key,
    with_cache_key,
)
from threadline.drivers._http._sse import SSEDecoder, StreamProgress
from threadline.drivers._http._wire import NOT_JSON, MalformedResponse, loads_or_not
from threadline.drivers.openai_responses._request import (
    REASONING_REPLAY,
    EncodedRequest,
    encode_compact_request,
    encode_count_request,
    encode_input,
    encode_request,
    new_message_cache,
)
from threadline.drivers.openai_responses._response import (
    ResponseFailed,
    StreamAssembler,
    parse_compaction,
    parse_response,
)
from threadline.drivers.openai_responses._state import ServerState
from threadline.tools._tools import Tool

__all__ = ["DEFAULT_BASE_URL", "OpenAIResponsesDriver", "ResponsesTokenCounter"]

logger = logging.getLogger("threadline.drivers.openai_responses")

DEFAULT_BASE_URL: Final = OPENAI_BASE_URL
_NAME: Final = "openai-responses"
_EFFORTS: Final = ("none", "minimal", "low", "medium", "high", "xhigh")
_SUMMARIES: Final = ("auto", "concise", "detailed")
_MISSING_ITEM = re.compile(r"item with id '[^']*' not found", re.IGNORECASE)
_MISSING_ITEM_NOTE: Final = (
    " — the request named an item by id alone, which only a server that stored it"
    " (store: true) can find; this driver replays reasoning items whole, with their"
    " encrypted_content, and sends store: false unless server_state=True, so the item"
    " must have come from elsewhere (a transcript edited by hand, reasoning saved"
    " without its encrypted_content, or a stored response the server has dropped)"
)
_NO_STATE_NOTE: Final = (
    " — OpenAIResponsesDriver(server_state=True) sent previous_response_id, which a server"
    " that keeps no state (llama.cpp's, for one) refuses: use server_state=False there"
)
_MISSING_RESPONSE = re.compile(r"previous response with id '[^']*' not found", re.IGNORECASE)


class OpenAIResponsesDriver(HTTPDriver):
    """A driver for the Responses API (``POST {base_url}/responses``), stateless.

    Every call sends ``store: false`` and the whole transcript the run kept
    as ``input`` items, and asks for ``reasoning.encrypted_content``: the
    reasoning of OpenAI's reasoning models comes back as items kept on the
    assistant message and is replayed exactly, next round and next turn.

    Args:
        base_url: the API root, ``/v1`` included; ``None`` reads
            ``OPENAI_BASE_URL``, else ``https://api.openai.com/v1``.
        api_key: the bearer token; ``None`` reads ``OPENAI_API_KEY``, and when
            that is unset too no ``Authorization`` header is sent. It never
            appears in a ``repr``, a log record or an exception.
        connection: where and how to connect (:class:`HTTPConnection`).
        **options: any field of :class:`HTTPConnection` as a keyword of its own.
        organization: sent as ``OpenAI-Organization``.
        project: sent as ``OpenAI-Project``.
        reasoning_effort: ``reasoning.effort`` for every call (``"low"``,
            ``"medium"``, ``"high"``, ...); ``None`` leaves the model's default.
        reasoning_summary: ``reasoning.summary`` (``"auto"``, ``"concise"``,
            ``"detailed"``): the summary becomes ``Reasoning.text``. A call's
            ``extra_body={"reasoning": {...}}`` replaces both.
        encrypted_reasoning: ask for ``reasoning.encrypted_content``, so
            reasoning can be replayed. Turn off for a server or model that
            refuses the ``include``; reasoning is then kept for display only
            (its summary), since without its encrypted content an item could
            only be named by id, which a stateless call cannot do.
        send_cache_key: send a call's ``cache_key`` as ``prompt_cache_key``.
            ``None`` sends it to OpenAI's own API only.
        server_state: keep the conversation on the server too: every call is
            sent with ``store: true``, and a call whose history is exactly
            what the server holds for the last reply (nothing cut, edited or
            replaced since) sends ``previous_response_id`` and only the new
            items. Any other call is sent whole, and a log record of
            ``threadline.drivers.openai_responses`` says why. A stored response
            the server no longer has is forgotten and the call sent whole.
            Off by default: stateless calls keep nothing on the server.
        cache_diagnosis: ask the API why its prompt cache missed: a call
            after an earlier one carries
            ``prompt_cache_options.comparison_response_id`` (the previous
            response's id), and the answer's ``prompt_cache_diagnostics``
            becomes ``ProviderResponse.cache_diagnosis`` (the round's
            ``RoundRecord.cache``). Off by default; models that do not
            diagnose answer without the field, and nothing is recorded.

    Raises:
        InvalidRequestError: an argument of the wrong kind, named.
        TypeError: a keyword that is neither the driver's nor a connection's.

    Example::

        async with OpenAIResponsesDriver(reasoning_summary="auto") as driver:
            client = Client(driver, default_model=Model("gpt-5-mini", context_size=400_000))
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        api_key: str | None = None,
        connection: HTTPConnection | None = None,
        organization: str | None = None,
        project: str | None = None,
        reasoning_effort: str | None = None,
        reasoning_summary: Literal["auto", "concise", "detailed"] | None = None,
        encrypted_reasoning: bool = True,
        send_cache_key: bool | None = None,
        server_state: bool = False,
        cache_diagnosis: bool = False,
        **options: Unpack[ConnectionOptions],
    ) -> None:
        if reasoning_effort is not None and reasoning_effort not in _EFFORTS:
            fail("reasoning_effort", f"one of {', '.join(_EFFORTS)} or None", reasoning_effort)
        if reasoning_summary is not None and reasoning_summary not in _SUMMARIES:
            fail("reasoning_summary", f"one of {', '.join(_SUMMARIES)} or None", reasoning_summary)
        reasoning = {"effort": reasoning_effort, "summary": reasoning_summary}
        self._reasoning = {key: value for key, value in reasoning.items() if value is not None}
        self._encrypted = check_bool("encrypted_reasoning", encrypted_reasoning)
        self._state = ServerState() if check_bool("server_state", server_state) else None
        self._diagnose = check_bool("cache_diagnosis", cache_diagnosis)
        connection = connection_of(
            "OpenAIResponsesDriver", connection, base_url=base_url, api_key=api_key, options=options
        )
        self._http = openai_endpoint(_NAME, connection, organization=organization, project=project)
        self._base_url = self._http.base_url
        self._url = httpx.URL(f"{self._base_url}/responses")
        self._count_url = httpx.URL(f"{self._base_url}/responses/input_tokens")
        self._compact_url = httpx.URL(f"{self._base_url}/responses/compact")
        self._send_cache_key = sends_cache_key(self._base_url, send_cache_key)
        self._client = self._http.client
        self._errors = self._http.errors
        # Each message's items, encoded once: a run re-sends its history every round.
        self._message_json = new_message_cache()

    @property
    def name(self) -> str:
        """``"openai-responses"``."""
        return _NAME

    def token_counter(self) -> TokenCounter | None:
        """``None``: the exact counter is a network call, see :meth:`exact_token_counter`."""
        return None

    def exact_token_counter(self, model: Model) -> ResponsesTokenCounter:
        """An exact counter for ``model`` backed by ``/responses/input_tokens``."""
        return ResponsesTokenCounter(self, model)

    def output_constraint(self, model: Model) -> OutputConstraint:
        """``"schema"``: the answer is constrained by ``text.format`` (a JSON schema)."""
        return "schema"

    def replay_projection(self, model: Model) -> ReplayProjection:
        """Replayed reasoning and compaction items are counted as sent: :meth:`replay_rules`
        price the string values of the items they send.

        That is their ``encrypted_content`` and summary texts, as o200k tokens.
        Encrypted content is base64, which tokenizes to more tokens than the
        reasoning it holds, and the API drops reasoning of turns before the last
        user message; so the estimate errs large, the safe side for a budget.
        The exact counter (``/responses/input_tokens``) counts them as the API
        does, near the budget's edge.
        """
        return REASONING_REPLAY

    def replay_rules(self, model: Model) -> ReplayRules:
        """This driver's own reasoning items go back, every turn
        (:data:`~threadline.drivers.openai_responses.REASONING_REPLAY`); any other
        stored state is refused before anything is sent."""
        return REASONING_REPLAY

    def _label(self, call: ProviderCall) -> str:
        return f"{_NAME}:{call.model.name}"

    # --- sending -------------------------------------------------------------

    def _encode(
        self, call: ProviderCall, *, stream: bool, continued: bool = True
    ) -> EncodedRequest:
        return encode_request(
            with_cache_key(call, self._send_cache_key),
            stream=stream,
            label=self._label(call),
            reasoning=self._reasoning,
            cache=self._message_json,
            encrypted=self._encrypted,
            store=self._state is not None,
            server_state=self._state if continued else None,
            diagnose=self._diagnose,
        )

    async def _send_call(
        self, call: ProviderCall, *, stream: bool
    ) -> tuple[httpx.Response, tuple[str, ...]]:
        """``call`` sent, and why it went whole in server-state mode (for the round's
        record); sent whole again when the response it continues is no longer on
        the server."""
        encoded = self._encode(call, stream=stream)
        request = self._http.request(self._url, encoded.body, stream=stream)
        notes = () if encoded.continuation_note is None else (encoded.continuation_note,)
        lost = encoded.previous_response_id
        if lost is None or self._state is None:
            return await self._send(request, stream=stream), notes
        refused: BadRequestError | None = None
        try:
            return await self._send(request, stream=stream), notes
        except BadRequestError as exc:
            if not _MISSING_RESPONSE.search(exc.message):
                if "previous_response_id" not in exc.message:
                    raise
                refused = _explained(exc, _NO_STATE_NOTE)
        if refused is not None:
            raise refused  # past the except block: see _decode
        self._state.forget(lost)
        note = f"sent whole, without previous_response_id: the server no longer has {lost}"
        logger.info("%s", note)
        whole = self._encode(call, stream=stream, continued=False).body
        request = self._http.request(self._url, whole, stream=stream)
        return await self._send(request, stream=stream), (note,)

    async def _send(self, request: httpx.Request, *, stream: bool = False) -> httpx.Response:
        """``request`` sent with retries; a missing stored item's refusal explained."""
        failure: ProviderError | None = None
        try:
            return await self._http.send(request, stream=stream)
        except BadRequestError as exc:
            if not _MISSING_ITEM.search(exc.message):
                raise
            failure = _explained(exc, _MISSING_ITEM_NOTE)
        raise failure  # past the except block: see _decode

    def _remember(self, call: ProviderCall, reply: Message, response_id: object) -> None:
        """In server-state mode, note that ``response_id`` holds ``call``'s history and
        ``reply``, as the next call will encode them."""
        if self._state is None or not isinstance(response_id, str) or not response_id:
            return
        messages = (*call.messages, reply)
        encoded = encode_input(messages, self._label(call), self._message_json)
        start = encoded.reply[0] if encoded.reply is not None else len(encoded.items)
        self._state.remember(encoded.items, start, response_id)

    # Errors are raised past their except blocks: no __context__ may keep the raw body.

    def _decode(
        self, content: bytes | str, request_id: str | None, *, content_type: str | None = None
    ) -> object:
        payload = loads_or_not(content)
        if payload is NOT_JSON:
            what = "the response body" if content_type is not None else "a stream event"
            raise self._errors.not_json(
                what, content, content_type=content_type, request_id=request_id
            )
        if (
            isinstance(payload, dict)
            and (payload.get("type") == "error" or payload.get("error") is not None)
            and payload.get("object") != "response"
        ):
            raise self._errors.from_payload(payload, request_id=request_id)
        return payload

    def _failed(self, exc: ResponseFailed, request_id: str | None) -> ProviderError:
        return self._errors.from_payload({"error": exc.error}, request_id=request_id)

    def _parse(
        self, response: httpx.Response, content: bytes, call: ProviderCall
    ) -> ProviderResponse:
        request_id = request_id_of(response.headers)
        content_type = response.headers.get("content-type", "")
        payload = self._decode(content, request_id, content_type=content_type)
        failure: ProviderError
        try:
            parsed = parse_response(
                payload,
                requested_model=call.model.name,
                provider=self._label(call),
                request_id=request_id,
            )
        except MalformedResponse as exc:
            failure = self._errors.malformed(str(exc), request_id=request_id)
        except ResponseFailed as exc:
            failure = self._failed(exc, request_id)
        else:
            assert isinstance(payload, dict)  # parse_response took it as a response object
            self._remember(call, parsed.message, payload.get("id"))
            return parsed
        raise failure

    async def complete(self, call: ProviderCall) -> ProviderResponse:
        """Send ``call`` and return the whole answer.

        Raises:
            InvalidRequestError: the call cannot be sent (refused reasoning
                replay state, an unknown forced tool, a value JSON cannot hold).
            ProviderError: the mapped failure, after retries where they apply;
                a response whose status is ``failed`` is mapped from its error.
        """
        response, notes = await self._send_call(call, stream=False)
        return self._parse(response, response.content, call).noted(notes)

    async def count_tokens(self, call: ProviderCall) -> int:
        """The input tokens of ``call`` as the server counts them (``/responses/input_tokens``).

        Raises:
            ProviderError: the mapped failure, or an answer without ``input_tokens``.
        """
        body = encode_count_request(
            call, label=self._label(call), reasoning=self._reasoning, cache=self._message_json
        )
        response = await self._send(self._http.request(self._count_url, body, stream=False))
        request_id = request_id_of(response.headers)
        content_type = response.headers.get("content-type", "")
        payload = self._decode(response.content, request_id, content_type=content_type)
        tokens = payload.get("input_tokens") if isinstance(payload, dict) else None
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise self._errors.malformed(
                f"/responses/input_tokens answered without an input_tokens count: {payload!r}",
                request_id=request_id,
            )
        return tokens

    async def compact(self, call: ProviderCall) -> ProviderResponse:
        """Compact ``call``'s transcript with ``POST /responses/compact`` (stateless).

        The transcript goes as a call would send it (from the latest compaction
        on); the answer is an assistant message with no text whose state is the
        compact output, in order: the messages it retained, then the compaction
        item. Kept opaque with this driver's and model's tag, it opens the
        window of later calls to this model, which send that whole output
        (see :mod:`threadline.drivers.openai_responses`).

        Raises:
            InvalidRequestError: refused replay state.
            ProviderError: the mapped failure, or an output that is not a
                compaction (no compaction item, an item of another type).
        """
        body = encode_compact_request(
            with_cache_key(call, self._send_cache_key),
            label=self._label(call),
            cache=self._message_json,
        )
        response = await self._send(self._http.request(self._compact_url, body, stream=False))
        request_id = request_id_of(response.headers)
        content_type = response.headers.get("content-type", "")
        payload = self._decode(response.content, request_id, content_type=content_type)
        try:
            return parse_compaction(
                payload,
                requested_model=call.model.name,
                provider=self._label(call),
                request_id=request_id,
            )
        except MalformedResponse as exc:
            reason = str(exc)
        raise self._errors.malformed(reason, request_id=request_id)

    @contextlib.asynccontextmanager
    async def stream(self, call: ProviderCall) -> AsyncIterator[AsyncIterator[StreamChunk]]:
        """Send ``call`` with ``stream: true``; yield chunks ending with ``ResponseDone``.

        Raises:
            ProviderError: on entry, the mapped failure; while iterating, an
                ``error`` event or ``response.failed`` (a context-length
                refusal is ``ContextLengthExceededError``), a broken
                connection, or a malformed event (``ProviderResponseError``).
        """
        response, notes = await self._send_call(call, stream=True)
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
            # A server that ignored "stream": true and answered in one piece.
            content = await read_body(response, self._errors, progress)
            for chunk in chunks_of(self._parse(response, content, call).noted(notes)):
                yield chunk
            return
        assembler = StreamAssembler(requested_model=call.model.name, provider=self._label(call))
        # The body's reads are decoded here, not through aiter_sse: a stream is
        # hundreds of small events, and each async step per event costs.
        # httpx's aiter_bytes is an async generator, closed by finish_reading.
        reads = cast("AsyncGenerator[bytes, None]", response.aiter_bytes())
        decoder = SSEDecoder(progress)
        failure: ProviderError | None = None
        ended = False  # "[DONE]", or the response's last event
        try:
            async for read in reads:
                for event in decoder.feed(read):
                    ended = event.data == "[DONE]" or assembler.finished
                    if ended:
                        break
                    payload = loads_or_not(event.data)
                    if (
                        type(payload) is not dict
                        or "error" in payload
                        or payload.get("type") == "error"
                    ):
                        payload = self._decode(event.data, request_id)  # the careful way
                    for chunk in assembler.add(payload):
                        yield chunk
                if ended or assembler.finished:
                    break
            else:
                for event in decoder.flush():
                    if event.data == "[DONE]" or assembler.finished:
                        break
                    for chunk in assembler.add(self._decode(event.data, request_id)):
                        yield chunk
            if assembler.finished:
                done = assembler.finish(request_id=request_id)
                self._remember(call, done.message, assembler.response_id)
                yield ResponseDone(response=done.noted(notes))
            else:
                failure = self._errors.stream_ended(
                    progress, "no response.completed", request_id=request_id
                )
        except MalformedResponse as exc:
            failure = self._errors.malformed(str(exc), request_id=request_id)
        except ResponseFailed as exc:
            failure = self._failed(exc, request_id)
        except httpx.TransportError as exc:
            failure = self._errors.from_transport(exc, progress=progress)
        finally:
            await finish_reading(reads, drain=assembler.finished)
        if failure is not None:
            raise failure


def _explained(exc: BadRequestError, note: str) -> BadRequestError:
    """``exc`` with ``note`` after its message: what the refusal means for this driver.
    A new error, so the caller raises it past its except block (no ``__context__``)."""
    return BadRequestError(
        exc.message + note,
        status=exc.status,
        body=exc.body,
        request_id=exc.request_id,
        provider=exc.provider,
    )


class ResponsesTokenCounter:
    """The exact input tokens of a transcript, asked of ``/responses/input_tokens``.

    A network call per count, so it is async: limiting asks it near the
    budget's edge, not for every estimate.

    Example::

        counter = driver.exact_token_counter(model)
        tokens = await counter.count(messages, tools)
    """

    def __init__(self, driver: OpenAIResponsesDriver, model: Model) -> None:
        self._driver = driver
        self._model = model

    def __repr__(self) -> str:
        return f"ResponsesTokenCounter(model={self._model.name!r})"

    async def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        """The server's count of ``messages`` sent with ``tools``."""
        call = ProviderCall(model=self._model, messages=tuple(messages), tools=tuple(tools))
        return await self._driver.count_tokens(call)
