"""Drivers: one folder per wire protocol, translating threadline's messages at the edge.

``OpenAIChatDriver`` speaks OpenAI Chat Completions (and every
OpenAI-compatible server); ``AnthropicDriver`` the Anthropic Messages API
(thinking replayed exactly); ``GeminiDriver`` the Gemini Developer API
(thought signatures kept on their part); ``LocalDriver`` runs a GGUF model in process and
needs the ``threadline[local]`` extra. Every HTTP driver connects through an
``HTTPConnection`` (base URL, key, client, time-out, retries, headers), which
drivers may share. The driver contract (``Driver``,
``ProviderCall``, ``ProviderResponse``, the stream chunks, and the
``ReplayRules`` a driver declares for the reasoning it sends back) lives in the
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
    HistorySpan,
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
from threadline._replay import ReplayRules, ReplayScope

if TYPE_CHECKING:
    # For type checkers only (a name left out here is still found, typed Any).
    from threadline.drivers._http import HTTPConnection as HTTPConnection
    from threadline.drivers._http import RetryPolicy as RetryPolicy
    from threadline.drivers.anthropic import AnthropicDriver as AnthropicDriver
    from threadline.drivers.gemini import GeminiDriver as GeminiDriver
    from threadline.drivers.local import LocalDriver as LocalDriver
    from threadline.drivers.openai_chat import OpenAIChatDriver as OpenAIChatDriver
    from threadline.drivers.openai_responses import OpenAIResponsesDriver as OpenAIResponsesDriver

# name -> the module that defines it, imported on first access. A new driver
# is its own folder plus one line here: __all__ below is made from this table.
_LAZY = {
    "AnthropicDriver": "threadline.drivers.anthropic",
    "GeminiDriver": "threadline.drivers.gemini",
    "HTTPConnection": "threadline.drivers._http",
    "LocalDriver": "threadline.drivers.local",
    "OpenAIChatDriver": "threadline.drivers.openai_chat",
    "OpenAIResponsesDriver": "threadline.drivers.openai_responses",
    "RetryPolicy": "threadline.drivers._http",
}

__all__ = [
    "Driver",
    "HistorySpan",
    "ProviderCall",
    "ProviderResponse",
    "ReasoningChunk",
    "ReplayRules",
    "ReplayScope",
    "RequestTimeoutError",
    "ResponseDone",
    "SamplingSettings",
    "StreamChunk",
    "TextChunk",
    "ToolCallChunk",
    *_LAZY,
]

__getattr__, __dir__ = lazy_members(globals(), _LAZY, __all__)
