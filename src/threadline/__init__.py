"""threadline: async LLM agent conversations that never overflow the context window.

The public names live here; everything is defined in private modules.
See README.md and docs/ for the guide.
"""

from threadline._agent import Agent
from threadline._budget import Budget, BudgetReport, BudgetResolution
from threadline._client import Client
from threadline._conversation import Conversation
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
    ThreadlineError,
    TokenizerDataError,
    ToolArgumentsError,
    TranscriptIntegrityError,
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
from threadline._limiting import (
    DroppedUnit,
    HandlerRun,
    LimitingRecord,
    TokenLimitEvent,
    TokenLimitHandler,
    drop_oldest_units,
)
from threadline._messages import (
    ContentPart,
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
from threadline._request import Request
from threadline._result import RoundRecord, RunResult
from threadline._sentinel import NOT_GIVEN, NotGiven
from threadline._serialization import (
    FORMAT_VERSION,
    ConversationDocument,
    ConversationEvent,
    dumps_conversation,
    dumps_messages,
    loads_conversation,
    loads_messages,
)
from threadline._tools import Tool, ToolOutcome, ToolResult, Toolset, tool
from threadline._transcript import Turn
from threadline._units import PinReason, Unit, UnitKind, check_integrity, split_units
from threadline.counting import (
    ApproximateCounter,
    BuiltinTokenCounter,
    ModelTokenCounter,
    TokenCounter,
    default_token_counter,
    set_default_token_counter,
)
from threadline.drivers.base import Driver, ProviderCall, ProviderResponse

__all__ = [
    "Agent",
    "ApproximateCounter",
    "AuthenticationError",
    "BadRequestError",
    "Budget",
    "BudgetReport",
    "BudgetResolution",
    "BuiltinTokenCounter",
    "Client",
    "ConcurrentModificationError",
    "ContentPart",
    "ContextLengthExceededError",
    "Conversation",
    "ConversationDocument",
    "ConversationEvent",
    "ConversationFormatError",
    "ConversationNotFoundError",
    "Driver",
    "DroppedUnit",
    "FORMAT_VERSION",
    "FinalResult",
    "HandlerError",
    "HandlerRun",
    "ImagePart",
    "InvalidRequestError",
    "LimitApplied",
    "LimitingRecord",
    "MaxRoundsExceededError",
    "Message",
    "Model",
    "ModelTokenCounter",
    "NOT_GIVEN",
    "NotGiven",
    "Origin",
    "PinReason",
    "ProviderCall",
    "ProviderError",
    "ProviderResponse",
    "ProviderResponseError",
    "ProviderUnavailableError",
    "RateLimitError",
    "Reasoning",
    "ReasoningDelta",
    "Request",
    "Role",
    "RoundDone",
    "RoundRecord",
    "RunResult",
    "StreamEvent",
    "TextDelta",
    "TextPart",
    "ThreadlineError",
    "TokenCounter",
    "TokenLimitEvent",
    "TokenLimitHandler",
    "TokenizerDataError",
    "Tool",
    "ToolArgumentsError",
    "ToolCall",
    "ToolCallEvent",
    "ToolOutcome",
    "ToolResult",
    "ToolResultEvent",
    "Toolset",
    "TranscriptIntegrityError",
    "Turn",
    "Unit",
    "UnitKind",
    "Usage",
    "check_integrity",
    "default_token_counter",
    "drop_oldest_units",
    "dumps_conversation",
    "dumps_messages",
    "loads_conversation",
    "loads_messages",
    "set_default_token_counter",
    "split_units",
    "tool",
]
