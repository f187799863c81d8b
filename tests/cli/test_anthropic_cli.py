"""The command line picks AnthropicDriver: `--provider anthropic` or ANTHROPIC_API_KEY set."""

from __future__ import annotations

import pytest

# The driver choice is a function of the private CLI module; the command's own
# tests drive it end to end.
from threadline.cli._app import build_driver, parser
from threadline.drivers import AnthropicDriver, OpenAIChatDriver

pytestmark = pytest.mark.anyio


async def test_provider_flag_builds_the_anthropic_driver() -> None:
    args = parser().parse_args(["chat", "--provider", "anthropic", "--model", "claude-x"])
    driver, model, _ = build_driver(args)
    async with driver:
        assert isinstance(driver, AnthropicDriver)
    assert (model.name, model.context_size) == ("claude-x", 200_000)


async def test_an_anthropic_key_in_the_environment_picks_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env")
    driver, _, _ = build_driver(parser().parse_args(["chat"]))
    async with driver:
        assert isinstance(driver, AnthropicDriver)


async def test_an_openai_key_still_wins_over_an_anthropic_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-env")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    driver, _, _ = build_driver(parser().parse_args(["chat"]))
    async with driver:
        assert isinstance(driver, OpenAIChatDriver)
