"""``CallDeadline``: the time limits of one provider call, whatever the driver.

httpx's timeouts bound each read, so a server that keeps a connection alive
with SSE comments never trips them. A ``CallDeadline`` bounds the call as a
whole (``timeout``: the request, the driver's retries, the reply) and a
stream's wait for the first piece of its reply (``first_token_timeout``), and
turns either into :class:`RequestTimeoutError`.

The run loop enters :meth:`CallDeadline.bound` around one call and, while a
streamed event is with the caller, :meth:`CallDeadline.handed_over`: the
limit is lifted there, so it never cancels the caller's own code, and a
limit that passed meanwhile fires at the next wait on the provider.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import AbstractAsyncContextManager, contextmanager
from types import TracebackType

import anyio
import anyio.lowlevel

from threadline._errors import RequestTimeoutError

__all__ = ["CallDeadline"]


class CallDeadline:
    """The time limits of one provider call (``None``: no such limit).

    A call without limits (the default) costs nothing: no cancel scope is
    entered, and handing an event over touches nothing. It runs once per
    streamed token.
    """

    def __init__(
        self,
        *,
        timeout: float | None,
        first_token_timeout: float | None,
        provider: str | None,
    ) -> None:
        self._timeout = timeout
        self._first_token_timeout = first_token_timeout
        self._provider = provider
        self._limited = timeout is not None or first_token_timeout is not None
        self._whole_until = math.inf
        self._first_until = math.inf
        self._first_seen = False
        self._first_in_force = False
        """Whether the deadline last set on the scope was the first-token one."""
        self._scope: anyio.CancelScope | None = None
        self._handing_over = _HandingOver(self)

    @contextmanager
    def bound(self) -> Iterator[None]:
        """Run the call's body under its limits.

        Raises:
            RequestTimeoutError: a limit passed before the body was done.
        """
        if not self._limited:
            yield
            return
        now = anyio.current_time()
        if self._timeout is not None:
            self._whole_until = now + self._timeout
        if self._first_token_timeout is not None:
            self._first_until = now + self._first_token_timeout
        with anyio.CancelScope() as scope:
            self._scope = scope
            self._arm()
            yield
        if scope.cancelled_caught:
            raise self._error()

    @property
    def limited(self) -> bool:
        """Whether the call has a limit at all (``timeout`` or ``first_token_timeout``)."""
        return self._limited

    def first_token(self) -> None:
        """The reply has begun: from now on only the whole call's limit holds."""
        self._first_seen = True

    def handed_over(self) -> AbstractAsyncContextManager[None]:
        """Lift the limits while an event is with the caller (inside :meth:`bound`)."""
        return self._handing_over

    async def _lift(self) -> None:
        scope = self._scope
        assert scope is not None, "handed_over() is used inside bound()"
        if scope.cancel_called:
            # A limit passed during the last wait, which still returned: let the
            # cancellation land here, inside the call, not in the caller's code.
            await anyio.lowlevel.checkpoint()
        scope.deadline = math.inf

    def _arm(self) -> None:
        assert self._scope is not None
        self._first_in_force = not self._first_seen and self._first_until < self._whole_until
        self._scope.deadline = self._first_until if self._first_in_force else self._whole_until

    def _error(self) -> RequestTimeoutError:
        if self._first_in_force:
            assert self._first_token_timeout is not None
            return RequestTimeoutError(
                limit="first_token_timeout",
                seconds=self._first_token_timeout,
                provider=self._provider,
            )
        assert self._timeout is not None
        return RequestTimeoutError(limit="timeout", seconds=self._timeout, provider=self._provider)


class _HandingOver(AbstractAsyncContextManager[None]):
    """What :meth:`CallDeadline.handed_over` returns: a class, not a generator,
    as it is entered once per streamed event."""

    __slots__ = ("_deadline",)

    def __init__(self, deadline: CallDeadline) -> None:
        self._deadline = deadline

    async def __aenter__(self) -> None:
        if self._deadline._limited:
            await self._deadline._lift()

    async def __aexit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        # Re-armed only when the caller asks for more: a caller who left (or
        # failed) is past the call, whose scope is being left too.
        if kind is None and self._deadline._limited:
            self._deadline._arm()
