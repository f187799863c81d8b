"""The Pre handlers used when a request's or a conversation's settings name none.

A request slides: :data:`DEFAULT_REQUEST_HANDLER` is ``drop_oldest_units(None)``,
which drops just enough, oldest first. A conversation cuts in blocks:
:data:`DEFAULT_CONVERSATION_HANDLER` is ``cache_stable_units()``, so the turns
after a cut keep the prompt's prefix and the provider's cache (docs/limiting.md
has the measurements behind the choice). Neither keeps any state, so one of
each serves every request and every conversation.
"""

from __future__ import annotations

from threadline.limiting._cache_stable import cache_stable_units
from threadline.limiting._drop_oldest import drop_oldest_units
from threadline.limiting._event import TokenLimitHandler

__all__ = ["DEFAULT_CONVERSATION_HANDLER", "DEFAULT_REQUEST_HANDLER"]

DEFAULT_REQUEST_HANDLER: TokenLimitHandler = drop_oldest_units(None)
"""A request's Pre handler when its settings name none."""

DEFAULT_CONVERSATION_HANDLER: TokenLimitHandler = cache_stable_units()
"""A conversation turn's Pre handler when the conversation's settings name none."""
