"""threadline: async LLM agent conversations that never overflow the context window.

The names users build, call or catch live here; everything else lives in a
documented subpackage: :mod:`threadline.limiting` (budgets, units, handlers,
the ledger), :mod:`threadline.counting`, :mod:`threadline.tools`,
:mod:`threadline.drivers`, :mod:`threadline.stores`,
:mod:`threadline.serialization` and :mod:`threadline.testing`. See README.md
and docs/ for the guide.
"""

from threadline._errors import (
    AuthenticationError,
    BadRequestError,
    ConcurrentModificationError,
    ContextLengthExceededError,
    ConversationFormatError,
    ConversationNotFoundError,
    HandlerError,
    InvalidRequestError,
    MaxRoundsExceededError,
    ProviderError,
    ProviderResponseError,
    ProviderUnavailableError,
    RateLimitError,
    StoreError,
    ThreadlineError,
)
from threadline._events import (
    FinalResult,
    LimitApplied,
    ReasoningDelta,
    RoundDone,
    StreamEvent,
    TextDelta,
    ToolCallEvent,
    ToolResultEvent,
)
from threadline._messages import (
    ImagePart,
    Message,
    Origin,
    Reasoning,
    Role,
    TextPart,
    ToolCall,
    Usage,
)
from threadline._models import Model
from threadline._public import publish
from threadline._result import RunResult
from threadline._sentinel import NOT_GIVEN
from threadline._settings import RequestSettings
from threadline.conversation._conversation import Conversation
from threadline.conversation._transcript import Turn
from threadline.engine._agent import Agent
from threadline.engine._client import Client
from threadline.engine._request import Request
from threadline.limiting import Budget
from threadline.tools import Tool, ToolResult, tool

__all__ = [
    "NOT_GIVEN",
    "Agent",
    "AuthenticationError",
    "BadRequestError",
    "Budget",
    "Client",
    "ConcurrentModificationError",
    "ContextLengthExceededError",
    "Conversation",
    "ConversationFormatError",
    "ConversationNotFoundError",
    "FinalResult",
    "HandlerError",
    "ImagePart",
    "InvalidRequestError",
    "LimitApplied",
    "MaxRoundsExceededError",
    "Message",
    "Model",
    "Origin",
    "ProviderError",
    "ProviderResponseError",
    "ProviderUnavailableError",
    "RateLimitError",
    "Reasoning",
    "ReasoningDelta",
    "Request",
    "RequestSettings",
    "Role",
    "RoundDone",
    "RunResult",
    "StoreError",
    "StreamEvent",
    "TextDelta",
    "TextPart",
    "ThreadlineError",
    "Tool",
    "ToolCall",
    "ToolCallEvent",
    "ToolResult",
    "ToolResultEvent",
    "Turn",
    "Usage",
    "__version__",
    "tool",
]

publish(globals(), [name for name in __all__ if name != "__version__"], __name__)
del publish


def __getattr__(name: str) -> str:
    # The version is read from the package metadata on first use:
    # importlib.metadata costs more at import than the rest of threadline.
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version("threadline")
        except PackageNotFoundError:  # pragma: no cover - a bare source tree
            return "0+unknown"
    raise AttributeError(f"module 'threadline' has no attribute {name!r}")
