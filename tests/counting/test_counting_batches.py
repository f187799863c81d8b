"""The built-in counter's batch paths (a cold count, the new end of a transcript, a mix
of cached and new messages) against a cost written out from the framing rules alone."""

from __future__ import annotations

import pickle
from collections.abc import Sequence

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from threadline import ImagePart, Message, Origin, Reasoning, TextPart, ToolCall
from threadline.counting import BuiltinTokenCounter, DefaultReplayProjection, o200k_base_encoding


def tokens(text: str) -> int:
    return len(o200k_base_encoding().encode_ordinary(text))


def reference_cost(message: Message) -> int:
    """A message's cost by the documented rules, computed one piece at a time."""
    cost = 4
    if isinstance(message.content, str):
        cost += tokens(message.content)
    else:
        for part in message.content:
            if isinstance(part, ImagePart):
                cost += 85 if part.detail == "low" else 765
            else:
                cost += tokens(part.text)
    if message.name:
        cost += 1 + tokens(message.name)
    if message.tool_call_id is not None:
        cost += 4 + tokens(message.tool_call_id)
    for call in message.tool_calls:
        cost += 7 + tokens(call.id) + tokens(call.name) + tokens(call.arguments)
    if message.reasoning is not None:
        replayed = DefaultReplayProjection().replayed_reasoning(message.reasoning)
        cost += sum(map(tokens, replayed))
    return cost


def reference_count(messages: Sequence[Message]) -> int:
    return sum(map(reference_cost, messages)) + 3


def fresh(messages: Sequence[Message]) -> list[Message]:
    """Equal messages that no counter has priced yet."""
    return [attrs.evolve(message) for message in messages]


class OnlyEncodeOrdinary:
    """A user encoding with nothing but ``encode_ordinary``; it records what it is given."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def encode_ordinary(self, text: str) -> list[int]:
        self.texts.append(text)
        return o200k_base_encoding().encode_ordinary(text)


# Texts that tokenizers treat specially: a special token's marker (plain text here),
# lone surrogates (tiktoken repairs them), empty text, non-Latin scripts.
_special_texts = st.sampled_from(
    ["<|endoftext|>", "a <|endofprompt|> b", "half a pair \ud83d here", "", "日本語 ✓", "x"]
)
_texts = st.one_of(st.text(max_size=30), _special_texts)
_parts = st.lists(
    st.one_of(
        st.builds(TextPart, text=_texts),
        st.builds(ImagePart, url=st.just("https://x/y.png"), detail=st.sampled_from([None, "low"])),
    ),
    max_size=3,
)
_calls = st.builds(ToolCall, id=_texts, name=st.text(min_size=1, max_size=8), arguments=_texts)
_reasoning = st.builds(
    Reasoning,
    text=_texts,
    provider_reasoning=st.sampled_from([b"", b'[{"type": "thinking", "thinking": "x y"}]']),
)
_names = st.none() | st.sampled_from(["", "ann", "<|endoftext|>"])
_messages = st.one_of(
    st.builds(Message.user, _texts),  # the plain shape
    st.builds(Message.system, _texts),
    st.builds(Message.user, _texts | _parts, name=_names),
    st.builds(
        Message.assistant,
        _texts,
        tool_calls=st.lists(_calls, max_size=2),
        reasoning=st.none() | _reasoning,
        name=_names,
    ),
    st.builds(Message.tool, st.text(min_size=1, max_size=12), _texts, name=_names),
)


@settings(max_examples=150, deadline=None)
@given(messages=st.lists(_messages, max_size=12))
def test_a_cold_count_of_any_shapes_is_the_sum_of_the_framing_rules(
    messages: list[Message],
) -> None:
    expected = reference_count(messages)
    assert BuiltinTokenCounter().count(messages) == expected
    assert BuiltinTokenCounter().count(messages) == expected  # warm: read off the messages
    assert BuiltinTokenCounter().count(fresh(messages)) == expected
    own = BuiltinTokenCounter(encoding=OnlyEncodeOrdinary())
    assert own.count(fresh(messages)) == expected
    # (An empty count in between, so that no count is taken from the one before:
    # a transcript equal to the last one counted is.)
    assert own.count([]) == 3
    assert own.count(messages) == expected  # priced with another encoding: kept by identity
    assert own.count([]) == 3
    assert own.count(messages) == expected  # and read back from there


@settings(max_examples=100, deadline=None)
@given(
    old=st.lists(_messages, min_size=1, max_size=8),
    new=st.lists(_messages, max_size=6),
    cut=st.integers(min_value=0, max_value=8),
)
def test_a_transcript_cut_at_its_start_and_grown_counts_like_a_cold_one(
    old: list[Message], new: list[Message], cut: int
) -> None:
    counter = BuiltinTokenCounter(encoding=OnlyEncodeOrdinary())
    counter.count(old)
    kept = old[cut:] + new
    assert counter.count(kept) == reference_count(kept)
    mixed = fresh(old[:cut]) + old[cut:] + new + old[:cut]
    assert counter.count(mixed) == reference_count(mixed)


def test_plain_messages_only_are_priced_in_one_batch_and_tokenized_once_each() -> None:
    encoding = OnlyEncodeOrdinary()
    counter = BuiltinTokenCounter(encoding=encoding)
    messages = [Message.user(f"question {n}") for n in range(50)] + [Message.user("question 0")]
    assert counter.count(messages) == reference_count(messages)
    assert sorted(encoding.texts) == sorted({f"question {n}" for n in range(50)})


def test_each_distinct_text_of_a_mixed_batch_is_tokenized_once() -> None:
    encoding = OnlyEncodeOrdinary()
    counter = BuiltinTokenCounter(encoding=encoding)
    call = ToolCall(id="call_1", name="get_weather", arguments='{"city": "Oslo"}')
    messages = [
        Message.user("What is the weather?", name="ann"),
        Message.assistant(tool_calls=[call]),
        Message.tool("call_1", "Sunny"),
        Message.user([TextPart(text="What is the weather?"), ImagePart(url="https://x/y.png")]),
    ]
    assert counter.count(messages) == reference_count(messages)
    assert len(encoding.texts) == len(set(encoding.texts))
    assert set(encoding.texts) == {
        "What is the weather?",
        "ann",
        "call_1",
        "get_weather",
        '{"city": "Oslo"}',
        "Sunny",
    }


def test_a_text_shared_by_a_plain_message_and_another_shape_is_tokenized_once() -> None:
    # Other shapes are priced first, one by one; the plain messages after them, in one
    # batch that looks up what was tokenized already.
    encoding = OnlyEncodeOrdinary()
    counter = BuiltinTokenCounter(encoding=encoding)
    call = ToolCall(id="call_7", name="get_weather", arguments="Sunny")
    messages = [
        Message.user("Sunny"),
        Message.assistant(tool_calls=[call]),
        Message.tool("call_7", "Sunny"),
        Message.assistant("get_weather"),
        Message.user("call_7", name="ann"),
        Message.user("Sunny"),
    ]
    assert counter.count(messages) == reference_count(messages)
    assert sorted(encoding.texts) == sorted({"Sunny", "call_7", "get_weather", "ann"})


def test_a_message_with_reasoning_among_other_shapes_is_priced_by_the_projection() -> None:
    thinking = b'[{"type": "thinking", "thinking": "think it through"}]'
    reasoning = Reasoning(text="think it through", provider_reasoning=thinking)
    call = ToolCall(id="c1", name="f", arguments="{}")
    messages = [
        Message.user("hi"),
        Message.assistant(tool_calls=[call]),
        Message.tool("c1", "done"),
        Message.assistant("the answer", reasoning=reasoning),
        Message.user("thanks", name="ann"),
    ]
    assert BuiltinTokenCounter().count(messages) == reference_count(messages)
    replayed = DefaultReplayProjection().replayed_reasoning(reasoning)
    assert sum(map(tokens, replayed)) > 0  # the projection's share is in the reference


def test_a_special_token_marker_is_counted_as_plain_text() -> None:
    messages = [Message.user("<|endoftext|>"), Message.tool("<|endofprompt|>", "<|endoftext|>")]
    marker = len(o200k_base_encoding().encode_ordinary("<|endoftext|>"))
    assert marker > 1
    assert BuiltinTokenCounter().count(messages) == reference_count(messages)
    assert BuiltinTokenCounter().message_tokens(Message.user("<|endoftext|>")) == 4 + marker


def test_lone_surrogates_anywhere_in_a_batch_are_counted_as_tiktoken_repairs_them() -> None:
    broken = "half a pair \ud83d here"
    call = ToolCall(id="c1", name="f", arguments=broken)
    messages = [
        Message.user("fine"),
        Message.assistant(tool_calls=[call]),
        Message.tool("c1", broken),
        Message.user(broken),
    ]
    assert BuiltinTokenCounter().count(messages) == reference_count(messages)


def test_a_message_made_without_init_is_counted() -> None:
    # An unpickled message has no cost slot set: it is read as "no cost yet, shape unknown".
    original = [Message.user("kept across a pickle"), Message.tool("c1", "result")]
    copies = pickle.loads(pickle.dumps(original))
    assert copies == original
    assert BuiltinTokenCounter().count(copies) == reference_count(original)
    assert (
        BuiltinTokenCounter().count(copies + fresh(original)) == 2 * reference_count(original) - 3
    )
    # Nor has its copy with another origin: it is not taken for plain text.
    turned = [message.with_origin(Origin.TURN) for message in pickle.loads(pickle.dumps(original))]
    assert BuiltinTokenCounter().count(turned) == reference_count(original)


def test_a_copy_with_another_origin_keeps_the_count_of_its_original() -> None:
    encoding = OnlyEncodeOrdinary()
    counter = BuiltinTokenCounter(encoding=encoding)
    message = Message.user("counted once, whatever its origin")
    cost = counter.message_tokens(message)
    before = len(encoding.texts)
    assert counter.message_tokens(message.with_origin(Origin.TURN)) == cost
    assert counter.message_tokens(message.with_origin(Origin.INJECTION)) == cost
    assert len(encoding.texts) == before


def test_default_counters_share_the_costs_on_the_messages() -> None:
    messages = [Message.user("shared"), Message.tool("c1", "by every default counter")]
    first = BuiltinTokenCounter().count(messages)
    assert first == reference_count(messages)
    # Another default counter reads the costs off the messages; a counter with its own
    # encoding prices them itself, and neither disturbs the other.
    assert BuiltinTokenCounter().count(messages) == first
    framing = 3 + 4 + (4 + 4)  # the reply, a message, a tool result
    doubled = BuiltinTokenCounter(encoding=Doubling())
    assert doubled.count(messages) == framing + 2 * (first - framing)
    assert BuiltinTokenCounter().count(messages) == first


class Doubling:
    def encode_ordinary(self, text: str) -> list[int]:
        return o200k_base_encoding().encode_ordinary(text) * 2


@pytest.mark.parametrize("size", [1, 2, 300])
def test_a_grown_transcript_prices_only_its_new_end(size: int) -> None:
    encoding = OnlyEncodeOrdinary()
    counter = BuiltinTokenCounter(encoding=encoding)
    messages = [Message.user(f"turn {n}") for n in range(size)]
    counter.count(messages)
    grown = [*messages, Message.assistant("new answer"), Message.tool("c9", "new result")]
    before = len(encoding.texts)
    assert counter.count(grown) == reference_count(grown)
    assert sorted(encoding.texts[before:]) == ["c9", "new answer", "new result"]


def test_a_tools_schema_is_counted_as_its_json_text() -> None:
    import json

    from threadline import Tool

    parameters = {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "Ville, 日本"},
            "n": {"maximum": 2.5},
        },
        "required": ["city"],
    }
    tool = Tool(name="lookup", description="Looks things up.", parameters=parameters)
    text = json.dumps(parameters, ensure_ascii=False)
    expected = 13 + tokens("lookup") + tokens("Looks things up.") + tokens(text)
    assert BuiltinTokenCounter().tool_tokens(tool) == expected
