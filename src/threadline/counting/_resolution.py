"""Which counter a request uses: the resolution chain and the process-wide default.

First match wins:

1. the request's counter (``Request.with_token_counter``);
2. the client's (``Client(token_counter=...)``);
3. the driver's (``driver.token_counter()``, when it returns one);
4. the process default (``set_default_token_counter``);
5. the built-in ``BuiltinTokenCounter``.

The winner is then fitted to the request: a ``BuiltinTokenCounter`` that was
not given a projection is bound to the driver's replay projection for the
model, and a ``ModelTokenCounter`` is bound to the model with ``for_model``.

The exact counter near the budget's edge (an :class:`AsyncTokenCounter`, or
a synchronous one) is resolved beside it, from the tiers that can have one:
the request's (``RequestSettings.exact_token_counter``), the client's
(``Client(exact_token_counter=...)``), the driver's
(``driver.exact_token_counter(model)``, for drivers whose provider counts).
There is no process default and no built-in: without one, nothing is counted
exactly and the estimate decides.

The process default is the one piece of global mutable state threadline
has. It is one reference, swapped under a lock, so a reader sees either the
old counter or the new one, never anything in between.
"""

from __future__ import annotations

import threading
from typing import Protocol, TypeAlias

from threadline._models import Model
from threadline.counting._approximate import ApproximateCounter
from threadline.counting._builtin import BuiltinTokenCounter
from threadline.counting._protocol import (
    AsyncTokenCounter,
    ModelTokenCounter,
    ReplayProjection,
    TokenCounter,
    is_token_counter,
)

__all__ = [
    "ExactCounter",
    "builtin_token_counter",
    "default_token_counter",
    "resolve_exact_token_counter",
    "resolve_token_counter",
    "set_default_token_counter",
]


ExactCounter: TypeAlias = AsyncTokenCounter | TokenCounter
"""What the exact tier holds: usually an async counter (a round trip), possibly a local one."""


class _CountingDriver(Protocol):
    """The two methods of a driver that counting uses."""

    def token_counter(self) -> TokenCounter | None: ...

    def replay_projection(self, model: Model) -> ReplayProjection: ...


# One built-in for the whole process, so every request that falls through to
# it shares one cache of message costs.
_BUILTIN = BuiltinTokenCounter()

_default_lock = threading.Lock()
_default: TokenCounter | None = None


def builtin_token_counter() -> BuiltinTokenCounter:
    """The process's built-in counter: the last tier of the chain."""
    return _BUILTIN


def set_default_token_counter(counter: TokenCounter | None) -> None:
    """Install ``counter`` as the process default; ``None`` goes back to the built-in.

    Meant for start-up wiring. Safe to call from several threads: the default
    is always exactly one of the counters installed.

    Example::

        threadline.set_default_token_counter(ApproximateCounter())

    Raises:
        TypeError: ``counter`` has no ``count`` method.
    """
    global _default
    if counter is not None and not is_token_counter(counter):
        raise TypeError(
            f"a token counter needs a count(messages, tools) method; got {type(counter).__name__}"
        )
    with _default_lock:
        _default = counter


def default_token_counter() -> TokenCounter:
    """The process default installed now: the last one set, or the built-in."""
    counter = _default
    return _BUILTIN if counter is None else counter


def resolve_token_counter(
    request_tier: TokenCounter | None,
    client_tier: TokenCounter | None,
    driver: _CountingDriver | None,
    model: Model,
) -> TokenCounter:
    """The counter a request for ``model`` uses: the first tier that has one.

    ``request_tier`` and ``client_tier`` are the counters set on the request
    and the client (``None`` when unset); ``driver`` is asked for its counter
    and, when the winner is an unbound ``BuiltinTokenCounter`` or
    ``ApproximateCounter``, for its replay
    projection. A winner that is a ``ModelTokenCounter`` is returned as
    ``winner.for_model(model)``.
    """
    counter = request_tier
    if counter is None:
        counter = client_tier
    if counter is None and driver is not None:
        counter = driver.token_counter()
    if counter is None:
        counter = default_token_counter()
    if isinstance(counter, BuiltinTokenCounter):
        if counter.projection is None and driver is not None:
            counter = counter.with_projection(driver.replay_projection(model))
        return counter.for_model(model)
    if isinstance(counter, ApproximateCounter):
        # Counted as the driver replays reasoning, like the built-in.
        if counter.projection is None and driver is not None:
            counter = counter.with_projection(driver.replay_projection(model))
        return counter
    if isinstance(counter, ModelTokenCounter):
        return counter.for_model(model)
    return counter


def resolve_exact_token_counter(
    request_tier: ExactCounter | None,
    client_tier: ExactCounter | None,
    driver: object | None,
    model: Model,
) -> ExactCounter | None:
    """The exact counter a request for ``model`` may ask near its budget, or ``None``.

    First match wins: ``request_tier``, ``client_tier``, then
    ``driver.exact_token_counter(model)`` when the driver has that method.
    A counter with a ``for_model`` method is bound to ``model`` with it.
    """
    counter = request_tier if request_tier is not None else client_tier
    if counter is None:
        from_driver = getattr(driver, "exact_token_counter", None)
        if callable(from_driver):
            found: ExactCounter | None = from_driver(model)
            return found
        return None
    bind = getattr(counter, "for_model", None)
    if callable(bind):
        bound: ExactCounter = bind(model)
        return bound
    return counter
