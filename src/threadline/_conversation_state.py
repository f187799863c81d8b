"""What a conversation holds and shows: its state, its settings, its saved form.

:class:`ConversationState` is the base of :class:`~threadline.Conversation`,
which adds what changes the state (turns, rewrites, loading); see
``_conversation``.
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Unpack

import anyio
import anyio.lowlevel
import attrs

from threadline._agent import Agent, combined_settings
from threadline._conversation_settings import saved_calibration, saved_settings
from threadline._conversation_window import (
    WINDOW_KEY,
    KeptWindow,
    SentWindow,
    cache_key,
    conversation_settings,
    keeps_window,
    window_after,
    window_value,
)
from threadline._errors import InvalidRequestError
from threadline._messages import Message, Usage
from threadline._models import Model
from threadline._plan import settings_budget, settings_counter
from threadline._provider import ProviderResponse
from threadline._request import Request
from threadline._result import RunResult
from threadline._sentinel import NotGiven
from threadline._settings import RequestSettings, SettingsChanges
from threadline._store import ConversationStore
from threadline._transcript import Transcript, Turn
from threadline._validate import fail, non_negative_int
from threadline.counting._calibration._saved import SavedEntry
from threadline.counting._protocol import is_incremental
from threadline.counting._resolution import default_token_counter
from threadline.limiting._drop_oldest import slides_by_one
from threadline.serialization._converter import dumps_conversation
from threadline.serialization._documents import ConversationDocument, ConversationEvent, JsonValue

__all__ = ["ConversationState", "now"]


def now() -> datetime:
    """The time a conversation stamps on what it writes."""
    return datetime.now(UTC)


class ConversationState:
    """A conversation's state and what can be read from it (see ``Conversation``)."""

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
        if id is None:
            id = uuid.uuid4().hex
        if not isinstance(id, str) or not id:
            fail("id", "a non-empty string or None", id)
        self._agent = agent
        self._id = id
        self._history_limit = non_negative_int("history_limit", history_limit)
        self._store = store
        self._settings = combined_settings(agent.settings, settings, options)
        # The document type validates the labels; keep its copy.
        self._metadata = ConversationDocument(id=id, metadata=metadata or {}).metadata
        self._extra_settings: dict[str, JsonValue] = {}
        # Made for a turn and let go once nobody holds or waits on it: an idle
        # conversation keeps no lock (see _turn_lock).
        self._lock: anyio.Lock | None = None
        self._lock_loop: anyio.lowlevel.EventLoopToken | None = None
        self._version = 0
        self._created_at: datetime | None = now()
        self._updated_at: datetime | None = None
        self._transcript = Transcript()
        self._window = KeptWindow()
        # The store's marker of each pending event (None: unknown), beside transcript.pending.
        self._pending_markers: tuple[str | None, ...] = ()
        # Where drop_oldest_units last cut the window, and what that holds for.
        self._slide: tuple[object, int] | None = None

    @asynccontextmanager
    async def _turn_lock(self) -> AsyncIterator[None]:
        """Held while a turn (or a rewrite) changes the conversation: one at a time."""
        lock = self._current_lock()
        try:
            async with lock:
                yield
        finally:
            if self._lock is lock and not lock.locked() and not lock.statistics().tasks_waiting:
                self._lock = self._lock_loop = None

    def _current_lock(self) -> anyio.Lock:
        # An anyio lock belongs to the backend that first used it; an idle
        # conversation may move on to another event loop (asyncio, then trio).
        loop = anyio.lowlevel.current_token()
        lock = self._lock
        if lock is None or (loop != self._lock_loop and not lock.locked()):
            lock = self._lock = anyio.Lock()
            self._lock_loop = loop
        return lock

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
        self._history_limit = non_negative_int("history_limit", value)

    @property
    def settings(self) -> RequestSettings:
        """What each turn's request is sent with; a new value applies from the next run.

        ``conv.settings = conv.settings.evolve(temperature=0)`` changes one option.
        """
        return self._settings

    @settings.setter
    def settings(self, value: RequestSettings) -> None:
        self._settings = combined_settings(self._settings, value, {})

    @property
    def max_context_tokens(self) -> int | None:
        """The context limit each turn's request gets (``None``: the model's)."""
        return self._settings.max_context_tokens

    @max_context_tokens.setter
    def max_context_tokens(self, value: int | None) -> None:
        self._settings = self._settings.evolve(max_context_tokens=value)

    @property
    def output_reserve_tokens(self) -> int | NotGiven:
        """The reply's reserve each turn's request gets (``NOT_GIVEN``: the default)."""
        return self._settings.output_reserve_tokens

    @output_reserve_tokens.setter
    def output_reserve_tokens(self, value: int | NotGiven) -> None:
        self._settings = self._settings.evolve(output_reserve_tokens=value)

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
        kept, base = self._window_base()
        return (*kept.head, *self._transcript.messages_from(base))

    @property
    def window_start(self) -> int:
        """The index into :attr:`events` of the first event the next turn sends.

        It moves when ``history_limit`` asks for it and, under the cache-stable
        policy (``cache_stable_units``), when a cut leaves the window; between
        cuts it stays put, so each turn's prompt begins with the last one's and
        the provider's prompt cache keeps serving it. It is saved with the
        conversation. 0 sends everything.
        """
        return self._window_base()[1]

    def _window_base(self) -> tuple[KeptWindow, int]:
        kept = self._window if keeps_window(self._settings) else KeptWindow()
        return kept, max(self._transcript.window_start(self._history_limit), kept.start)

    def _sent_window(self, *, turn: bool = False) -> SentWindow:
        """The history the next turn sends, as the very objects it will send.

        ``turn``: for the turn itself, which under ``drop_oldest_units`` starts
        where the last cut left the window (see :meth:`_slide_key`).
        """
        kept, base = self._window_base()
        slide = self._slide
        if turn and slide is not None and slide[0] == self._slide_key():
            base = max(base, slide[1])
        window = self._transcript.seed_from(base)
        return SentWindow(kept=kept, base=base, window=window)

    def _slide_key(self) -> tuple[object, ...] | None:
        """What the window's slide under ``drop_oldest_units`` holds for; ``None`` when
        a turn must send the whole window.

        ``drop_oldest_units(None)`` keeps the newest stretch of units that fits
        the budget, wherever the transcript it is given starts, and as a
        transcript grows at its end that stretch only starts later. So while the
        budget, the counter and the handlers stay as they were, the units
        before where the last cut left the window would be dropped again, and a
        turn sends only what follows: the same messages, limited in what the
        new messages cost, and a ledger that lists this turn's drops. It holds
        for a counter that prices message by message, without calibration
        (whose ratio moves with each report).
        """
        settings = conversation_settings(self._settings)
        client = self._agent.client
        if (
            keeps_window(settings)
            or settings.post_max_tokens_reached is not None
            or not slides_by_one(settings.pre_max_tokens_reached)
            or client.calibration is not None
            or self._agent.model is None
            or not is_incremental(settings_counter(settings, client, self._agent.model))
        ):
            return None
        return (self._settings, client.token_counter, default_token_counter())

    def _slide_after(self, sent: SentWindow, result: RunResult) -> tuple[object, int] | None:
        """Where the window's slide stands once ``result`` is committed."""
        key = self._slide_key()
        if key is None:
            return None
        slide = self._slide
        start = slide[1] if slide is not None and slide[0] == key else 0
        if any(record.context_retry for record in result.rounds):
            return key, start  # a budget the provider tightened for one round
        kept = window_after(sent, result, instructions=self._agent.instructions is not None)
        if kept.head or kept.start <= sent.base:
            return key, start  # nothing of the window was cut
        return key, kept.start

    def _turn_request(self, prompt: Message) -> tuple[Request, SentWindow]:
        """The request of a turn sending ``prompt``, and the history it sends."""
        sent = self._sent_window(turn=True)
        request = self._agent.request().with_settings(conversation_settings(self._settings))
        checked = self._transcript.checked(sent.kept.head, sent.window, sent.base)
        if checked is None:
            request.with_messages(sent.history)
        else:
            request._with_checked_history(checked)  # a turn costs what its new messages cost
        request.with_prompt(prompt).with_cache_key(cache_key(self._id))
        return request, sent

    def _window_after(self, sent: SentWindow, result: RunResult) -> KeptWindow:
        """The kept window once ``result`` is committed (none without the cache-stable policy)."""
        if not keeps_window(self._settings):
            return KeptWindow()
        return window_after(sent, result, instructions=self._agent.instructions is not None)

    @property
    def model_input(self) -> tuple[Message, ...]:
        """Exactly what the model will see next turn before its prompt: the agent's
        instructions as the first (system) message, then the window, as the
        request sends them (origin ``seed``).

        Limiting still applies when a turn is over budget. :meth:`token_estimate`
        counts this list and the agent's tools.
        """
        window = self._sent_window().history
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
        and the agent's tools, priced with the counter a turn would use.

        Raises:
            InvalidRequestError: no model to resolve the counter for.
        """
        agent = self._agent
        counter = settings_counter(self._settings, agent.client, self._model())
        return counter.count(self.model_input, agent.tools)

    def available_context_tokens(self) -> int | None:
        """Prompt budget left after :meth:`token_estimate`, at least 0; ``None`` without a budget.

        The budget is the one a turn resolves from :attr:`settings` and the model.

        Raises:
            InvalidRequestError: no model, a reserve that fills the limit, or a
                ``max_output_tokens`` above the model's.
        """
        budget = settings_budget(self._settings, self._model()).budget
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

    # -- counting state -----------------------------------------------------------------

    def _calibration_ratios(self) -> dict[str, SavedEntry]:
        """What the client's calibration knows of the agent's model, to be saved."""
        calibration = self._agent.client.calibration
        model = self._agent.model
        if calibration is None or model is None:
            return {}
        return calibration.saved_of(model.name)

    def _restore_calibration(self) -> None:
        """Give the ratios a loaded document saved to the client's calibration, if any."""
        calibration = self._agent.client.calibration
        if calibration is not None:
            calibration.restore(saved_calibration(self._extra_settings))

    # -- documents ----------------------------------------------------------------------

    def _header(
        self,
        *,
        next_turn_id: int | None = None,
        total_usage: Usage | None = None,
        updated_at: datetime | None = None,
        window: KeptWindow | None = None,
    ) -> ConversationDocument:
        settings = saved_settings(self._settings, self._extra_settings, self._calibration_ratios())
        kept = window_value(self._window if window is None else window)
        if kept is not None:
            settings[WINDOW_KEY] = kept
        return ConversationDocument(
            id=self._id,
            history_limit=self._history_limit,
            next_turn_id=self._transcript.next_turn_id if next_turn_id is None else next_turn_id,
            total_usage=self._transcript.total_usage if total_usage is None else total_usage,
            settings=settings,
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

    def __repr__(self) -> str:
        return (
            f"Conversation(id={self._id!r}, turns={self._transcript.turn_count()}, "
            f"events={len(self._transcript)}, history_limit={self._history_limit})"
        )
