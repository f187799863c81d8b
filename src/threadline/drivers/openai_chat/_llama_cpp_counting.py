"""``LlamaCppTokenCounter``: a llama.cpp server's own count of a prompt.

The upstream llama.cpp server (``llama-server``) offers, beside Chat
Completions, the two steps of its own prompt building: ``POST /apply-template``
renders a Chat Completions body with the model's chat template (tools
included, as the template shows them) and ``POST /tokenize`` tokenizes text
with the model's tokenizer. The counter sends the very body a completion
would carry through the first and the rendered prompt through the second,
tokenized as the server tokenizes a prompt (special tokens added and parsed),
so its count is the ``prompt_tokens`` the server reports for that call.

Two round trips per count: limiting asks it only near the budget. Both
endpoints sit at the server's root, beside ``/v1``. llama-cpp-python's
server has neither; this counter is for the upstream one.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import httpx

from threadline._errors import ProviderError
from threadline._provider import ProviderCall
from threadline.drivers._http._errors import ErrorMapper, snippet

if TYPE_CHECKING:
    from threadline._messages import Message
    from threadline._models import Model
    from threadline.tools._tools import Tool

__all__ = ["MISSING_ENDPOINT_STATUSES", "LlamaCppTokenCounter", "server_root"]

MISSING_ENDPOINT_STATUSES = frozenset({404, 405, 501})
"""What a server without ``/apply-template`` or ``/tokenize`` answers them: it cannot
count, so asking again is a wasted round trip (and a warning) every round."""

Post = Callable[[str, bytes], Awaitable[httpx.Response]]
"""Sends a JSON body to a path at the server's root (with the driver's headers and retries)."""


def server_root(base_url: str) -> str:
    """Where llama-server's own endpoints are: ``base_url`` without a trailing ``/v1``."""
    root = base_url.rstrip("/")
    return root.removesuffix("/v1")


class LlamaCppTokenCounter:
    """The prompt tokens a llama.cpp server counts for a call: ``/apply-template``, then
    ``/tokenize``. An :class:`~threadline.counting.AsyncTokenCounter`.

    Made by ``OpenAIChatDriver(..., exact_counting="llama.cpp")``:
    ``driver.exact_token_counter(model)`` returns one, and limiting asks it
    near the budget.

    Raises:
        ProviderError: from ``count``, the server's refusal or a failure to reach
            it (after the driver's retries), or an answer without a prompt or tokens.
    """

    __slots__ = ("_encode", "_errors", "_model", "_on_missing", "_post")

    def __init__(
        self,
        post: Post,
        encode: Callable[[ProviderCall], bytes],
        errors: ErrorMapper,
        model: Model,
        on_missing: Callable[[], None] | None = None,
    ) -> None:
        self._post = post
        self._encode = encode
        self._errors = errors
        self._model = model
        self._on_missing = on_missing

    async def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        """The server's count of ``messages`` sent with ``tools``."""
        call = ProviderCall(model=self._model, messages=tuple(messages), tools=tuple(tools))
        rendered = await self._answer("/apply-template", self._encode(call))
        prompt = rendered.get("prompt")
        if not isinstance(prompt, str):
            raise self._errors.malformed(
                f"/apply-template answered without a prompt: {snippet(repr(rendered))}"
            )
        body = {"content": prompt, "add_special": True, "parse_special": True}
        tokenized = await self._answer("/tokenize", json.dumps(body).encode())
        tokens = tokenized.get("tokens")
        if not isinstance(tokens, list):
            raise self._errors.malformed(
                f"/tokenize answered without tokens: {snippet(repr(tokenized))}"
            )
        return len(tokens)

    async def _answer(self, path: str, content: bytes) -> dict[str, object]:
        try:
            response = await self._post(path, content)
        except ProviderError as error:
            if error.status in MISSING_ENDPOINT_STATUSES and self._on_missing is not None:
                self._on_missing()  # the driver stops offering this counter
            raise
        try:
            payload = json.loads(response.content)
        except ValueError:
            payload = None
        if not isinstance(payload, dict):
            text = response.content.decode("utf-8", errors="replace")
            raise self._errors.malformed(f"{path} did not answer a JSON object: {snippet(text)!r}")
        return payload

    def __repr__(self) -> str:
        return f"LlamaCppTokenCounter(model={self._model.name!r})"
