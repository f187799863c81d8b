"""``ApproximateCounter``: 4 + ceil(utf8_bytes / 4) per message."""

from __future__ import annotations

import math

from hypothesis import given
from hypothesis import strategies as st

from threadline import ImagePart, Message, Reasoning, TextPart, Tool, ToolCall
from threadline.counting import (
    ApproximateCounter,
    IncrementalTokenCounter,
    estimate_content_tokens,
    estimate_message_tokens,
)


def test_content_estimate_is_a_quarter_of_the_utf8_bytes_rounded_up() -> None:
    assert estimate_content_tokens("") == 0
    assert estimate_content_tokens("abcd") == 1
    assert estimate_content_tokens("abcde") == 2
    assert estimate_content_tokens("hello world") == 3
    # "é" is two bytes, "日" three: bytes, not characters, are counted.
    assert estimate_content_tokens("éé") == 1
    assert estimate_content_tokens("日本語") == 3


@given(st.text())
def test_content_estimate_matches_the_formula_for_any_text(text: str) -> None:
    assert estimate_content_tokens(text) == math.ceil(len(text.encode("utf-8")) / 4)


def test_a_message_costs_four_plus_its_text() -> None:
    assert estimate_message_tokens(Message.user("hello world")) == 4 + 3
    assert estimate_message_tokens(Message.assistant()) == 4


def test_all_text_the_model_sees_is_counted_together() -> None:
    call = ToolCall(id="call_1", name="get_weather", arguments='{"city":"Paris"}')
    message = Message.assistant("ok", tool_calls=[call], name="bot")
    size = len("ok") + len("bot") + len("call_1") + len("get_weather") + len('{"city":"Paris"}')
    assert estimate_message_tokens(message) == 4 + math.ceil(size / 4)
    result = Message.tool("call_1", "Sunny")
    assert estimate_message_tokens(result) == 4 + math.ceil((len("call_1") + len("Sunny")) / 4)


def test_images_cost_the_fixed_amounts() -> None:
    message = Message.user(
        [
            TextPart(text="abcd"),
            ImagePart(url="https://example.com/a.png"),
            ImagePart(url="https://example.com/b.png", detail="low"),
        ]
    )
    assert estimate_message_tokens(message) == 4 + 1 + 765 + 85


def test_reasoning_counts_only_what_is_replayed() -> None:
    display_only = Message.assistant("ok", reasoning=Reasoning(text="x" * 400))
    assert estimate_message_tokens(display_only) == estimate_message_tokens(Message.assistant("ok"))
    replayed = Message.assistant(
        "ok",
        reasoning=Reasoning(provider_reasoning=b'[{"type": "thinking", "thinking": "abcdefgh"}]'),
    )
    assert estimate_message_tokens(replayed) == 4 + math.ceil((2 + 8) / 4)


def test_tools_cost_their_schema_estimate() -> None:
    tool = Tool(name="ping", description="Ping.", parameters={"type": "object"})
    schema = '{"type": "object"}'
    expected = 4 + math.ceil((len("ping") + len("Ping.") + len(schema)) / 4)
    counter = ApproximateCounter()
    assert counter.overhead_tokens([tool]) == expected
    assert counter.overhead_tokens() == 0
    assert counter.count([Message.user("hello world")], [tool]) == 7 + expected


@given(st.lists(st.text(), max_size=6))
def test_approximate_counts_are_incremental(texts: list[str]) -> None:
    counter = ApproximateCounter()
    assert isinstance(counter, IncrementalTokenCounter)
    messages = [Message.user(text) for text in texts]
    expected = sum(map(counter.message_tokens, messages)) + counter.overhead_tokens()
    assert counter.count(messages) == expected


def test_a_lone_surrogate_is_sized_not_an_error() -> None:
    from threadline import Message
    from threadline.counting import ApproximateCounter

    # 2 ASCII bytes and 3 for the surrogate: 4 + ceil(5 / 4)
    assert ApproximateCounter().count([Message.user("ab\udcff")]) == 4 + 2
