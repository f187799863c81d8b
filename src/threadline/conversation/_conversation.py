"""``Conversation``: one thread with an agent, remembering every turn.

A conversation keeps its transcript as :class:`ConversationEvent` objects and
builds every turn's request through the agent's ``client.request()``: the
same engine as a bare request, with the conversation's window as history.
A turn plans its request once, before anything is written: an invalid
request is refused first, and the plan checked is the plan run.

Per-turn work is proportional to the window, not to the transcript (see
``_transcript``). What goes to the store and when is ``_durability``'s
business, which history a turn sends ``_window``'s, and what a saved
document holds ``_document``'s; this module holds the conversation's state
and its public face.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncGenerator, AsyncIterator, Iterable, Mapping
from contextlib import asynccontextmanager
from datetime import datetime
from types import MappingProxyType
from typing import Any, Unpack

import attrs

from threadline._errors import (
    ConcurrentModificationError,
    ConversationNotFoundError,
    InvalidRequestError,
)
from threadline._events import FinalResult, StreamEvent
from threadline._messages import Message, Origin, Role, Usage
from threadline._models import Model
from threadline._provider import ProviderResponse
from threadline._result import RunResult
from threadline._sentinel import NOT_GIVEN, NotGiven
from threadline._settings import RequestSettings, SettingsChanges
from threadline._store import ConversationStore
from threadline._validate import fail, non_negative_int
from threadline.conversation._compaction import native_compaction
from threadline.conversation._document import header_settings, restore, restore_calibration
from threadline.conversation._durability import Header, TurnWrite, TurnWriter, now, read_stored
from threadline.conversation._lock import TurnLock
from threadline.conversation._transcript import (
    KeptPrompt,
    Transcript,
    Turn,
    checked_replacement,
    sum_usage,
    turn_events,
)
from threadline.conversation._window import (
    NOTHING_KEPT,
    KeptWindow,
    SentWindow,
    Slide,
    WindowPolicy,
    cache_key,
    sent_window,
    slide_after,
    slide_start,
)
from threadline.engine._agent import Agent, combined_settings
from threadline.engine._plan import RunPlan, settings_budget, settings_counter
from threadline.engine._replay import sent_form
from threadline.engine._request import planned, run_plan, stream_plan, with_checked_history
from threadline.limiting._ledger import CompactionOutcome
from threadline.limiting._prefix import SentPrompt
from threadline.serialization._converter import dumps_conversation, loads_conversation
from threadline.serialization._documents import (
    ConversationDocument,
    ConversationEvent,
    JsonValue,
    id_problem,
)
from threadline.tools._output import output_spec

__all__ = ["Conversation", "Turn"]

_NOTHING: Mapping[str, Any] = MappingProxyType({})
"""What a conversation without labels or unknown saved settings holds: one shared
empty mapping, not an empty dict each."""


@attrs.frozen(kw_only=True)
class _Turn:
    """A turn under way: its writes, the plan it runs and the history that plan sends."""

    write: TurnWrite
    plan: RunPlan
    sent: SentWindow
    slide_key: tuple[object, ...] | None


class Conversation:
    """One thread with an agent: every turn sees the turns before it.

    ``history_limit`` caps, in messages, the window sent as history: the
    window holds at least that many messages and starts at a user message,
    so it never opens inside a turn; 0 sends the whole transcript. The
    transcript itself keeps every turn.

    Every turn's request gets :attr:`settings`: the agent's
    :class:`RequestSettings`, or ``settings`` when given, with the keyword
    arguments (``max_context_tokens``, ``output_reserve_tokens``, the limiting
    handlers, ...) applied on top (see docs/limiting.md). With a ``store``,
    every turn is persisted as it happens: the prompt is written as pending
    first, and the turn replaces it when its run completes (a failed or
    cancelled run takes it back). This makes a *new* conversation: for an
    ``id`` the store already holds, the first turn raises
    ``ConcurrentModificationError`` saying so; use :meth:`load` to continue a
    stored conversation, or :meth:`open` to load it or create it in one call.

    One conversation serves one caller at a time: a second ``run`` waits for
    the first to finish.

    Raises:
        InvalidRequestError: an option of the wrong type or sign.

    Example::

        conv = Conversation(agent, history_limit=20)
        await conv.run("My name is Ada.")
        print((await conv.run("What is my name?")).text)
    """

    # Slotted: a service keeps thousands of conversations, and a dict each adds up.
    __slots__ = (
        "__weakref__",
        "_agent",
        "_created_at",
        "_extra_settings",
        "_history_limit",
        "_id",
        "_last_prompt",
        "_lock",
        "_metadata",
        "_policy",
        "_slide",
        "_transcript",
        "_window",
        "_writer",
    )

    def __init__(
        self,
        agent: Agent,
        *,
        id: str | None = None,
        history_limit: int = 0,
        store: ConversationStore | None = None,
        metadata: Mapping[str, str] | None = None,
        settings: RequestSettings | None = None,
        **options: Unpack[SettingsChanges],
    ) -> None:
        if not isinstance(agent, Agent):
            fail("agent", "an Agent", agent)
        self._agent = agent
        self._id = uuid.uuid4().hex if id is None else _checked_id(id, "or None")
        self._history_limit = non_negative_int("history_limit", history_limit)
        self._policy = WindowPolicy.of(combined_settings(agent.settings, settings, options))
        # The document type validates the labels; keep its copy (none: a shared empty one).
        labels = ConversationDocument(id=self._id, metadata=metadata or {}).metadata
        self._metadata: Mapping[str, str] = labels or _NOTHING
        # Settings keys this version does not know, and the saved calibration.
        self._extra_settings: Mapping[str, JsonValue] = _NOTHING
        self._lock = TurnLock()
        self._created_at: datetime | None = now()
        self._transcript = Transcript()
        self._window = NOTHING_KEPT
        self._slide: Slide | None = None
        self._writer = TurnWriter(store, self._id)
        # What the last turn's last round sent: the next turn's prompt is compared
        # with it, to say why the provider's cache missed (RoundRecord.cache).
        self._last_prompt: KeptPrompt | SentPrompt | None = None

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
        return self._writer.store

    @property
    def version(self) -> int:
        """The store version this conversation last wrote or loaded (0: not stored yet)."""
        return self._writer.version

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
        self._history_limit = non_negative_int("history_limit", value)

    @property
    def settings(self) -> RequestSettings:
        """What each turn's request is sent with; a new value applies from the next run.

        ``conv.settings = conv.settings.evolve(temperature=0)`` changes one option.
        """
        return self._policy.settings

    @settings.setter
    def settings(self, value: RequestSettings) -> None:
        self._policy = WindowPolicy.of(combined_settings(self._policy.settings, value, {}))

    @property
    def max_context_tokens(self) -> int | None:
        """The context limit each turn's request gets (``None``: the model's)."""
        return self._policy.settings.max_context_tokens

    @max_context_tokens.setter
    def max_context_tokens(self, value: int | None) -> None:
        self._policy = WindowPolicy.of(self._policy.settings.evolve(max_context_tokens=value))

    @property
    def output_reserve_tokens(self) -> int | NotGiven:
        """The reply's reserve each turn's request gets (``NOT_GIVEN``: the default)."""
        return self._policy.settings.output_reserve_tokens

    @output_reserve_tokens.setter
    def output_reserve_tokens(self, value: int | NotGiven) -> None:
        self._policy = WindowPolicy.of(self._policy.settings.evolve(output_reserve_tokens=value))

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
        """The conversation's messages the next turn sends as history: the window.

        Under the cache-stable policy the window opens where the last cut left
        it (see :attr:`window_start`), after any summary a handler put there.
        The agent's instructions are not among them; :attr:`model_input` adds them.
        """
        kept = self._policy.kept(self._window)
        return (*kept.head, *self._transcript.messages_from(self.window_start))

    @property
    def window_start(self) -> int:
        """The index into :attr:`events` of the first event the next turn sends.

        It moves when ``history_limit`` asks for it and, under the cache-stable
        policy (``cache_stable_units``), when a cut leaves the window; between
        cuts it stays put, so each turn's prompt begins with the last one's and
        the provider's prompt cache keeps serving it. It is saved with the
        conversation. 0 sends everything.
        """
        start = self._transcript.window_start(self._history_limit)
        return max(start, self._policy.kept(self._window).start)

    @property
    def model_input(self) -> tuple[Message, ...]:
        """Exactly what the model will see next turn before its prompt: the agent's
        instructions as the first (system) message, then the window, as the
        request sends them (origin ``seed``).

        Limiting still applies when a turn is over budget. :meth:`token_estimate`
        counts this list and the agent's tools.
        """
        kept = self._policy.kept(self._window)
        window = sent_window(self._transcript, self._history_limit, kept).history
        instructions = self._agent.instructions
        if instructions is None:
            return tuple(window)
        return (Message.system(instructions), *window)

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
        """The tokens the next request would carry before its prompt: :attr:`model_input`
        (as the driver would be handed it, after the replay rules) and the agent's
        tools (and the output schema of its settings), priced with the counter a turn would use.

        Raises:
            InvalidRequestError: no model to resolve the counter for.
        """
        agent = self._agent
        defaults, model = agent.client.defaults, self._model()
        settings = self._policy.settings
        counter = settings_counter(settings, defaults, model)
        tools = agent.tools
        if settings.output_type is not None:  # priced as a turn prices it
            tools = (*tools, output_spec(settings.output_type).schema.counted_tool())
        return counter.count(sent_form(self.model_input, defaults.driver, model), tools)

    def available_context_tokens(self) -> int | None:
        """Prompt budget left after :meth:`token_estimate`, at least 0; ``None`` without a budget.

        The budget is the one a turn resolves from :attr:`settings` and the model.

        Raises:
            InvalidRequestError: no model, a reserve that fills the limit, or a
                ``max_output_tokens`` above the model's.
        """
        budget = settings_budget(self._policy.settings, self._model()).budget
        if budget is None:
            return None
        return max(0, budget.prompt_tokens - self.token_estimate())

    def _model(self) -> Model:
        model = self._agent.model
        if model is None:
            raise InvalidRequestError(
                "no model: give the Agent a model or the Client a default_model"
            )
        return model

    # -- running ------------------------------------------------------------------------

    async def run(self, prompt: str | Message, *, output_type: Any = NOT_GIVEN) -> RunResult[Any]:
        """Run one turn and add it to the conversation.

        A failed or cancelled run changes nothing, in memory or in the store.
        ``output_type`` sets this turn's (see ``Request.with_output_type``;
        ``None``: a text answer), instead of the settings'; the turn saves the
        answer's raw text, whose value ``Turn.output`` rebuilds when asked.

        Raises:
            InvalidRequestError: a prompt that is not a str or a user message,
                or a request the agent's setup makes invalid.
            ConcurrentModificationError: another writer wrote the stored
                conversation first. Before the model is called when that write
                came before this turn began (nothing was sent); after it
                answered when the write came while the model worked, with the
                answer in ``unsaved_result``. Either way the turn is not added.
            ProviderError, HandlerError, MaxRoundsExceededError: as ``Request.run``.
            OutputValidationError: the answer failed the turn's output type (the
                turn is not added).
        """
        async with self._lock.held():
            turn = self._prepare(prompt, output_type)
            try:
                await self._writer.write_pending(turn.write, self._pending_header(turn))
                result = await run_plan(turn.plan)
                await self._commit(turn, result)
                return result
            finally:
                if not turn.write.committed:
                    await self._writer.abandon(turn.write)

    @asynccontextmanager
    async def stream(
        self, prompt: str | Message, *, output_type: Any = NOT_GIVEN
    ) -> AsyncIterator[AsyncIterator[StreamEvent]]:
        """Run one turn, yielding its events; the turn joins the conversation when the
        stream completes (before ``FinalResult`` is handed out). ``output_type`` as
        for :meth:`run`.

        Leaving the ``async with`` before ``FinalResult`` (``break``, an
        exception, a cancel scope) cancels the turn and changes nothing::

            async with conv.stream("Tell me a story.") as events:
                async for event in events:
                    if isinstance(event, TextDelta):
                        print(event.text, end="")
        """
        async with self._lock.held():
            turn = self._prepare(prompt, output_type)
            try:
                await self._writer.write_pending(turn.write, self._pending_header(turn))
                async with stream_plan(turn.plan) as events:
                    relay = self._relay(events, turn)
                    try:
                        yield relay
                    finally:
                        await relay.aclose()
            finally:
                if not turn.write.committed:
                    await self._writer.abandon(turn.write)

    async def _relay(
        self, events: AsyncIterator[StreamEvent], turn: _Turn
    ) -> AsyncGenerator[StreamEvent, None]:
        async for event in events:
            if isinstance(event, FinalResult):
                await self._commit(turn, event.result)
            yield event

    def _prepare(self, prompt: str | Message, output_type: Any = NOT_GIVEN) -> _Turn:
        """The turn sending ``prompt``, its request planned: an invalid one is refused
        here, before anything is written."""
        if isinstance(prompt, str):
            message = Message.user(prompt, origin=Origin.TURN)
        elif isinstance(prompt, Message) and prompt.role is Role.USER:
            message = prompt.with_origin(Origin.TURN)
        else:
            fail("prompt", "a str or a user Message", prompt)
        policy, transcript = self._policy, self._transcript
        key = policy.slide_key(self._agent)
        slid = slide_start(self._slide, key)
        sent = sent_window(transcript, self._history_limit, policy.kept(self._window), slid)
        request = self._agent.request().with_settings(policy.turn_settings)
        checked = transcript.checked(sent.kept.head, sent.window, sent.base)
        if checked is None:
            request.with_messages(sent.history)
        else:
            with_checked_history(request, checked)  # a turn costs what its new messages cost
        request.with_prompt(message).with_cache_key(cache_key(self._id))
        if not isinstance(output_type, NotGiven):
            request.with_output_type(output_type)
        return _Turn(
            write=self._writer.begin(transcript.next_turn_id, message, transcript.pending),
            plan=attrs.evolve(planned(request), previous_prompt=self._previous_prompt()),
            sent=sent,
            slide_key=key,
        )

    def _previous_prompt(self) -> SentPrompt | None:
        last = self._last_prompt
        return last.sent() if isinstance(last, KeptPrompt) else last

    def _pending_header(self, turn: _Turn) -> Header:
        """The header the turn's pending write sends: its turn id handed out."""
        return lambda: self._header(next_turn_id=turn.write.turn_id + 1, updated_at=now())

    async def _commit(self, turn: _Turn, result: RunResult) -> None:
        events = turn_events(turn.write.turn_id, result)
        if events[-1].message.tool_calls:
            raise InvalidRequestError(
                "the run ended on tool calls nobody answered; a conversation needs every "
                "tool to have a function"
            )
        transcript = self._transcript
        sent, instructions = turn.sent, self._agent.instructions is not None
        window = self._policy.after(sent, result, instructions=instructions)
        slide = slide_after(self._slide, turn.slide_key, sent, result, instructions=instructions)

        def header() -> ConversationDocument:
            return self._header(
                next_turn_id=max(transcript.next_turn_id, turn.write.turn_id + 1),
                total_usage=transcript.total_usage + result.usage,
                updated_at=now(),
                window=window,
            )

        try:
            pending = await self._writer.commit(turn.write, events, transcript.pending, header)
        except ConcurrentModificationError as exc:
            # Another writer got in between pending and commit: the turn is not
            # stored, but its answer goes back with the error.
            exc.unsaved_result = result
            raise
        # No await since the store took the turn: nothing can cancel what follows.
        transcript.pending = pending
        transcript.append_turn(events, result.response, result.usage)
        self._window, self._slide = window, slide
        self._last_prompt = transcript.kept_prompt(result.last_prompt)

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
        async with self._lock.held():
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
                window=NOTHING_KEPT,
            )

    async def compact(self) -> CompactionOutcome:
        """Compact the conversation with the provider's own compaction, where it has one.

        What the next turn would send is handed to the driver's
        ``Driver.compact`` (OpenAI's ``/responses/compact`` for
        ``OpenAIResponsesDriver``), and its answer, an assistant message with
        no text holding the opaque compaction, is added at the end of the
        transcript as a turn of its own, in one versioned write. Later turns
        to that provider and model send only what follows it (plus what the
        compaction retained); the transcript and the store keep every turn,
        so another provider is still handed the whole history, never the
        opaque state. The call's usage joins :attr:`total_usage`.

        A compaction that cannot be used changes nothing and says why: the
        returned :class:`~threadline.limiting.CompactionOutcome` is
        ``"unsupported"`` (the driver has none), ``"failed"`` (the provider
        refused or failed), ``"empty"`` (no compaction came back, or nothing
        to compact), else ``"applied"``; ``covered_tokens`` and
        ``summary_tokens`` are :meth:`token_estimate` before and after.

        Raises:
            InvalidRequestError: no model.
            ConcurrentModificationError: the store changed under this
                conversation; nothing is written.
        """
        async with self._lock.held():
            driver, model = self._agent.client.defaults.driver, self._model()
            transcript = self._transcript
            done = await native_compaction(
                driver,
                model,
                sent_form(self.model_input, driver, model),
                turn_id=transcript.next_turn_id,
                covered_tokens=self.token_estimate(),
                cache_key=cache_key(self._id),
            )
            if done.event is None:
                return done.outcome
            compacted = Transcript(
                (*transcript.events, done.event),
                pending=transcript.pending,
                next_turn_id=transcript.next_turn_id + 1,
                total_usage=transcript.total_usage + (done.event.usage or Usage()),
            )
            compacted.last_response = transcript.last_response  # the answer stays the last
            await self._rewrite(compacted)  # appended: the kept window's indices still hold
            return attrs.evolve(done.outcome, summary_tokens=self.token_estimate())

    async def reset(self) -> None:
        """Forget the transcript, pending prompts and usage; keep the agent, id and settings.

        Turn ids keep counting forward. With a store, the empty conversation is saved.
        """
        async with self._lock.held():
            await self._rewrite(
                Transcript(next_turn_id=self._transcript.next_turn_id), window=NOTHING_KEPT
            )

    async def discard_pending(self) -> None:
        """Drop the pending prompts a crashed process left behind."""
        async with self._lock.held():
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
        if self._writer.store is None:
            raise InvalidRequestError("this conversation has no store to save to")
        async with self._lock.held():
            await self._rewrite(self._transcript)

    async def _rewrite(self, transcript: Transcript, *, window: KeptWindow | None = None) -> None:
        """Install ``transcript`` (and ``window``; ``None`` keeps the kept window)."""
        window = self._window if window is None else window

        def document() -> ConversationDocument:
            header = self._header(
                next_turn_id=transcript.next_turn_id,
                total_usage=transcript.total_usage,
                updated_at=now(),
                window=window,
            )
            return attrs.evolve(header, events=(*transcript.events, *transcript.pending))

        await self._writer.save(
            document,
            pending=len(transcript.pending),
            same_pending=transcript.pending == self._transcript.pending,
        )
        self._transcript = transcript
        self._window, self._slide = window, None  # the slide's indices no longer hold

    # -- documents ----------------------------------------------------------------------

    def _header(
        self,
        *,
        next_turn_id: int | None = None,
        total_usage: Usage | None = None,
        updated_at: datetime | None = None,
        window: KeptWindow | None = None,
    ) -> ConversationDocument:
        """The document's header: the conversation as it is, with what is given changed."""
        transcript = self._transcript
        return ConversationDocument(
            id=self._id,
            history_limit=self._history_limit,
            next_turn_id=transcript.next_turn_id if next_turn_id is None else next_turn_id,
            total_usage=transcript.total_usage if total_usage is None else total_usage,
            settings=header_settings(
                self._policy.settings,
                self._extra_settings,
                self._agent,
                self._window if window is None else window,
            ),
            metadata=self._metadata,
            created_at=self._created_at,
            updated_at=self._writer.updated_at if updated_at is None else updated_at,
        )

    def to_document(self) -> ConversationDocument:
        """The conversation as a document: transcript (pending prompts last), window and
        settings. Never the agent, keys or tool handlers."""
        transcript = self._transcript
        return attrs.evolve(self._header(), events=(*transcript.events, *transcript.pending))

    def to_json(self, *, indent: int | None = None) -> str:
        """The conversation as versioned JSON; restore it with :meth:`from_json`."""
        return dumps_conversation(self.to_document(), indent=indent)

    def __repr__(self) -> str:
        return (
            f"Conversation(id={self._id!r}, turns={self._transcript.turn_count()}, "
            f"events={len(self._transcript)}, history_limit={self._history_limit})"
        )

    # -- loading ------------------------------------------------------------------------

    @classmethod
    def from_document(
        cls,
        agent: Agent,
        document: ConversationDocument,
        *,
        store: ConversationStore | None = None,
        version: int = 0,
        history_limit: int | None = None,
        settings: RequestSettings | None = None,
        **options: Unpack[SettingsChanges],
    ) -> Conversation:
        """A conversation continuing ``document`` with ``agent``.

        Its settings are the agent's (or ``settings``), then what the document
        saved (its budget knobs), then ``options``. ``version`` is the store
        version the document was loaded at (0: not stored). ``history_limit``,
        when given, replaces the saved one, as for :meth:`open`.

        Raises:
            ConversationFormatError: a setting of the wrong type, or a
                transcript whose tool units are broken.
            InvalidRequestError: an option of the wrong type or sign, or one
                the document holds (``id=``, ``metadata=``).
        """
        return cls._continuing(
            agent,
            document,
            store=store,
            version=version,
            history_limit=history_limit,
            settings=settings,
            options=options,
        )

    @classmethod
    def _continuing(
        cls,
        agent: Agent,
        document: ConversationDocument,
        *,
        store: ConversationStore | None,
        version: int,
        history_limit: int | None,
        settings: RequestSettings | None,
        options: SettingsChanges,
    ) -> Conversation:
        """:meth:`from_document`, its keyword arguments handed as one mapping, so that
        none of them can collide with the loading methods' own."""
        if not isinstance(document, ConversationDocument):
            raise TypeError(f"expected a ConversationDocument, not {type(document).__name__}")
        _refuse_saved_options(options)
        restored = restore(document)
        conversation = cls(
            agent,
            id=document.id,
            history_limit=document.history_limit if history_limit is None else history_limit,
            store=store,
            metadata=document.metadata,
            settings=combined_settings(agent.settings, settings, restored.changes),
            **options,
        )
        conversation._extra_settings = restored.extra
        restore_calibration(agent, restored.extra)
        conversation._created_at = document.created_at
        conversation._transcript = restored.transcript
        conversation._window = restored.window
        conversation._writer = TurnWriter(
            store,
            document.id,
            version=version,
            pending=len(restored.transcript.pending),
            updated_at=document.updated_at,
            stored=document if version else None,
        )
        return conversation

    @classmethod
    def from_json(
        cls,
        agent: Agent,
        text: str | bytes,
        *,
        store: ConversationStore | None = None,
        history_limit: int | None = None,
        settings: RequestSettings | None = None,
        **options: Unpack[SettingsChanges],
    ) -> Conversation:
        """Restore a conversation saved with :meth:`to_json`, to continue with ``agent``.

        Handlers, counters and stores are not saved: the agent's apply (pass
        others as ``settings`` or keyword arguments, as to ``Conversation``).
        ``history_limit``, when given, replaces the saved one, as for :meth:`open`;
        the id and metadata are the saved conversation's.

        Raises:
            ConversationFormatError: the text is not a saved conversation this
                version can read (an unknown version, a malformed document).
            InvalidRequestError: an option of the wrong type or sign, or one
                the document holds (``id=``, ``metadata=``).
        """
        return cls._continuing(
            agent,
            loads_conversation(text),
            store=store,
            version=0,
            history_limit=history_limit,
            settings=settings,
            options=options,
        )

    @classmethod
    async def load(
        cls,
        agent: Agent,
        store: ConversationStore,
        id: str,
        *,
        history_limit: int | None = None,
        settings: RequestSettings | None = None,
        **options: Unpack[SettingsChanges],
    ) -> Conversation:
        """Continue the conversation ``id`` kept in ``store``.

        ``agent`` runs the turns from now on: its client, model, instructions,
        tools and handlers (none of those are stored). ``store`` is where the
        conversation is read from and goes on being written to; ``id`` is its
        id there. The window (``history_limit``, unless given here, as for
        :meth:`open`), metadata and saved budget knobs come from the store.
        Each turn's settings are the agent's (or
        ``settings``, when given), then the saved budget knobs, then the
        keyword arguments (``max_context_tokens``, ``output_reserve_tokens``,
        the limiting handlers, ... as for ``Conversation``), later ones
        winning. Prompts a crashed process left pending are in
        :attr:`pending_events`.

        Raises:
            ConversationNotFoundError: the store has no such conversation
                (:meth:`open` creates it instead).
            ConversationFormatError: what it holds cannot be continued.
            InvalidRequestError: a keyword argument of the wrong type or sign,
                or one the store holds (``metadata=``, ``version=``).

        Example::

            conv = await Conversation.load(agent, store, "support-42", max_context_tokens=32_000)
        """
        stored = await read_stored(store, _checked_id(id))
        conversation = cls._continuing(
            agent,
            stored.document,
            store=store,
            version=stored.version,
            history_limit=history_limit,
            settings=settings,
            options=options,
        )
        markers = stored.pending_markers
        if len(markers) == len(conversation._transcript.pending):
            conversation._writer.markers = tuple(markers)
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
            conversation = await cls.load(
                agent, store, id, history_limit=history_limit, settings=settings, **options
            )
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
        return conversation


def _checked_id(id: object, alternative: str = "") -> str:
    """``id`` when it can be a conversation's: a non-empty string, and text (see
    ``id_problem``). ``alternative`` names what else the argument takes ("or None").

    Raises:
        InvalidRequestError: it cannot, naming the ``id`` argument.
    """
    if not isinstance(id, str) or not id:
        fail("id", " ".join(("a non-empty string", alternative)).strip(), id)
    if id_problem(id) is not None:
        fail("id", "text UTF-8 can encode, without a lone surrogate", id)
    return id


def _refuse_saved_options(options: SettingsChanges) -> None:
    """Refuse, naming it, a keyword argument that is what a restored conversation takes
    from its document (it would clash with the document's own value)."""
    names: Mapping[str, object] = options
    for name in ("id", "metadata"):
        if name in names:
            raise InvalidRequestError(
                f"{name}= is not an option of a restored conversation: it keeps the {name} "
                f"it was saved with (Conversation(...) makes a new one)"
            )
