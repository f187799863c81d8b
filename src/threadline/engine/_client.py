"""``Client``: a driver plus the client-tier defaults every request starts from.

The client holds them as one frozen :class:`ClientDefaults`, which is what its
requests receive: a request never sees the ``Client``.
"""

from __future__ import annotations

from threadline._closing import AsyncClosing
from threadline._models import Model
from threadline._provider import Driver
from threadline._settings import exact_counter_or_none, token_counter_or_none
from threadline._validate import fail
from threadline.counting._calibration import TokenCalibration
from threadline.counting._protocol import TokenCounter
from threadline.counting._resolution import ExactCounter
from threadline.engine._defaults import ClientDefaults
from threadline.engine._request import Request

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
        token_counter = token_counter_or_none("token_counter", token_counter)
        exact_token_counter = exact_counter_or_none("exact_token_counter", exact_token_counter)
        if calibration is not None and not isinstance(calibration, TokenCalibration):
            fail("calibration", "a TokenCalibration or None", calibration)
        self._defaults = ClientDefaults(
            driver=driver,
            token_counter=token_counter,
            exact_token_counter=exact_token_counter,
            calibration=calibration,
            default_model=Model(default_model) if isinstance(default_model, str) else default_model,
        )

    @property
    def defaults(self) -> ClientDefaults:
        """The driver and the defaults above, as the one frozen value each request reads."""
        return self._defaults

    @property
    def driver(self) -> Driver:
        """The driver every request is sent through."""
        return self._defaults.driver

    @property
    def token_counter(self) -> TokenCounter | None:
        """The client tier of the counting chain, when set."""
        return self._defaults.token_counter

    @property
    def exact_token_counter(self) -> ExactCounter | None:
        """The client tier of the exact counter, when set."""
        return self._defaults.exact_token_counter

    @property
    def calibration(self) -> TokenCalibration | None:
        """The calibration requests learn from and scale by, when set."""
        return self._defaults.calibration

    @property
    def default_model(self) -> Model | None:
        """The model of requests that do not call ``with_model``."""
        return self._defaults.default_model

    def request(self) -> Request:
        """A new request builder on this client."""
        return Request(self._defaults)

    async def aclose(self) -> None:
        """Close the driver's connections, if it holds any."""
        await self.driver.aclose()

    def __repr__(self) -> str:
        model = self.default_model.name if self.default_model else None
        return f"Client(driver={self.driver!r}, default_model={model!r})"
