"""threadline: async LLM agent conversations that never overflow the context window.

The names users build, call or catch live here; everything else lives in a
documented subpackage: :mod:`threadline.limiting` (budgets, units, handlers,
the ledger), :mod:`threadline.counting`, :mod:`threadline.tools`,
:mod:`threadline.drivers`, :mod:`threadline.stores`,
:mod:`threadline.serialization` and :mod:`threadline.testing`. See README.md
and docs/ for the guide.

Each name here is imported on first use (PEP 562), so ``import threadline``
alone loads none of the modules behind them.
"""

import typing

from threadline._public import lazy_members

if typing.TYPE_CHECKING:
    __version__: str
    from threadline._errors import AuthenticationError as AuthenticationError
    from threadline._errors import BadRequestError as BadRequestError
    from threadline._errors import ConcurrentModificationError as ConcurrentModificationError
    from threadline._errors import ContextLengthExceededError as ContextLengthExceededError
    from threadline._errors import ConversationFormatError as ConversationFormatError
    from threadline._errors import ConversationNotFoundError as ConversationNotFoundError
    from threadline._errors import HandlerError as HandlerError
    from threadline._errors import InvalidRequestError as InvalidRequestError
    from threadline._errors import MaxRoundsExceededError as MaxRoundsExceededError
    from threadline._errors import ProviderError as ProviderError
    from threadline._errors import ProviderResponseError as ProviderResponseError
    from threadline._errors import ProviderUnavailableError as ProviderUnavailableError
    from threadline._errors import RateLimitError as RateLimitError
    from threadline._errors import StoreError as StoreError
    from threadline._errors import ThreadlineError as ThreadlineError
    from threadline._events import FinalResult as FinalResult
    from threadline._events import LimitApplied as LimitApplied
    from threadline._events import ReasoningDelta as ReasoningDelta
    from threadline._events import RoundDone as RoundDone
    from threadline._events import StreamEvent as StreamEvent
    from threadline._events import TextDelta as TextDelta
    from threadline._events import ToolCallEvent as ToolCallEvent
    from threadline._events import ToolResultEvent as ToolResultEvent
    from threadline._messages import ImagePart as ImagePart
    from threadline._messages import Message as Message
    from threadline._messages import Origin as Origin
    from threadline._messages import Reasoning as Reasoning
    from threadline._messages import Role as Role
    from threadline._messages import TextPart as TextPart
    from threadline._messages import ToolCall as ToolCall
    from threadline._messages import Usage as Usage
    from threadline._models import Model as Model
    from threadline._result import RunResult as RunResult
    from threadline._sentinel import NOT_GIVEN as NOT_GIVEN
    from threadline._settings import RequestSettings as RequestSettings
    from threadline.conversation._conversation import Conversation as Conversation
    from threadline.conversation._transcript import Turn as Turn
    from threadline.engine._agent import Agent as Agent
    from threadline.engine._client import Client as Client
    from threadline.engine._request import Request as Request
    from threadline.limiting import Budget as Budget
    from threadline.tools import Tool as Tool
    from threadline.tools import ToolResult as ToolResult
    from threadline.tools import tool as tool

# name -> the module that defines it, imported on first access: ``import
# threadline`` alone loads none of them (attrs classes cost their build time
# at import), and ``from threadline import Agent`` loads what Agent needs.
_LAZY = {
    "Agent": "threadline.engine._agent",
    "AuthenticationError": "threadline._errors",
    "BadRequestError": "threadline._errors",
    "Budget": "threadline.limiting",
    "Client": "threadline.engine._client",
    "ConcurrentModificationError": "threadline._errors",
    "ContextLengthExceededError": "threadline._errors",
    "Conversation": "threadline.conversation._conversation",
    "ConversationFormatError": "threadline._errors",
    "ConversationNotFoundError": "threadline._errors",
    "FinalResult": "threadline._events",
    "HandlerError": "threadline._errors",
    "ImagePart": "threadline._messages",
    "InvalidRequestError": "threadline._errors",
    "LimitApplied": "threadline._events",
    "MaxRoundsExceededError": "threadline._errors",
    "Message": "threadline._messages",
    "Model": "threadline._models",
    "NOT_GIVEN": "threadline._sentinel",
    "Origin": "threadline._messages",
    "ProviderError": "threadline._errors",
    "ProviderResponseError": "threadline._errors",
    "ProviderUnavailableError": "threadline._errors",
    "RateLimitError": "threadline._errors",
    "Reasoning": "threadline._messages",
    "ReasoningDelta": "threadline._events",
    "Request": "threadline.engine._request",
    "RequestSettings": "threadline._settings",
    "Role": "threadline._messages",
    "RoundDone": "threadline._events",
    "RunResult": "threadline._result",
    "StoreError": "threadline._errors",
    "StreamEvent": "threadline._events",
    "TextDelta": "threadline._events",
    "TextPart": "threadline._messages",
    "ThreadlineError": "threadline._errors",
    "Tool": "threadline.tools",
    "ToolCall": "threadline._messages",
    "ToolCallEvent": "threadline._events",
    "ToolResult": "threadline.tools",
    "ToolResultEvent": "threadline._events",
    "Turn": "threadline.conversation._transcript",
    "Usage": "threadline._messages",
    "tool": "threadline.tools",
}

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

_member, __dir__ = lazy_members(globals(), _LAZY, [n for n in __all__ if n != "__version__"])
del lazy_members


# Hidden from type checkers, so a misspelt ``threadline.Nmae`` is still an
# error there: every real name is declared above.
if not typing.TYPE_CHECKING:

    def __getattr__(name: str) -> typing.Any:
        # The version is read from the package metadata on first use:
        # importlib.metadata costs more at import than the rest of threadline.
        if name == "__version__":
            from importlib.metadata import PackageNotFoundError, version

            try:
                return version("threadline")
            except PackageNotFoundError:  # pragma: no cover - a bare source tree
                return "0+unknown"
        return _member(name)
