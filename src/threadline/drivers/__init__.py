"""Drivers: one module per wire protocol, translating threadline's messages at the edge.

``OpenAIChatDriver`` speaks OpenAI Chat Completions (and every
OpenAI-compatible server); ``AnthropicDriver`` the Anthropic Messages API
(thinking replayed exactly); ``LocalDriver`` runs a GGUF model in process and
needs the ``threadline[local]`` extra. The driver contract (``Driver``,
``ProviderCall``, ``ProviderResponse`` and the stream chunks) lives in the
core; the drivers themselves are imported only when first asked for, so
``import threadline`` loads none of them.

``RequestTimeoutError`` (a ``ProviderUnavailableError``) is what a call past
the request's ``timeout`` or ``first_token_timeout`` raises, whatever the
driver.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from threadline._errors import RequestTimeoutError
from threadline._provider import (
    Driver,
    ProviderCall,
    ProviderResponse,
    ReasoningChunk,
    ResponseDone,
    SamplingSettings,
    StreamChunk,
    TextChunk,
    ToolCallChunk,
)
from threadline._public import lazy_members

if TYPE_CHECKING:
    from threadline.drivers._http import RetryPolicy
    from threadline.drivers.anthropic import AnthropicDriver
    from threadline.drivers.local import LocalDriver
    from threadline.drivers.openai_chat import OpenAIChatDriver

__all__ = [
    "AnthropicDriver",
    "Driver",
    "LocalDriver",
    "OpenAIChatDriver",
    "ProviderCall",
    "ProviderResponse",
    "ReasoningChunk",
    "RequestTimeoutError",
    "ResponseDone",
    "RetryPolicy",
    "SamplingSettings",
    "StreamChunk",
    "TextChunk",
    "ToolCallChunk",
]

# name -> the module that defines it, imported on first access.
_LAZY = {
    "AnthropicDriver": "threadline.drivers.anthropic",
    "LocalDriver": "threadline.drivers.local",
    "OpenAIChatDriver": "threadline.drivers.openai_chat",
    "RetryPolicy": "threadline.drivers._http",
}

__getattr__, __dir__ = lazy_members(globals(), _LAZY, __all__)
