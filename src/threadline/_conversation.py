"""``Conversation``: one thread with an agent, remembering every turn.

A conversation keeps its transcript as :class:`ConversationEvent` objects and
builds every turn's request through the agent's ``client.request()``: the
same engine as a bare request, with the conversation's window as history.

A turn joins the transcript only when its run completes. Until then nothing
in memory changes; with a store, the submitted prompt is written first,
marked pending, and the turn replaces it in one write on success. A failed or
cancelled run removes the pending copy again, under a shielded cancel scope,
so the conversation and its store are left as they were.

Per-turn work is proportional to the window, not to the transcript (see
``_transcript``).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import anyio
import anyio.lowlevel
import attrs

from threadline._agent import Agent
from threadline._conversation_settings import (
    check_handler,
    check_history_limit,
    check_max_context,
    check_reserve,
    settings_from,
    settings_to,
)
from threadline._errors import ConcurrentModificationError, InvalidRequestError
from threadline._events import FinalResult, StreamEvent
from threadline._messages import Message, Origin, Role, Usage
from threadline._provider import ProviderResponse
from threadline._request import Request
from threadline._result import RunResult
from threadline._sentinel import NOT_GIVEN, NotGiven
from threadline._store import ConversationStore
from threadline._transcript import Transcript, Turn, checked_replacement, sum_usage, turn_events
from threadline.limiting._budget import resolve_budget
from threadline.limiting._event import TokenLimitHandler
from threadline.serialization._converter import dumps_conversation, loads_conversation
from threadline.serialization._documents import ConversationDocument, ConversationEvent, JsonValue

__all__ = ["Agent", "Conversation", "Turn"]

logger = logging.getLogger("threadline.conversation")


def _now() -> datetime:
    return datetime.now(UTC)


# -- Conversation -----------------------------------------------------------------------


@attrs.define(kw_only=True)
class _TurnInProgress:
    turn_id: int
    prompt: Message
    request: Request
    pending_written: bool = False
    created_store_entry: bool = False
    committed: bool = False


class Conversation:
    """One thread with an agent: every turn sees the turns before it.

    ``history_limit`` caps, in messages, the window sent as history: the
    window holds at least that many messages and starts at a user message,
    so it never opens inside a turn; 0 sends the whole transcript. The
    transcript itself keeps every turn. ``max_context_tokens``,
    ``output_reserve_tokens`` and the limiting handlers go to every turn's
    request (see docs/limiting.md). With a ``store``, every turn is persisted
    as it happens (see the module docstring); use :meth:`load` to continue a
    stored conversation.

    One conversation serves one caller at a time: a second ``run`` waits for
    the first to finish.

    Raises:
        InvalidRequestError: an option of the wrong type or sign.

    Example::

        conv = Conversation(agent, history_limit=20)
        await conv.run("My name is Ada.")
        print((await conv.run("What is my name?")).text)
    """

    def __init__(
        self,
        agent: Agent,
        *,
        id: str | None = None,
        history_limit: int = 0,
        store: ConversationStore | None = None,
        max_context_tokens: int | None = None,
        output_reserve_tokens: int | NotGiven = NOT_GIVEN,
        pre_max_tokens_reached: TokenLimitHandler | None = None,
        post_max_tokens_reached: TokenLimitHandler | None = None,
        metadata: Mapping[str, str] | None = None,
    ) -> None:
        if not isinstance(agent, Agent):
            raise InvalidRequestError(f"Conversation needs an Agent, not {type(agent).__name__}")
        if id is None:
            id = uuid.uuid4().hex
        if not isinstance(id, str) or not id:
            raise InvalidRequestError(f"a conversation id is a non-empty string, not {id!r}")
        self._agent = agent
        self._id = id
        self._history_limit = check_history_limit(history_limit)
        self._store = store
        self._max_context_tokens = check_max_context(max_context_tokens)
        self._output_reserve = check_reserve(output_reserve_tokens)
        self._pre = check_handler("pre_max_tokens_reached", pre_max_tokens_reached)
        self._post = check_handler("post_max_tokens_reached", post_max_tokens_reached)
        # The document type validates the labels; keep its copy.
        self._metadata = ConversationDocument(id=id, metadata=metadata or {}).metadata
        self._extra_settings: dict[str, JsonValue] = {}
        self._lock = anyio.Lock()
        self._lock_loop: anyio.lowlevel.EventLoopToken | None = None
        self._version = 0
        self._created_at: datetime | None = _now()
        self._updated_at: datetime | None = None
        self._transcript = Transcript()

    def _turn_lock(self) -> anyio.Lock:
        # An anyio lock belongs to the backend that first used it; an idle
        # conversation may move on to another event loop (asyncio, then trio).
        loop = anyio.lowlevel.current_token()
        if loop != self._lock_loop and not self._lock.locked():
            if self._lock_loop is not None:
                self._lock = anyio.Lock()
            self._lock_loop = loop
        return self._lock

    # -- state --------------------------------------------------------------------------

    @property
    def id(self) -> str:
        """The conversation's id."""
        return self._id

    @property
    def agent(self) -> Agent:
        """The agent the conversation runs with."""
        return self._agent

    @property
    def store(self) -> ConversationStore | None:
        """Where the conversation persists, if anywhere."""
        return self._store

    @property
    def version(self) -> int:
        """The store version this conversation last wrote or loaded (0: not stored yet)."""
        return self._version

    @property
    def metadata(self) -> dict[str, str]:
        """The caller's labels (a copy)."""
        return dict(self._metadata)

    @property
    def history_limit(self) -> int:
        """How many messages the window holds at least; 0 sends the whole transcript.

        A new value applies from the next run.
        """
        return self._history_limit

    @history_limit.setter
    def history_limit(self, value: int) -> None:
        self._history_limit = check_history_limit(value)

    @property
    def max_context_tokens(self) -> int | None:
        """The context limit each turn's request gets (``None``: the model's)."""
        return self._max_context_tokens

    @max_context_tokens.setter
    def max_context_tokens(self, value: int | None) -> None:
        self._max_context_tokens = check_max_context(value)

    @property
    def output_reserve_tokens(self) -> int | NotGiven:
        """The reply's reserve each turn's request gets (``NOT_GIVEN``: the default)."""
        return self._output_reserve

    @output_reserve_tokens.setter
    def output_reserve_tokens(self, value: int | NotGiven) -> None:
        self._output_reserve = check_reserve(value)

    @property
    def events(self) -> tuple[ConversationEvent, ...]:
        """The whole answered transcript, oldest first (pending events are not in it)."""
        return self._transcript.events

    @property
    def pending_events(self) -> tuple[ConversationEvent, ...]:
        """Prompts a crashed process submitted and never saw answered.

        They are never sent to the model. Run one again to answer it (the
        pending copy goes when the turn commits), or :meth:`discard_pending`.
        """
        return self._transcript.pending

    def pending_messages(self) -> tuple[Message, ...]:
        """The messages of :attr:`pending_events`."""
        return tuple(event.message for event in self._transcript.pending)

    @property
    def messages(self) -> tuple[Message, ...]:
        """What the model sees as history next turn: the window's messages."""
        return tuple(self._transcript.window(self._history_limit))

    @property
    def turns(self) -> tuple[Turn, ...]:
        """The completed turns, oldest first."""
        return self._transcript.turns

    def turn_count(self) -> int:
        """How many completed turns the transcript holds."""
        return self._transcript.turn_count()

    @property
    def total_usage(self) -> Usage:
        """What every provider call of the conversation reported, summed."""
        return self._transcript.total_usage

    @property
    def last_response(self) -> ProviderResponse | None:
        """The latest answer (``None`` before the first)."""
        return self._transcript.last_response

    def user_event_indices(self) -> list[int]:
        """Indices into :attr:`events` of the user messages: the safe places to cut."""
        return self._transcript.user_indices()

    # -- token helpers ------------------------------------------------------------------

    def token_estimate(self) -> int:
        """The tokens the next request would carry before its prompt: instructions,
        tools and the window, priced with the counter a turn would use.

        Raises:
            InvalidRequestError: no model to resolve the counter for.
        """
        agent = self._agent
        messages = [
            m.with_origin(Origin.SEED) for m in self._transcript.window(self._history_limit)
        ]
        if agent.instructions is not None:
            messages.insert(0, Message.system(agent.instructions))
        return agent.resolved_token_counter().count(messages, agent.tools)

    def available_context_tokens(self) -> int | None:
        """Prompt budget left after :meth:`token_estimate`, at least 0; ``None`` without a budget.

        Raises:
            InvalidRequestError: no model, or a reserve that fills the limit.
        """
        resolution = resolve_budget(
            self._agent._require_model(),
            max_context_tokens=self._max_context_tokens,
            output_reserve_tokens=self._output_reserve,
            max_output_tokens=self._agent.max_output_tokens,
        )
        if resolution.budget is None:
            return None
        return max(0, resolution.budget.prompt_tokens - self.token_estimate())

    # -- running ------------------------------------------------------------------------

    async def run(self, prompt: str | Message) -> RunResult:
        """Run one turn and add it to the conversation.

        A failed or cancelled run changes nothing, in memory or in the store.

        Raises:
            InvalidRequestError: a prompt that is not a str or a user message,
                or a request the agent's setup makes invalid.
            ConcurrentModificationError: the store changed under this conversation.
            ProviderError, HandlerError, MaxRoundsExceededError: as ``Request.run``.
        """
        async with self._turn_lock():
            turn = self._prepare(prompt)
            try:
                await self._write_pending(turn)
                result = await turn.request.run()
                await self._commit(turn, result)
                return result
            finally:
                if not turn.committed:
                    await self._abandon(turn)

    @asynccontextmanager
    async def stream(self, prompt: str | Message) -> AsyncIterator[AsyncIterator[StreamEvent]]:
        """Run one turn, yielding its events; the turn joins the conversation when the
        stream completes (before ``FinalResult`` is handed out).

        Leaving the ``async with`` before ``FinalResult`` (``break``, an
        exception, a cancel scope) cancels the turn and changes nothing::

            async with conv.stream("Tell me a story.") as events:
                async for event in events:
                    if isinstance(event, TextDelta):
                        print(event.text, end="")
        """
        async with self._turn_lock():
            turn = self._prepare(prompt)
            try:
                await self._write_pending(turn)
                async with turn.request.stream() as events:
                    relay = self._relay(events, turn)
                    try:
                        yield relay
                    finally:
                        await relay.aclose()
            finally:
                if not turn.committed:
                    await self._abandon(turn)

    async def _relay(
        self, events: AsyncIterator[StreamEvent], turn: _TurnInProgress
    ) -> AsyncGenerator[StreamEvent, None]:
        async for event in events:
            if isinstance(event, FinalResult):
                await self._commit(turn, event.result)
            yield event

    def _prepare(self, prompt: str | Message) -> _TurnInProgress:
        if isinstance(prompt, str):
            message = Message.user(prompt, origin=Origin.TURN)
        elif isinstance(prompt, Message) and prompt.role is Role.USER:
            message = prompt.with_origin(Origin.TURN)
        else:
            raise InvalidRequestError(f"a prompt is a str or a user Message, not {prompt!r:.80}")
        request = (
            self._agent.request()
            .with_messages(self._transcript.window(self._history_limit))
            .with_prompt(message)
        )
        if self._max_context_tokens is not None:
            request.with_max_context_tokens(self._max_context_tokens)
        if not isinstance(self._output_reserve, NotGiven):
            request.with_output_reserve_tokens(self._output_reserve)
        if self._pre is not None:
            request.pre_max_tokens_reached(self._pre)
        if self._post is not None:
            request.post_max_tokens_reached(self._post)
        return _TurnInProgress(
            turn_id=self._transcript.next_turn_id, prompt=message, request=request
        )

    async def _write_pending(self, turn: _TurnInProgress) -> None:
        store = self._store
        if store is None:
            return
        await turn.request.budget_resolution()  # refuse a bad request before writing anything
        pending = ConversationEvent(message=turn.prompt, turn_id=turn.turn_id, pending=True)
        header = self._header(next_turn_id=turn.turn_id + 1, updated_at=_now())
        # Shielded, so the version we hold always matches what the store did.
        with anyio.CancelScope(shield=True):
            turn.created_store_entry = self._version == 0
            self._version = await store.append_events(
                self._id, [pending], header=header, expected_version=self._version
            )
            turn.pending_written = True

    async def _commit(self, turn: _TurnInProgress, result: RunResult) -> None:
        events = turn_events(turn.turn_id, result)
        if events[-1].message.tool_calls:
            raise InvalidRequestError(
                "the run ended on tool calls nobody answered; a conversation needs every "
                "tool to have a function"
            )
        usage = result.usage
        leftover = self._transcript.pending
        resubmitted = next(
            (
                i
                for i, e in enumerate(leftover)
                if e.message.with_origin(Origin.TURN) == turn.prompt
            ),
            None,
        )
        if resubmitted is not None:
            leftover = leftover[:resubmitted] + leftover[resubmitted + 1 :]
        with anyio.CancelScope(shield=True):
            if self._store is not None:
                header = self._header(
                    next_turn_id=max(self._transcript.next_turn_id, turn.turn_id + 1),
                    total_usage=self._transcript.total_usage + usage,
                    updated_at=_now(),
                )
                try:
                    self._version = await self._store.append_events(
                        self._id,
                        [*events, *leftover],
                        header=header,
                        expected_version=self._version,
                        drop_pending=True,
                    )
                except ConcurrentModificationError as exc:
                    # Another writer got in between pending and commit: the
                    # turn is not stored, but its answer goes back with the error.
                    exc.unsaved_result = result
                    raise
                self._updated_at = header.updated_at
            self._transcript.pending = leftover
            self._transcript.append_turn(events, result.response, usage)
            turn.committed = True

    async def _abandon(self, turn: _TurnInProgress) -> None:
        store = self._store
        if store is None or not turn.pending_written:
            return
        with anyio.CancelScope(shield=True):
            try:
                if turn.created_store_entry and await self._delete_own_entry(store):
                    return
                self._version = await store.append_events(
                    self._id,
                    list(self._transcript.pending),
                    header=self._header(),
                    expected_version=self._version,
                    drop_pending=True,
                )
            except Exception:
                # The pending prompt stays visible on load; that is what it is for.
                logger.warning(
                    "could not remove the pending prompt of conversation %r after its turn failed",
                    self._id,
                    exc_info=True,
                )

    async def _delete_own_entry(self, store: ConversationStore) -> bool:
        """Remove the stored conversation a failed first turn created, when no one
        else has written it since; ``True`` when it is gone."""
        stored = await store.load(self._id)
        if stored.version != self._version:
            return False
        await store.delete(self._id)
        self._version = 0
        return True

    # -- rewriting ----------------------------------------------------------------------

    async def replace_events(self, events: Iterable[ConversationEvent]) -> None:
        """Install ``events`` as the transcript: the compaction hook.

        The events are copied; turns, total usage and the last response are
        rebuilt from them, and turn ids keep counting forward from the
        highest ever handed out. With a store, the new transcript is saved.

        Raises:
            InvalidRequestError: an event list that starts with a non-user
                event, breaks a tool unit, or holds pending events.
            ConcurrentModificationError: the store changed under this conversation.
        """
        replacement = checked_replacement(events)
        async with self._turn_lock():
            transcript = self._transcript
            next_turn_id = max(
                transcript.next_turn_id, max((e.turn_id for e in replacement), default=-1) + 1
            )
            await self._rewrite(
                Transcript(
                    replacement,
                    pending=transcript.pending,
                    next_turn_id=next_turn_id,
                    total_usage=sum_usage(replacement),
                )
            )

    async def reset(self) -> None:
        """Forget the transcript, pending prompts and usage; keep the agent, id and settings.

        Turn ids keep counting forward. With a store, the empty conversation is saved.
        """
        async with self._turn_lock():
            await self._rewrite(Transcript(next_turn_id=self._transcript.next_turn_id))

    async def discard_pending(self) -> None:
        """Drop the pending prompts a crashed process left behind."""
        async with self._turn_lock():
            transcript = self._transcript
            if transcript.pending:
                await self._rewrite(
                    Transcript(
                        transcript.events,
                        next_turn_id=transcript.next_turn_id,
                        total_usage=transcript.total_usage,
                    )
                )

    async def save(self) -> None:
        """Write the whole conversation to its store (settings changes included).

        Raises:
            InvalidRequestError: the conversation has no store.
            ConcurrentModificationError: the store changed under this conversation.
        """
        if self._store is None:
            raise InvalidRequestError("this conversation has no store to save to")
        async with self._turn_lock():
            await self._rewrite(self._transcript)

    async def _rewrite(self, transcript: Transcript) -> None:
        # Shielded, so a cancel cannot leave the store rewritten and the memory not.
        with anyio.CancelScope(shield=True):
            if self._store is not None:
                header = self._header(
                    next_turn_id=transcript.next_turn_id,
                    total_usage=transcript.total_usage,
                    updated_at=_now(),
                )
                document = attrs.evolve(header, events=(*transcript.events, *transcript.pending))
                self._version = await self._store.save(document, expected_version=self._version)
                self._updated_at = header.updated_at
            self._transcript = transcript

    # -- documents ----------------------------------------------------------------------

    def _header(
        self,
        *,
        next_turn_id: int | None = None,
        total_usage: Usage | None = None,
        updated_at: datetime | None = None,
    ) -> ConversationDocument:
        return ConversationDocument(
            id=self._id,
            history_limit=self._history_limit,
            next_turn_id=self._transcript.next_turn_id if next_turn_id is None else next_turn_id,
            total_usage=self._transcript.total_usage if total_usage is None else total_usage,
            settings=settings_to(
                self._max_context_tokens, self._output_reserve, self._extra_settings
            ),
            metadata=self._metadata,
            created_at=self._created_at,
            updated_at=self._updated_at if updated_at is None else updated_at,
        )

    def to_document(self) -> ConversationDocument:
        """The conversation as a document: transcript (pending prompts last), window and
        settings. Never the agent, keys or tool handlers."""
        return attrs.evolve(
            self._header(), events=(*self._transcript.events, *self._transcript.pending)
        )

    def to_json(self, *, indent: int | None = None) -> str:
        """The conversation as versioned JSON; restore it with :meth:`from_json`."""
        return dumps_conversation(self.to_document(), indent=indent)

    @classmethod
    def from_document(
        cls,
        agent: Agent,
        document: ConversationDocument,
        *,
        store: ConversationStore | None = None,
        version: int = 0,
        pre_max_tokens_reached: TokenLimitHandler | None = None,
        post_max_tokens_reached: TokenLimitHandler | None = None,
    ) -> Conversation:
        """A conversation continuing ``document`` with ``agent``.

        ``version`` is the store version the document was loaded at (0: not stored).

        Raises:
            ConversationFormatError: a setting of the wrong type, or a
                transcript whose tool units are broken.
        """
        if not isinstance(document, ConversationDocument):
            raise TypeError(f"expected a ConversationDocument, not {type(document).__name__}")
        options = settings_from(document)
        transcript = Transcript.from_document(document)
        conversation = cls(
            agent,
            id=document.id,
            history_limit=document.history_limit,
            store=store,
            max_context_tokens=options.get("max_context_tokens"),
            output_reserve_tokens=options.get("output_reserve_tokens", NOT_GIVEN),
            pre_max_tokens_reached=pre_max_tokens_reached,
            post_max_tokens_reached=post_max_tokens_reached,
            metadata=document.metadata,
        )
        conversation._extra_settings = options["extra"]
        conversation._version = version
        conversation._created_at = document.created_at
        conversation._updated_at = document.updated_at
        conversation._transcript = transcript
        return conversation

    @classmethod
    def from_json(
        cls,
        agent: Agent,
        text: str | bytes,
        *,
        store: ConversationStore | None = None,
        pre_max_tokens_reached: TokenLimitHandler | None = None,
        post_max_tokens_reached: TokenLimitHandler | None = None,
    ) -> Conversation:
        """Restore a conversation saved with :meth:`to_json`, to continue with ``agent``.

        Handlers and stores are not saved; pass them again.

        Raises:
            ConversationFormatError: the text is not a saved conversation this
                version can read (an unknown version, a malformed document).
        """
        return cls.from_document(
            agent,
            loads_conversation(text),
            store=store,
            pre_max_tokens_reached=pre_max_tokens_reached,
            post_max_tokens_reached=post_max_tokens_reached,
        )

    @classmethod
    async def load(
        cls,
        agent: Agent,
        store: ConversationStore,
        id: str,
        *,
        pre_max_tokens_reached: TokenLimitHandler | None = None,
        post_max_tokens_reached: TokenLimitHandler | None = None,
    ) -> Conversation:
        """Continue the conversation ``id`` kept in ``store``.

        Raises:
            ConversationNotFoundError: the store has no such conversation.
            ConversationFormatError: what it holds cannot be continued.
        """
        stored = await store.load(id)
        return cls.from_document(
            agent,
            stored.document,
            store=store,
            version=stored.version,
            pre_max_tokens_reached=pre_max_tokens_reached,
            post_max_tokens_reached=post_max_tokens_reached,
        )

    def __repr__(self) -> str:
        return (
            f"Conversation(id={self._id!r}, turns={self._transcript.turn_count()}, "
            f"events={len(self._transcript)}, history_limit={self._history_limit})"
        )
