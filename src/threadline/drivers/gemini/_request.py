"""The ``generateContent`` request body: the transcript (``_contents``) and every other field.

Pure translation, no I/O. ``tools`` are one ``functionDeclarations`` list
with each tool's JSON Schema as ``parametersJsonSchema``; ``tool_choice`` is
``toolConfig.functionCallingConfig`` (``auto`` AUTO, ``none`` NONE,
``required`` ANY, a tool's name ANY limited to it); the output cap, sampling,
stop sequences and thinking go in ``generationConfig``. A call's
``extra_body`` is merged last, its ``generationConfig`` into the one built
here field by field.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any, Final, Literal

import attrs

from threadline._errors import InvalidRequestError
from threadline._provider import ProviderCall
from threadline.drivers._http._wire import JSONCache, encode_body
from threadline.drivers.gemini._contents import encode_contents
from threadline.tools._tools import Tool

__all__ = ["EncodedRequest", "ThinkingConfig", "encode_count_request", "encode_request"]

logger = logging.getLogger("threadline.drivers.gemini")

_LEVELS: Final = ("minimal", "low", "medium", "high")


def _budget(
    instance: ThinkingConfig, attribute: attrs.Attribute[int | None], value: object
) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise InvalidRequestError(
            f"ThinkingConfig budget must be an int >= 0, or -1 for the model to decide; "
            f"not {value!r}"
        )


def _level(instance: ThinkingConfig, attribute: attrs.Attribute[str | None], value: object) -> None:
    if value is not None and value not in _LEVELS:
        raise InvalidRequestError(
            f"ThinkingConfig level must be one of {', '.join(_LEVELS)} or None, not {value!r}"
        )
    if value is not None and instance.budget is not None:
        raise InvalidRequestError("ThinkingConfig takes a budget or a level, not both")


@attrs.frozen(kw_only=True)
class ThinkingConfig:
    """Gemini's ``thinkingConfig``: ``ThinkingConfig(level="low")`` or ``(budget=1024)``.

    ``budget`` (Gemini 2.5: tokens, ``0`` off, ``-1`` the model decides) and
    ``level`` (Gemini 3: ``"minimal"``, ``"low"``, ``"medium"``, ``"high"``) are
    exclusive; ``include_thoughts`` asks for thought summaries, which become
    ``Reasoning.text``. Give it to ``GeminiDriver(thinking=...)`` for every call.

    Raises:
        InvalidRequestError: a negative budget below -1, an unknown level, or both.
    """

    budget: int | None = attrs.field(default=None, validator=_budget)
    level: Literal["minimal", "low", "medium", "high"] | None = attrs.field(
        default=None, validator=_level
    )
    include_thoughts: bool = True

    def to_json(self) -> dict[str, Any]:
        """The ``generationConfig.thinkingConfig`` field."""
        config: dict[str, Any] = {"includeThoughts": self.include_thoughts}
        if self.budget is not None:
            config["thinkingBudget"] = self.budget
        if self.level is not None:
            config["thinkingLevel"] = self.level
        return config


@attrs.frozen(kw_only=True)
class EncodedRequest:
    """A body ready to send, and what was changed or left out to make it sendable."""

    body: bytes
    notes: tuple[str, ...] = ()


def _declaration(tool: Tool) -> dict[str, Any]:
    declared: dict[str, Any] = {"name": tool.name}
    if tool.description:
        declared["description"] = tool.description
    declared["parametersJsonSchema"] = tool.parameters
    return declared


def _tool_config(choice: str, tools: tuple[Tool, ...]) -> dict[str, Any]:
    modes = {"auto": "AUTO", "none": "NONE", "required": "ANY"}
    if choice in modes:
        return {"functionCallingConfig": {"mode": modes[choice]}}
    if not any(tool.name == choice for tool in tools):
        raise InvalidRequestError(
            f"tool_choice {choice!r} is neither 'auto', 'none', 'required' nor the name "
            "of a tool sent with the call"
        )
    return {"functionCallingConfig": {"mode": "ANY", "allowedFunctionNames": [choice]}}


def _output_config(call: ProviderCall) -> dict[str, Any]:
    """The structured-output fields of ``generationConfig``: a JSON answer constrained
    by ``responseJsonSchema`` (full JSON Schema, unlike the older OpenAPI-subset
    ``responseSchema``), so the schema goes as the tools room wrote it."""
    if call.output is None:
        return {}
    return {"responseMimeType": "application/json", "responseJsonSchema": dict(call.output.schema)}


def _generation_config(
    call: ProviderCall, thinking: ThinkingConfig | None, extra: Mapping[str, Any]
) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if call.max_output_tokens is not None:
        config["maxOutputTokens"] = call.max_output_tokens
    sampling = call.sampling
    for field, value in (
        ("temperature", sampling.temperature),
        ("topP", sampling.top_p),
        ("stopSequences", None if sampling.stop is None else list(sampling.stop)),
        ("seed", sampling.seed),
        ("presencePenalty", sampling.presence_penalty),
        ("frequencyPenalty", sampling.frequency_penalty),
    ):
        if value is not None:
            config[field] = value
    if thinking is not None:
        config["thinkingConfig"] = thinking.to_json()
    config.update(_output_config(call))
    given = extra.get("generationConfig")
    if given is not None:
        if not isinstance(given, Mapping):
            raise InvalidRequestError(
                f"extra_body generationConfig must be a mapping, not {type(given).__name__}"
            )
        config.update(given)
    return config


def _head(call: ProviderCall, thinking: ThinkingConfig | None) -> dict[str, Any]:
    """Every field but ``contents`` and ``systemInstruction``, ``extra_body`` merged last."""
    head: dict[str, Any] = {}
    if call.tools:
        head["tools"] = [{"functionDeclarations": [_declaration(tool) for tool in call.tools]}]
    if call.tool_choice is not None:
        head["toolConfig"] = _tool_config(call.tool_choice, call.tools)
    extra = dict(call.extra_body)
    config = _generation_config(call, thinking, extra)
    extra.pop("generationConfig", None)
    if config:
        head["generationConfig"] = config
    head.update(extra)
    return head


def _body(
    call: ProviderCall, label: str, thinking: ThinkingConfig | None, cache: JSONCache | None
) -> tuple[bytes, tuple[str, ...]]:
    """The request as ``generateContent`` takes it, and the transcript's notes."""
    transcript = encode_contents(call.messages, label=label, cache=cache)
    body = encode_body(_head(call, thinking))[:-1]
    if transcript.system:
        body += b',"systemInstruction":{"parts":[' + b",".join(transcript.system) + b"]}"
    body += b',"contents":' + transcript.contents + b"}"
    if body.startswith(b"{,"):
        body = b"{" + body[2:]
    return body, transcript.notes


def encode_request(
    call: ProviderCall,
    *,
    label: str,
    thinking: ThinkingConfig | None = None,
    cache: JSONCache | None = None,
) -> EncodedRequest:
    """The body of ``POST models/{model}:generateContent`` (and of its stream) for ``call``.

    ``label`` (``"gemini:<model>"``) decides whose thought signatures are replayed.

    Raises:
        InvalidRequestError: a transcript Gemini would refuse and that cannot be
            repaired, an unknown forced tool, a value JSON cannot carry.
    """
    body, notes = _body(call, label, thinking, cache)
    return EncodedRequest(body=body, notes=notes)


def encode_count_request(
    call: ProviderCall,
    *,
    model_path: str,
    label: str,
    thinking: ThinkingConfig | None = None,
    cache: JSONCache | None = None,
) -> bytes:
    """The body of ``POST models/{model}:countTokens``: the whole request as a
    ``generateContentRequest``, so the system instruction and tools are counted too."""
    body, _ = _body(call, label, thinking, cache)
    model = encode_body({"model": model_path})[1:-1]
    return b'{"generateContentRequest":{' + model + b"," + body[1:] + b"}"
