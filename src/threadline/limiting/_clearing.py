"""Context editing: keep every turn, send old tool output and old reasoning cleared.

Long agent runs are mostly tool output. Dropping whole units loses the
conversation's turns along with it; clearing keeps them and sends an old tool
result as a short note instead (what was cleared and how many tokens it held),
or an old reply without its reasoning. The call/result pairing, the unit
borders and every pinned unit stay as they were; the conversation's history
keeps every message whole (only what is sent is cleared).

Both handlers are cache-aware the way ``cache_stable_units`` is. Clearing one
result per turn would change the prompt early on every turn, so once over
the budget a handler clears a *batch*, oldest first, down to a low-water mark
(60% of the budget by default), and on the turns that follow it clears the
very same messages again (it remembers them) and nothing more, until the
budget is reached again. The prompt's prefix then changes only once per batch
(and up to twice more around a cut by the Post handler: a handler runs only
over budget, so a window the cut left that fits unlimited is sent uncleared).

When clearing cannot bring the transcript down to the mark (the turns' own
text is most of it), a handler clears nothing new: compose one as Pre with a
cutting handler as Post, which then cuts a block of whole turns::

    conv = Conversation(
        agent,
        pre_max_tokens_reached=clear_tool_results(keep=3),
        post_max_tokens_reached=cache_stable_units(),
    )
"""

from __future__ import annotations

import math
import string
from collections import OrderedDict
from typing import Literal

import attrs

from threadline._errors import InvalidRequestError
from threadline._messages import Message, Role
from threadline.counting._protocol import TokenCounter
from threadline.limiting._budget import message_costs
from threadline.limiting._cache_stable import DEFAULT_LOW_WATER, checked_batching
from threadline.limiting._event import TokenLimitEvent, priced
from threadline.limiting._traits import HandlerTraits
from threadline.limiting._units import PinReason

__all__ = [
    "DEFAULT_CLEARED_PLACEHOLDER",
    "ClearingHandler",
    "clear_thinking",
    "clear_tool_results",
]

DEFAULT_CLEARED_PLACEHOLDER = (
    "[tool result cleared to save context: {tool} returned {tokens} tokens here; "
    "call the tool again if you need it]"
)
"""The note sent in place of a cleared tool result; ``{tool}``, ``{tokens}`` and
``{call_id}`` are filled in."""

_FIELDS = frozenset({"tool", "tokens", "call_id"})
_MEMORY_SIZE = 65_536  # cleared messages remembered per handler, newest kept
_What = Literal["tool result", "reasoning"]
# What a cleared message is remembered by: cheap to make every turn, since a str
# caches its own hash (the text itself is not held).
_Key = tuple[str | None, int, int]


@attrs.frozen(kw_only=True)
class _Candidate:
    index: int
    key: _Key
    cost: int  # what clearing it saves (0: it stays as it is)
    held: int  # the tokens its cleared content held
    replacement: Message | None


class ClearingHandler:
    """A clearing handler that :func:`clear_tool_results` or :func:`clear_thinking` builds.

    It remembers which messages it cleared (by call id and text, not holding
    the text), so use one per conversation: a handler shared between
    conversations clears, in each, what any of them cleared.
    """

    # Called every round: what it cleared before it clears again, over budget or
    # not, so a window a cut left that fits unlimited keeps its prefix too.
    __threadline_traits__ = HandlerTraits(runs_every_round=True)

    __slots__ = (
        "__qualname__",
        "_memory",
        "counter",
        "keep",
        "low_water",
        "min_tokens",
        "placeholder",
        "what",
    )

    def __init__(
        self,
        what: _What,
        *,
        keep: int,
        placeholder: str,
        min_tokens: int,
        low_water: float,
        counter: TokenCounter | None,
    ) -> None:
        self.what = what
        self.keep = keep
        self.placeholder = placeholder
        self.min_tokens = min_tokens
        self.low_water = low_water
        self.counter = counter
        self._memory: OrderedDict[_Key, None] = OrderedDict()
        # The ledger's name for it.
        self.__qualname__ = "clear_tool_results" if what == "tool result" else "clear_thinking"

    async def __call__(self, event: TokenLimitEvent) -> None:
        counter = self.counter if self.counter is not None else event.counter
        if not self._memory and event.estimated_tokens <= event.budget_tokens:
            return  # nothing cleared yet, nothing to clear: the common case, for free
        costs, total, _ = priced(event, counter)
        candidates = self._candidates(event, costs, counter)
        target = math.floor(event.budget_tokens * self.low_water)
        memory = self._memory
        chosen: list[_Candidate] = []
        # First what was cleared on earlier turns, so the prompt's prefix stays the
        # same; a new batch only when that is not enough, down to the low-water mark.
        for candidate in candidates:
            if candidate.key in memory:
                chosen.append(candidate)
                total -= candidate.cost
        if total > event.budget_tokens:
            batch: list[_Candidate] = []
            for candidate in candidates:
                if total <= target:
                    break
                if candidate.key not in memory:
                    batch.append(candidate)
                    total -= candidate.cost
            # A batch that cannot reach the mark would leave the transcript just
            # under the budget, and the next turns would clear one result each,
            # changing the prefix every turn: the Post handler's cut does better.
            if total <= target:
                chosen += batch
        for candidate in chosen:
            assert candidate.replacement is not None  # only those that shrink are candidates
            memory[candidate.key] = None
            memory.move_to_end(candidate.key)
            event.clear(
                candidate.index,
                candidate.replacement,
                reason=f"{self.what} cleared by {self.__qualname__}: over budget, down to "
                f"the low-water mark of {target} tokens ({self.low_water:.0%} of the budget)",
                tokens=candidate.held,
            )
        while len(memory) > _MEMORY_SIZE:
            memory.popitem(last=False)

    def _candidates(
        self, event: TokenLimitEvent, costs: list[int], counter: TokenCounter
    ) -> list[_Candidate]:
        """What may be cleared, oldest first: not pinned, not among the newest ``keep``,
        not before the first user message (a cut drops that), worth ``min_tokens``."""
        messages = event.messages
        units = event.units()
        held: set[int] = set()
        first_user: int | None = None
        current_prompt = len(messages)
        for unit in units:
            if unit.pinned:
                held.update(unit.indices)
                if unit.reason is PinReason.CURRENT_PROMPT:
                    current_prompt = min(current_prompt, unit.start)
            if first_user is None and messages[unit.start].role is Role.USER:
                first_user = unit.start
        if first_user is None:
            return []
        if self.what == "tool result":
            return self._tool_results(messages, costs, held, first_user, counter)
        return _eligible(
            self._reasoning(messages, costs, held, first_user, current_prompt, counter), self.keep
        )

    def _tool_results(
        self,
        messages: list[Message],
        costs: list[int],
        held: set[int],
        first_user: int,
        counter: TokenCounter,
    ) -> list[_Candidate]:
        found: list[_Candidate] = []
        notes: list[Message] = []  # priced together, once
        for index in range(first_user, len(messages)):
            message = messages[index]
            if message.role is not Role.TOOL:
                continue
            text = message.text
            key = (message.tool_call_id, len(text), hash(text))
            replacement = None
            if index not in held and costs[index] >= self.min_tokens and not _is_cleared(text):
                note = self.placeholder.format(
                    tool=message.name or "the tool",
                    tokens=costs[index],
                    call_id=message.tool_call_id,
                )
                replacement = attrs.evolve(message, content=note)
                notes.append(replacement)
            # A result too small to clear, or cleared already, still counts among
            # the newest ``keep``.
            found.append(
                _Candidate(index=index, key=key, cost=0, held=costs[index], replacement=replacement)
            )
        older = found[: max(0, len(found) - self.keep)]
        chosen = [c for c in older if c.replacement is not None]
        note_costs, _ = message_costs(counter, [c.replacement for c in chosen if c.replacement])
        return [
            attrs.evolve(c, cost=c.held - cost)
            for c, cost in zip(chosen, note_costs, strict=True)
            if c.held > cost
        ]

    def _reasoning(
        self,
        messages: list[Message],
        costs: list[int],
        held: set[int],
        first_user: int,
        current_prompt: int,
        counter: TokenCounter,
    ) -> list[_Candidate]:
        # Never at or after the current prompt: that is the tool-use cycle still
        # going on, whose reasoning the provider needs back.
        found: list[_Candidate] = []
        for index in range(first_user, current_prompt):
            message = messages[index]
            if message.role is not Role.ASSISTANT or message.reasoning is None or index in held:
                continue
            bare = attrs.evolve(message, reasoning=None)
            saved = costs[index] - message_costs(counter, [bare])[0][0]
            reasoning = message.reasoning
            key = (None, len(reasoning.text), hash((reasoning.text, reasoning.provider_reasoning)))
            if saved < self.min_tokens:
                found.append(_Candidate(index=index, key=key, cost=0, held=0, replacement=None))
                continue
            found.append(
                _Candidate(
                    index=index,
                    key=key,
                    cost=saved,
                    held=saved,
                    replacement=bare,
                )
            )
        return found

    def __repr__(self) -> str:
        return (
            f"{self.__qualname__}(keep={self.keep!r}, min_tokens={self.min_tokens!r}, "
            f"low_water={self.low_water!r})"
        )


def _eligible(found: list[_Candidate], keep: int) -> list[_Candidate]:
    """The older ones, past the newest ``keep``, that clearing would shrink."""
    older = found[: max(0, len(found) - keep)]
    return [c for c in older if c.cost > 0]


def _is_cleared(text: str) -> bool:
    return text.startswith("[tool result cleared")


def _checked_common(keep: object, min_tokens: object, low_water: object, counter: object) -> None:
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 0:
        raise InvalidRequestError(f"keep is how many of the newest to keep, 0 or more: {keep!r}")
    if isinstance(min_tokens, bool) or not isinstance(min_tokens, int) or min_tokens < 0:
        raise InvalidRequestError(f"min_tokens must be an int, 0 or more, not {min_tokens!r}")
    checked_batching(low_water, counter, "a clearing handler")


def _checked_placeholder(placeholder: object) -> str:
    if not isinstance(placeholder, str) or not placeholder.strip():
        raise InvalidRequestError(f"placeholder must be a non-empty str, not {placeholder!r}")
    try:
        fields = {name for _, name, _, _ in string.Formatter().parse(placeholder) if name}
    except ValueError as exc:
        raise InvalidRequestError(f"placeholder is not a format string: {exc}") from None
    unknown = fields - _FIELDS
    if unknown:
        raise InvalidRequestError(
            f"placeholder names {sorted(unknown)}; it may use only {{tool}}, {{tokens}} "
            "and {call_id}"
        )
    if not placeholder.startswith("[tool result cleared"):
        # The handler recognises its own notes by this opening, so it never
        # clears a note again.
        placeholder = "[tool result cleared] " + placeholder
    return placeholder


def clear_tool_results(
    keep: int = 3,
    *,
    placeholder: str = DEFAULT_CLEARED_PLACEHOLDER,
    min_tokens: int = 100,
    low_water: float = DEFAULT_LOW_WATER,
    counter: TokenCounter | None = None,
) -> ClearingHandler:
    """Build a handler that sends older tool results as a short note instead of their content.

    When the transcript is over budget it clears tool results oldest first,
    in one batch down to ``low_water`` of the budget, and keeps the newest
    ``keep`` results, every result a pinned unit holds (this run's live
    exchange), and results under ``min_tokens`` as they are. A cleared result
    keeps its call id and tool name; its content becomes ``placeholder`` with
    ``{tool}``, ``{tokens}`` (what it held) and ``{call_id}`` filled in. On
    the turns that follow it clears the same results again, and a new batch
    only once the budget is reached again, so the prompt's prefix (and the
    provider's cache) holds between batches. The ledger lists each cleared
    result (``LimitingRecord.cleared``); the conversation's history keeps it whole.

    Raises:
        InvalidRequestError: a negative ``keep`` or ``min_tokens``, ``low_water``
            outside ``(0, 1]``, a ``placeholder`` that is not a format string of
            those fields, or ``counter`` is not a token counter.
    """
    _checked_common(keep, min_tokens, low_water, counter)
    return ClearingHandler(
        "tool result",
        keep=keep,
        placeholder=_checked_placeholder(placeholder),
        min_tokens=min_tokens,
        low_water=float(low_water),
        counter=counter,
    )


def clear_thinking(
    keep: int = 1,
    *,
    min_tokens: int = 50,
    low_water: float = DEFAULT_LOW_WATER,
    counter: TokenCounter | None = None,
) -> ClearingHandler:
    """Build a handler that sends older replies without their reasoning.

    Like :func:`clear_tool_results`, in batches down to ``low_water``, for
    assistant messages before the current prompt, keeping the newest
    ``keep``: the tool-use cycle still going on (this run's replies) keeps
    its reasoning, which providers need back to go on from their tool
    results. Only reasoning that is sent counts: where the driver's replay
    rules leave an earlier turn's state out anyway (Anthropic), clearing it
    saves nothing and nothing is cleared.

    Raises:
        InvalidRequestError: as :func:`clear_tool_results`.
    """
    _checked_common(keep, min_tokens, low_water, counter)
    return ClearingHandler(
        "reasoning",
        keep=keep,
        placeholder="",
        min_tokens=min_tokens,
        low_water=float(low_water),
        counter=counter,
    )
