"""Anthropic's ``compaction`` block opens the sent window, whatever the transcript.

For any transcript of turns whose assistant messages carry no state, thinking,
this model's compaction block, another model's, or one whose summary failed
(``content`` null): the run loop hands the driver the system messages and the
messages from the latest block this model made with a summary on (everything
when there is none; a failed one opens nothing), the driver called directly with the
whole transcript sends the same body, and no other model's block is ever sent.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from threadline import Message, Model, Reasoning, Role
from threadline.drivers import AnthropicDriver, ProviderCall
from threadline.drivers.anthropic._request import encode_request
from threadline.engine._replay import sent_form

MODEL = Model("claude-test", context_size=200_000)
LABEL = "anthropic:claude-test"
KINDS = ("none", "thinking", "ours", "theirs", "failed")


def assistant(turn: int, kind: str) -> Message:
    words = f"answer {turn}"
    if kind == "none":
        return Message.assistant(words)
    block: dict[str, Any]
    if kind == "thinking":
        block = {"type": "thinking", "thinking": f"hmm {turn}", "signature": "sig"}
    elif kind == "failed":  # the API's block when the summary failed: a no-op, round-tripped
        block = {"type": "compaction", "content": None}
    else:
        block = {"type": "compaction", "content": f"summary {turn} by {kind}"}
    provider = "anthropic:other" if kind == "theirs" else LABEL
    return Message.assistant(
        words, reasoning=Reasoning(provider_reasoning=json.dumps([block]), provider=provider)
    )


def transcript(kinds: list[str], system: bool) -> tuple[Message, ...]:
    messages: list[Message] = [Message.system("Be brief.")] if system else []
    for turn, kind in enumerate(kinds):
        messages += [Message.user(f"question {turn}"), assistant(turn, kind)]
    return (*messages, Message.user("last question"))


def body(messages: tuple[Message, ...]) -> dict[str, Any]:
    call = ProviderCall(model=MODEL, messages=messages)
    encoded = encode_request(call, stream=False, label=LABEL, default_max_tokens=100)
    document: dict[str, Any] = json.loads(encoded.body)
    return document


@settings(max_examples=80, deadline=None)
@given(kinds=st.lists(st.sampled_from(KINDS), max_size=8), system=st.booleans())
def test_only_the_window_from_the_latest_own_block_is_sent(kinds: list[str], system: bool) -> None:
    messages = transcript(kinds, system)
    ours = [
        i
        for i, m in enumerate(messages)
        if m.reasoning and b"by ours" in m.reasoning.provider_reasoning
    ]
    start = ours[-1] if ours else 0
    expected = [m for m in messages[:start] if m.role is Role.SYSTEM] + list(messages[start:])

    handed = sent_form(messages, AnthropicDriver(api_key="k"), MODEL)
    assert [m.text for m in handed] == [m.text for m in expected]

    whole, window = body(messages), body(handed)
    assert whole == window  # the driver called directly cuts where the run loop does
    text = json.dumps(whole)
    assert "by theirs" not in text
    assert "hmm" not in text  # no earlier turn's thinking: the last message is a user's
    if ours:
        first = whole["messages"][0]
        assert first["role"] == "assistant"
        assert first["content"][0]["content"] == f"summary {(start - system) // 2} by ours"
        assert text.count("by ours") == 1  # earlier blocks went with the turns they stand for
    else:
        assert len(whole["messages"]) == len(messages) - system
