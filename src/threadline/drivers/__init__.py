"""Drivers: one module per wire protocol, translating threadline's messages at the edge.

``OpenAIChatDriver`` speaks OpenAI Chat Completions (and every
OpenAI-compatible server); ``LocalDriver`` runs a GGUF model in process and
needs the ``threadline[local]`` extra, so it is imported only when asked for.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from threadline.drivers._http import RetryPolicy
from threadline.drivers.base import Driver, ProviderCall, ProviderResponse
from threadline.drivers.openai_chat import OpenAIChatDriver

if TYPE_CHECKING:
    from threadline.drivers.local import LocalDriver

__all__ = [
    "Driver",
    "LocalDriver",
    "OpenAIChatDriver",
    "ProviderCall",
    "ProviderResponse",
    "RetryPolicy",
]


def __getattr__(name: str) -> Any:
    if name == "LocalDriver":
        from threadline.drivers.local import LocalDriver

        return LocalDriver
    raise AttributeError(f"module 'threadline.drivers' has no attribute {name!r}")
