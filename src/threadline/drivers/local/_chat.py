"""The local driver's chat layer: messages to prompt text, and tool calls in ChatML.

Three things live here, all pure Python (no model is loaded by this module):

- translation between threadline's ``Message`` and llama-cpp-python's chat
  message dicts (the OpenAI shape ``create_chat_completion`` takes), both ways;
- the prompt formats: the GGUF file's own Jinja chat template, rendered with
  llama-cpp-python's ``Jinja2ChatFormatter`` exactly as its chat handler
  renders it, and the ChatML function-calling protocol of llama-cpp-python's
  ``chatml-function-calling`` format, used for turns that carry tools;
- the grammars that constrain the model while it picks a tool and writes its
  arguments.

The driver and its token counter both build prompts through :func:`render`,
so what the counter tokenizes is what the model is sent.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal, Protocol, TypeAlias

from threadline._errors import InvalidRequestError
from threadline._messages import ImagePart, Message, Origin, Role, ToolCall
from threadline.drivers._tool_calls import tool_call_dicts
from threadline.tools._tools import Tool

__all__ = [
    "CHATML_FUNCTION_CALLING",
    "CHAT_TEMPLATE",
    "MESSAGE_PREFIX",
    "ChatFormatName",
    "LlamaMessage",
    "PromptFormat",
    "TemplateRenderer",
    "call_prefix",
    "choice_grammar",
    "from_llama_message",
    "is_chatml_template",
    "to_llama_messages",
    "to_llama_tools",
]

LlamaMessage: TypeAlias = dict[str, Any]
"""A chat message as llama-cpp-python takes it (``{"role": ..., "content": ...}``)."""

CHAT_TEMPLATE: Final = "chat_template.default"
CHATML_FUNCTION_CALLING: Final = "chatml-function-calling"
ChatFormatName: TypeAlias = Literal["chat_template.default", "chatml-function-calling"]

# The reply protocol of llama-cpp-python's chatml-function-calling format: a
# reply opens with "message:" (then text) or with a "functions.<name>:" line
# followed by the call's JSON arguments. The driver samples one call per reply.
MESSAGE_PREFIX: Final = "message:\n"
_CALL_SEPARATOR: Final = "\n"  # between the calls of one assistant message in a history


def call_prefix(name: str) -> str:
    """The line that opens a call to the tool ``name`` in a reply."""
    return f"functions.{name}:\n"


# --- messages ---------------------------------------------------------------


def to_llama_messages(messages: Sequence[Message]) -> list[LlamaMessage]:
    """Translate a transcript into llama-cpp-python chat messages.

    Tool calls become ``tool_calls`` entries and tool results ``tool``
    messages carrying their ``tool_call_id``; reasoning is not replayed (a
    local model has nowhere to take it back).

    Raises:
        InvalidRequestError: a message holds an image (the local models read
            text only).
    """
    translated: list[LlamaMessage] = []
    for index, message in enumerate(messages):
        if not isinstance(message.content, str) and any(
            isinstance(part, ImagePart) for part in message.content
        ):
            raise InvalidRequestError(
                f"message {index}: LocalDriver runs text-only models; remove the image parts"
            )
        entry: LlamaMessage = {"role": message.role.value, "content": message.text}
        if message.tool_calls:
            entry["tool_calls"] = tool_call_dicts(message.tool_calls)
        if message.tool_call_id is not None:
            entry["tool_call_id"] = message.tool_call_id
        if message.name is not None:
            entry["name"] = message.name
        translated.append(entry)
    return translated


def from_llama_message(entry: Mapping[str, Any], *, origin: Origin = Origin.TURN) -> Message:
    """Translate one llama-cpp-python chat message (a reply, usually) back.

    Raises:
        InvalidRequestError: the entry is not a chat message threadline can hold.
    """
    role = entry.get("role")
    if role not in {r.value for r in Role}:
        raise InvalidRequestError(f"a chat message with an unknown role: {role!r}")
    content = entry.get("content")
    calls = [
        ToolCall(
            id=str(call["id"]),
            name=str(call["function"]["name"]),
            arguments=str(call["function"].get("arguments") or "{}"),
        )
        for call in entry.get("tool_calls") or ()
    ]
    return Message(
        role=Role(role),
        content=content if isinstance(content, str) else "",
        tool_calls=calls,
        tool_call_id=entry.get("tool_call_id"),
        name=entry.get("name"),
        origin=origin,
    )


def to_llama_tools(tools: Sequence[Tool]) -> list[dict[str, Any]]:
    """Tools as llama-cpp-python's ``tools`` argument lists them."""
    return [
        {
            "type": "function",
            "function": {
                "name": tool.name,
                "description": tool.description,
                "parameters": json.loads(json.dumps(tool.parameters)),
            },
        }
        for tool in tools
    ]


# --- prompt formats ---------------------------------------------------------


class TemplateRenderer(Protocol):
    """llama-cpp-python's ``Jinja2ChatFormatter``, as far as the driver uses it."""

    def __call__(self, *, messages: list[LlamaMessage], **kwargs: Any) -> Any: ...


def is_chatml_template(template: str) -> bool:
    """Whether a GGUF chat template frames turns in ChatML (SmolLM2, Qwen, ...)."""
    return "<|im_start|>" in template and "<|im_end|>" in template


def _calls_text(entry: LlamaMessage) -> str:
    return _CALL_SEPARATOR.join(
        call_prefix(call["function"]["name"]) + call["function"]["arguments"]
        for call in entry.get("tool_calls", ())
    )


def _flatten_for_template(messages: list[LlamaMessage]) -> list[LlamaMessage]:
    """Messages a template without tool support can render.

    Such templates read ``content`` only (and fail on ``None``), so tool
    calls are written into the assistant's text the way the function-calling
    protocol writes them, and tool results keep the ``tool`` role.
    """
    flat: list[LlamaMessage] = []
    for entry in messages:
        text = entry["content"]
        if entry.get("tool_calls"):
            calls = _calls_text(entry)
            text = f"{text}\n{calls}" if text else calls
        flat.append({"role": entry["role"], "content": text})
    return flat


def _tool_instructions(tools: list[dict[str, Any]]) -> str:
    listing = "\n".join(
        f"functions.{t['function']['name']}: {t['function']['description']}\n"
        f"{json.dumps(t['function']['parameters'], ensure_ascii=False)}"
        for t in tools
    )
    return (
        "You have access to the following functions:\n"
        f"{listing}\n\n"
        "Reply either with a message or with a function call.\n"
        "For a message, begin the reply with 'message:' on its own line, then the message.\n"
        "For a function call, write 'functions.<function_name>:' on its own line, "
        "then the arguments as one JSON object on the next line."
    )


def _render_chatml_functions(messages: list[LlamaMessage], tools: list[dict[str, Any]]) -> str:
    """The prompt of the chatml-function-calling protocol, tool results included."""
    names: dict[str, str] = {}
    turns: list[tuple[str, str]] = []
    rest = messages
    if tools:
        system = _tool_instructions(tools)
        if messages and messages[0]["role"] == "system":
            system = f"{messages[0]['content']}\n\n{system}"
            rest = messages[1:]
        turns.append(("system", system))
    for entry in rest:
        role, text = entry["role"], entry["content"]
        if role == "assistant":
            if tools and text:
                text = MESSAGE_PREFIX + text
            if entry.get("tool_calls"):
                for call in entry["tool_calls"]:
                    names[call["id"]] = call["function"]["name"]
                calls = _calls_text(entry)
                text = f"{text}\n{calls}" if text else calls
        elif role == "tool":
            name = entry.get("name") or names.get(entry.get("tool_call_id", ""), "")
            label = f"functions.{name} returned:\n" if name else ""
            text = label + text
        turns.append((role, text))
    framed = "".join(f"<|im_start|>{role}\n{text}<|im_end|>\n" for role, text in turns)
    return framed + "<|im_start|>assistant\n"


class PromptFormat:
    """Renders a transcript into the prompt text one model is sent.

    ``chat_format`` chooses the format: ``None`` renders plain turns with the
    GGUF's own template and turns with tools with the chatml-function-calling
    protocol (when the template is ChatML); ``"chat_template.default"`` always
    uses the GGUF's template and refuses tools; ``"chatml-function-calling"``
    always uses the protocol.
    """

    def __init__(
        self,
        *,
        chat_format: ChatFormatName | None,
        template: str | None,
        make_renderer: Callable[[str], TemplateRenderer],
    ) -> None:
        self.chat_format = chat_format
        self._template = template
        self._renderer = make_renderer(template) if template is not None else None

    @property
    def supports_tools(self) -> bool:
        """Whether calls carrying tools can be sent in this format."""
        if self.chat_format == CHATML_FUNCTION_CALLING:
            return True
        if self.chat_format == CHAT_TEMPLATE:
            return False
        return self._template is not None and is_chatml_template(self._template)

    def uses_functions(self, tools: Sequence[Tool]) -> bool:
        """Whether a call with ``tools`` is rendered in the function-calling protocol.

        Raises:
            InvalidRequestError: the call carries tools this format cannot offer.
        """
        if self.chat_format == CHATML_FUNCTION_CALLING:
            return True
        if not tools:
            return False
        if not self.supports_tools:
            raise InvalidRequestError(
                f"this local model cannot call tools in its chat format ({self.describe()}); "
                "send the request without tools, or use a ChatML model with "
                "LocalDriver(chat_format='chatml-function-calling')"
            )
        return True

    def describe(self) -> str:
        if self.chat_format is not None:
            return self.chat_format
        if self._template is None:
            return "no chat template in the GGUF file"
        return "the GGUF's chat template, which is not ChatML"

    def render(self, messages: Sequence[Message], tools: Sequence[Tool]) -> str:
        """The prompt text for ``messages`` and ``tools``, up to the reply's opening.

        Raises:
            InvalidRequestError: tools this format cannot offer, an image, or a
                transcript the model's template refuses.
        """
        entries = to_llama_messages(messages)
        if self.uses_functions(tools):
            return _render_chatml_functions(entries, to_llama_tools(tools))
        if self._renderer is None:
            raise InvalidRequestError(
                "the GGUF file has no chat template; use a chat model, or "
                "LocalDriver(chat_format='chatml-function-calling') for a ChatML one"
            )
        try:
            rendered = self._renderer(messages=_flatten_for_template(entries))
        except Exception as exc:  # the template's own raise_exception, or a Jinja error
            raise InvalidRequestError(
                f"the model's chat template cannot render this transcript: {exc}"
            ) from None
        prompt = rendered.prompt
        if not isinstance(prompt, str):  # pragma: no cover - llama-cpp-python's contract
            raise TypeError("the chat template rendered something other than text")
        return prompt


# --- grammars ---------------------------------------------------------------


def _literal(text: str) -> str:
    return json.dumps(text)  # a JSON string literal is a valid GBNF literal


def _alternatives(options: Sequence[str]) -> str:
    return " | ".join(_literal(option) for option in options)


def choice_grammar(tool_names: Sequence[str], *, allow_message: bool) -> tuple[str, list[str]]:
    """The GBNF that makes the model open its reply, and the openings it allows.

    With ``allow_message`` the reply may be a message; ``tool_names`` are the
    tools it may call instead (empty: a message only).
    """
    options = [MESSAGE_PREFIX] if allow_message else []
    options += [call_prefix(name) for name in tool_names]
    return f"root ::= {_alternatives(options)}\n", options
