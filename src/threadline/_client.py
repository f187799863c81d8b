"""``Client``: a driver plus the client-tier defaults every request starts from."""

from __future__ import annotations

from threadline._closing import AsyncClosing
from threadline._models import Model
from threadline._provider import Driver
from threadline._request import Request
from threadline._settings import token_counter_or_none
from threadline.counting._protocol import TokenCounter

__all__ = ["Client"]


class Client(AsyncClosing):
    """A driver and the defaults its requests share.

    ``token_counter`` is the client tier of the counting chain (request →
    client → driver → process default → built-in). ``default_model`` is used
    by requests that do not call ``with_model``; give it a ``context_size``
    so requests get a budget.

    Example::

        model = Model("gpt-4o-mini", context_size=128_000)
        client = Client(OpenAIChatDriver(), default_model=model)
        result = await client.request().with_prompt("Hello").run()

    Raises:
        InvalidRequestError: a ``token_counter`` that is not a counter.
    """

    def __init__(
        self,
        driver: Driver,
        *,
        token_counter: TokenCounter | None = None,
        default_model: Model | str | None = None,
    ) -> None:
        self.driver = driver
        self.token_counter = token_counter_or_none("token_counter", token_counter)
        self.default_model = (
            Model(default_model) if isinstance(default_model, str) else default_model
        )

    def request(self) -> Request:
        """A new request builder on this client."""
        return Request(self)

    async def aclose(self) -> None:
        """Close the driver's connections, if it holds any."""
        close = getattr(self.driver, "aclose", None)
        if close is not None:
            await close()

    def __repr__(self) -> str:
        model = self.default_model.name if self.default_model else None
        return f"Client(driver={self.driver!r}, default_model={model!r})"
