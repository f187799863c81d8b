"""A conversation's window: which of its messages a turn sends as history.

The window opens at the latest user message that leaves ``history_limit``
messages (``Transcript.window_start``), and two policies can move its start
further, both read from the handlers' declared traits (``limiting._traits``)
by a :class:`WindowPolicy`, made once from the conversation's settings:

- **kept**: under a handler that keeps a stable prefix (the conversation's
  default, ``cache_stable_units``), a conversation does not send its whole
  transcript every turn: it sends what the last cut left, a
  :class:`KeptWindow`, plus each new turn. The window's start stays put, so
  every turn's prompt begins with the one before it and the provider serves
  that prefix from its cache, until the budget is reached and the handler
  cuts again. A message a handler put in front of the kept turns (a summary)
  is part of the window too: the ``head``. The kept window is saved with the
  conversation (``_document``).
- **slid**: under a handler that slides one unit at a time
  (``drop_oldest_units(None)``) and nothing else, a turn sends only what
  follows the last cut, which the handler would drop again anyway (see
  :meth:`WindowPolicy.slide_key`). That start is not saved.
"""

from __future__ import annotations

import hashlib
import weakref
from collections.abc import Sequence

import attrs

from threadline._messages import Message, Origin, Role
from threadline._result import RunResult
from threadline._settings import RequestSettings
from threadline.conversation._transcript import Transcript
from threadline.counting._protocol import is_incremental
from threadline.counting._resolution import default_token_counter
from threadline.engine._agent import Agent
from threadline.engine._plan import settings_counter
from threadline.limiting._defaults import DEFAULT_CONVERSATION_HANDLER
from threadline.limiting._traits import traits_of

__all__ = [
    "NOTHING_KEPT",
    "KeptWindow",
    "SentWindow",
    "Slide",
    "WindowPolicy",
    "cache_key",
    "sent_window",
    "slide_after",
    "slide_start",
    "window_after",
]


@attrs.frozen(kw_only=True)
class KeptWindow:
    """What the last cut left: the first event still sent, and messages standing before it.

    ``start`` indexes the conversation's events (0: nothing was cut); ``head``
    are messages a handler put in front of the kept events, such as a summary
    of what was cut, sent before them every turn.
    """

    start: int = 0
    head: tuple[Message, ...] = ()


NOTHING_KEPT = KeptWindow()
"""Nothing cut yet: one value every such conversation shares."""


@attrs.frozen(kw_only=True)
class SentWindow:
    """What a turn sent as history, as the very objects it sent.

    ``base`` is the event index of ``window[0]``; ``head`` are the kept head
    messages. The run hands the same objects back for what limiting kept, so
    the next window is found by identity, never by comparing texts.
    """

    kept: KeptWindow
    base: int
    window: Sequence[Message]

    @property
    def history(self) -> tuple[Message, ...]:
        """The history the turn's request is given: the head, then the window."""
        return (*self.kept.head, *self.window)


@attrs.frozen
class Slide:
    """Where a sliding handler last cut the window (``start``, an event index), and
    what that holds for (``key``, see :meth:`WindowPolicy.slide_key`)."""

    key: tuple[object, ...]
    start: int


def slide_start(slide: Slide | None, key: tuple[object, ...] | None) -> int:
    """Where the last cut left the window when ``slide`` holds for a turn with slide
    ``key``; 0 (nothing to skip) otherwise."""
    return slide.start if key is not None and slide is not None and slide.key == key else 0


_policies: weakref.WeakValueDictionary[int, WindowPolicy] = weakref.WeakValueDictionary()
"""The policy made for each settings value (by its id) that a conversation still holds."""


@attrs.frozen(kw_only=True, eq=False)
class WindowPolicy:
    """How a conversation's settings shape its window, worked out once per settings value.

    ``settings`` are the conversation's own; ``turn_settings`` what each turn
    runs with (the conversation's default Pre handler filled in when they name
    none); ``keeps_window`` says a Pre or Post handler keeps a stable prefix;
    ``may_slide`` that the Pre handler slides one unit at a time and nothing
    else cuts, so the slide may apply (the model and counter decide each turn).
    """

    settings: RequestSettings
    turn_settings: RequestSettings
    keeps_window: bool
    may_slide: bool

    @classmethod
    def of(cls, settings: RequestSettings) -> WindowPolicy:
        """The policy of a conversation whose settings are ``settings``: the one made for
        that very settings value while any conversation still holds it."""
        # Thousands of conversations on one agent share its settings; each would
        # otherwise hold its own copy of the turn settings (a fortieth of the memory
        # of a 20-turn conversation). Found by id: the policy holds the settings, so
        # while it is alive no other object has that id.
        shared = _policies.get(id(settings))
        if shared is not None and shared.settings is settings:
            return shared
        policy = cls._made(settings)
        _policies[id(settings)] = policy
        return policy

    @classmethod
    def _made(cls, settings: RequestSettings) -> WindowPolicy:
        turn = settings
        if settings.pre_max_tokens_reached is None:
            turn = settings.evolve(pre_max_tokens_reached=DEFAULT_CONVERSATION_HANDLER)
        pre, post = turn.pre_max_tokens_reached, turn.post_max_tokens_reached
        keeps = traits_of(pre).keeps_stable_prefix or traits_of(post).keeps_stable_prefix
        return cls(
            settings=settings,
            turn_settings=turn,
            keeps_window=keeps,
            may_slide=not keeps and post is None and traits_of(pre).slides_one_unit,
        )

    def kept(self, window: KeptWindow) -> KeptWindow:
        """The part of the kept ``window`` a turn honours: all of it while a handler keeps
        a stable prefix, else none."""
        return window if self.keeps_window else NOTHING_KEPT

    def slide_key(self, agent: Agent) -> tuple[object, ...] | None:
        """What a slide of the window holds for on a turn of ``agent``; ``None`` when the
        turn must send the whole window.

        A sliding handler (``drop_oldest_units(None)``) keeps the newest stretch
        of units that fits the budget, wherever the transcript it is given
        starts, and as a transcript grows at its end that stretch only starts
        later. So while the budget, the counter and the handlers stay as they
        were, the units before where the last cut left the window would be
        dropped again, and a turn sends only what follows: the same messages,
        limited in what the new messages cost, and a ledger that lists this
        turn's drops. It holds for a counter that prices message by message,
        without calibration (whose ratio moves with each report).
        """
        client = agent.client
        model = agent.model
        if (
            not self.may_slide
            or client.calibration is not None
            or model is None
            or not is_incremental(settings_counter(self.turn_settings, client.defaults, model))
        ):
            return None
        return (self.settings, client.token_counter, default_token_counter())

    def after(self, sent: SentWindow, result: RunResult, *, instructions: bool) -> KeptWindow:
        """The kept window once ``result`` is committed (none while no handler keeps one)."""
        if not self.keeps_window:
            return NOTHING_KEPT
        return window_after(sent, result, instructions=instructions)


def sent_window(
    transcript: Transcript, history_limit: int, kept: KeptWindow, slide_start: int = 0
) -> SentWindow:
    """The history a turn sends, as the very objects it will send: the events from the
    latest of the ``history_limit`` window's start, the ``kept`` window's and
    ``slide_start``, after the kept head."""
    base = max(transcript.window_start(history_limit), kept.start, slide_start)
    return SentWindow(kept=kept, base=base, window=transcript.seed_from(base))


def slide_after(
    slide: Slide | None,
    key: tuple[object, ...] | None,
    sent: SentWindow,
    result: RunResult,
    *,
    instructions: bool,
) -> Slide | None:
    """Where the window's slide stands once ``result``, a turn run with slide ``key``,
    is committed (``None``: the turn did not slide)."""
    if key is None:
        return None
    start = slide_start(slide, key)
    if any(record.context_retry for record in result.rounds):
        return Slide(key, start)  # a budget the provider tightened for one round
    kept = window_after(sent, result, instructions=instructions)
    if kept.head or kept.start <= sent.base:
        return Slide(key, start)  # nothing of the window was cut
    return Slide(key, kept.start)


def cache_key(conversation_id: str) -> str:
    """The prompt-cache key a conversation's requests carry: stable for its id, and a
    digest of it, so an id that names a person never reaches the provider."""
    digest = hashlib.sha256(conversation_id.encode("utf-8")).hexdigest()
    return f"threadline-{digest[:32]}"


def window_after(sent: SentWindow, result: RunResult, *, instructions: bool) -> KeptWindow:
    """Where the window stands after ``result``: the first kept message of the
    window sent, and the messages a handler left in front of it.

    ``instructions`` says the transcript opens with the agent's system
    message, which no handler drops. A start that a handler left inside a
    turn moves back to that turn's user message: the window may hold more
    than the cut left, never a reply without its question.
    """
    window = sent.window
    if not any(record.handlers for record in result.limiting):
        return sent.kept  # no handler ran: the window is as it was sent
    position: dict[int, int] = {}
    for index, message in enumerate(window):
        position.setdefault(id(message), index)  # one object twice: the earlier keeps more
    messages = result.messages[1:] if instructions else result.messages
    head: list[Message] = []
    offset = len(window)  # everything before this run's prompt is gone
    for message in messages:
        found = position.get(id(message))
        if found is not None:
            offset = found
            break
        if message.origin is Origin.TURN:
            break  # this run's prompt: pinned, so always there
        if message.origin is not Origin.INJECTION:  # injections are never kept
            head.append(message)
    while 0 < offset < len(window) and window[offset].role is not Role.USER:
        offset -= 1
    kept_head = tuple(head)
    if offset == 0 and _same(kept_head, sent.kept.head):
        return sent.kept  # no cut: the start stays where it was (history_limit moves on its own)
    return KeptWindow(start=sent.base + offset, head=kept_head)


def _same(a: Sequence[Message], b: Sequence[Message]) -> bool:
    return len(a) == len(b) and all(x is y for x, y in zip(a, b, strict=True))
