"""The command line picks OpenAIResponsesDriver with `--provider openai-responses`."""

from __future__ import annotations

import pytest

# The driver choice is a function of the private CLI module; the command's own
# tests drive it end to end.
from threadline.cli._app import build_driver, parser
from threadline.drivers import OpenAIResponsesDriver

pytestmark = pytest.mark.anyio


async def test_provider_flag_builds_the_responses_driver(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL", raising=False)
    monkeypatch.delenv("THREADLINE_BASE_URL", raising=False)
    args = parser().parse_args(["chat", "--provider", "openai-responses", "--model", "gpt-5-mini"])
    driver, model, _ = build_driver(args)
    async with driver:
        assert isinstance(driver, OpenAIResponsesDriver)
        assert "api.openai.com" in repr(driver)
    assert model.name == "gpt-5-mini"
