"""Which counter a request uses: the resolution chain and the process-wide default.

First match wins:

1. the request's counter (``Request.with_token_counter``);
2. the client's (``Client(token_counter=...)``);
3. the driver's (``driver.token_counter()``, when it returns one);
4. the process default (``set_default_token_counter``);
5. the built-in ``BuiltinTokenCounter``.

The winner is then fitted to the request when it is a ``ModelTokenCounter``
(the built-in and approximate counters are): ``for_projection`` with the
driver's replay projection for the model (a counter given a projection of
its own keeps it), then ``for_model``.

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
from typing import Protocol

from threadline._models import Model
from threadline.counting._builtin import BuiltinTokenCounter
from threadline.counting._protocol import (
    BindableCounter,
    ExactCounter,
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


class _CountingDriver(Protocol):
    """What counting asks of a driver: three methods of ``threadline.drivers.Driver``.

    Named here rather than imported: the driver contract sits above counting.
    """

    def token_counter(self) -> TokenCounter | None: ...

    def replay_projection(self, model: Model) -> ReplayProjection: ...

    def exact_token_counter(self, model: Model) -> ExactCounter | None: ...


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
    and the client (``None`` when unset); ``driver`` is asked for its counter.
    A winner that is a ``ModelTokenCounter`` is fitted to the request:
    ``winner.for_projection(driver.replay_projection(model)).for_model(model)``
    (without a driver, only ``for_model``). Any other winner is used as it is.
    """
    counter = request_tier
    if counter is None:
        counter = client_tier
    if counter is None and driver is not None:
        counter = driver.token_counter()
    if counter is None:
        counter = default_token_counter()
    if not isinstance(counter, ModelTokenCounter):
        return counter
    if driver is not None:
        counter = counter.for_projection(driver.replay_projection(model))
    return counter.for_model(model)


def resolve_exact_token_counter(
    request_tier: ExactCounter | None,
    client_tier: ExactCounter | None,
    driver: _CountingDriver | None,
    model: Model,
) -> ExactCounter | None:
    """The exact counter a request for ``model`` may ask near its budget, or ``None``.

    First match wins: ``request_tier``, ``client_tier``, then
    ``driver.exact_token_counter(model)``. A counter set on the request or the
    client that is a ``BindableCounter`` is bound to ``model`` with ``for_model``.
    """
    counter = request_tier if request_tier is not None else client_tier
    if counter is None:
        return None if driver is None else driver.exact_token_counter(model)
    if isinstance(counter, BindableCounter):
        return counter.for_model(model)
    return counter
