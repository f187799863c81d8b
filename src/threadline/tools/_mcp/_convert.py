"""MCP's JSON to threadline's values: a listed tool to a ``Tool``, a call's result
to a ``ToolResult``.

Results follow the protocol's content blocks: text blocks are joined, an
image becomes an ``ImagePart`` (a ``data:`` URL), a resource link or an
embedded text resource becomes a line of text, and ``structuredContent`` is
kept as JSON (the text block a server adds beside it for older clients is
the same JSON, so it is not sent twice). ``isError`` makes an error result.
"""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, Literal

from threadline._messages import ContentPart, ImagePart, TextPart
from threadline.tools._results import ToolResult
from threadline.tools._tools import Tool

__all__ = ["result_of", "tool_of"]

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def tool_of(
    wire: Mapping[str, Any],
    function: Callable[..., Awaitable[ToolResult]],
    *,
    timeout: float | None,
    max_result_tokens: int | Literal["budget"] | None,
) -> Tool:
    """The ``Tool`` for one entry of ``tools/list``; its ``inputSchema`` offered as it is.

    A name providers refuse (a dot, a slash, over 64 characters) is offered
    with those characters as ``_``; ``function`` calls the server by its own name.

    Raises:
        InvalidRequestError: an ``inputSchema`` that is not a JSON object schema.
    """
    name = str(wire.get("name", ""))
    safe = _UNSAFE.sub("_", name)[:64] or "tool"
    description = wire.get("description") or wire.get("title") or ""
    return Tool(
        name=safe,
        description=str(description),
        parameters=wire.get("inputSchema") or {"type": "object", "properties": {}},
        function=function,
        timeout=timeout,
        max_result_tokens=max_result_tokens,
    )


def result_of(wire: Mapping[str, Any]) -> ToolResult:
    """The ``ToolResult`` of a ``tools/call`` result."""
    structured = wire.get("structuredContent")
    texts: list[str] = []
    images: list[ContentPart] = []
    if structured is not None:
        texts.append(json.dumps(structured, ensure_ascii=False))
    for block in wire.get("content") or ():
        text, image = _block(block)
        if image is not None:
            images.append(image)
        elif text is not None and not (structured is not None and _same_json(text, structured)):
            texts.append(text)
    joined = "\n".join(texts)
    is_error = bool(wire.get("isError"))
    if images and not is_error:
        parts: tuple[ContentPart, ...] = (TextPart(text=joined), *images) if joined else ()
        return ToolResult(parts or tuple(images))
    return ToolResult(joined, is_error=is_error)


def _block(block: Mapping[str, Any]) -> tuple[str | None, ImagePart | None]:
    kind = block.get("type")
    if kind == "text":
        return str(block.get("text", "")), None
    if kind == "image":
        return None, ImagePart(url=f"data:{block.get('mimeType')};base64,{block.get('data', '')}")
    if kind == "resource_link":
        described = f": {block['description']}" if block.get("description") else ""
        kind_of = f" ({block['mimeType']})" if block.get("mimeType") else ""
        return (
            f"[resource {block.get('name', '')} at {block.get('uri', '')}{kind_of}{described}]",
            None,
        )
    if kind == "resource":
        resource = block.get("resource") or {}
        if "text" in resource:
            return str(resource["text"]), None
        return f"[binary resource at {resource.get('uri', '')} left out]", None
    # Audio, and any block kind newer than this code: said, not silently dropped.
    mime = f" ({block['mimeType']})" if block.get("mimeType") else ""
    return f"[the tool returned {kind or 'a content block'}{mime}, which is left out]", None


def _same_json(text: str, value: Any) -> bool:
    """Whether ``text`` repeats the structured content ``value``: its JSON, or, for the
    ``{"result": ...}`` object FastMCP wraps a plain return value in, that value."""
    try:
        parsed = json.loads(text)
    except ValueError:
        parsed = text
    if parsed == value:
        return True
    if isinstance(value, dict) and len(value) == 1:
        (inner,) = value.values()
        return bool(inner in (parsed, text))
    return False
