"""What calibration believes of a provider before its first report: a prior per class.

Every class's slope has a prior mean and a prior uncertainty (a standard
deviation), and a fit is pulled towards the mean as strongly as that
uncertainty says (``_slopes``: the ridge of a class is the reports' noise
over its prior variance). A class the reports have said little about keeps
its prior uncertainty, and where the count decides what is sent it is priced
that far above its mean: high, not at the mean.

The text priors are measured, not chosen: ``benchmarks/derive_calibration_priors.py``
tokenizes a sample of each script with thirteen vocabularies (eleven from
llama.cpp's source tree, SmolLM2's and o200k_base itself) and prints their
tokens per o200k token (:data:`MEASURED`). Three of them are the vocabularies
of families ``bench_counting_heldout.py`` measures (Llama 3's, Command-R's,
DeepSeek's), so it measures each family on the prior without its own
vocabulary's row (:func:`prior_of`): no family is measured on a prior that saw
it. The prior of the text slopes is those rows' mean and covariance: the
spread is wide because vocabularies are (one spends 0.9 tokens per o200k
token on Korean, another 3.9), and the letters of most scripts move together
(a vocabulary with few Cyrillic merges tends to have few Arabic ones), so the
first reports of some scripts say something of the others; digits move with
none (whether a vocabulary splits numbers into single digits is its
pre-tokenizer's rule). Thirteen rows are too few to know 66 correlations, so
the correlations are shrunk towards none by as much as the rows say they are
unsure (:func:`correlation_shrinkage`, Schäfer and Strimmer's estimate).

The other three classes are the chat template's, not the vocabulary's: a
template may leave tool calls and results out (a slope of 0) or spell them
at length, and spends on a message's framing from nothing to a few times
o200k's four tokens; their prior is 1 give or take 1, independent of the rest,
but for the tool call's spread, which is measured: a template's tool calls are
unseen until the first tool round's report, and where they are priced at
their bound (:data:`BOUND_Z` deviations above the mean) that bound is the most
any of llama.cpp's templates spends on a call (:data:`TOOL_CALL_SPELLED`:
its control markers spelled as text, as a vocabulary that holds none of them
spells them, on the shortest call measured). A benchmark that holds a family
out leaves its template out of that too.
The fourth, ``system_dropped``, is measured on templates: of the 61 chat
templates llama.cpp ships that render a tool exchange, one (Mistral Nemo's)
leaves the system message out of a prompt a tool result ends
(``benchmarks/derive_template_prior.py``). So its slope is 0 (the template
shows it) with a probability of 61 in 63 (Laplace's rule of succession), and
else what the system message's text costs (Latin text's slope); its prior is
that mixture's mean and variance, and a fit weighs the two by the reports
(``_slopes``).
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Collection, Sequence
from typing import Final

from threadline.counting._calibration._classes import CLASSES, SCRIPTS

__all__ = [
    "BOUND_Z",
    "DROPPING_SHARE",
    "MEASURED",
    "PRIOR_COVARIANCE",
    "PRIOR_SLOPES",
    "PRIOR_UNCERTAINTY",
    "TOOL_CALL_SPELLED",
    "correlation_shrinkage",
    "prior_of",
]

MEASURED: Final = {
    # tokens per o200k token, by SCRIPTS
    "o200k_base": (1.00, 1.00, 1.00, 1.00, 1.00, 1.00, 1.00, 1.00, 1.00, 1.00, 1.00, 1.00),
    "aquila": (1.29, 1.84, 1.56, 1.04, 2.42, 2.44, 2.24, 3.15, 2.71, 1.66, 1.03, 2.03),
    "baichuan": (1.34, 1.97, 2.40, 1.00, 1.64, 2.82, 2.48, 3.29, 2.26, 0.84, 1.62, 1.29),
    "command-r": (1.00, 0.92, 0.63, 0.83, 0.91, 1.21, 0.85, 2.24, 2.47, 1.16, 1.61, 1.74),
    "deepseek-coder": (1.43, 1.68, 2.49, 1.54, 3.94, 4.24, 3.91, 5.85, 4.76, 1.75, 1.61, 2.60),
    "deepseek-llm": (1.29, 1.53, 1.79, 1.20, 2.67, 2.91, 2.61, 4.50, 4.18, 1.34, 1.61, 2.39),
    "falcon": (1.17, 3.34, 2.65, 1.76, 3.61, 3.18, 3.30, 4.88, 4.13, 1.16, 1.02, 2.53),
    "gpt-2": (1.34, 3.74, 2.67, 2.20, 3.42, 3.24, 2.97, 4.91, 4.32, 1.30, 0.77, 2.85),
    "gpt-neox": (1.29, 1.82, 1.56, 1.61, 2.42, 2.32, 2.24, 3.26, 2.68, 1.68, 1.02, 2.11),
    "llama-bpe": (1.17, 1.16, 1.05, 0.98, 1.00, 1.32, 2.42, 1.71, 1.21, 1.23, 1.00, 2.40),
    "mpt": (1.29, 1.82, 1.56, 1.61, 2.42, 2.32, 2.24, 3.26, 2.68, 1.68, 0.76, 2.11),
    "refact": (1.54, 1.74, 2.05, 1.26, 1.30, 2.50, 2.27, 3.79, 2.34, 1.16, 1.61, 2.00),
    "SmolLM2": (1.31, 2.63, 2.05, 2.22, 3.42, 3.00, 2.82, 3.76, 4.16, 1.39, 1.61, 2.53),
}
"""Printed by ``benchmarks/derive_calibration_priors.py``."""

TEMPLATE_PRIOR: Final = (1.0, 1.0)
"""The mean and standard deviation of the framing, tool call and tool result slopes (the
tool call's spread aside: :data:`TOOL_CALL_SPELLED`)."""

BOUND_Z: Final = 1.645
"""How many standard deviations above its fitted price new text is priced (and
below it what is gone): the one-sided 95% point of a normal distribution."""

TOOL_CALL_SPELLED: Final = {
    # the most tokens per o200k token of the tool class, markers spelled as text
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": 4.576,
    "Kimi-K3": 3.854,
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use": 3.770,
    "tencent-Hy3": 3.205,
    "upstage-Solar-Open-100B": 3.028,
    "Cohere2MoE": 2.925,
    "MiniMax-M3": 2.808,
    "deepseek-ai-DeepSeek-V3.1": 2.715,
    "deepseek-ai-DeepSeek-V3.2": 2.630,
    "deepseek-ai-DeepSeek-V4-Flash-0731": 2.630,
    "deepseek-ai-DeepSeek-V4": 2.630,
    "Kimi-K2-Thinking": 2.311,
    "Kimi-K2-Instruct": 2.297,
    "moonshotai-Kimi-K2": 2.255,
    "muse-glimmer": 2.125,
    "mistralai-Mistral-Nemo-Instruct-2407": 1.783,
    "MiniMax-M2": 1.665,
    "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16": 1.622,
    "GLM-4.6": 1.601,
    "inclusionai-ling-3.0-flash": 1.580,
    "Qwen3-Coder": 1.562,
    "StepFun3.5-Flash": 1.526,
    "Qwen3.5-4B": 1.521,
    "ibm-granite-granite-4.0": 1.451,
    "ibm-granite-granite-4.1": 1.451,
    "NVIDIA-Nemotron-Nano-v2": 1.446,
    "Spark2.5": 1.443,
    "MiMo-VL": 1.438,
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use": 1.438,
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": 1.438,
    "Qwen-QwQ-32B": 1.438,
    "Qwen-Qwen2.5-7B-Instruct": 1.438,
    "Qwen-Qwen3-0.6B": 1.438,
    "Reka-Edge": 1.392,
    "GigaChat3-10B-A1.8B": 1.383,
    "unsloth-Apriel-1.5": 1.382,
    "Apriel-1.6-15b-Thinker-fixed": 1.368,
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": 1.368,
    "Mistral-Small-3.2-24B-Instruct-2506": 1.366,
    "GLM-4.7-Flash": 1.346,
    "ByteDance-Seed-OSS": 1.286,
    "MiniMax-M1": 1.276,
    "google-gemma-4-31B-it": 1.201,
    "openbmb-MiniCPM5-1B": 1.146,
    "Bielik-11B-v3.0-Instruct": 1.104,
    "google-gemma-4-31B-it-interleaved": 1.071,
    "openai-gpt-oss-120b": 1.068,
    "GigaChat3.1-10B-A1.8B": 1.008,
    "meta-llama-Llama-3.1-8B-Instruct": 0.881,
    "meta-llama-Llama-3.2-3B-Instruct": 0.881,
    "meta-llama-Llama-3.3-70B-Instruct": 0.881,
    "mistralai-Ministral-3-14B-Reasoning-2512": 0.824,
    "unsloth-mistral-Devstral-Small-2507": 0.824,
    "meetkai-functionary-medium-v3.1": 0.731,
    "LFM2-8B-A1B": 0.646,
    "Apertus-8B-Instruct": 0.231,
    "ibm-granite-granite-3.3-2B-Instruct": 0.118,
    "HuggingFaceTB-SmolLM3-3B": 0.099,
    "LFM2.5-Instruct": 0.099,
    "llama-cpp-rwkv-world": 0.000,
    "microsoft-Phi-3.5-mini-instruct": 0.000,
}
"""Printed by ``benchmarks/derive_template_prior.py``: per chat template llama.cpp ships
(by file name), the most it spends per o200k token of the ``tool`` class on any call
measured, its control markers spelled as text. The tool call's prior spread is what
puts its bound at the most of these (:func:`prior_of`)."""


def correlation_shrinkage(columns: Sequence[Sequence[float]]) -> float:
    """How far towards none the correlations of ``columns`` (one per variable, as many
    values each) are best shrunk, from 0 (kept) to 1 (none): Schäfer and Strimmer's
    estimate (2005), the sum of the sample correlations' estimated variances over the
    sum of their squares. Few rows make each correlation unsure, and it shrinks them
    more; correlations far from 0, less."""
    size = len(columns[0])
    standard = []
    for column in columns:
        mean, spread = statistics.fmean(column), statistics.stdev(column)
        standard.append([(x - mean) / spread if spread else 0.0 for x in column])
    unsure = squares = 0.0  # each pair once: both sums count every pair alike
    for i, j in itertools.combinations(range(len(columns)), 2):
        products = [a * b for a, b in zip(standard[i], standard[j], strict=True)]
        mean = statistics.fmean(products)
        squares += (mean * size / (size - 1)) ** 2
        unsure += size / (size - 1) ** 3 * sum((p - mean) ** 2 for p in products)
    return min(1.0, unsure / squares) if squares else 1.0


def _text_prior(rows: Sequence[Sequence[float]]) -> tuple[list[float], list[list[float]]]:
    columns = list(zip(*rows, strict=True))
    means = [statistics.fmean(c) for c in columns]
    kept = 1.0 - correlation_shrinkage(columns)
    covariance = [
        [statistics.covariance(a, b) * (1.0 if i == j else kept) for j, b in enumerate(columns)]
        for i, a in enumerate(columns)
    ]
    return means, covariance


TEMPLATES_DROPPING_SYSTEM: Final = (1, 61)
"""Of llama.cpp's shipped chat templates that render a system message, a tool call and
its result, how many leave the system message out of a prompt a tool result ends
(Mistral Nemo's), and how many were rendered: printed by
``benchmarks/derive_template_prior.py``."""


DROPPING_SHARE: Final = (TEMPLATES_DROPPING_SYSTEM[0] + 1) / (TEMPLATES_DROPPING_SYSTEM[1] + 2)
"""The prior probability that a template leaves the system message out of a prompt a
tool result ends: the share of :data:`TEMPLATES_DROPPING_SYSTEM`, by Laplace's rule of
succession (2 in 63)."""


def _dropped(latin: float, latin_variance: float) -> tuple[float, float]:
    # A template shows the system message (the slope is 0) or drops it (the slope is what
    # its text costs, Latin text's, as unsure): the mean and variance of that mixture.
    share = DROPPING_SHARE
    mean = share * latin
    return mean, share * (latin**2 + latin_variance) - mean**2


def prior_of(
    excluding: Collection[str] = (),
) -> tuple[tuple[float, ...], tuple[tuple[float, ...], ...]]:
    """The prior slopes (by :data:`CLASSES`) and their covariance, measured over the rows
    of :data:`MEASURED` and :data:`TOOL_CALL_SPELLED` but those named in ``excluding``: a
    benchmark that holds a vocabulary or a template out measures calibration on a prior
    that never saw it.

    Raises:
        ValueError: a name that is not a row of either, or so many left out that fewer
            than three vocabularies are left to measure a spread from.
    """
    unknown = sorted(set(excluding) - MEASURED.keys() - TOOL_CALL_SPELLED.keys())
    if unknown:
        raise ValueError(
            f"no measured vocabulary or template is named {', '.join(map(repr, unknown))}"
        )
    rows = [row for name, row in MEASURED.items() if name not in excluding]
    if len(rows) < 3:
        raise ValueError(f"{len(rows)} measured vocabularies left: too few for a prior")
    text_means, text_covariance = _text_prior(rows)
    first = len(CLASSES) - len(SCRIPTS)
    means = [TEMPLATE_PRIOR[0]] * first + text_means
    size = len(CLASSES)
    covariance = [[0.0] * size for _ in range(size)]
    for i in range(first):
        covariance[i][i] = TEMPLATE_PRIOR[1] ** 2
    tool = CLASSES.index("tool")
    spent = [v for name, v in TOOL_CALL_SPELLED.items() if name not in excluding]
    most = max(spent, default=TEMPLATE_PRIOR[0])
    covariance[tool][tool] = max(TEMPLATE_PRIOR[1], (most - TEMPLATE_PRIOR[0]) / BOUND_Z) ** 2
    dropped = CLASSES.index("system_dropped")
    means[dropped], covariance[dropped][dropped] = _dropped(text_means[0], text_covariance[0][0])
    for i, row in enumerate(text_covariance):
        covariance[first + i][first:] = row
    return tuple(means), tuple(map(tuple, covariance))


PRIOR_SLOPES, PRIOR_COVARIANCE = prior_of()
"""Each class's slope before any report (by :data:`CLASSES`), and their covariance."""

PRIOR_UNCERTAINTY: Final = tuple(PRIOR_COVARIANCE[i][i] ** 0.5 for i in range(len(CLASSES)))
"""Each class's prior standard deviation, by :data:`CLASSES`."""
