"""Tools the model may call: ``Tool``, the ``@tool`` decorator and ``ToolResult``."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

__all__ = ["Tool"]


@attrs.frozen(kw_only=True, eq=False)
class Tool:
    """A function the model may call.

    ``parameters`` is the JSON schema (an object schema) of its arguments;
    ``function`` (sync or async) is called with the decoded arguments as
    keyword arguments. A tool without a function is declared to the model
    but executed by the caller.
    """

    name: str
    description: str = ""
    parameters: Mapping[str, Any] = attrs.field(
        factory=lambda: {"type": "object", "properties": {}}
    )
    function: Callable[..., Any] | None = None
