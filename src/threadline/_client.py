"""``Client``: a driver plus the client-tier defaults every request starts from."""

from __future__ import annotations

from threadline._closing import AsyncClosing
from threadline._models import Model
from threadline._provider import Driver
from threadline._request import Request
from threadline._settings import exact_counter_or_none, token_counter_or_none
from threadline._validate import fail
from threadline.counting._calibration import TokenCalibration
from threadline.counting._protocol import TokenCounter
from threadline.counting._resolution import ExactCounter

__all__ = ["Client"]


class Client(AsyncClosing):
    """A driver and the defaults its requests share.

    ``token_counter`` is the client tier of the counting chain (request →
    client → driver → process default → built-in). ``exact_token_counter``
    is the client tier of the exact counter limiting asks near the budget
    (request → client → driver). ``calibration`` opts in to calibration: a
    :class:`~threadline.counting.TokenCalibration` that learns, per model,
    how far the estimate is from the provider's reported input tokens and
    scales later estimates (see docs/counting.md). ``default_model`` is used
    by requests that do not call ``with_model``; give it a ``context_size``
    so requests get a budget.

    Example::

        model = Model("gpt-4o-mini", context_size=128_000)
        client = Client(OpenAIChatDriver(), default_model=model)
        result = await client.request().with_prompt("Hello").run()

    Raises:
        InvalidRequestError: a ``token_counter`` or ``exact_token_counter`` that
            is not a counter, a ``calibration`` that is not a ``TokenCalibration``.
    """

    def __init__(
        self,
        driver: Driver,
        *,
        token_counter: TokenCounter | None = None,
        exact_token_counter: ExactCounter | None = None,
        calibration: TokenCalibration | None = None,
        default_model: Model | str | None = None,
    ) -> None:
        self.driver = driver
        self.token_counter = token_counter_or_none("token_counter", token_counter)
        self.exact_token_counter = exact_counter_or_none("exact_token_counter", exact_token_counter)
        if calibration is not None and not isinstance(calibration, TokenCalibration):
            fail("calibration", "a TokenCalibration or None", calibration)
        self.calibration = calibration
        self.default_model = (
            Model(default_model) if isinstance(default_model, str) else default_model
        )

    def request(self) -> Request:
        """A new request builder on this client."""
        return Request(self)

    async def aclose(self) -> None:
        """Close the driver's connections, if it holds any."""
        await self.driver.aclose()

    def __repr__(self) -> str:
        model = self.default_model.name if self.default_model else None
        return f"Client(driver={self.driver!r}, default_model={model!r})"
