"""Reasoning is counted as the driver replays it: the default replay projection."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest

from threadline import Message, Reasoning
from threadline.counting import (
    ApproximateCounter,
    BuiltinTokenCounter,
    DefaultReplayProjection,
    ReplayProjection,
    o200k_base_encoding,
)

THOUGHT = "The user asks for the capital of France. That is Paris."
SIGNATURE = "EqQBCkgIARABGAIiQL2f9z0d+YmPq2yQ7bXcV0lNq8h1Yw=="
REDACTED = "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIw"


def tokens(text: str) -> int:
    return len(o200k_base_encoding().encode_ordinary(text))


def reasoning_cost(reasoning: Reasoning, counter: BuiltinTokenCounter | None = None) -> int:
    """What ``reasoning`` adds to an assistant message's count."""
    counter = counter or BuiltinTokenCounter()
    with_it = Message.assistant("Paris.", reasoning=reasoning)
    without = Message.assistant("Paris.")
    return counter.message_tokens(with_it) - counter.message_tokens(without)


def blocks(*items: dict[str, object]) -> bytes:
    return json.dumps(list(items)).encode()


def test_display_text_without_replay_state_costs_nothing() -> None:
    assert reasoning_cost(Reasoning(text=THOUGHT)) == 0
    assert DefaultReplayProjection().replayed_reasoning(Reasoning(text=THOUGHT)) == ()


@pytest.mark.parametrize("empty", [b"", b"   \n", b"null", b" null "])
def test_empty_blank_or_null_replay_state_costs_nothing(empty: bytes) -> None:
    assert reasoning_cost(Reasoning(text=THOUGHT, provider_reasoning=empty)) == 0


def test_a_thinking_block_costs_its_plaintext_and_signature() -> None:
    state = blocks({"type": "thinking", "thinking": THOUGHT, "signature": SIGNATURE})
    reasoning = Reasoning(provider_reasoning=state, provider="anthropic:claude-sonnet-4-5")
    assert DefaultReplayProjection().replayed_reasoning(reasoning) == (THOUGHT, SIGNATURE)
    assert reasoning_cost(reasoning) == tokens(THOUGHT) + tokens(SIGNATURE)


def test_a_redacted_block_costs_its_data() -> None:
    state = blocks({"type": "redacted_thinking", "data": REDACTED})
    reasoning = Reasoning(provider_reasoning=state)
    assert DefaultReplayProjection().replayed_reasoning(reasoning) == (REDACTED,)
    assert reasoning_cost(reasoning) == tokens(REDACTED)


def test_mixed_blocks_cost_every_replayed_piece_in_order() -> None:
    state = blocks(
        {"type": "thinking", "thinking": THOUGHT, "signature": SIGNATURE},
        {"type": "redacted_thinking", "data": REDACTED},
    )
    reasoning = Reasoning(provider_reasoning=state)
    assert DefaultReplayProjection().replayed_reasoning(reasoning) == (
        THOUGHT,
        SIGNATURE,
        REDACTED,
    )


def test_envelope_metadata_costs_nothing() -> None:
    short = blocks({"type": "thinking", "thinking": THOUGHT, "signature": SIGNATURE})
    long_envelope = blocks(
        {
            "type": "thinking_with_a_much_longer_type_name",
            "id": "rs_0123456789abcdef0123456789abcdef",
            "status": "completed",
            "index": 12345,
            "cached": True,
            "extra": None,
            "thinking": THOUGHT,
            "signature": SIGNATURE,
        }
    )
    assert reasoning_cost(Reasoning(provider_reasoning=long_envelope)) == reasoning_cost(
        Reasoning(provider_reasoning=short)
    )


def test_nested_replay_state_costs_its_nested_strings() -> None:
    # An OpenAI-Responses-like item: summary texts and encrypted content are replayed.
    state = json.dumps(
        {
            "type": "reasoning",
            "id": "rs_1",
            "summary": [{"type": "summary_text", "text": "Looked up the capital."}],
            "encrypted_content": "gAAAAABo-encrypted",
        }
    ).encode()
    replayed = DefaultReplayProjection().replayed_reasoning(Reasoning(provider_reasoning=state))
    assert replayed == ("Looked up the capital.", "gAAAAABo-encrypted")


def test_a_display_copy_beside_its_replay_state_is_not_counted_twice() -> None:
    state = blocks({"type": "thinking", "thinking": THOUGHT, "signature": SIGNATURE})
    with_copy = Reasoning(text=THOUGHT, provider_reasoning=state)
    without_copy = Reasoning(provider_reasoning=state)
    assert reasoning_cost(with_copy) == reasoning_cost(without_copy)
    assert reasoning_cost(with_copy) == tokens(THOUGHT) + tokens(SIGNATURE)


@pytest.mark.parametrize(
    "broken",
    [b'[{"type": "thinking", "thinking": "cut o', b"\xff\xfe not utf-8", b"{'single': 'quotes'}"],
)
def test_invalid_json_is_counted_as_raw_text_without_failing(broken: bytes) -> None:
    reasoning = Reasoning(provider_reasoning=broken)
    raw = broken.decode("utf-8", errors="replace")
    assert DefaultReplayProjection().replayed_reasoning(reasoning) == (raw,)
    assert reasoning_cost(reasoning) == tokens(raw)


def test_deeply_nested_replay_state_does_not_crash() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    assert reasoning_cost(Reasoning(provider_reasoning=deep)) >= 0
    nested = b'{"a": ' * 500 + b'"leaf"' + b"}" * 500
    replayed = DefaultReplayProjection().replayed_reasoning(Reasoning(provider_reasoning=nested))
    assert replayed == ("leaf",)


def test_all_default_projections_are_equal_and_satisfy_the_protocol() -> None:
    assert DefaultReplayProjection() == DefaultReplayProjection()
    assert hash(DefaultReplayProjection()) == hash(DefaultReplayProjection())
    assert isinstance(DefaultReplayProjection(), ReplayProjection)


class ReplaysDisplayText:
    """A driver projection that sends the display text back (as some servers want)."""

    def replayed_reasoning(self, reasoning: Reasoning) -> Sequence[str]:
        return (reasoning.text,)


class UnhashableProjection:
    __hash__ = None  # type: ignore[assignment]

    def replayed_reasoning(self, reasoning: Reasoning) -> Sequence[str]:
        return (reasoning.text, reasoning.text)


def test_a_driver_projection_decides_what_is_counted() -> None:
    reasoning = Reasoning(text=THOUGHT)
    bound = BuiltinTokenCounter().with_projection(ReplaysDisplayText())
    assert reasoning_cost(reasoning, bound) == tokens(THOUGHT)
    assert ApproximateCounter(projection=ReplaysDisplayText()).message_tokens(
        Message.assistant(reasoning=reasoning)
    ) > ApproximateCounter().message_tokens(Message.assistant(reasoning=reasoning))


def test_counters_with_different_projections_share_a_cache_but_not_reasoning_costs() -> None:
    default = BuiltinTokenCounter()
    replaying = default.with_projection(ReplaysDisplayText())
    message = Message.assistant("Paris.", reasoning=Reasoning(text=THOUGHT))
    assert default.message_tokens(message) == 4 + tokens("Paris.")
    assert replaying.message_tokens(message) == 4 + tokens("Paris.") + tokens(THOUGHT)
    assert default.message_tokens(message) == 4 + tokens("Paris.")


def test_an_unhashable_projection_still_counts() -> None:
    counter = BuiltinTokenCounter(projection=UnhashableProjection())
    message = Message.assistant("Paris.", reasoning=Reasoning(text="abc"))
    expected = 4 + tokens("Paris.") + 2 * tokens("abc")
    assert counter.message_tokens(message) == expected
    assert counter.count([message, message]) == 2 * expected + 3
