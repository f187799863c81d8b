"""What a limiting handler declares about itself: :class:`HandlerTraits`.

The engine and a :class:`~threadline.Conversation` take a few short cuts
that hold only for handlers that behave a certain way: the engine makes a
sliding-window cut itself, from the prices it holds, instead of calling the
handler; a conversation keeps its window's start between cuts. A handler
says it behaves that way by declaring traits, with :func:`with_traits`, and
everything that relies on them reads them through :func:`traits_of`. The
built-in handlers declare theirs the same way, so nothing recognises a
handler by what it is, and a handler of your own gets the same treatment
when it declares the same traits.

The traits travel on the handler as one attribute. Reading that attribute
through :func:`traits_of` is how a declared capability is read, not a probe:
nothing else looks at a handler's attributes, and a handler that declares
nothing has no traits (:data:`NO_TRAITS`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import attrs

from threadline._errors import InvalidRequestError
from threadline._validate import attrs_check, fail

__all__ = ["NO_TRAITS", "TRAITS_ATTRIBUTE", "HandlerTraits", "traits_of", "with_traits"]

TRAITS_ATTRIBUTE = "__threadline_traits__"
"""Where a handler (or its class, for every instance) carries its declared traits."""

_Handler = TypeVar("_Handler", bound=Callable[..., object])


def _flag(name: str, value: object) -> None:
    if not isinstance(value, bool):
        fail(name, "True or False", value)


@attrs.frozen(kw_only=True)
class HandlerTraits:
    """What a limiting handler promises about its cuts.

    ``slides_one_unit``: the handler cuts exactly as ``drop_oldest_units(None)``
    does: priced with the event's counter, it drops droppable units, oldest
    first, until the transcript fits, then up to the first user message, and
    nothing else. What it keeps is then the newest stretch that fits, wherever
    the transcript starts, so the engine may make that cut itself, from the
    prices it holds, without calling the handler (its name still goes in the
    ledger), and a conversation may send only what the last cut left. Declare
    it only for a handler that gives that very cut, such as one that hands the
    event to ``drop_oldest_units(None)``: code of its own may not run.

    ``keeps_stable_prefix``: the handler cuts in blocks, so the turns after a
    cut keep the prompt's prefix (as ``cache_stable_units`` does). A
    conversation whose Pre or Post handler declares it keeps its window's
    start where the last cut left it, and saves it (see docs/limiting.md).

    ``runs_every_round``: as Pre, the handler is called on every round with a
    budget, over it or not (a transcript that fits is still handed over), because
    it repeats on each round what it did on the ones before, so the prompt's
    prefix holds (as ``clear_tool_results`` re-clears the results it cleared).
    Such a handler must leave a transcript that fits as it found it unless it
    is repeating itself.
    """

    slides_one_unit: bool = attrs.field(default=False, validator=attrs_check(_flag))
    keeps_stable_prefix: bool = attrs.field(default=False, validator=attrs_check(_flag))
    runs_every_round: bool = attrs.field(default=False, validator=attrs_check(_flag))


NO_TRAITS = HandlerTraits()
"""The traits of a handler that declares none: no promise, so no short cut."""


def traits_of(handler: object) -> HandlerTraits:
    """The traits ``handler`` declares (see :func:`with_traits`); :data:`NO_TRAITS` when
    it declares none, or is ``None``."""
    traits = getattr(handler, TRAITS_ATTRIBUTE, NO_TRAITS)
    return traits if isinstance(traits, HandlerTraits) else NO_TRAITS


def with_traits(handler: _Handler, traits: HandlerTraits) -> _Handler:
    """Declare ``traits`` on ``handler``, and return it (the same object).

    ``handler`` is a function or a callable object that takes attributes; a
    handler class can declare traits for all its instances with a class
    attribute named ``__threadline_traits__`` instead.

    Example::

        async def halve(event: TokenLimitEvent) -> None:
            # One block cut: the oldest half of what may go, in one step.
            droppable = event.units(pinned=False)
            event.drop_units(droppable[: len(droppable) // 2 + 1], reason="block cut")

        pre = with_traits(halve, HandlerTraits(keeps_stable_prefix=True))
        conv = Conversation(agent, pre_max_tokens_reached=pre)

    Raises:
        InvalidRequestError: ``traits`` is not a ``HandlerTraits``, or
            ``handler`` cannot take an attribute (wrap it in a function).
    """
    if not isinstance(traits, HandlerTraits):
        fail("traits", "a HandlerTraits", traits)
    try:
        setattr(handler, TRAITS_ATTRIBUTE, traits)
    except (AttributeError, TypeError):
        raise InvalidRequestError(
            f"a {type(handler).__name__} cannot carry traits; wrap the handler in a "
            "function and declare them on that"
        ) from None
    return handler
