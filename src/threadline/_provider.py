"""The ``Driver`` protocol: what the run loop asks of every provider.

A driver translates one wire protocol. It takes a ``ProviderCall`` (threadline's
own messages and tools, already limited to the budget) and gives back a
``ProviderResponse``, or a stream of ``StreamChunk`` values ending in a
``ResponseDone`` that carries the same ``ProviderResponse``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import AbstractAsyncContextManager
from typing import Any, Literal, Protocol, TypeAlias, runtime_checkable

import attrs

from threadline._messages import Message, Usage
from threadline._models import Model
from threadline._replay import ANY_REPLAY, ReplayRules
from threadline.counting._protocol import ExactCounter, ReplayProjection, TokenCounter
from threadline.tools._output import OutputSchema
from threadline.tools._tools import Tool

__all__ = [
    "CacheDiagnosis",
    "Driver",
    "FinishReason",
    "OutputConstraint",
    "ProviderCall",
    "ProviderResponse",
    "ReasoningChunk",
    "ResponseDone",
    "SamplingSettings",
    "StreamChunk",
    "TextChunk",
    "ToolCallChunk",
    "chunks_of",
]

FinishReason: TypeAlias = str
"""``"stop"``, ``"length"``, ``"tool_calls"``, ``"content_filter"``, ``"refusal"``, or what
the provider said."""

OutputConstraint: TypeAlias = Literal["schema", "grammar", "prompt"]
"""How a driver holds a structured answer to its schema: ``"schema"`` the provider
enforces the JSON schema it is sent, ``"grammar"`` the driver samples under a grammar
made from it, ``"prompt"`` nothing does (the run asks in the system message and
validates)."""


@attrs.frozen(kw_only=True)
class SamplingSettings:
    """Sampling options passed through to the provider; ``None`` leaves its default."""

    temperature: float | None = None
    top_p: float | None = None
    stop: tuple[str, ...] | None = None
    seed: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None


@attrs.frozen(kw_only=True)
class HistorySpan:
    """Where a call's history stands in its messages and whose it is, without holding
    them: the history a conversation vouches for (its own messages, sent again every
    turn) is ``messages[offset:offset + length]``, taken from ``source`` (a
    transcript's token and the event the history starts at).

    Two spans with one source and offset hold the same message objects there, the
    shorter's being the start of the longer: a transcript only grows at its end,
    and a rewritten one is a new source. So whoever keeps something per call (the
    next round's prompt comparison, a test double's call log) knows what two calls
    share without comparing their messages.
    """

    source: tuple[object, int]
    offset: int
    length: int

    def begins(self, later: HistorySpan | None) -> bool:
        """Whether a call whose history has span ``later`` holds this span's history
        at the same place, as its start (so its first ``offset + length`` messages
        are this call's, the ``offset`` messages before the history aside)."""
        return (
            later is not None
            and later.source == self.source
            and later.offset == self.offset
            and later.length >= self.length
        )


@attrs.frozen(kw_only=True)
class ProviderCall:
    """One call to a provider: what the run loop sends in one round."""

    model: Model
    messages: tuple[Message, ...]
    tools: tuple[Tool, ...] = ()
    tool_choice: str | None = None
    """``"auto"``, ``"none"``, ``"required"`` or the name of one tool; ``None`` omits it."""
    max_output_tokens: int | None = None
    sampling: SamplingSettings = SamplingSettings()
    extra_body: Mapping[str, Any] = attrs.field(factory=dict)
    """Provider-specific fields merged into the request body as given."""
    cache_key: str | None = None
    """A stable key for the prompt prefix this call shares with earlier ones (a
    conversation's), for providers that route their prompt cache by one."""
    output: OutputSchema | None = None
    """The JSON schema the answer must follow (``output_type``), for the driver to send
    or enforce as its ``output_constraint`` says; ``None``: a text answer."""
    previous_response_id: str | None = None
    """The ``response_id`` (else the ``request_id``) of the response to the call
    before this one (the round before, or a conversation's previous turn): what
    a provider's cache diagnosis
    compares this call with (Anthropic's ``diagnostics.previous_message_id``).
    Only for diagnosis; a stateless driver sends the whole transcript regardless."""
    history: HistorySpan | None = attrs.field(default=None, eq=False, repr=False)
    """Where the conversation's history stands in ``messages`` and whose it is (see
    :class:`HistorySpan`), when the engine can vouch for it: a driver that keeps
    something per call knows what this call shares with an earlier one without
    comparing their messages. ``None``: not known (no conversation, or a handler or
    a replay rule changed the history); compare the messages then. Where the
    messages came from, not what is sent: two calls that send the same are equal
    whatever their spans."""


@attrs.frozen(kw_only=True)
class CacheDiagnosis:
    """The provider's own account of why its prompt cache missed, read by a driver.

    Anthropic's cache diagnostics (``diagnostics.cache_miss_reason`` on a
    message, when the request carried ``diagnostics.previous_message_id``) and
    OpenAI's ``prompt_cache_diagnostics`` on a Responses response compare a
    request with an earlier one and name where they diverged. ``provider``
    names who said it; ``reason`` is the provider's word, as it gave it
    (``"system_changed"``, ``"tools_changed"``, ``"messages_changed"``,
    ``"cache_hit"``...); ``missed_tokens`` how many input tokens it says the
    divergence cost (``None``: not said).
    """

    provider: str
    reason: str
    missed_tokens: int | None = None

    def __str__(self) -> str:
        missed = "" if self.missed_tokens is None else f", {self.missed_tokens} tokens missed"
        return f"{self.reason} ({self.provider}{missed})"


@attrs.frozen(kw_only=True)
class ProviderResponse:
    """The provider's answer to one call."""

    message: Message
    """The assistant message (origin ``TURN``), with any tool calls and reasoning."""
    finish_reason: FinishReason
    usage: Usage
    model: str
    """The model name the provider says answered."""
    request_id: str | None = None
    """The id the provider gave the HTTP request (``x-request-id``), for support."""
    response_id: str | None = None
    """The id the provider gave this response in its body (Anthropic's ``msg_...``,
    OpenAI Responses' ``resp_...``): what a later call's cache diagnosis names
    (``ProviderCall.previous_response_id``). ``None``: the body named none."""
    replay_notes: tuple[str, ...] = ()
    """What the driver did to the stored replay state to send this call, one line
    each (a placeholder signature where the provider demands one, a stale signature
    left off); the round's record keeps them (``RoundRecord.replay_notes``)."""
    cache_diagnosis: CacheDiagnosis | None = None
    """Why the provider's prompt cache missed, by the provider's own diagnosis, where
    the driver reads one (see :class:`CacheDiagnosis`)."""
    omitted_output: bool = False
    """Whether the provider's answer held output ``message`` does not (a server tool's
    call, code it ran, audio): its ``usage.output_tokens`` then count more than the
    message, and calibration learns nothing from them."""

    @property
    def text(self) -> str:
        """The reply's text."""
        return self.message.text

    def noted(self, notes: tuple[str, ...]) -> ProviderResponse:
        """This response with ``notes`` added to its :attr:`replay_notes`."""
        return attrs.evolve(self, replay_notes=(*self.replay_notes, *notes)) if notes else self


@attrs.frozen(kw_only=True)
class TextChunk:
    """A piece of the reply's text."""

    text: str


@attrs.frozen(kw_only=True)
class ReasoningChunk:
    """A piece of the reply's display reasoning."""

    text: str


@attrs.frozen(kw_only=True)
class ToolCallChunk:
    """A piece of a tool call: ``index`` says which call it belongs to."""

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@attrs.frozen(kw_only=True)
class ResponseDone:
    """The end of a stream: the whole response, assembled."""

    response: ProviderResponse


StreamChunk: TypeAlias = TextChunk | ReasoningChunk | ToolCallChunk | ResponseDone


def chunks_of(response: ProviderResponse, *, text_pieces: int = 1) -> Iterator[StreamChunk]:
    """A whole response as the chunks a stream of it would carry.

    The display reasoning as one chunk, the text in ``text_pieces`` (about
    equal) pieces, each tool call whole, then ``ResponseDone``. For a server
    that answered a stream in one piece, and for fakes that stream a scripted
    reply, so stream consumers see the same kinds of chunk either way.
    """
    message = response.message
    if message.reasoning is not None and message.reasoning.text:
        yield ReasoningChunk(text=message.reasoning.text)
    text = message.text
    if text:
        size = max(1, -(-len(text) // max(1, text_pieces)))
        for start in range(0, len(text), size):
            yield TextChunk(text=text[start : start + size])
    for index, call in enumerate(message.tool_calls):
        yield ToolCallChunk(index=index, id=call.id, name=call.name, arguments=call.arguments)
    yield ResponseDone(response=response)


@runtime_checkable
class Driver(Protocol):
    """What the run loop needs from a provider.

    ``name``, ``complete``, ``stream``, ``token_counter`` and
    ``replay_projection`` every driver implements. The rest are optional
    powers with defaults: a driver subclasses ``Driver`` to inherit them and
    overrides the ones it has (replay rules with an allow-list, an exact
    counter, something to load or to release). threadline calls them all
    directly, never asking first whether a driver has them.

    Example::

        class EchoDriver(Driver):
            name = "echo"

            async def complete(self, call: ProviderCall) -> ProviderResponse: ...
            def stream(self, call: ProviderCall): ...
            def token_counter(self) -> TokenCounter | None:
                return None
            def replay_projection(self, model: Model) -> ReplayProjection:
                return DefaultReplayProjection()
    """

    @property
    def name(self) -> str:
        """A short name for logs and ``Reasoning.provider`` (``"openai-chat"``)."""
        ...

    async def complete(self, call: ProviderCall) -> ProviderResponse:
        """Send ``call`` and wait for the whole response.

        Raises:
            ProviderError: or one of its subclasses, mapped from the provider's answer.
        """
        ...

    def stream(self, call: ProviderCall) -> AbstractAsyncContextManager[AsyncIterator[StreamChunk]]:
        """Send ``call`` and yield the response as it arrives, ending with ``ResponseDone``.

        Leaving the context manager early closes the connection.
        """
        ...

    def token_counter(self) -> TokenCounter | None:
        """A provider-specific counter for the driver tier, or ``None``."""
        ...

    def replay_projection(self, model: Model) -> ReplayProjection:
        """How this driver replays reasoning to ``model`` (what counting must count)."""
        ...

    # --- optional powers, with defaults ----------------------------------------

    def replay_rules(self, model: Model) -> ReplayRules:
        """Which stored replay state this driver sends back to ``model``, and where.

        The run loop hands each call only the state these rules send (checked
        by their allow-list), and counts exactly that; a driver that sends
        state back checks it by the same rules (``threadline._replay.replayed``)
        whoever calls it. Its :meth:`replay_projection` is then usually these
        rules too. Default: :data:`ANY_REPLAY`, no allow-list (every turn's
        state is handed over, refused only when it is not JSON or holds a
        ``{"type": "text"}`` block).
        """
        return ANY_REPLAY

    def exact_token_counter(self, model: Model) -> ExactCounter | None:
        """The provider's own count for ``model`` (often a round trip), or ``None``.

        Limiting asks it near the budget's edge when neither the request nor
        the client set an exact counter. Default: ``None``, nothing is
        counted exactly and the estimate decides.
        """
        return None

    def output_constraint(self, model: Model) -> OutputConstraint:
        """How this driver holds a structured answer from ``model`` to its schema.

        A driver that sends ``ProviderCall.output`` to a provider which enforces
        it says ``"schema"``; one that samples under a grammar ``"grammar"``.
        Default: ``"prompt"``, the driver ignores ``output``, and the run puts
        the schema in the system message and validates the answer.
        """
        return "prompt"

    def tool_result_images(self, model: Model) -> bool:
        """Whether a tool result sent to ``model`` may carry images (``ImagePart``).

        Default: ``False``; the run loop then puts a note where an image was
        (an MCP tool's screenshot, say), so what is sent is what was counted.
        """
        return False

    async def compact(self, call: ProviderCall) -> ProviderResponse | None:
        """Compact ``call.messages`` with the provider's own compaction, or ``None``.

        A driver whose provider compacts a transcript natively (OpenAI's
        ``/responses/compact``) sends it and gives back an assistant message
        with no text and no tool call whose ``Reasoning.provider_reasoning``
        holds what the provider returned, exactly as received, including a
        block its :meth:`replay_rules` name as a ``boundary``: the window
        then opens at that message for this provider and model, while any
        other provider is handed the whole history (the state is theirs
        alone). ``Conversation.compact()`` calls it and commits the message.
        Default: ``None``, no native compaction.

        Raises:
            ProviderError: the provider refused or failed the compaction.
        """
        return None

    async def load(self) -> None:
        """Load now what the first call would otherwise load (a local model's weights).

        Default: nothing to load.
        """
        return None

    async def aclose(self) -> None:
        """Release what the driver holds (its HTTP client, a loaded model); idempotent.

        Default: nothing to release.
        """
        return None
