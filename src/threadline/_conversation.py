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
``_transcript``). What a conversation holds and shows (its state, settings,
token helpers and saved form) is in ``_conversation_state``; this module adds
what changes it: turns, rewrites and loading.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterable
from contextlib import asynccontextmanager
from typing import Unpack

import anyio
import attrs

from threadline._agent import Agent, combined_settings
from threadline._conversation_settings import saved_changes
from threadline._conversation_state import ConversationState, now
from threadline._errors import ConcurrentModificationError, InvalidRequestError
from threadline._events import FinalResult, StreamEvent
from threadline._messages import Message, Origin, Role
from threadline._request import Request
from threadline._result import RunResult
from threadline._settings import RequestSettings, SettingsChanges
from threadline._store import ConversationStore
from threadline._transcript import Transcript, Turn, checked_replacement, sum_usage, turn_events
from threadline._validate import fail
from threadline.serialization._converter import loads_conversation
from threadline.serialization._documents import ConversationDocument, ConversationEvent

__all__ = ["Agent", "Conversation", "Turn"]

logger = logging.getLogger("threadline.conversation")


@attrs.define(kw_only=True)
class _TurnInProgress:
    turn_id: int
    prompt: Message
    request: Request
    pending_written: bool = False
    created_store_entry: bool = False
    committed: bool = False
    # This turn's own pending copy in the store: removed exactly, whatever others wrote.
    marker: str = attrs.field(factory=lambda: uuid.uuid4().hex)


class Conversation(ConversationState):
    """One thread with an agent: every turn sees the turns before it.

    ``history_limit`` caps, in messages, the window sent as history: the
    window holds at least that many messages and starts at a user message,
    so it never opens inside a turn; 0 sends the whole transcript. The
    transcript itself keeps every turn.

    Every turn's request gets :attr:`settings`: the agent's
    :class:`RequestSettings`, or ``settings`` when given, with the keyword
    arguments (``max_context_tokens``, ``output_reserve_tokens``, the limiting
    handlers, ...) applied on top (see docs/limiting.md). With a ``store``,
    every turn is persisted as it happens (see the module docstring); use
    :meth:`load` to continue a stored conversation.

    One conversation serves one caller at a time: a second ``run`` waits for
    the first to finish.

    Raises:
        InvalidRequestError: an option of the wrong type or sign.

    Example::

        conv = Conversation(agent, history_limit=20)
        await conv.run("My name is Ada.")
        print((await conv.run("What is my name?")).text)
    """

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
            fail("prompt", "a str or a user Message", prompt)
        request = (
            self._agent.request()
            .with_settings(self._settings)
            .with_messages(self._transcript.window(self._history_limit))
            .with_prompt(message)
        )
        return _TurnInProgress(
            turn_id=self._transcript.next_turn_id, prompt=message, request=request
        )

    async def _write_pending(self, turn: _TurnInProgress) -> None:
        store = self._store
        if store is None:
            return
        await turn.request.budget_resolution()  # refuse a bad request before writing anything
        pending = ConversationEvent(message=turn.prompt, turn_id=turn.turn_id, pending=True)
        header = self._header(next_turn_id=turn.turn_id + 1, updated_at=now())
        # Shielded, so the version we hold always matches what the store did.
        with anyio.CancelScope(shield=True):
            turn.created_store_entry = self._version == 0
            self._version = await store.append_events(
                self._id,
                [pending],
                header=header,
                expected_version=self._version,
                pending_marker=turn.marker,
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
                    updated_at=now(),
                )
                try:
                    # Only a resubmitted leftover needs the rewrite of every pending copy.
                    self._version = await self._store.append_events(
                        self._id,
                        [*events, *leftover] if resubmitted is not None else events,
                        header=header,
                        expected_version=self._version,
                        drop_pending=True if resubmitted is not None else turn.marker,
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
                try:
                    self._version = await store.append_events(
                        self._id,
                        [],
                        header=self._header(),
                        expected_version=self._version,
                        drop_pending=turn.marker,
                    )
                except ConcurrentModificationError:
                    # Another writer got in: take back exactly this turn's prompt.
                    await store.remove_pending(self._id, turn.marker)
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
                    updated_at=now(),
                )
                document = attrs.evolve(header, events=(*transcript.events, *transcript.pending))
                self._version = await self._store.save(document, expected_version=self._version)
                self._updated_at = header.updated_at
            self._transcript = transcript

    @classmethod
    def from_document(
        cls,
        agent: Agent,
        document: ConversationDocument,
        *,
        store: ConversationStore | None = None,
        version: int = 0,
        settings: RequestSettings | None = None,
        **options: Unpack[SettingsChanges],
    ) -> Conversation:
        """A conversation continuing ``document`` with ``agent``.

        Its settings are the agent's (or ``settings``), then what the document
        saved (its budget knobs), then ``options``. ``version`` is the store
        version the document was loaded at (0: not stored).

        Raises:
            ConversationFormatError: a setting of the wrong type, or a
                transcript whose tool units are broken.
        """
        if not isinstance(document, ConversationDocument):
            raise TypeError(f"expected a ConversationDocument, not {type(document).__name__}")
        saved, extra = saved_changes(document)
        transcript = Transcript.from_document(document)
        conversation = cls(
            agent,
            id=document.id,
            history_limit=document.history_limit,
            store=store,
            metadata=document.metadata,
            settings=combined_settings(agent.settings, settings, saved),
            **options,
        )
        conversation._extra_settings = extra
        conversation._restore_calibration()
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
        settings: RequestSettings | None = None,
        **options: Unpack[SettingsChanges],
    ) -> Conversation:
        """Restore a conversation saved with :meth:`to_json`, to continue with ``agent``.

        Handlers, counters and stores are not saved: the agent's apply (pass
        others as ``settings`` or keyword arguments, as to ``Conversation``).

        Raises:
            ConversationFormatError: the text is not a saved conversation this
                version can read (an unknown version, a malformed document).
        """
        return cls.from_document(
            agent, loads_conversation(text), store=store, settings=settings, **options
        )

    @classmethod
    async def load(
        cls,
        agent: Agent,
        store: ConversationStore,
        id: str,
        *,
        settings: RequestSettings | None = None,
        **options: Unpack[SettingsChanges],
    ) -> Conversation:
        """Continue the conversation ``id`` kept in ``store``, with the agent's settings
        (its handlers included) unless ``settings`` or keyword arguments say otherwise.

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
            settings=settings,
            **options,
        )
