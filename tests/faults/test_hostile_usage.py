"""Hostile usage reports through both HTTP drivers, with calibration on.

A provider (faked at the transport with respx) answers a conversation honestly but for
one response, whose usage claims an absurd number of input tokens: 10^12, more than the
model's window, or one token for a prompt of hundreds. The conversation keeps its
history, is limited as an honest provider's counts say, and saves a calibration that a
resumed conversation in a fresh process can use.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import attrs
import httpx
import pytest
import respx

from threadline import (
    Agent,
    Client,
    Conversation,
    Model,
    ProviderResponseError,
)
from threadline.counting import TokenCalibration
from threadline.drivers import AnthropicDriver, Driver, OpenAIChatDriver, RetryPolicy

pytestmark = pytest.mark.anyio

WINDOW = 16_384
MODEL = Model("hostile-model", context_size=WINDOW)
OPENAI = "https://openai.example/v1"
ANTHROPIC = "https://anthropic.example"
KEY = "sk-hostile-0000000000000000"
NO_RETRY = RetryPolicy(max_retries=0)
INSTRUCTIONS = "You are a travel assistant. Answer in two or three plain sentences."
QUESTIONS = [
    f"Question {n}: tell me about the old town, its bridges, its markets and the best "
    f"time of year to walk there without the crowds, and what it costs to stay a week."
    for n in range(14)
]
ANSWER = (
    "The old town is quietest in early spring, when the markets open late and the "
    "bridges are empty before nine; a week in a small guest house costs about as much "
    "as three nights in a hotel by the river."
)


@attrs.define
class Provider:
    """A chat server (OpenAI's protocol or Anthropic's) that reports honest usage,
    about a token for every four characters of the request's JSON, except where
    ``lies`` says otherwise (by call, from 0). A request whose honest count is over
    ``limit`` is refused as too long, as a real server refuses it."""

    kind: str
    lies: dict[int, Any] = attrs.field(factory=dict)
    limit: int = WINDOW
    bodies: list[dict[str, Any]] = attrs.field(factory=list)
    refused: int = 0

    def driver(self) -> Driver:
        if self.kind == "openai":
            return OpenAIChatDriver(OPENAI, api_key=KEY, retry_policy=NO_RETRY)
        return AnthropicDriver(
            base_url=ANTHROPIC, api_key=KEY, retry_policy=NO_RETRY, prompt_caching=False
        )

    def route(self, mock: respx.MockRouter) -> None:
        if self.kind == "openai":
            mock.post(f"{OPENAI}/chat/completions").mock(side_effect=self.respond)
            return
        mock.post(f"{ANTHROPIC}/v1/messages").mock(side_effect=self.respond)
        # Anthropic can count a prompt before it is sent; that count is honest.
        count = mock.post(f"{ANTHROPIC}/v1/messages/count_tokens")
        count.mock(side_effect=self.count)

    def count(self, request: httpx.Request) -> httpx.Response:
        counted = honest_tokens(json.loads(request.content))
        return httpx.Response(200, json={"input_tokens": counted})

    def respond(self, request: httpx.Request) -> httpx.Response:
        body: dict[str, Any] = json.loads(request.content)
        honest = honest_tokens(body)
        if honest > self.limit:
            self.refused += 1
            return self.too_long(honest)
        self.bodies.append(body)
        call = len(self.bodies) - 1
        reported = self.lies.get(call, honest)
        if self.kind == "openai":
            return httpx.Response(200, json=openai_reply(reported))
        return httpx.Response(200, json=anthropic_reply(reported))

    def too_long(self, honest: int) -> httpx.Response:
        if self.kind == "openai":
            message = f"This model's maximum context length is {self.limit} tokens. "
            message += f"However, your messages resulted in {honest} tokens."
            error = {"message": message, "code": "context_length_exceeded"}
            return httpx.Response(400, json={"error": error})
        message = f"prompt is too long: {honest} tokens > {self.limit} maximum"
        error = {"type": "invalid_request_error", "message": message}
        return httpx.Response(400, json={"type": "error", "error": error})

    def turns_sent(self, call: int) -> int:
        """The user messages request ``call`` carried."""
        return sum(1 for m in self.bodies[call]["messages"] if m["role"] == "user")


def honest_tokens(body: dict[str, Any]) -> int:
    return len(json.dumps([body.get("system"), body["messages"]])) // 4


def openai_reply(prompt_tokens: Any) -> dict[str, Any]:
    choice = {"index": 0, "message": {"role": "assistant", "content": ANSWER}}
    return {
        "id": "chatcmpl-1",
        "model": MODEL.name,
        "choices": [{**choice, "finish_reason": "stop"}],
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": 40},
    }


def anthropic_reply(input_tokens: Any) -> dict[str, Any]:
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": MODEL.name,
        "content": [{"type": "text", "text": ANSWER}],
        "stop_reason": "end_turn",
        "usage": {"input_tokens": input_tokens, "output_tokens": 40},
    }


def agent_for(provider: Provider, calibration: TokenCalibration) -> Agent:
    client = Client(provider.driver(), calibration=calibration)
    return Agent(client, model=MODEL, instructions=INSTRUCTIONS)


def assert_sane(saved: dict[str, Any]) -> None:
    """A saved calibration that prices a prompt about as the honest reports did."""
    for entry in saved.values():
        ratio = entry if isinstance(entry, float) else entry["ratio"]
        assert 0.5 < ratio < 3
        if isinstance(entry, dict):
            assert abs(entry["intercept"]) < 1_000
            assert all(0 <= slope < 8 for slope in entry["slopes"].values())


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("lie", [10**12, WINDOW + 1], ids=["10^12", "over the window"])
async def test_one_absurd_report_wipes_no_history_now_or_after_a_resume(
    kind: str, lie: int, caplog: pytest.LogCaptureFixture
) -> None:
    provider = Provider(kind, lies={3: lie})
    calibration = TokenCalibration()
    with respx.mock(assert_all_called=False) as mock, caplog.at_level(logging.WARNING):
        provider.route(mock)
        conversation = Conversation(agent_for(provider, calibration))
        for question in QUESTIONS[:6]:
            await conversation.run(question)
    # Every turn sent the whole conversation so far: a 16k window holds it all.
    assert [provider.turns_sent(call) for call in range(6)] == [1, 2, 3, 4, 5, 6]
    assert f"{lie} input tokens" in caplog.text
    text = conversation.to_json()
    saved = json.loads(text)["settings"]["token_calibration"]
    assert_sane(saved)

    # Resumed in a fresh process: a fresh calibration takes the saved one.
    fresh = Provider(kind)
    with respx.mock(assert_all_called=False) as mock:
        fresh.route(mock)
        resumed = Conversation.from_json(agent_for(fresh, TokenCalibration()), text)
        await resumed.run(QUESTIONS[6])
    assert fresh.turns_sent(0) == 7


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
@pytest.mark.parametrize("lie", [1, 10])
async def test_one_report_far_below_the_prompt_does_not_let_a_turn_overflow(
    kind: str, lie: int
) -> None:
    # The lie comes just before the conversation outgrows the server's 1,100 tokens:
    # priced from a report of one token, the next turn would be sent whole and refused
    # (and the retry would cut it to its last question). Priced from the honest reports,
    # each turn is cut to fit.
    provider = Provider(kind, lies={9: lie}, limit=1_100)
    calibration = TokenCalibration()
    with respx.mock(assert_all_called=False) as mock:
        provider.route(mock)
        agent = agent_for(provider, calibration)
        conversation = Conversation(agent, max_context_tokens=1_200, output_reserve_tokens=100)
        for question in QUESTIONS:
            await conversation.run(question)
    assert provider.refused == 0
    assert provider.turns_sent(len(QUESTIONS) - 1) < len(QUESTIONS)  # limiting did cut
    assert_sane(json.loads(conversation.to_json())["settings"]["token_calibration"])


@pytest.mark.parametrize("kind", ["openai", "anthropic"])
async def test_a_count_of_true_is_refused_naming_the_field(kind: str) -> None:
    provider = Provider(kind, lies={0: True})
    calibration = TokenCalibration(min_estimated_tokens=0)
    with respx.mock(assert_all_called=False) as mock:
        provider.route(mock)
        conversation = Conversation(agent_for(provider, calibration))
        with pytest.raises(ProviderResponseError, match="should be a token count, not True"):
            await conversation.run(QUESTIONS[0])
    assert calibration.ratios() == {}
    assert conversation.messages == ()
