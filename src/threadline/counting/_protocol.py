"""The counting protocols every tier of the resolution chain speaks.

:class:`TokenCounter` is the estimate every decision starts from: local,
synchronous, cheap. :class:`AsyncTokenCounter` is its async form, for counts
that take a round trip (a provider's counting endpoint); limiting asks one
only near the budget's edge (see docs/counting.md).
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol, Self, TypeAlias, TypeGuard, runtime_checkable

if TYPE_CHECKING:
    from threadline._messages import Message, Reasoning
    from threadline._models import Model
    from threadline.tools._tools import Tool

__all__ = [
    "AsyncTokenCounter",
    "BindableCounter",
    "BoundedTokenCounter",
    "ExactCounter",
    "IncrementalTokenCounter",
    "ModelTokenCounter",
    "ReplayProjection",
    "TokenCounter",
    "is_async_token_counter",
    "is_bounded",
    "is_incremental",
    "is_token_counter",
]


@runtime_checkable
class TokenCounter(Protocol):
    """Counts the prompt tokens of a transcript plus the tool schemas sent with it."""

    __slots__ = ()

    def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        """The estimated prompt tokens of ``messages`` and ``tools``."""
        ...


@runtime_checkable
class AsyncTokenCounter(Protocol):
    """Counts like :class:`TokenCounter`, but awaits: a count that costs a round trip.

    A provider's counting endpoint (llama.cpp's ``/tokenize``, Anthropic's
    ``count_tokens``) is one. It is exact where the provider says so: the
    count is what the provider will report as the prompt's input tokens.
    """

    async def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        """The prompt tokens of ``messages`` and ``tools``, as the provider counts them."""
        ...


ExactCounter: TypeAlias = AsyncTokenCounter | TokenCounter
"""What the exact tier holds: usually an async counter (a round trip), possibly a local one."""


@runtime_checkable
class BindableCounter(Protocol):
    """A counter that fits itself to the request it counts for.

    The resolution chain takes the counter that won its tier and, when it is
    a ``BindableCounter``, fits it in two steps: :meth:`for_projection` (an
    estimate only) with how the request's driver replays reasoning, then
    :meth:`for_model` with the model the request resolved to. Both steps
    default to the counter itself, so a counter subclasses this protocol and
    overrides the step that matters to it: the built-in counters take the
    driver's projection, a counter per tokenizer picks one by model.

    Example::

        class PerFamily(ModelTokenCounter):
            def count(self, messages, tools=()): ...
            def for_model(self, model):
                return LLAMA_COUNTER if model.name.startswith("llama") else self
    """

    __slots__ = ()

    def for_projection(self, projection: ReplayProjection) -> Self:
        """The counter to use where reasoning is replayed as ``projection`` says.

        A counter already bound to a projection of its own keeps it. Default:
        this counter (it does not count reasoning by projection).
        """
        return self

    def for_model(self, model: Model) -> Self | TokenCounter | AsyncTokenCounter:
        """The counter to use for ``model``. Default: this counter."""
        return self


@runtime_checkable
class ModelTokenCounter(TokenCounter, BindableCounter, Protocol):
    """A synchronous :class:`BindableCounter`: an estimate that fits itself to each request."""

    __slots__ = ()

    def for_model(self, model: Model) -> TokenCounter:
        """The counter to use for ``model`` (its tokenizer, say). Default: this counter."""
        return self


@runtime_checkable
class IncrementalTokenCounter(TokenCounter, Protocol):
    """A counter whose total is a sum of per-message costs plus a fixed overhead.

    For such a counter ``count(messages, tools) ==
    sum(message_tokens(m) for m in messages) + overhead_tokens(tools)``, which
    lets limiting price every message once and drop units by prefix sums.
    """

    def message_tokens(self, message: Message) -> int:
        """What ``message`` adds to a transcript's count."""
        ...

    def overhead_tokens(self, tools: Sequence[Tool] = ()) -> int:
        """What a transcript costs besides its messages: tool schemas and reply priming."""
        ...


@runtime_checkable
class BoundedTokenCounter(IncrementalTokenCounter, Protocol):
    """An incremental counter that can bound a transcript's cost without tokenizing it.

    ``messages_tokens_bound(messages) >= sum(map(message_tokens, messages))``
    always, and equals it when every message was priced before. Limiting
    asks for the bound first: a transcript whose bound fits far inside the
    budget needs no exact count to decide, so its count is made only when read
    (internal: the built-in counter is the only one).
    """

    def messages_tokens_bound(self, messages: Sequence[Message]) -> int:
        """At least what ``messages`` add to a transcript's count, at a fraction of the cost."""
        ...


@runtime_checkable
class ReplayProjection(Protocol):
    """How a driver replays an assistant message's reasoning to its model.

    A counter counts a message as its driver will send it: the pieces returned
    here are counted, and nothing else of the reasoning is.
    """

    def replayed_reasoning(self, reasoning: Reasoning) -> Sequence[str]:
        """The texts of ``reasoning`` that go back to the model (and cost tokens)."""
        ...


_incremental_kinds: dict[type, bool] = {}


def is_incremental(counter: TokenCounter) -> TypeGuard[IncrementalTokenCounter]:
    """``isinstance(counter, IncrementalTokenCounter)``, remembered per counter type.

    A runtime protocol check inspects the type's methods on every call;
    limiting asks it for every round of every request, so the answer is
    kept once per type (a counter's methods live on its type).
    """
    kind = type(counter)
    known = _incremental_kinds.get(kind)
    if known is None:
        known = _incremental_kinds[kind] = isinstance(counter, IncrementalTokenCounter)
    return known


_bounded_kinds: dict[type, bool] = {}


def is_bounded(counter: TokenCounter) -> TypeGuard[BoundedTokenCounter]:
    """``isinstance(counter, BoundedTokenCounter)``, remembered per counter type
    (as :func:`is_incremental`)."""
    kind = type(counter)
    known = _bounded_kinds.get(kind)
    if known is None:
        known = _bounded_kinds[kind] = isinstance(counter, BoundedTokenCounter)
    return known


def is_async_token_counter(value: object) -> bool:
    """Whether ``value`` is an :class:`AsyncTokenCounter`: its ``count`` is a coroutine function.

    The runtime protocol check cannot tell ``async def count`` from ``def
    count``; this does.
    """
    if _is_container(value) or not isinstance(value, AsyncTokenCounter):
        return False
    return inspect.iscoroutinefunction(value.count)


def is_token_counter(value: object) -> bool:
    """Whether ``value`` can serve as a (synchronous) counter.

    The runtime protocol check only asks for a ``count`` attribute, which a
    ``str`` or a ``list`` has too; those are refused here, so a counter given
    by name fails where it is given, not deep inside a run. So is an
    :class:`AsyncTokenCounter`: its ``count`` cannot be used where an
    estimate is needed at once.
    """
    if _is_container(value) or not isinstance(value, TokenCounter):
        return False
    return not inspect.iscoroutinefunction(value.count)


def _is_container(value: object) -> bool:
    return isinstance(value, str | bytes | bytearray | list | tuple | dict | set | frozenset)
