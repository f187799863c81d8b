"""Tools: ``@tool`` turns a typed function into a tool the model can call.

The JSON schema comes from the signature and the docstring; arguments are
checked against it before the function runs, and a failing tool becomes an
error result the model can recover from. See docs/tools.md.

The same schema code describes a request's ``output_type``, and an answer
that fails it raises ``OutputValidationError`` (docs/structured-output.md).
"""

from threadline._errors import OutputValidationError, ToolArgumentsError
from threadline._public import publish
from threadline.tools._tools import Tool, ToolOutcome, ToolResult, Toolset, tool

__all__ = [
    "OutputValidationError",
    "Tool",
    "ToolArgumentsError",
    "ToolOutcome",
    "ToolResult",
    "Toolset",
    "tool",
]

publish(globals(), __all__, __name__)
