"""The model catalog: known windows from genai-prices' bundled data, a warning for the rest."""

from __future__ import annotations

import logging
import subprocess
import sys
import uuid
from decimal import Decimal

import pytest

from threadline import InvalidRequestError, Model, Usage


def test_a_known_model_gets_its_window_from_the_catalog() -> None:
    assert Model("gpt-4o-mini").context_size == 128_000
    assert Model("claude-sonnet-4-5").context_size == 200_000


def test_an_explicit_context_size_wins_over_the_catalog() -> None:
    assert Model("gpt-4o-mini", context_size=8_000).context_size == 8_000
    # An explicit None means "no window": no lookup, so no limiting.
    assert Model("gpt-4o-mini", context_size=None).context_size is None


def test_an_unknown_model_warns_once_per_name_that_limiting_is_off(
    caplog: pytest.LogCaptureFixture,
) -> None:
    name = f"no-such-model-{uuid.uuid4().hex}"
    with caplog.at_level(logging.WARNING, logger="threadline.models"):
        first = Model(name)
        Model(name)
    assert first.context_size is None
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    text = warnings[0].getMessage()
    assert name in text
    assert "not limited" in text
    assert "context_size" in text


def test_an_unknown_model_with_a_context_size_does_not_warn(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="threadline.models"):
        Model(f"my-finetune-{uuid.uuid4().hex}", context_size=32_768)
    assert caplog.records == []


def test_a_bad_context_size_is_still_refused() -> None:
    with pytest.raises(InvalidRequestError, match="context_size"):
        Model("gpt-4o-mini", context_size=0)


def test_cost_prices_a_usage_at_the_catalog_list_price() -> None:
    cost = Model("gpt-4o-mini").cost(
        Usage(input_tokens=1_000_000, output_tokens=1_000_000),
        api_url="https://api.openai.com/v1",
    )
    assert isinstance(cost, Decimal)
    assert cost > 0
    cheaper = Model("gpt-4o-mini").cost(Usage(input_tokens=1_000, output_tokens=0))
    assert cheaper is not None
    assert 0 < cheaper < cost


def test_cost_is_unknown_for_a_server_of_your_own_or_an_unknown_model() -> None:
    usage = Usage(input_tokens=1_000, output_tokens=100)
    assert Model("gpt-4o-mini").cost(usage, api_url="http://127.0.0.1:8080/v1") is None
    assert Model("local-model", context_size=2048).cost(usage) is None


def test_import_threadline_does_not_load_the_catalog() -> None:
    code = "import sys, threadline; print('genai_prices' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
