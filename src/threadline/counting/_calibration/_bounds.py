"""What a calibration can believe: the bounds of a report, a ratio, a slope, an intercept.

A calibration learns from what providers report, and a report can be wrong:
a server's bug, a proxy that sums several calls, a hostile server. What a
calibration believes prices every later turn and is saved with the
conversation, so one wrong report must not decide them. Two rules, from the
vocabularies themselves (docs/counting.md has the measurements):

- **What no tokenizer can produce is refused.** Every byte-level BPE
  vocabulary, and every SentencePiece one with byte fallback, spends at most
  one token per byte of UTF-8 text and at least one per its longest token's
  bytes: 128 in o200k_base, cl100k_base and voyage3_base, 32 in SmolLM2's.
  So on any text one tokenizer's count is within :data:`MIN_RATIO` (1/128)
  and :data:`MAX_RATIO` (128) times o200k's: a report outside that of the
  estimate, and a saved ratio or text slope outside it, cannot be true.
  Neither can a prompt larger than the model's window, or a saved intercept
  past :data:`MAX_PROMPT_TOKENS`.
- **One report moves the calibration by a bounded step.** On real text the
  vocabularies are far closer: on the counting benchmark's conversation they
  spend 0.85 to 2.6 times o200k's tokens per script, and even one token a
  byte is 3.6 to 6 times. So a report more than :data:`MAX_STEP` times the
  calibration's own price of its prompt is taken as that many times, and a
  fit's slopes move at most that far per report; a provider whose counts
  really are that far off is believed a step at a time. (A report far
  *below* that price is the calibration's to judge: see ``_token_calibration``.)

A reply's output tokens are believed by the same measure (:func:`implausible_reply`),
and only while they agree with the prompts' reports (``_chance``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Final

from threadline.counting._calibration._classes import CLASSES

__all__ = [
    "MAX_PROMPT_TOKENS",
    "MAX_RATIO",
    "MAX_STEP",
    "MIN_RATIO",
    "MIN_REPLY_TOKENS",
    "bounded_slopes",
    "implausible",
    "implausible_reply",
    "slope_range",
    "stepped",
]

MAX_RATIO: Final = 128.0
"""The most tokens any tokenizer spends per o200k token of text: o200k's longest token
is 128 bytes, and no tokenizer spends more than one token a byte."""

MIN_RATIO: Final = 1 / MAX_RATIO
"""The fewest: o200k spends at most one token a byte, and no vocabulary measured has a
token longer than 128 bytes."""

MAX_STEP: Final = 4.0
"""How far one report moves a calibration: a report is taken as at most this many times
the calibration's price of its prompt, and a slope moves at most this factor per report.
Real vocabularies differ from o200k by at most 2.6 times per script on real text."""

MAX_PROMPT_TOKENS: Final = 100_000_000
"""The largest saved intercept believed: ten times the largest window any model has
(10 million tokens, Llama 4 Scout's, the largest in genai-prices' catalog)."""

_TEXT = frozenset(CLASSES[CLASSES.index("latin") :])


def implausible(reported: int, estimated: int, window: int | None) -> str | None:
    """Why a report of ``reported`` input tokens for a prompt estimated at ``estimated``
    cannot be true, or ``None`` when it can."""
    if window is not None and reported > window:
        return f"more than the model's window of {window}"
    ratio = reported / estimated
    if not MIN_RATIO <= ratio <= MAX_RATIO:
        return (
            f"{ratio:.3g} times the estimate of {estimated}, and no tokenizer spends less "
            f"than 1/128 or more than 128 times o200k's tokens"
        )
    return None


MIN_REPLY_TOKENS: Final = 8
"""The least o200k tokens of text a reply needs to be learned from: what a provider
counts beside the text (an end of turn, a stop sequence) is most of a shorter one."""


def implausible_reply(output_tokens: int, estimated: int) -> bool:
    """Whether ``output_tokens``, reported for a reply of text alone whose o200k
    estimate is ``estimated``, cannot be that text's count: under a quarter or over
    :data:`MAX_STEP` times twice the estimate. The vocabularies measured spend 0.6 to
    5.9 tokens per o200k token on any script (``_priors.MEASURED``); a count outside
    that holds something else (hidden reasoning) or is none (a constant)."""
    return not estimated / MAX_STEP <= output_tokens <= 2 * MAX_STEP * estimated


def stepped(reported: int, predicted: float) -> int:
    """``reported``, or at most :data:`MAX_STEP` times ``predicted`` (what the
    calibration priced the prompt at) when it is more."""
    return min(reported, max(1, math.floor(MAX_STEP * predicted)))


def slope_range(name: str) -> tuple[float, float]:
    """The slopes the class ``name`` (of :data:`CLASSES`) can have: at least
    :data:`MIN_RATIO` for text, which every tokenizer spends tokens on, and at least 0
    for framing and tool calls, which a chat template may leave out; at most
    :data:`MAX_RATIO`."""
    return (MIN_RATIO if name in _TEXT else 0.0), MAX_RATIO


def bounded_slopes(slopes: Sequence[float], previous: Sequence[float]) -> tuple[float, ...]:
    """``slopes``, each within :data:`MAX_STEP` of its ``previous`` value (a slope of 0
    may grow to 1) and within :func:`slope_range`."""
    bounded = []
    for name, slope, before in zip(CLASSES, slopes, previous, strict=True):
        low, high = slope_range(name)
        step_low, step_high = before / MAX_STEP, max(before * MAX_STEP, before + 1.0)
        bounded.append(min(high, max(low, step_low, min(step_high, slope))))
    return tuple(bounded)
