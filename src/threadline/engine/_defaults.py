"""``ClientDefaults``: what a request reads from its client, as one frozen value.

A request needs its client's driver, the client tiers of the counting chain
(the estimate and the exact counter), its calibration and its default model;
never the ``Client`` itself. Handing it this value keeps the engine a line
(client, request, plan, run) rather than a circle, and lets planning,
``Agent`` and ``Conversation`` resolve counters from the same facts.
"""

from __future__ import annotations

import attrs

from threadline._models import Model
from threadline._provider import Driver
from threadline.counting._calibration import TokenCalibration
from threadline.counting._protocol import TokenCounter
from threadline.counting._resolution import ExactCounter

__all__ = ["ClientDefaults"]


@attrs.frozen(kw_only=True)
class ClientDefaults:
    """A client's driver and the defaults every one of its requests starts from.

    ``Client`` checks the values before it makes one; this value trusts them.
    """

    driver: Driver
    token_counter: TokenCounter | None = None
    """The client tier of the counting chain (request, client, driver, default, built-in)."""
    exact_token_counter: ExactCounter | None = None
    """The client tier of the exact counter limiting asks near the budget."""
    calibration: TokenCalibration | None = None
    """Learns how far the estimate is from the provider's reported tokens, per model."""
    default_model: Model | None = None
    """The model of a request that does not call ``with_model``."""
