"""The threadline side of ``bench_request.py``'s clients, one copy for every protocol.

Each protocol's clients class (``Clients``, ``AnthropicClients``,
``ResponsesClients``, ``GeminiClients``) builds its threadline ``Client``s in
``_open`` and inherits how they are timed from :class:`ThreadlineCalls`, so
every driver is timed the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from threadline import Client, FinalResult, Message, Request, TextDelta


class ThreadlineCalls:
    """Timed calls through threadline; the subclass's ``_open`` sets the clients."""

    threadline: Client
    threadline_httpx: Client  # the same driver on a plain httpx pool
    threadline_cold: Client  # a driver of its own, for first requests
    threadline_stream: Client
    cold_driver: Any  # its JSON cache is replaced before each first request
    max_output_tokens: int | None = None  # what the protocol requires, if it does
    new_message_cache: Callable[[], object]  # the driver's own JSON cache, empty

    def _asked(self, client: Client, prompt: str, history: Sequence[Message] = ()) -> Request:
        request = client.request().with_messages(history).with_prompt(prompt)
        if self.max_output_tokens is None:
            return request
        return request.with_max_output_tokens(self.max_output_tokens)

    async def threadline_complete(
        self, history: list[Message], prompt: str, *, httpx_pool: bool = False, cold: bool = False
    ) -> str:
        client = self.threadline_httpx if httpx_pool else self.threadline
        client = self.threadline_cold if cold else client
        result = await self._asked(client, prompt, history).run()
        return result.text

    async def threadline_complete_uncached(self, history: list[Message], prompt: str) -> str:
        """A first request: ``history`` is new objects (never counted nor encoded), and
        the JSON cache is new."""
        self.cold_driver._message_json = type(self).new_message_cache()
        return await self.threadline_complete(history, prompt, cold=True)

    async def threadline_consume_stream(self, prompt: str) -> str:
        pieces = []
        async with self._asked(self.threadline_stream, prompt).stream() as events:
            async for event in events:
                if isinstance(event, TextDelta):
                    pieces.append(event.text)
                elif isinstance(event, FinalResult):
                    assert event.result.text == "".join(pieces)
        return "".join(pieces)
