"""The tokenizer under the built-in counter: bpe-openai when installed, else tiktoken.

Both must give the same o200k_base counts; the comparisons here run wherever
the ``fast-tokenizer`` extra is installed, as the ``test`` extra installs it.
"""

from __future__ import annotations

import importlib.util
import logging
import sys
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from threadline import Message, Tool, ToolCall
from threadline.counting import BuiltinTokenCounter, _lengths, o200k_base_encoding
from threadline.counting._lengths import TokenLengths, o200k_base_lengths, repair_surrogates

needs_bpe_openai = pytest.mark.skipif(
    importlib.util.find_spec("bpe_openai") is None,
    reason="the fast-tokenizer extra (bpe-openai) is not installed",
)


def bpe_openai() -> TokenLengths:
    """o200k_base's lengths, which must be bpe-openai's here (never tiktoken's twice)."""
    lengths = o200k_base_lengths()
    assert lengths.tokenizer == "bpe-openai"
    return lengths


def tiktoken_tokens(text: str) -> int:
    return len(o200k_base_encoding().encode_ordinary(text))


@pytest.fixture
def fresh_choice(monkeypatch: pytest.MonkeyPatch) -> None:
    """o200k_base's tokenizer chosen again on the next count; the process's own
    choice comes back after the test."""
    monkeypatch.setattr(_lengths, "_o200k_base", None)


HAND_PICKED = [
    "",
    "hello world",
    "I'm sure they'll say it's ours; THEY'LL SAY IT'S OURS",
    "  indented\n\tcode()\r\n\r\n   \n",
    "1234567890 3.14159 1,000,000 2024-12-01T10:00:00Z",
    "中文分词测试, 日本語のテキスト, 한국어 문장",
    "emoji 👍🏽 family 👨‍👩‍👧 flags 🇳🇴 and é (e\u0301)",
    "<|endoftext|> and <|endofprompt|> as plain text",
    'def f(x):\n    return {"a": [1, 2, 3]}  # comment\n',
    "a" * 5_000,
    " " * 3_000 + "x",
    "\u00a0\u2028\u3000 unusual blanks \u200b\u200d",
    "ÀÉÎÕÜ àéîõü Ǆǅǆ ǈǋ ﬁ",
]


@needs_bpe_openai
@pytest.mark.parametrize("text", HAND_PICKED)
def test_bpe_openai_counts_hand_picked_texts_as_tiktoken(text: str) -> None:
    assert bpe_openai().count(text) == tiktoken_tokens(text)


@needs_bpe_openai
@settings(max_examples=400, deadline=None)
@given(st.text(max_size=300))
def test_bpe_openai_counts_any_text_as_tiktoken(text: str) -> None:
    assert bpe_openai().count(text) == tiktoken_tokens(text)


# st.characters() never draws a surrogate: these are mixed in by hand.
SURROGATES = st.sampled_from(["\ud800", "\udbff", "\udc00", "\udfff", "\ud83d"])


@needs_bpe_openai
@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.characters(), SURROGATES), max_size=100).map("".join))
def test_bpe_openai_counts_text_with_lone_surrogates_as_tiktoken(text: str) -> None:
    assert bpe_openai().safe_count(text) == tiktoken_tokens(text)


PIECES = ["the", " ", "  ", "\n", "'s", "42", "1234", "é", "中", "!?", "\t"]


@needs_bpe_openai
@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(PIECES)))
def test_bpe_openai_counts_runs_of_pieces_as_tiktoken(pieces: list[str]) -> None:
    # Runs of blanks, digits and punctuation are where pre-tokenizers differ.
    text = "".join(pieces)
    assert bpe_openai().count(text) == tiktoken_tokens(text)


@needs_bpe_openai
def test_the_fast_path_refuses_lone_surrogates_and_the_safe_path_repairs_them() -> None:
    broken = "tool output \ud800 cut in half"
    with pytest.raises(UnicodeEncodeError):
        bpe_openai().count(broken)
    assert bpe_openai().safe_count(broken) == tiktoken_tokens(broken)
    assert repair_surrogates(broken) == "tool output \ufffd cut in half"


@needs_bpe_openai
def test_a_counter_on_tiktoken_counts_a_transcript_as_the_default_one() -> None:
    call = ToolCall(id="call_1", name="get_weather", arguments='{"city": "Oslo"}')
    transcript = [
        Message.system("You are terse."),
        Message.user("Weather in Oslo? \ud83d half an emoji"),
        Message.assistant(tool_calls=[call]),
        Message.tool("call_1", "12 °C, rain", name="get_weather"),
        Message.assistant("It is 12 °C and raining in Oslo."),
    ]
    tool = Tool(name="get_weather", description="Weather.", parameters={"type": "object"})
    bpe_openai()
    default = BuiltinTokenCounter().count(transcript, [tool])
    on_tiktoken = BuiltinTokenCounter(encoding=o200k_base_encoding()).count(transcript, [tool])
    assert default == on_tiktoken


@pytest.mark.usefixtures("fresh_choice")
def test_without_bpe_openai_the_counter_counts_with_tiktoken(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(_lengths, "_bpe_openai_bindings", lambda: None)  # not installed
    lengths = o200k_base_lengths()
    assert lengths.tokenizer == "tiktoken"
    assert BuiltinTokenCounter().count([Message.user("hello world")]) == 4 + 2 + 3
    assert lengths.counts(["hello world", "I'm"]) == [2, tiktoken_tokens("I'm")]
    assert lengths.safe_count("a\ud800b") == tiktoken_tokens("a\ud800b")
    assert "bpe-openai" not in caplog.text  # not installed is no warning


@needs_bpe_openai
@pytest.mark.usefixtures("fresh_choice")
def test_an_unusable_bpe_openai_is_logged_and_tiktoken_counts(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(name: str) -> object:
        raise RuntimeError(f"no data for {name}")

    monkeypatch.setattr(_lengths._bpe_openai_bindings(), "tokenizer_for_encoding", broken)
    with caplog.at_level(logging.WARNING, logger="threadline.counting"):
        lengths = o200k_base_lengths()
    assert lengths.tokenizer == "tiktoken"
    assert "bpe-openai is installed but unusable (no data for o200k_base)" in caplog.text
    assert lengths.count("hello world") == 2


@needs_bpe_openai
def test_the_extension_is_found_without_running_the_package_and_only_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The package's __init__ builds Python tables of every vocabulary: not needed.
    monkeypatch.delitem(sys.modules, "bpe_openai._bindings", raising=False)
    monkeypatch.delitem(sys.modules, "bpe_openai", raising=False)
    loaded = _lengths._bpe_openai_bindings()
    assert "bpe_openai" not in sys.modules
    assert sys.modules["bpe_openai._bindings"] is loaded
    assert _lengths._bpe_openai_bindings() is loaded
    assert loaded.tokenizer_for_encoding("o200k_base").count("hello world") == 2


def test_no_bpe_openai_package_means_no_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delitem(sys.modules, "bpe_openai._bindings", raising=False)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert _lengths._bpe_openai_bindings() is None


@pytest.mark.usefixtures("fresh_choice")
@pytest.mark.parametrize(
    "failure",
    [
        ImportError("bpe-openai is installed without its bpe_openai._bindings extension"),
        ValueError("bpe_openai.__spec__ is None"),  # what find_spec raises for a stub module
    ],
)
def test_a_bpe_openai_that_fails_to_load_is_logged_and_tiktoken_counts(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, failure: Exception
) -> None:
    def failing() -> object:
        raise failure

    monkeypatch.setattr(_lengths, "_bpe_openai_bindings", failing)
    with caplog.at_level(logging.WARNING, logger="threadline.counting"):
        lengths = o200k_base_lengths()
    assert lengths.tokenizer == "tiktoken"
    assert f"bpe-openai is installed but unusable ({failure})" in caplog.text


@pytest.mark.usefixtures("fresh_choice")
def test_the_choice_is_made_once_even_by_threads_counting_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    made: list[TokenLengths | None] = []
    real = _lengths._bpe_openai
    start = threading.Barrier(8)

    def watched() -> TokenLengths | None:
        made.append(real())
        return made[-1]

    monkeypatch.setattr(_lengths, "_bpe_openai", watched)

    def first_count(_: int) -> TokenLengths:
        start.wait()
        return o200k_base_lengths()

    with ThreadPoolExecutor(max_workers=8) as pool:
        found = list(pool.map(first_count, range(8)))
    assert len(made) == 1
    assert len(found) == 8
    assert all(lengths is found[0] for lengths in found)
