"""The built-in counter: o200k_base tokens, framing overhead, and incremental counts."""

from __future__ import annotations

import gc
import threading
import weakref
from collections.abc import Sequence

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from threadline import ImagePart, Message, Reasoning, Role, TextPart, Tool, ToolCall
from threadline._messages import ContentPart
from threadline.counting import (
    BuiltinTokenCounter,
    IncrementalTokenCounter,
    ModelTokenCounter,
    o200k_base_encoding,
)
from threadline.counting import _framing as framing


def tokens(text: str) -> int:
    return len(o200k_base_encoding().encode_ordinary(text))


class CountingEncoding:
    """o200k_base, recording every text it is asked to tokenize."""

    def __init__(self) -> None:
        self.texts: list[str] = []
        self._encoding = o200k_base_encoding()

    def encode_ordinary(self, text: str) -> list[int]:
        self.texts.append(text)
        return self._encoding.encode_ordinary(text)


WEATHER = Tool(
    name="get_weather",
    description="Current weather for a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string", "description": "City name"}},
        "required": ["city"],
    },
)


def transcript(size: int) -> list[Message]:
    """``size`` messages mixing user, assistant, tool calls and tool results, all distinct."""
    messages: list[Message] = [Message.system("You are a careful assistant.")]
    index = 0
    while len(messages) < size:
        messages.append(Message.user(f"Question {index}: what is the weather in city {index}?"))
        if index % 3 == 0:
            call = ToolCall(id=f"call_{index}", name="get_weather", arguments=f'{{"n": {index}}}')
            messages.append(Message.assistant(tool_calls=[call]))
            messages.append(Message.tool(f"call_{index}", f"Sunny, {index % 40} degrees"))
        messages.append(Message.assistant(f"Answer {index}: it is sunny in city {index}."))
        index += 1
    return messages[:size]


# --- where the framing numbers come from -------------------------------------------------


def test_every_role_is_one_token_so_a_message_is_framed_by_four() -> None:
    assert all(tokens(role.value) == 1 for role in Role)
    assert framing.MESSAGE_TOKENS == 3 + 1


def test_tool_call_framing_is_a_segment_addressed_to_functions() -> None:
    assert 3 + tokens(" to=functions.") == framing.TOOL_CALL_TOKENS


def test_tool_result_framing_is_its_author_line_minus_the_role_token() -> None:
    assert tokens("functions.") + tokens(" to=assistant") - 1 == framing.TOOL_RESULT_TOKENS


def test_tool_schema_framing_is_the_tools_section_wrapper() -> None:
    header = "# Tools\n\n## functions\n\nnamespace functions {\n\n"
    footer = "} // namespace functions"
    assert tokens(header) + tokens(footer) == framing.TOOLS_SECTION_TOKENS
    wrapper = ["// ", "\ntype ", " = (_: ", ") => any;\n\n"]
    assert sum(map(tokens, wrapper)) == framing.TOOL_SCHEMA_TOKENS


# --- what each part of a request costs ---------------------------------------------------


def test_a_text_message_costs_framing_plus_its_tokens_plus_the_reply() -> None:
    counter = BuiltinTokenCounter()
    assert counter.count([Message.user("hello world")]) == 4 + 2 + 3
    assert counter.count([]) == 3


def test_a_name_costs_its_tokens_plus_one() -> None:
    counter = BuiltinTokenCounter()
    named = Message.user("hello world", name="example_user")
    assert counter.message_tokens(named) == 4 + 2 + tokens("example_user") + 1


def test_a_tool_call_costs_its_id_name_and_arguments_plus_framing() -> None:
    call = ToolCall(id="call_abc123", name="get_weather", arguments='{"city": "Paris"}')
    message = Message.assistant("Let me check.", tool_calls=[call])
    expected = (
        4
        + tokens("Let me check.")
        + 7
        + tokens("call_abc123")
        + tokens("get_weather")
        + tokens('{"city": "Paris"}')
    )
    assert BuiltinTokenCounter().message_tokens(message) == expected


def test_each_of_several_tool_calls_is_framed() -> None:
    calls = [ToolCall(id=f"c{n}", name="f", arguments="{}") for n in range(3)]
    one = BuiltinTokenCounter().message_tokens(Message.assistant(tool_calls=calls[:1]))
    three = BuiltinTokenCounter().message_tokens(Message.assistant(tool_calls=calls))
    assert three - one == 2 * (7 + tokens("c1") + tokens("f") + tokens("{}"))


def test_a_tool_result_costs_its_content_and_call_id_plus_framing() -> None:
    message = Message.tool("call_abc123", "Sunny, 21 degrees")
    expected = 4 + tokens("Sunny, 21 degrees") + 4 + tokens("call_abc123")
    assert BuiltinTokenCounter().message_tokens(message) == expected


def test_tool_schemas_cost_name_description_and_json_schema() -> None:
    counter = BuiltinTokenCounter()
    schema = (
        '{"type": "object", "properties": {"city": {"type": "string", '
        '"description": "City name"}}, "required": ["city"]}'
    )
    per_tool = 13 + tokens("get_weather") + tokens("Current weather for a city.") + tokens(schema)
    assert counter.tool_tokens(WEATHER) == per_tool
    assert counter.overhead_tokens([WEATHER]) == 3 + 13 + per_tool
    assert counter.count([], [WEATHER, WEATHER]) == 3 + 13 + 2 * per_tool


def test_a_tool_without_description_costs_no_description() -> None:
    bare = Tool(name="ping")
    assert BuiltinTokenCounter().tool_tokens(bare) == 13 + tokens("ping") + tokens(
        '{"type": "object", "properties": {}}'
    )


def test_text_parts_cost_their_tokens_and_images_a_fixed_amount() -> None:
    counter = BuiltinTokenCounter()
    parts: list[ContentPart] = [
        TextPart(text="What is in this picture?"),
        ImagePart(url="https://example.com/cat.png"),
        ImagePart(url="data:image/png;base64," + "A" * 10_000, detail="low"),
    ]
    message = Message.user(parts)
    assert counter.message_tokens(message) == 4 + tokens("What is in this picture?") + 765 + 85


def test_high_and_auto_detail_images_cost_the_same() -> None:
    for detail in (None, "auto", "high"):
        assert framing.image_tokens(ImagePart(url="https://x/y.png", detail=detail)) == 765


def test_non_ascii_text_is_counted_in_o200k_tokens() -> None:
    message = Message.user("Ünïcödé 日本語 ✓")
    assert BuiltinTokenCounter().message_tokens(message) == 4 + 8


def test_the_built_in_is_an_incremental_and_model_counter() -> None:
    counter = BuiltinTokenCounter()
    assert isinstance(counter, IncrementalTokenCounter)
    assert isinstance(counter, ModelTokenCounter)


def test_for_model_keeps_the_counter() -> None:
    from threadline import Model

    counter = BuiltinTokenCounter()
    assert counter.for_model(Model("gpt-4o")) is counter


def test_a_bad_cache_size_is_refused() -> None:
    with pytest.raises(ValueError, match="cache_size"):
        BuiltinTokenCounter(cache_size=0)


_texts = st.text(max_size=40)
_calls = st.builds(ToolCall, id=_texts, name=st.text(min_size=1, max_size=10), arguments=_texts)
_reasoning = st.builds(
    Reasoning, text=_texts, provider_reasoning=st.sampled_from([b"", b'[{"thinking": "x"}]'])
)
_messages = st.one_of(
    st.builds(Message.user, _texts, name=st.none() | st.text(min_size=1, max_size=8)),
    st.builds(Message.system, _texts),
    st.builds(
        Message.assistant,
        _texts,
        tool_calls=st.lists(_calls, max_size=2),
        reasoning=st.none() | _reasoning,
    ),
    st.builds(Message.tool, st.text(min_size=1, max_size=12), _texts),
)


@settings(max_examples=60, deadline=None)
@given(messages=st.lists(_messages, max_size=8), with_tools=st.booleans())
def test_count_is_the_sum_of_message_costs_plus_overhead(
    messages: list[Message], with_tools: bool
) -> None:
    counter = BuiltinTokenCounter()
    tools = [WEATHER] if with_tools else []
    expected = sum(map(counter.message_tokens, messages)) + counter.overhead_tokens(tools)
    assert counter.count(messages, tools) == expected
    # Cached or not, a count is the same: count equal messages no counter has priced.
    copies = [attrs.evolve(message) for message in messages]
    assert BuiltinTokenCounter().count(copies, tools) == expected


# --- against the published formula -------------------------------------------------------


def cookbook_count(messages: Sequence[dict[str, str]]) -> int:
    """OpenAI's cookbook formula for chat prompts, written out independently.

    3 tokens per message, plus the tokens of every value (role, content,
    name), plus 1 per name, plus 3 that prime the reply.
    """
    total = 3
    for message in messages:
        total += 3
        for key, value in message.items():
            total += tokens(value)
            if key == "name":
                total += 1
    return total


def test_plain_chat_counts_match_the_cookbook_formula() -> None:
    """Expected prompt tokens for plain chat transcripts, by OpenAI's cookbook formula.

    These are not recorded ``usage.prompt_tokens``: no OpenAI-compatible
    server with an o200k_base model was reachable where this was written. The
    numbers are what the formula OpenAI publishes for its chat models (3 per
    message, the values' tokens, 1 per name, 3 for the reply) gives with
    o200k_base, computed by ``cookbook_count`` above and written out as
    literals, so that a change of framing shows up here as a changed number.
    Replace them with recorded numbers when a server is available.
    """
    cases: list[tuple[list[dict[str, str]], int]] = [
        ([{"role": "user", "content": "hello world"}], 9),
        (
            [
                {"role": "system", "content": "You are terse."},
                {"role": "user", "content": "What is 2 + 2?"},
                {"role": "assistant", "content": "4"},
                {"role": "user", "content": "And 3 + 3?"},
            ],
            39,
        ),
        (
            [
                {"role": "system", "content": "You translate office jargon into plain words."},
                {"role": "user", "name": "sample_user", "content": "Let's circle back offline."},
                {"role": "assistant", "content": "Let's talk about it later, in private."},
                {"role": "user", "content": "We need to move the needle on this."},
            ],
            53,
        ),
    ]
    counter = BuiltinTokenCounter()
    for raw, expected in cases:
        messages = [
            Message(role=Role(m["role"]), content=m["content"], name=m.get("name")) for m in raw
        ]
        assert cookbook_count(raw) == expected
        assert counter.count(messages) == expected


# --- incremental counting ----------------------------------------------------------------


def test_recounting_after_one_append_tokenizes_only_the_new_message() -> None:
    encoding = CountingEncoding()
    counter = BuiltinTokenCounter(encoding=encoding)
    messages = transcript(2_000)
    first = counter.count(messages, [WEATHER])
    tokenized_first = len(encoding.texts)
    assert tokenized_first >= 2_000

    new = Message.user("One more question about the weather in Oslo.")
    second = counter.count([*messages, new], [WEATHER])

    assert encoding.texts[tokenized_first:] == ["One more question about the weather in Oslo."]
    assert second == first + counter.message_tokens(new)


def test_counting_the_same_transcript_again_tokenizes_nothing() -> None:
    encoding = CountingEncoding()
    counter = BuiltinTokenCounter(encoding=encoding)
    messages = transcript(300)
    counter.count(messages, [WEATHER])
    before = len(encoding.texts)
    counter.count(messages, [WEATHER])
    counter.count(messages[:100])
    assert len(encoding.texts) == before


def test_equal_messages_are_tokenized_once() -> None:
    encoding = CountingEncoding()
    counter = BuiltinTokenCounter(encoding=encoding)
    first = Message.user("the same words")
    twin = Message.user("the same words")
    assert first is not twin
    counter.count([first, twin])
    counter.count([twin])
    assert encoding.texts == ["the same words"]


def test_derived_counters_share_the_cache() -> None:
    from threadline.counting import DefaultReplayProjection

    encoding = CountingEncoding()
    counter = BuiltinTokenCounter(encoding=encoding)
    messages = transcript(50)
    counter.count(messages)
    before = len(encoding.texts)
    counter.with_projection(DefaultReplayProjection()).count(messages)
    assert len(encoding.texts) == before


def test_the_cache_is_bounded() -> None:
    counter = BuiltinTokenCounter(cache_size=64)
    counter.count(transcript(1_000))
    assert len(counter._shared.cache) <= 64


def test_recently_used_messages_survive_eviction() -> None:
    encoding = CountingEncoding()
    counter = BuiltinTokenCounter(encoding=encoding, cache_size=64)
    system = Message.system("Always kept in view.")
    for chunk in range(20):
        batch = [Message.user(f"message {chunk}-{n}") for n in range(10)]
        counter.count([system, *batch])
    assert encoding.texts.count("Always kept in view.") == 1


def test_concurrent_counts_agree_with_a_sequential_count() -> None:
    messages = transcript(600)
    # Counted on equal messages: the shared counter's first counts must price them.
    expected = BuiltinTokenCounter().count(transcript(600), [WEATHER])
    shared = BuiltinTokenCounter(cache_size=256)  # small: generations turn over mid-count
    start = threading.Barrier(8)
    results: list[int] = []
    errors: list[BaseException] = []

    def count_many() -> None:
        try:
            start.wait()
            for _ in range(5):
                results.append(shared.count(messages, [WEATHER]))
        except BaseException as exc:  # pragma: no cover - reported by the assert below
            errors.append(exc)

    threads = [threading.Thread(target=count_many) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert errors == []
    assert results == [expected] * 40


def test_tools_are_priced_once() -> None:
    encoding = CountingEncoding()
    counter = BuiltinTokenCounter(encoding=encoding)
    counter.count([], [WEATHER])
    before = len(encoding.texts)
    counter.count([], [WEATHER])
    assert len(encoding.texts) == before


def test_a_transcript_rewritten_in_place_is_counted_afresh() -> None:
    counter = BuiltinTokenCounter()
    messages = transcript(200)
    counter.count(messages)
    messages[50] = Message.user("A rewritten message in the middle, much longer than before " * 5)
    expected = sum(map(counter.message_tokens, messages)) + counter.overhead_tokens()
    assert counter.count(messages) == expected


def test_a_transcript_that_lost_its_oldest_messages_is_counted_afresh() -> None:
    counter = BuiltinTokenCounter()
    messages = transcript(200)
    counter.count(messages)
    kept = messages[:1] + messages[40:]
    expected = sum(map(counter.message_tokens, kept)) + counter.overhead_tokens()
    assert counter.count(kept) == expected
    assert counter.count(messages[:10]) == (
        sum(map(counter.message_tokens, messages[:10])) + counter.overhead_tokens()
    )


def test_counters_with_other_projections_do_not_reuse_each_others_totals() -> None:
    from threadline.counting import DefaultReplayProjection

    class ReplaysDisplayText:
        def replayed_reasoning(self, reasoning: Reasoning) -> Sequence[str]:
            return (reasoning.text,)

    default = BuiltinTokenCounter(projection=DefaultReplayProjection())
    replaying = default.with_projection(ReplaysDisplayText())
    messages = [Message.user("hi"), Message.assistant("ok", reasoning=Reasoning(text="thinking"))]
    assert replaying.count(messages) == default.count(messages) + tokens("thinking")
    assert default.count(messages) == replaying.count(messages) - tokens("thinking")


def test_text_with_lone_surrogates_is_counted_as_tiktoken_repairs_it() -> None:
    broken = "half a pair \ud83d here"
    repaired = len(o200k_base_encoding().encode_ordinary(broken))
    counter = BuiltinTokenCounter()
    messages = [Message.user("fine"), Message.user(broken)]
    assert counter.count(messages) == (4 + tokens("fine")) + (4 + repaired) + 3


def test_the_cost_cache_keeps_no_counted_message_alive() -> None:
    counter = BuiltinTokenCounter()
    kept = Message.user("still here " * 5)
    copies = [Message.user(f"a copy made for one call {i}") for i in range(50)]
    watch = [weakref.ref(m) for m in copies]
    before = counter.count([kept, *copies])
    counter.count([kept])  # the last transcript counted no longer holds the copies
    del copies
    gc.collect()
    assert all(ref() is None for ref in watch)
    assert counter.count([kept]) == before - sum(
        counter.count([Message.user(f"a copy made for one call {i}")]) - 3 for i in range(50)
    )


class DoublingEncoding:
    """Two tokens for every o200k_base token: a counter that prices differently."""

    def __init__(self) -> None:
        self._encoding = o200k_base_encoding()

    def encode_ordinary(self, text: str) -> list[int]:
        return self._encoding.encode_ordinary(text) * 2


def test_counters_that_price_differently_never_take_each_others_cached_costs() -> None:
    messages = transcript(40)
    plain_expected = BuiltinTokenCounter().count(list(transcript(40)))
    doubled_expected = BuiltinTokenCounter(encoding=DoublingEncoding()).count(transcript(40))
    plain, doubled = BuiltinTokenCounter(), BuiltinTokenCounter(encoding=DoublingEncoding())
    for _ in range(3):  # warm and cold, in both orders, on the very same message objects
        assert doubled.count(messages) == doubled_expected
        assert plain.count(messages) == plain_expected
        assert sum(map(doubled.message_tokens, messages)) == sum(
            map(doubled.message_tokens, transcript(40))
        )
    assert plain_expected != doubled_expected
