"""What the reports measured messages at: a step between two prompts is their cost.

A fit prices a message by its classes, within some percent of what it costs;
a cut that drops half a transcript moves a thousand tokens at those prices,
and the count of what is left is off by that percent of the thousand, not of
what is left. But the messages a cut drops were each reported already: when
a prompt is the one before it plus new messages, the report's growth is what
those messages cost in this template and vocabulary. So :class:`MeasuredCosts`
keeps, per calibration key, what a step measured each message of the last
prompt at (a step's growth shared among the messages it added by their fitted
prices), and a fitted count prices leaving one out at that.

Only steps between prompts that end alike are measured: a template may
render a prompt a tool result ends otherwise (Mistral's leaves the system
message out of it), and that difference is no message's cost. A step that
also left messages out (a cut) measures what it added when every message it
left out was measured: the growth plus what those cost. A step that changed
a message before its new ones (a result cleared, messages reordered), or
that adds one message twice (two copies are one message here, and their
cost could not be told apart), measures nothing; the next one does. So
some messages are never measured and keep their fitted price: those of the
first prompt, and a reply a cut keeps apart from the question its step
added with it (the step is shared by fitted price).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING

from threadline._messages import Role
from threadline.counting._anchored import message_key

if TYPE_CHECKING:
    from threadline._messages import Message

__all__ = ["MeasuredCosts", "rounded_in_order"]


class MeasuredCosts:
    """What steps between one key's reports measured the messages of its last prompt at.

    :meth:`observe` is called under :class:`~._token_calibration.TokenCalibration`'s
    lock; :meth:`shares` may be read from any thread without it: :meth:`observe`
    publishes a new mapping and never changes one it has published.
    """

    __slots__ = ("_costs", "_latest")

    def __init__(self) -> None:
        # Per ending (a tool result's or another), the last prompt (by message key) and
        # its report.
        self._latest: dict[bool, tuple[tuple[Message, ...], int]] = {}
        # The last prompt (by message key) and what each of its measured messages costs,
        # published together.
        self._costs: tuple[tuple[Message, ...], dict[Message, float]] = ((), {})

    def observe(
        self, prompt: Sequence[Message], tokens: int, price: Callable[[Message], float]
    ) -> None:
        """Learn from a report of ``tokens`` for ``prompt``, ``price`` a message's fitted
        price (see the module docstring)."""
        keys = tuple(message_key(m) for m in prompt)
        ending = bool(prompt) and prompt[-1].role is Role.TOOL
        present = set(keys)
        known = self._costs[1]
        costs = {m: c for m, c in known.items() if m in present}
        before = self._latest.get(ending)
        if before is not None:
            self._step(before, keys, present, tokens, known, costs, price)
        self._costs = (keys, costs)
        self._latest[ending] = (keys, tokens)

    def _step(
        self,
        before: tuple[tuple[Message, ...], int],
        keys: tuple[Message, ...],
        present: set[Message],
        tokens: int,
        known: dict[Message, float],
        costs: dict[Message, float],
        price: Callable[[Message], float],
    ) -> None:
        """Measure what ``keys`` (``present``, as a set) added to ``before`` (the last
        prompt that ended alike), into ``costs`` (``known``'s that are still present):
        when ``keys`` is what ``before`` kept of itself, in order, then new messages, and
        all ``before`` left out was measured."""
        earlier, was = before
        kept = tuple(m for m in earlier if m in present)
        gone = [m for m in earlier if m not in present]
        if len(keys) <= len(kept) or keys[: len(kept)] != kept:
            return
        if any(m not in known for m in gone):
            return
        new = keys[len(kept) :]
        if len(set(new)) < len(new):
            return
        cost = tokens - was + sum(known[m] for m in gone)
        added = []
        for message in new:
            if message in costs:
                cost -= costs[message]  # measured already, by a step of the other ending
            else:
                added.append(message)
        if not added or cost < 0:
            return
        prices = [max(0.0, price(m)) for m in added]
        total = sum(prices)
        for message, priced in zip(added, prices, strict=True):
            costs[message] = cost * (priced / total if total > 0 else 1 / len(added))

    def shares(self) -> dict[Message, int]:
        """What leaving each measured message of the last prompt out saves, by message
        key, in whole tokens: rounded in the prompt's order, so that what a run of them
        saves is within a token of what they were measured at."""
        prompt, costs = self._costs
        return rounded_in_order((m, costs[m]) for m in prompt if m in costs)


def rounded_in_order(costs: Iterable[tuple[Message, float]]) -> dict[Message, int]:
    """Each message's cost in whole tokens, by message key, rounded in the order given:
    what any run of distinct messages counts is within a token of the sum of their
    costs, where each rounded up would count up to a token more a message. A repeated
    message counts what its first does (a count is by message), so each copy after the
    first may be off by up to half a token."""
    found: dict[Message, int] = {}
    total = 0.0
    for message, cost in costs:
        if message not in found:
            found[message] = round(total + cost) - round(total)
            total += cost
    return found
