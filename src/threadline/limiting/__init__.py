"""Limiting: budgets, units, the Pre/Post handlers and the ledger of what was dropped.

A request over its prompt budget runs its handlers on a copy of the
transcript; ``drop_oldest_units`` (the default) drops whole units oldest
first, ``cache_stable_units`` cuts a block at once so the prompt's prefix
stays cached, ``summarize_oldest`` replaces the oldest with a summary, and
``clear_tool_results`` / ``clear_thinking`` keep every turn but send old tool
output and old reasoning cleared. A
handler of your own gets a :class:`TokenLimitEvent` and can do everything the
built-ins do: list the units (``event.units()``), drop some with a reason
the ledger records (``event.drop_units(units, reason=...)``), recount
(``event.is_over_budget()``), and declare the same traits as a built-in
(:class:`HandlerTraits`, :func:`with_traits`) to get the same treatment from
the engine and a conversation. See docs/limiting.md and docs/handlers.md.
"""

from threadline._errors import TranscriptIntegrityError
from threadline._provider import CacheDiagnosis
from threadline._public import publish
from threadline._result import RoundRecord
from threadline.limiting._budget import Budget, BudgetReport, BudgetResolution
from threadline.limiting._cache_stable import (
    DEFAULT_LOW_WATER,
    CacheStableUnits,
    cache_stable_units,
)
from threadline.limiting._clearing import (
    DEFAULT_CLEARED_PLACEHOLDER,
    ClearingHandler,
    clear_thinking,
    clear_tool_results,
)
from threadline.limiting._drop_oldest import drop_oldest_units
from threadline.limiting._event import TokenLimitEvent, TokenLimitHandler
from threadline.limiting._ledger import (
    ClearedMessage,
    CompactionOutcome,
    CompactionStatus,
    DroppedReasoning,
    DroppedUnit,
    HandlerRun,
    LimitingRecord,
    ToolCallRepair,
)
from threadline.limiting._prefix import CacheReport, PrefixChange, PrefixReason, SentPrompt
from threadline.limiting._summarize import (
    DEFAULT_SUMMARY_INSTRUCTIONS,
    SUMMARY_ACKNOWLEDGEMENT,
    SUMMARY_HEADING,
    summarize_oldest,
)
from threadline.limiting._traits import HandlerTraits, traits_of, with_traits
from threadline.limiting._units import (
    PinReason,
    Unit,
    UnitKind,
    Units,
    check_integrity,
    split_units,
)

__all__ = [
    "DEFAULT_CLEARED_PLACEHOLDER",
    "DEFAULT_LOW_WATER",
    "DEFAULT_SUMMARY_INSTRUCTIONS",
    "SUMMARY_ACKNOWLEDGEMENT",
    "SUMMARY_HEADING",
    "Budget",
    "BudgetReport",
    "BudgetResolution",
    "CacheDiagnosis",
    "CacheReport",
    "CacheStableUnits",
    "ClearedMessage",
    "ClearingHandler",
    "CompactionOutcome",
    "CompactionStatus",
    "DroppedReasoning",
    "DroppedUnit",
    "HandlerRun",
    "HandlerTraits",
    "LimitingRecord",
    "PinReason",
    "PrefixChange",
    "PrefixReason",
    "RoundRecord",
    "SentPrompt",
    "TokenLimitEvent",
    "TokenLimitHandler",
    "ToolCallRepair",
    "TranscriptIntegrityError",
    "Unit",
    "UnitKind",
    "Units",
    "cache_stable_units",
    "check_integrity",
    "clear_thinking",
    "clear_tool_results",
    "drop_oldest_units",
    "split_units",
    "summarize_oldest",
    "traits_of",
    "with_traits",
]

publish(globals(), __all__, __name__)
