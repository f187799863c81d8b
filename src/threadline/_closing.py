"""``async with`` for everything that holds a resource and has ``aclose()``.

Clients, drivers and stores all open a connection pool, a file or a model
and release it in ``aclose()``; this mixin gives each the same context
manager instead of a copy per class.
"""

from __future__ import annotations

from types import TracebackType
from typing import Self

__all__ = ["AsyncClosing"]


class AsyncClosing:
    """``async with thing:`` returns the thing and awaits ``thing.aclose()`` on exit."""

    __slots__ = ()

    async def aclose(self) -> None:
        """Release what the object holds; calling it twice is harmless."""

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()
