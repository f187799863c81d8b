"""``Conversation``: one thread with an agent, remembering every turn.

A conversation keeps its transcript as :class:`ConversationEvent` objects and
builds every turn's request through the agent's ``client.request()``: the
same engine as a bare request, with the conversation's window as history.

A turn joins the transcript only when its run completes. Until then nothing
in memory changes; with a store, the submitted prompt is written first,
marked pending under a marker of the turn's own, and the turn replaces it in
one write on success. A failed or cancelled run removes that copy again, under
a shielded cancel scope, so the conversation and its store are left as they
were; a refused one removes exactly its own copy, whatever other writers did.
A pending prompt sent again answers the copy a crash left (by its marker)
instead of writing a second one.

Per-turn work is proportional to the window, not to the transcript (see
``_transcript``). What a conversation holds and shows (its state, settings,
token helpers and saved form) is in ``_conversation_state``; this module adds
what changes it: turns, rewrites and loading.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from typing import Unpack

import anyio
import attrs

from threadline._conversation_settings import saved_changes
from threadline._conversation_state import ConversationState, now
from threadline._conversation_window import KeptWindow, SentWindow, saved_window
from threadline._errors import (
    ConcurrentModificationError,
    ConversationNotFoundError,
    InvalidRequestError,
)
from threadline._events import FinalResult, StreamEvent
from threadline._messages import Message, Origin, Role
from threadline._result import RunResult
from threadline._settings import RequestSettings, SettingsChanges
from threadline._store import ConversationStore
from threadline._transcript import Transcript, Turn, checked_replacement, sum_usage, turn_events
from threadline._validate import fail
from threadline.engine._agent import Agent, combined_settings
from threadline.engine._request import Request
from threadline.serialization._converter import loads_conversation
from threadline.serialization._documents import ConversationDocument, ConversationEvent

__all__ = ["Agent", "Conversation", "Turn"]

logger = logging.getLogger("threadline.conversation")


@attrs.define(kw_only=True)
class _TurnInProgress:
    turn_id: int
    prompt: Message
    request: Request
    sent: SentWindow
    marker: str
    """This turn's pending copy in the store: committed or removed exactly, whatever
    other writers did."""
    adopted: bool = False
    """The prompt is a pending prompt a crashed turn left in the store, under
    ``marker``: this turn answers that copy and writes none of its own, so a
    crash now still leaves exactly one."""
    pending_written: bool = False
    created_store_entry: bool = False
    committed: bool = False


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
    every turn is persisted as it happens (see the module docstring). This
    makes a *new* conversation: for an ``id`` the store already holds, the
    first turn raises ``ConcurrentModificationError`` saying so; use
    :meth:`load` to continue a stored conversation, or :meth:`open` to load
    it or create it in one call.

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
            ConcurrentModificationError: another writer wrote the stored
                conversation first. Before the model is called when that write
                came before this turn began (nothing was sent); after it
                answered when the write came while the model worked, with the
                answer in ``unsaved_result``. Either way the turn is not added.
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
        request, sent = self._turn_request(message)
        adopted = next(
            (
                marker
                for i in self._copies_of(message)
                if (marker := self._pending_markers[i]) is not None
            ),
            None,
        )
        return _TurnInProgress(
            turn_id=self._transcript.next_turn_id,
            prompt=message,
            request=request,
            sent=sent,
            marker=adopted or uuid.uuid4().hex,
            adopted=adopted is not None,
        )

    def _copies_of(self, prompt: Message) -> list[int]:
        """Indices into the pending prompts of those that ``prompt`` sends again."""
        return [
            i
            for i, event in enumerate(self._transcript.pending)
            if event.message.with_origin(Origin.TURN) == prompt
        ]

    async def _write_pending(self, turn: _TurnInProgress) -> None:
        store = self._store
        if store is None:
            return
        await turn.request.budget_resolution()  # refuse a bad request before writing anything
        pending = ConversationEvent(message=turn.prompt, turn_id=turn.turn_id, pending=True)
        header = self._header(next_turn_id=turn.turn_id + 1, updated_at=now())
        # Shielded, so the version we hold always matches what the store did. An
        # adopted prompt is already pending: the write only claims the version,
        # so a stale conversation is still refused before the model is called.
        with anyio.CancelScope(shield=True):
            turn.created_store_entry = self._version == 0
            try:
                self._version = await store.append_events(
                    self._id,
                    [] if turn.adopted else [pending],
                    header=header,
                    expected_version=self._version,
                    pending_marker=None if turn.adopted else turn.marker,
                    generation=turn.marker if turn.created_store_entry else None,
                )
            except ConcurrentModificationError as exc:
                raise self._refusal(exc) from None
            turn.pending_written = not turn.adopted

    def _refusal(self, error: ConcurrentModificationError) -> ConcurrentModificationError:
        """``error``, or for a conversation made new whose id the store already holds,
        the error that says so and how to continue the stored one."""
        if self._version != 0 or error.actual is None:
            return error
        return ConcurrentModificationError(
            self._id,
            expected=0,
            actual=error.actual,
            message=(
                f"conversation {self._id!r} already exists in the store (version "
                f"{error.actual}) and this Conversation was made as a new one; continue the "
                f"stored one with `await Conversation.load(agent, store, {self._id!r})`, or "
                f"`await Conversation.open(agent, store, {self._id!r})` to load it or "
                "create it in one call"
            ),
        )

    async def _commit(self, turn: _TurnInProgress, result: RunResult) -> None:
        events = turn_events(turn.turn_id, result)
        if events[-1].message.tool_calls:
            raise InvalidRequestError(
                "the run ended on tool calls nobody answered; a conversation needs every "
                "tool to have a function"
            )
        pending, markers = self._transcript.pending, self._pending_markers
        copies = self._copies_of(turn.prompt)
        kept = [i for i in range(len(pending)) if i not in copies]
        # A copy without a marker (written by save() or an older version) goes only
        # with every pending event; the others are written back, without markers.
        rewrite = any(markers[i] is None for i in copies)
        window, slide = self._window_after(turn.sent, result), self._slide_after(turn.sent, result)
        with anyio.CancelScope(shield=True):
            if self._store is not None:
                header = self._header(
                    next_turn_id=max(self._transcript.next_turn_id, turn.turn_id + 1),
                    total_usage=self._transcript.total_usage + result.usage,
                    updated_at=now(),
                    window=window,
                )
                try:
                    self._version = await self._store.append_events(
                        self._id,
                        [*events, *(pending[i] for i in kept)] if rewrite else events,
                        header=header,
                        expected_version=self._version,
                        drop_pending=True if rewrite else turn.marker,
                    )
                except ConcurrentModificationError as exc:
                    # Another writer got in between pending and commit: the
                    # turn is not stored, but its answer goes back with the error.
                    exc.unsaved_result = result
                    raise
                self._updated_at = header.updated_at
                if not rewrite:
                    await self._remove_copies({markers[i] for i in copies} - {turn.marker})
            self._transcript.pending = tuple(pending[i] for i in kept)
            self._pending_markers = tuple(None if rewrite else markers[i] for i in kept)
            self._transcript.append_turn(events, result.response, result.usage)
            self._window, self._slide = window, slide
            turn.committed = True

    async def _remove_copies(self, markers: Iterable[str | None]) -> None:
        """Take back further pending copies of a prompt just answered (left by
        earlier crashes while it was sent again)."""
        assert self._store is not None
        for marker in markers:
            if marker is None:
                continue
            try:
                await self._store.remove_pending(self._id, marker)
            except Exception:
                logger.warning(
                    "could not remove a pending copy of a prompt conversation %r answered",
                    self._id,
                    exc_info=True,
                )

    async def _abandon(self, turn: _TurnInProgress) -> None:
        """Take back this turn's own pending copy (an adopted one stays pending)."""
        store = self._store
        if store is None or not turn.pending_written:
            return
        with anyio.CancelScope(shield=True):
            try:
                if turn.created_store_entry and await self._delete_own_entry(store, turn):
                    return
                try:
                    # Versioned, so the header goes back to what it was too.
                    self._version = await store.append_events(
                        self._id,
                        [],
                        header=self._header(),
                        expected_version=self._version,
                        drop_pending=turn.marker,
                        generation=turn.marker if turn.created_store_entry else None,
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

    async def _delete_own_entry(self, store: ConversationStore, turn: _TurnInProgress) -> bool:
        """Remove the stored conversation a failed first turn created (with its marker
        as generation), when no one else has written it since; ``True`` when it is gone."""
        try:
            await store.delete(self._id, expected_version=self._version, generation=turn.marker)
        except ConcurrentModificationError:
            return False
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
                ),
                window=KeptWindow(),
            )

    async def reset(self) -> None:
        """Forget the transcript, pending prompts and usage; keep the agent, id and settings.

        Turn ids keep counting forward. With a store, the empty conversation is saved.
        """
        async with self._turn_lock():
            await self._rewrite(
                Transcript(next_turn_id=self._transcript.next_turn_id), window=KeptWindow()
            )

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

    async def _rewrite(self, transcript: Transcript, *, window: KeptWindow | None = None) -> None:
        """Install ``transcript`` (and ``window``; ``None`` keeps the kept window)."""
        window = self._window if window is None else window
        kept = transcript.pending == self._transcript.pending  # their writers' markers stay
        markers = self._pending_markers if kept else (None,) * len(transcript.pending)
        # Shielded, so a cancel cannot leave the store rewritten and the memory not.
        with anyio.CancelScope(shield=True):
            if self._store is not None:
                header = self._header(
                    next_turn_id=transcript.next_turn_id,
                    total_usage=transcript.total_usage,
                    updated_at=now(),
                    window=window,
                )
                document = attrs.evolve(header, events=(*transcript.events, *transcript.pending))
                try:
                    self._version = await self._store.save(
                        document, expected_version=self._version, pending_markers=markers
                    )
                except ConcurrentModificationError as exc:
                    raise self._refusal(exc) from None
                self._updated_at = header.updated_at
            self._transcript = transcript
            self._window, self._slide = window, None  # the slide's indices no longer hold
            self._pending_markers = markers

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
        window = saved_window(extra, transcript.messages_from(0))
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
        conversation._window = window
        conversation._pending_markers = (None,) * len(transcript.pending)
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
        """Continue the conversation ``id`` kept in ``store``.

        ``agent`` runs the turns from now on: its client, model, instructions,
        tools and handlers (none of those are stored). ``store`` is where the
        conversation is read from and goes on being written to; ``id`` is its
        id there. The window (``history_limit``), metadata and saved budget
        knobs come from the store. Each turn's settings are the agent's (or
        ``settings``, when given), then the saved budget knobs, then the
        keyword arguments (``max_context_tokens``, ``output_reserve_tokens``,
        the limiting handlers, ... as for ``Conversation``), later ones
        winning. Prompts a crashed process left pending are in
        :attr:`pending_events`.

        Raises:
            ConversationNotFoundError: the store has no such conversation
                (:meth:`open` creates it instead).
            ConversationFormatError: what it holds cannot be continued.
            InvalidRequestError: a keyword argument of the wrong type or sign.

        Example::

            conv = await Conversation.load(agent, store, "support-42", max_context_tokens=32_000)
        """
        stored = await store.load(id)
        conversation = cls.from_document(
            agent,
            stored.document,
            store=store,
            version=stored.version,
            settings=settings,
            **options,
        )
        markers = stored.pending_markers
        if len(markers) == len(conversation._transcript.pending):
            conversation._pending_markers = tuple(markers)
        return conversation

    @classmethod
    async def open(
        cls,
        agent: Agent,
        store: ConversationStore,
        id: str,
        *,
        history_limit: int | None = None,
        metadata: Mapping[str, str] | None = None,
        settings: RequestSettings | None = None,
        **options: Unpack[SettingsChanges],
    ) -> Conversation:
        """Continue the conversation ``id`` in ``store``, or start it when there is none.

        A stored conversation is loaded as by :meth:`load`; otherwise a new
        one is made, as ``Conversation(agent, id=id, store=store, ...)``, and
        stored with its first turn. ``history_limit``, when given, applies
        either way (``None``: the stored one, or 0 for a new conversation);
        ``metadata`` labels a new conversation only (a stored one keeps its
        own). ``settings`` and the keyword arguments are as for :meth:`load`.

        Should another process create ``id`` between ``open`` and the first
        turn, that turn raises ``ConcurrentModificationError`` before its model
        is called; ``open`` again to continue the stored one.

        Raises:
            ConversationFormatError: what the store holds cannot be continued.
            InvalidRequestError: an argument of the wrong type or sign.

        Example::

            conv = await Conversation.open(agent, store, "support-42")
            await conv.run("Hello again.")
        """
        try:
            conversation = await cls.load(agent, store, id, settings=settings, **options)
        except ConversationNotFoundError:
            return cls(
                agent,
                id=id,
                store=store,
                history_limit=0 if history_limit is None else history_limit,
                metadata=metadata,
                settings=settings,
                **options,
            )
        if history_limit is not None:
            conversation.history_limit = history_limit
        return conversation
