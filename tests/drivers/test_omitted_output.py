"""Each driver says when a provider's answer held output its message does not: a server
tool's call, code Gemini ran, audio. Those output tokens count more than the message, so
calibration must not take them for the message's text (``ProviderResponse.omitted_output``)."""

from __future__ import annotations

from typing import Any

import pytest

from threadline.drivers.anthropic._response import StreamAssembler as AnthropicStream
from threadline.drivers.anthropic._response import parse_message
from threadline.drivers.gemini._response import StreamAssembler as GeminiStream
from threadline.drivers.gemini._response import parse_response as parse_gemini
from threadline.drivers.openai_chat._wire import StreamAssembler as ChatStream
from threadline.drivers.openai_chat._wire import parse_completion
from threadline.drivers.openai_responses._response import parse_response as parse_responses

NAMES: dict[str, Any] = {"requested_model": "m", "provider": "p"}
TEXT = "The museum opens at nine."


def anthropic(*blocks: dict[str, Any]) -> bool:
    body = {"content": list(blocks), "stop_reason": "end_turn", "model": "m"}
    return parse_message(body, request_id=None, **NAMES).omitted_output


def test_anthropic_says_when_a_server_tool_ran() -> None:
    text = {"type": "text", "text": TEXT}
    call = {"type": "tool_use", "id": "t1", "name": "lookup", "input": {}}
    assert anthropic(text, call) is False
    search = {"type": "server_tool_use", "id": "s1", "name": "web_search", "input": {}}
    assert anthropic(search, {"type": "web_search_tool_result", "content": []}, text) is True


def test_anthropic_says_so_in_a_stream_too() -> None:
    stream = AnthropicStream(**NAMES)
    events = [
        ("message_start", {"type": "message_start", "message": {"model": "m", "usage": {}}}),
        (
            "content_block_start",
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "server_tool_use", "id": "s1", "name": "web_search"},
            },
        ),
        (
            "content_block_start",
            {"type": "content_block_start", "index": 1, "content_block": {"type": "text"}},
        ),
        (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 1,
                "delta": {"type": "text_delta", "text": TEXT},
            },
        ),
    ]
    for name, event in events:
        stream.add(event, name)
    response = stream.finish(request_id=None)
    assert response.message.text == TEXT
    assert response.omitted_output is True


def responses(*items: dict[str, Any]) -> bool:
    body = {"status": "completed", "model": "m", "output": list(items)}
    return parse_responses(body, request_id=None, **NAMES).omitted_output


def test_responses_says_when_a_built_in_tool_ran() -> None:
    message = {"type": "message", "content": [{"type": "output_text", "text": TEXT}]}
    assert responses(message) is False
    assert responses({"type": "web_search_call", "id": "w1", "status": "completed"}, message)


def gemini(*parts: dict[str, Any]) -> bool:
    body = {"candidates": [{"content": {"parts": list(parts)}, "finishReason": "STOP"}]}
    return parse_gemini(body, request_id=None, **NAMES).omitted_output


def test_gemini_says_when_it_ran_code() -> None:
    call = {"functionCall": {"name": "lookup", "args": {}}}
    assert gemini({"text": TEXT}, call) is False
    code = {"executableCode": {"language": "PYTHON", "code": "print(9)"}}
    result = {"codeExecutionResult": {"outcome": "OUTCOME_OK", "output": "9"}}
    assert gemini(code, result, {"text": TEXT}) is True
    stream = GeminiStream(**NAMES)
    for part in (code, {"text": TEXT}):
        stream.add({"candidates": [{"content": {"parts": [part]}}]})
    assert stream.finish(request_id=None).omitted_output is True


@pytest.mark.parametrize("audio", [None, {"id": "a1", "data": "UklGRg==", "transcript": TEXT}])
def test_chat_completions_says_when_it_spoke(audio: dict[str, Any] | None) -> None:
    message = {"role": "assistant", "content": TEXT, "audio": audio}
    body = {"choices": [{"message": message, "finish_reason": "stop"}], "model": "m"}
    assert parse_completion(body, request_id=None, **NAMES).omitted_output is (audio is not None)
    stream = ChatStream(**NAMES)
    stream.add({"choices": [{"index": 0, "delta": {"content": TEXT, "audio": audio}}]})
    assert stream.finish(request_id=None).omitted_output is (audio is not None)
