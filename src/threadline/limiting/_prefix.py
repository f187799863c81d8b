"""Why the cache missed: each round's prompt compared with the one before it.

A provider serves a prompt's prefix from its cache only while it is the same,
byte for byte, as a prompt it saw recently. Each round the run compares what
it sends with what the round before it sent (in a conversation, the previous
turn's last round) and records the first message that changed and why: a
cut by limiting, a summary, a cleared result or reasoning, an edited message,
tools that changed or moved, a changed system prompt. Beside it go the share
of the prompt the provider reported it served from its cache, and the
provider's own diagnosis where it gives one
(:class:`~threadline.limiting.CacheDiagnosis` on the ``ProviderResponse``,
filled in by a driver).

The comparison is cheap: messages the two prompts share are mostly the very
same objects, so the common prefix is found by identity, field by field only
where they are not (the last turn's own messages), and nothing is hashed or
serialized.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, TypeAlias

import attrs

from threadline._messages import Message, Role
from threadline._provider import CacheDiagnosis
from threadline.limiting._incremental import CheckedHistory, HistorySpan
from threadline.limiting._ledger import LimitingRecord

if TYPE_CHECKING:
    from threadline.tools._tools import Tool

__all__ = ["CacheReport", "PrefixChange", "PrefixReason", "SentPrompt", "compare_prompts"]

PrefixReason: TypeAlias = Literal[
    "first call",
    "unchanged",
    "tools changed",
    "tools reordered",
    "system prompt changed",
    "cut by limiting",
    "summarized",
    "cleared",
    "edited message",
]
"""Why a round's prompt does not begin with the one before it (``"unchanged"``: it does;
``"first call"``: there was none to compare with)."""

_SUMMARY_HEADING = "Summary of the earlier conversation:"  # limiting._summarize's heading
_CLEARED = "[tool result cleared"  # the opening of every clear_tool_results note


@attrs.frozen(kw_only=True, eq=False)
class SentPrompt:
    """What one round sent: its messages and tools, as the very objects sent, and the
    id the provider gave its response."""

    messages: Sequence[Message]
    """A tuple; a conversation keeps its last turn's as a window onto its transcript,
    which holds the same messages (its own as their seed copies)."""
    tools: tuple[Tool, ...] = ()
    response_id: str | None = None
    """The provider's id of the response to it, for the next call's cache diagnosis."""
    history: HistorySpan | None = None
    """Where it held the history a conversation vouched for, and whose: the next
    prompt that holds that history grown at its end is known to repeat it."""


@attrs.frozen(kw_only=True)
class PrefixChange:
    """How a round's prompt relates to the previous round's.

    ``reason`` says why it does not begin with it (:data:`PrefixReason`);
    ``position`` is the first message that differs (``None`` when nothing
    does, or there was nothing to compare with; 0 when the tools changed,
    which come first in what a provider caches); ``previous_messages`` how
    many the previous prompt had and ``kept_messages`` how many of them this
    one begins with.
    """

    reason: PrefixReason
    position: int | None = None
    previous_messages: int = 0
    kept_messages: int = 0

    @property
    def kept(self) -> bool:
        """True when the prompt begins with the previous one, so its cache can serve it."""
        return self.reason == "unchanged"

    def __str__(self) -> str:
        if self.reason in ("unchanged", "first call"):
            kept = self.kept_messages
            return (
                f"prefix kept ({kept} message{'' if kept == 1 else 's'})"
                if self.reason == "unchanged"
                else "first call: nothing to compare with"
            )
        where = "the tools" if self.reason.startswith("tools") else f"message {self.position}"
        return (
            f"prefix changed at {where}: {self.reason} "
            f"({self.kept_messages} of {self.previous_messages} messages kept)"
        )


@attrs.frozen(kw_only=True)
class CacheReport:
    """A round's cache, as threadline saw it and as the provider reported it.

    ``prefix`` is how the prompt relates to the previous round's;
    ``input_tokens`` and ``cached_input_tokens`` are the provider's usage
    (0: it did not say); ``diagnosis`` the provider's own account of a miss,
    where its driver reads one.
    """

    prefix: PrefixChange
    input_tokens: int = 0
    cached_input_tokens: int = 0
    diagnosis: CacheDiagnosis | None = None

    @property
    def cached_share(self) -> float | None:
        """The share of the prompt the provider served from its cache (``None``: it
        reported no input tokens)."""
        if not self.input_tokens:
            return None
        return self.cached_input_tokens / self.input_tokens

    def __str__(self) -> str:
        share = self.cached_share
        said = "cache: " + ("not reported" if share is None else f"{share:.0%} of the prompt")
        said += f"; {self.prefix}"
        if self.diagnosis is not None:
            said += f"; the provider says: {self.diagnosis}"
        return said


def compare_prompts(
    previous: SentPrompt | None,
    messages: Sequence[Message],
    tools: Sequence[Tool],
    limiting: Sequence[LimitingRecord] = (),
    history: CheckedHistory | None = None,
) -> PrefixChange:
    """How ``messages`` (with ``tools``) relate to the ``previous`` prompt; ``limiting``
    are this round's limiting steps, which tell a cut from an edit; ``history`` the
    history a conversation vouches for, standing in ``messages`` where it says."""
    if previous is None:
        return PrefixChange(reason="first call")
    before = previous.messages
    size = len(before)
    if tuple(tools) != previous.tools:
        names = [tool.name for tool in tools]
        old = [tool.name for tool in previous.tools]
        moved = sorted(names) == sorted(old) and names != old
        reason: PrefixReason = "tools reordered" if moved else "tools changed"
        return PrefixChange(reason=reason, position=0, previous_messages=size)
    at = _shared_start(before, messages, _known_alike(previous, messages, history))
    if at == size:
        return PrefixChange(reason="unchanged", previous_messages=size, kept_messages=size)
    reason = _why(before, messages, at, limiting)
    return PrefixChange(reason=reason, position=at, previous_messages=size, kept_messages=at)


def _known_alike(
    previous: SentPrompt, messages: Sequence[Message], history: CheckedHistory | None
) -> range | None:
    """The messages of ``messages`` known to be the previous prompt's own: the history
    it held, when ``history`` is that history grown at its end, standing at the same
    place (by identity, its ends) in both. ``None``: nothing is known."""
    span = previous.history
    if history is None or span is None or not history.starts_with(span):
        return None
    vouched, start = history.messages, history.offset
    end = start + len(vouched)
    if end > len(messages) or (vouched and messages[start] is not vouched[0]):
        return None
    if vouched and messages[end - 1] is not vouched[-1]:
        return None
    return range(start, start + span.length)


def _shared_start(before: Sequence[Message], after: Sequence[Message], known: range | None) -> int:
    """How many messages ``after`` starts with that go out as ``before``'s did;
    ``known`` are alike already (see :func:`_known_alike`)."""
    end = min(len(before), len(after))
    if known is not None:
        # Around the history only: the system message before it, the turn after.
        changed = _first_change(before, after, 0, known.start)
        return changed if changed < known.start else _first_change(before, after, known.stop, end)
    # Shared messages are mostly the very same objects, and the last turn's come
    # back as seed copies at the end: step back over those, confirm the rest in
    # one tuple comparison (in C, identity before equality: equal messages go out
    # alike), and compare field by field from there.
    at = end
    while at and before[at - 1] is not after[at - 1]:
        at -= 1
    if at and tuple(before[:at]) != tuple(after[:at]):
        at = 0
    return _first_change(before, after, at, end)


def _first_change(before: Sequence[Message], after: Sequence[Message], start: int, end: int) -> int:
    """The first index from ``start`` on (``end`` when none before it) where ``after``
    does not go out as ``before`` did."""
    return next(
        (
            i
            for i in range(start, end)
            if before[i] is not after[i] and not _sent_alike(before[i], after[i])
        ),
        end,
    )


def _sent_alike(a: Message, b: Message) -> bool:
    """Whether ``a`` and ``b`` go out the same: all but the origin, which is not sent
    (the last turn's prompt comes back from the history as a seed message)."""
    return (
        a.role is b.role
        and a.content == b.content
        and a.tool_calls == b.tool_calls
        and a.tool_call_id == b.tool_call_id
        and a.name == b.name
        and a.reasoning == b.reasoning
    )


def _why(
    before: Sequence[Message],
    after: Sequence[Message],
    at: int,
    limiting: Sequence[LimitingRecord],
) -> PrefixReason:
    """Why ``after`` leaves ``before`` at message ``at``."""
    cut = any(run.dropped_messages for record in limiting for run in record.handlers)
    if at >= len(after):
        return "cut by limiting" if cut else "edited message"
    new, old = after[at], before[at] if at < len(before) else None
    if old is not None and new.role is Role.SYSTEM and old.role is Role.SYSTEM and at == 0:
        return "system prompt changed"
    if new.role is Role.USER and new.text.startswith(_SUMMARY_HEADING):
        return "summarized"
    if old is not None and _cleared(old, new):
        return "cleared"
    return "cut by limiting" if cut else "edited message"


def _cleared(old: Message, new: Message) -> bool:
    """Whether ``new`` is ``old`` with its tool output or reasoning cleared."""
    if new.role is not old.role or new.tool_call_id != old.tool_call_id:
        return False
    if new.role is Role.TOOL:
        return new.text.startswith(_CLEARED) and not old.text.startswith(_CLEARED)
    return new.role is Role.ASSISTANT and new.reasoning is None and old.reasoning is not None
