"""The encoded request body: per-message JSON reused across requests, same bytes' meaning."""

from __future__ import annotations

import json

from threadline import ImagePart, Message, Model, TextPart, Tool, ToolCall
from threadline.drivers import ProviderCall, SamplingSettings
from threadline.drivers.openai_chat._wire import MessageJSONCache, encode_request, request_body

MODEL = Model("gpt-test")
WEATHER = Tool(
    name="get_weather",
    description="Current weather for a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
)
TRANSCRIPT = (
    Message.system("You are terse."),
    Message.user("Weather in Paris? Ünïcödé and \u2028 stay as they are.", name="ada"),
    Message.assistant(
        "", tool_calls=[ToolCall(id="call_1", name="get_weather", arguments='{"city":"Paris"}')]
    ),
    Message.tool("call_1", "18C, clear"),
    Message.assistant("Paris is 18C."),
    Message.user(
        (TextPart(text="And this?"), ImagePart(url="https://example.test/a.png", detail="low"))
    ),
)


def _call(**changes: object) -> ProviderCall:
    fields: dict[str, object] = {
        "model": MODEL,
        "messages": TRANSCRIPT,
        "tools": (WEATHER,),
        "tool_choice": "get_weather",
        "max_output_tokens": 64,
        "sampling": SamplingSettings(temperature=0.5, stop=("END",)),
        "extra_body": {"user": "u-1"},
    }
    fields.update(changes)
    return ProviderCall(**fields)  # type: ignore[arg-type]


def test_cached_encoding_means_exactly_what_request_body_builds() -> None:
    cache = MessageJSONCache()
    for stream in (False, True):
        call = _call()
        expected = request_body(call, stream=stream)
        encoded = encode_request(call, stream=stream, cache=cache)
        assert json.loads(encoded) == expected
        assert json.loads(encode_request(call, stream=stream)) == expected


def test_a_repeated_history_is_encoded_once_and_sent_identically() -> None:
    cache = MessageJSONCache(min_messages=1)
    first = encode_request(_call(), stream=False, cache=cache)
    assert len(cache) == len(TRANSCRIPT)
    longer = _call(messages=(*TRANSCRIPT, Message.user("One more.")))
    second = encode_request(longer, stream=False, cache=cache)
    assert len(cache) == len(TRANSCRIPT) + 1
    assert json.loads(second)["messages"][:-1] == json.loads(first)["messages"]
    assert json.loads(second)["messages"][-1] == {"role": "user", "content": "One more."}


def test_the_cache_forgets_old_messages_and_never_holds_oversized_ones() -> None:
    cache = MessageJSONCache(max_bytes=400, min_messages=1)
    messages = tuple(Message.user(f"message number {i}") for i in range(100))
    encoded = encode_request(_call(messages=messages), stream=False, cache=cache)
    assert [m["content"] for m in json.loads(encoded)["messages"]] == [m.text for m in messages]
    assert len(cache) < 20

    huge = Message.user("x" * 1000)
    encoded = encode_request(_call(messages=(huge,)), stream=False, cache=cache)
    assert json.loads(encoded)["messages"] == [{"role": "user", "content": "x" * 1000}]
    assert huge not in cache
    assert messages[-1] in cache


def test_only_a_long_history_is_kept_and_both_encode_alike() -> None:
    cache = MessageJSONCache(min_messages=10)
    short = tuple(Message.user(f"short {i}") for i in range(9))
    encoded = encode_request(_call(messages=short), stream=False, cache=cache)
    assert len(cache) == 0  # a short conversation keeps no second copy of its text
    assert json.loads(encoded) == request_body(_call(messages=short), stream=False)

    long = (*short, Message.user("the tenth"))
    encoded = encode_request(_call(messages=long), stream=False, cache=cache)
    assert len(cache) == len(long)
    assert json.loads(encoded) == request_body(_call(messages=long), stream=False)


def test_extra_body_may_replace_messages_but_never_the_stream_flag() -> None:
    cache = MessageJSONCache()
    replaced = _call(extra_body={"messages": [{"role": "user", "content": "raw"}]})
    body = json.loads(encode_request(replaced, stream=False, cache=cache))
    assert body["messages"] == [{"role": "user", "content": "raw"}]

    forced = _call(extra_body={"stream": True})
    assert "stream" not in json.loads(encode_request(forced, stream=False, cache=cache))
    unforced = _call(extra_body={"stream": False})
    assert json.loads(encode_request(unforced, stream=True, cache=cache))["stream"] is True
