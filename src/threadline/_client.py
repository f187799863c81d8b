"""``Client``: a driver plus the client-tier defaults every request starts from."""

from __future__ import annotations

from types import TracebackType
from typing import TYPE_CHECKING, Self

from threadline._errors import InvalidRequestError
from threadline._models import Model
from threadline._provider import Driver
from threadline.counting._protocol import TokenCounter, is_token_counter

if TYPE_CHECKING:
    from threadline._request import Request

__all__ = ["Client"]


class Client:
    """A driver and the defaults its requests share.

    ``token_counter`` is the client tier of the counting chain (request →
    client → driver → process default → built-in). ``default_model`` is used
    by requests that do not call ``with_model``; give it a ``context_size``
    so requests get a budget.

    Example::

        model = Model("gpt-4o-mini", context_size=128_000)
        client = Client(OpenAIChatDriver(), default_model=model)
        result = await client.request().with_prompt("Hello").run()
    """

    def __init__(
        self,
        driver: Driver,
        *,
        token_counter: TokenCounter | None = None,
        default_model: Model | str | None = None,
    ) -> None:
        if token_counter is not None and not is_token_counter(token_counter):
            raise InvalidRequestError(
                f"token_counter must have a count(messages, tools) method, "
                f"not {type(token_counter).__name__}"
            )
        self.driver = driver
        self.token_counter = token_counter
        self.default_model = (
            Model(default_model) if isinstance(default_model, str) else default_model
        )

    def request(self) -> Request:
        """A new request builder on this client."""
        from threadline._request import Request

        return Request(self)

    async def aclose(self) -> None:
        """Close the driver's connections, if it holds any."""
        close = getattr(self.driver, "aclose", None)
        if close is not None:
            await close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    def __repr__(self) -> str:
        model = self.default_model.name if self.default_model else None
        return f"Client(driver={self.driver!r}, default_model={model!r})"
