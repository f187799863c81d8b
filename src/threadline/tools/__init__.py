"""Tools: ``@tool`` turns a typed function into a tool the model can call.

The JSON schema comes from the signature and the docstring; arguments are
checked against it before the function runs, and a failing tool becomes an
error result the model can recover from. ``MCPServer`` offers the tools of
a Model Context Protocol server (the ``threadline[mcp]`` extra). See
docs/tools.md.

The same schema code describes a request's ``output_type``, and an answer
that fails it raises ``OutputValidationError`` (docs/structured-output.md).
"""

from threadline._errors import OutputValidationError, ToolArgumentsError, ToolError
from threadline._public import publish
from threadline.tools._mcp import MCPServer
from threadline.tools._tools import Tool, ToolOutcome, ToolResult, Toolset, ToolSource, tool

__all__ = [
    "MCPServer",
    "OutputValidationError",
    "Tool",
    "ToolArgumentsError",
    "ToolError",
    "ToolOutcome",
    "ToolResult",
    "ToolSource",
    "Toolset",
    "tool",
]

publish(globals(), __all__, __name__)
