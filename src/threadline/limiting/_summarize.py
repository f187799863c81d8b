"""Ready-made limiting handlers beyond the built-in ``drop_oldest_units``.

:func:`summarize_oldest` is a Pre handler: when the transcript is over
budget it replaces the oldest droppable turns with one summary message
written by a (usually cheaper) model, and keeps the rest verbatim. Pair it
with ``drop_oldest_units(None)`` as Post, for when the summary alone is not
enough::

    conv = Conversation(
        agent,
        max_context_tokens=16_000,
        pre_max_tokens_reached=summarize_oldest(cheap_client, keep_last_turns=2),
        post_max_tokens_reached=drop_oldest_units(None),
    )

A compaction is a transaction: the summary is written first, and only a
usable one changes what is sent. A summarizer that fails, runs out of time,
returns nothing, or writes a summary no shorter than what it covers leaves
the transcript as it was, and the round's ledger says what happened
(``LimitingRecord.compactions``): no error text, placeholder or empty summary
ever stands in for the turns. In a conversation the summary and the
cut are committed with the turn in one versioned write (the store keeps every
turn; the summary heads the window), or refused with
``ConcurrentModificationError`` when another writer got in first.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Protocol, TypeVar, runtime_checkable

import anyio
import attrs

from threadline._errors import InvalidRequestError
from threadline._messages import Message, Role
from threadline._models import Model
from threadline.limiting._event import TokenLimitEvent, TokenLimitHandler
from threadline.limiting._ledger import CompactionStatus
from threadline.limiting._units import PinReason, UnitKind

if TYPE_CHECKING:
    from threadline._settings import RequestSettings
    from threadline.engine._agent import Agent
    from threadline.engine._client import Client
    from threadline.engine._request import Request

__all__ = [
    "DEFAULT_SUMMARY_INSTRUCTIONS",
    "SUMMARY_ACKNOWLEDGEMENT",
    "SUMMARY_HEADING",
    "summarize_oldest",
]

logger = logging.getLogger("threadline.limiting")

DEFAULT_SUMMARY_INSTRUCTIONS = (
    "You condense conversations. Summarize the transcript you are given for an assistant "
    "that will continue the conversation without seeing it. Keep names, facts, numbers, "
    "decisions, what tools returned, the user's preferences and open questions. Write "
    "short plain sentences with no preamble."
)
"""What the summarizing model is told, unless ``instructions`` says otherwise."""

SUMMARY_HEADING = "Summary of the earlier conversation:"
"""The first line of every summary message, so the model reads it as a summary."""

SUMMARY_ACKNOWLEDGEMENT = "Understood: I have the summary and will continue from it."
"""The assistant's reply placed after a summary when a user message follows it.

A summary is a user message; put straight before the next user message it
would make two user turns in a row, which Anthropic's Messages API refuses
and strict chat templates (many OpenAI-compatible servers) reject as roles
that do not alternate. Merging the summary into that next message instead
would rewrite a message the caller (or the current prompt) owns, so the
summary stays a turn of its own and this short answer closes it."""

_ACK = Message.assistant(SUMMARY_ACKNOWLEDGEMENT)
_MEMORY_SIZE = 128
_K = TypeVar("_K", bound=Hashable)
_V = TypeVar("_V")


class _SummaryMemory:
    """Summaries already written, so later turns extend a summary instead of redoing it.

    A conversation sends its whole window every turn: without this, every
    turn over budget would summarize the same old turns again. An entry maps
    the messages a summary covers to the summary; a summary seen again at the
    front of a transcript (a later round of the same run) is recognised too.
    """

    def __init__(self) -> None:
        self._by_first: OrderedDict[Message, tuple[tuple[Message, ...], Message]] = OrderedDict()
        self._covered: OrderedDict[Message, tuple[Message, ...]] = OrderedDict()

    def covering(
        self, messages: Sequence[Message], start: int, cut: int
    ) -> tuple[Message, int, tuple[Message, ...]] | None:
        """A known summary of ``messages[start:end]`` for some ``end <= cut``:
        ``(summary, end, the original messages it covers)``."""
        first = messages[start]
        covered = self._covered.get(first)
        if covered is not None:
            end = start + 1
            if end < len(messages) and messages[end] == _ACK:
                end += 1  # the acknowledgement belongs to the summary
            return first, end, covered
        entry = self._by_first.get(first)
        if entry is None:
            return None
        prefix, summary = entry
        end = start + len(prefix)
        if end > cut or tuple(messages[start:end]) != prefix:
            return None
        return summary, end, prefix

    def remember(self, covered: tuple[Message, ...], summary: Message) -> None:
        _put(self._by_first, covered[0], (covered, summary))
        _put(self._covered, summary, covered)


def _put(table: OrderedDict[_K, _V], key: _K, value: _V) -> None:
    table[key] = value
    table.move_to_end(key)
    if len(table) > _MEMORY_SIZE:
        table.popitem(last=False)


def _summary_range(event: TokenLimitEvent, keep_last_turns: int) -> tuple[int, int] | None:
    """``(start, cut)``: the droppable turns to summarize, or ``None`` when there are none.

    The range opens after the first system message and ends at a user
    message, before the last ``keep_last_turns`` turns and before the first
    pinned unit (the current prompt, the live exchange).
    """
    start: int | None = None
    boundary = len(event.messages)
    user_starts: list[int] = []
    for unit in event.units():
        if start is None and unit.reason is PinReason.FIRST_SYSTEM:
            continue
        if start is None:
            start = unit.start
        if unit.pinned:
            boundary = unit.start
            break
        if unit.kind is UnitKind.USER:
            user_starts.append(unit.start)
    if start is None:
        return None
    cuts = [*user_starts, boundary]
    if len(cuts) <= keep_last_turns:
        return None
    cut = cuts[-(keep_last_turns + 1)]
    return (start, cut) if cut > start else None


def _render(messages: Sequence[Message]) -> str:
    """The messages as a plain-text transcript, which any model can read."""
    lines: list[str] = []
    for message in messages:
        if message.role is Role.ASSISTANT:
            if message.text:
                lines.append(f"assistant: {message.text}")
            lines.extend(
                f"assistant called tool {call.name} with {call.arguments}"
                for call in message.tool_calls
            )
        elif message.role is Role.TOOL:
            lines.append(f"tool result ({message.name or message.tool_call_id}): {message.text}")
        else:
            lines.append(f"{message.role.value}: {message.text}")
    return "\n".join(lines)


def summarize_oldest(
    summarizer: Client | Agent,
    *,
    model: Model | str | None = None,
    keep_last_turns: int = 2,
    instructions: str = DEFAULT_SUMMARY_INSTRUCTIONS,
    max_summary_tokens: int | None = None,
    timeout: float | None = None,
) -> TokenLimitHandler:
    """Build a Pre handler that summarizes the oldest turns into one message.

    ``summarizer`` writes the summaries: a ``Client`` (with ``model``, or its
    ``default_model``) or an ``Agent`` (its client, model and sampling: ``temperature``,
    ``top_p``, ``seed``; ``model`` overrides). Each time the transcript is over budget,
    the droppable turns before the last ``keep_last_turns`` turns are replaced by one
    user message starting with :data:`SUMMARY_HEADING`; when a user message follows it,
    an assistant message (:data:`SUMMARY_ACKNOWLEDGEMENT`) comes between them, so roles
    still alternate for every provider. Cuts fall only at user messages; the first
    system message, the current prompt and this run's live tool exchange are never
    summarized. A summary already written is reused while it still fits, and extended
    with the turns that follow it when it does not, so a long conversation does not pay
    for the same summary every turn.

    Nothing but a usable summary changes the transcript: a summarizer that
    raises, takes longer than ``timeout`` seconds, returns a blank summary, or
    one no shorter than the turns it covers leaves it as it was (the Post
    handler then drops what does not fit), and the round's ledger records the outcome
    (``LimitingRecord.compactions``, a :class:`~threadline.limiting.CompactionOutcome`).
    A summary cut off at ``max_summary_tokens`` is the cap doing its job: it
    is used, and its outcome's ``detail`` says it was cut.
    Cancelling the run itself still cancels it.

    Raises:
        InvalidRequestError: no model to summarize with, a negative
            ``keep_last_turns``, or a ``timeout`` that is not a positive number.
    """
    client, summary_model, sampling = _summarizing_client(summarizer, model)
    if isinstance(keep_last_turns, bool) or not isinstance(keep_last_turns, int):
        raise InvalidRequestError(f"keep_last_turns must be an int, not {keep_last_turns!r}")
    if keep_last_turns < 0:
        raise InvalidRequestError(f"keep_last_turns must be 0 or more, not {keep_last_turns}")
    if timeout is not None and (
        isinstance(timeout, bool) or not isinstance(timeout, int | float) or timeout <= 0
    ):
        raise InvalidRequestError(f"timeout is in seconds, more than 0, or None: not {timeout!r}")
    write_summary = _summary_writer(
        client, summary_model, instructions, max_summary_tokens, sampling
    )
    if timeout is not None:
        write_summary = _with_timeout(write_summary, float(timeout))
    memory = _SummaryMemory()

    async def handler(event: TokenLimitEvent) -> None:
        await _fold_oldest(event, keep_last_turns, memory, write_summary)

    handler.__name__ = handler.__qualname__ = "summarize_oldest"
    return handler


@runtime_checkable
class _SummarizingClient(Protocol):
    """What summarize_oldest needs of a ``Client``."""

    @property
    def default_model(self) -> Model | None: ...

    def request(self) -> Request: ...


@runtime_checkable
class _SummarizingAgent(Protocol):
    """What summarize_oldest needs of an ``Agent``."""

    @property
    def client(self) -> Client: ...

    @property
    def model(self) -> Model | None: ...

    @property
    def settings(self) -> RequestSettings: ...


def _summarizing_client(
    summarizer: object, model: Model | str | None
) -> tuple[_SummarizingClient, Model | str, RequestSettings | None]:
    """The client that writes the summaries and the model it writes them with.

    Told apart by what they have, not by their class: the limiting room sits
    below the client and the agent, and never imports them.
    """
    sampling: RequestSettings | None = None
    if isinstance(summarizer, _SummarizingAgent):
        client: _SummarizingClient = summarizer.client
        model = model or summarizer.model
        sampling = summarizer.settings
    elif isinstance(summarizer, _SummarizingClient):
        client = summarizer
        model = model or client.default_model
    else:
        raise InvalidRequestError(
            f"summarize_oldest needs a Client or an Agent to write summaries, "
            f"not {type(summarizer).__name__}"
        )
    if model is None:
        raise InvalidRequestError(
            "summarize_oldest has no model: pass model=..., or give the Client a default_model"
        )
    return client, model, sampling


@attrs.frozen
class _Written:
    """What the summarizer came back with: the summary, or why there is none."""

    text: str = ""
    status: CompactionStatus = "applied"
    detail: str = ""


_Writer = Callable[[Sequence[Message]], Awaitable[_Written]]


def _summary_writer(
    client: _SummarizingClient,
    model: Model | str,
    instructions: str,
    max_summary_tokens: int | None,
    sampling: RequestSettings | None,
) -> _Writer:
    """A function that asks ``model`` for a summary of some messages; what it raises
    comes back as a ``"failed"`` outcome; a summary cut off at the cap is used, and
    its outcome's detail says it was cut."""

    async def write_summary(material: Sequence[Message]) -> _Written:
        request = (
            client.request()
            .with_model(model)
            .with_system(instructions)
            .with_prompt(_render(material))
        )
        if max_summary_tokens is not None:
            request.with_max_output_tokens(max_summary_tokens)
        if sampling is not None:  # an Agent's sampling: a temperature-0 agent sums up alike
            request.with_temperature(sampling.temperature).with_top_p(sampling.top_p)
            request.with_seed(sampling.seed)
        try:
            result = await request.run()
        except Exception as exc:  # any failure of the summarizer is a no-op, reported
            return _Written(status="failed", detail=f"{type(exc).__name__}: {exc}")
        if result.response.finish_reason == "length":
            # max_summary_tokens is the user's cap on a summary, so one that reached
            # it is used as written (if shorter than what it covers); the outcome says so.
            return _Written(
                result.text.strip(),
                detail=f"the summary was cut off at max_summary_tokens ({max_summary_tokens})",
            )
        return _Written(result.text.strip())

    return write_summary


def _with_timeout(write_summary: _Writer, timeout: float) -> _Writer:
    """``write_summary`` given ``timeout`` seconds: after that, a ``"cancelled"`` outcome."""

    async def bounded(material: Sequence[Message]) -> _Written:
        with anyio.move_on_after(timeout) as scope:
            return await write_summary(material)
        assert scope.cancelled_caught
        return _Written(status="cancelled", detail=f"no summary within {timeout:g} seconds")

    return bounded


async def _fold_oldest(
    event: TokenLimitEvent,
    keep_last_turns: int,
    memory: _SummaryMemory,
    write_summary: _Writer,
) -> None:
    """Replace the oldest turns of ``event.messages`` with one summary, reusing what is known."""
    found = _summary_range(event, keep_last_turns)
    if found is None:
        return
    start, cut = found
    messages = event.messages
    known = memory.covering(messages, start, cut)
    if known is None:
        material: list[Message] = list(messages[start:cut])
        covered = tuple(messages[start:cut])
    else:
        summary, end, earlier = known
        reused = _folded(messages, start, end, summary)
        if end == cut or event.counter.count(reused, event.tools) <= event.budget_tokens:
            event.note_compaction(
                "reused",
                covered_messages=end - start,
                covered_tokens=_cost(event, messages[start:end]),
                summary_tokens=_cost(event, [summary]),
            )
            _replace(event, start, end, summary)
            return
        material = [summary, *messages[end:cut]]
        covered = earlier + tuple(messages[end:cut])
    covered_tokens = _cost(event, messages[start:cut])
    written = await write_summary(material)
    outcome = (
        written
        if written.status != "applied" or written.text
        else _Written(status="empty", detail="the summarizing model returned nothing")
    )
    summary = Message.user(f"{SUMMARY_HEADING}\n{outcome.text}")
    summary_tokens = _cost(event, [summary]) if outcome.text else None
    longer = summary_tokens is not None and summary_tokens >= covered_tokens
    if outcome.status == "applied" and longer:
        outcome = _Written(
            status="too long",
            detail=f"the summary ({summary_tokens} tokens) is no shorter than the "
            f"{covered_tokens} tokens it covers",
        )
    event.note_compaction(
        outcome.status,
        covered_messages=cut - start,
        covered_tokens=covered_tokens,
        summary_tokens=summary_tokens,
        detail=outcome.detail,
    )
    if outcome.status != "applied":
        logger.warning(
            "compaction by summarize_oldest did not happen (%s: %s); the transcript is left "
            "as it was",
            outcome.status,
            outcome.detail,
        )
        return
    memory.remember(covered, summary)
    _replace(event, start, cut, summary)


def _cost(event: TokenLimitEvent, messages: Sequence[Message]) -> int:
    """What ``messages`` cost by the event's counter, without the request's overhead."""
    counter = event.counter
    return counter.count(messages, ()) - counter.count([], ())


def _folded(messages: Sequence[Message], start: int, end: int, summary: Message) -> list[Message]:
    """``messages`` with ``[start:end]`` replaced by ``summary``, and by the
    acknowledgement after it when a user message follows (roles alternate)."""
    after = messages[end:]
    closing = [_ACK] if after and after[0].role is Role.USER else []
    return [*messages[:start], summary, *closing, *after]


def _replace(event: TokenLimitEvent, start: int, end: int, summary: Message) -> None:
    for index in range(start, end):
        event.note_drop(index, "summarized into one message by summarize_oldest")
    event.messages = _folded(event.messages, start, end, summary)
