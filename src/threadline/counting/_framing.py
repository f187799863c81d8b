"""The fixed token costs the built-in counter adds around the text it tokenizes.

Every number here is either OpenAI's published counting rule or the o200k
token count of the wrapper text a chat model is shown around a piece of the
request; ``tests/test_counting_builtin.py`` re-derives each one from its
wrapper text, so a change here that breaks the derivation fails a test.
docs/counting.md explains them for users.

Messages (OpenAI cookbook, "How to count tokens with tiktoken"): each message
is framed by three tokens (start, the separator after the header, end) plus
its role, which is one o200k token for all four roles; a ``name`` costs its
tokens plus one; the reply is primed with three tokens (start, ``assistant``,
separator), counted once per request.

Tool calls, tool results and tool schemas are not covered by that rule; the
costs below follow how OpenAI renders them to its models:

- a tool call is its own assistant segment addressed ``to=functions.NAME``:
  three framing tokens plus ``" to=functions."`` (four tokens), plus the
  tokens of the call's id, name and arguments. OpenAI does not show the id to
  the model, but the chat templates of many OpenAI-compatible servers do, and
  for a budget an over-estimate is the safe error;
- a tool result is authored ``functions.NAME to=assistant``:
  ``"functions."`` (two tokens) and ``" to=assistant"`` (three) replace the
  one role token already counted, so four more, plus the tokens of the
  ``tool_call_id`` it answers (which stands in for the function name);
- tool schemas go into a tools section: ``"# Tools\\n\\n## functions\\n\\n
  namespace functions {\\n\\n"`` and ``"} // namespace functions"`` once (13
  tokens), and per tool the wrapper ``"// "``, ``"\\ntype "``, ``" = (_: "``
  and ``") => any;\\n\\n"`` (13 tokens) around its description, name and
  parameters. The parameters are counted as their JSON text (what the chat
  templates of OpenAI-compatible servers embed), which is longer than
  OpenAI's own TypeScript-like rendering: again the safe error.

Images are not downloaded or decoded (counting is offline and cheap), so an
image costs a fixed amount: 85 tokens at ``detail="low"``, else 765, the cost
OpenAI's published tile formula gives a 1024x1024 image at high detail (85
base + 4 tiles x 170).
"""

from __future__ import annotations

from typing import Final

from threadline._messages import ImagePart

MESSAGE_TOKENS: Final = 4
"""Per message: 3 framing tokens plus the role's one token."""

NAME_TOKENS: Final = 1
"""Per message with a ``name``, on top of the name's own tokens."""

REPLY_TOKENS: Final = 3
"""Once per request: the reply is primed with start, ``assistant``, separator."""

TOOL_CALL_TOKENS: Final = 7
"""Per tool call, on top of its id, name and arguments."""

TOOL_RESULT_TOKENS: Final = 4
"""Per tool result, on top of its content and the ``tool_call_id`` it answers."""

TOOLS_SECTION_TOKENS: Final = 13
"""Once per request that declares tools: the tools section's header and footer."""

TOOL_SCHEMA_TOKENS: Final = 13
"""Per declared tool, on top of its name, description and JSON schema."""

IMAGE_LOW_DETAIL_TOKENS: Final = 85
"""An image sent at ``detail="low"``."""

IMAGE_TOKENS: Final = 765
"""Any other image: a 1024x1024 image at high detail."""


def image_tokens(part: ImagePart) -> int:
    """What an image part costs: fixed, since images are never fetched or decoded."""
    return IMAGE_LOW_DETAIL_TOKENS if part.detail == "low" else IMAGE_TOKENS
