"""The replay rules a driver declares: an allow-list of blocks, sent and counted as declared."""

from __future__ import annotations

import pytest

from threadline import Client, InvalidRequestError, Message, Model, Reasoning, ToolCall, tool
from threadline.counting import BuiltinTokenCounter
from threadline.drivers import ReplayRules, ReplayScope
from threadline.testing import ScriptedDriver

pytestmark = pytest.mark.anyio

MODEL = Model("fake", context_size=100_000)
OURS = "scripted:fake"

# -- rules a driver declares ---------------------------------------------------------

# OpenAI Responses replays reasoning items every turn; Gemini its thought signatures.
RESPONSES = ReplayRules({"reasoning"})
SIGNATURES = ReplayRules({"thought_signature"}, scope=ReplayScope.EVERY_TURN)


class DeclaringDriver(ScriptedDriver):
    """A test double that replays as a new driver would, by the rules it declares."""

    def __init__(self, rules: ReplayRules, replies: list[str | Message]) -> None:
        super().__init__(replies)
        self.rules = rules

    def replay_rules(self, model: Model) -> ReplayRules:
        return self.rules

    def replay_projection(self, model: Model) -> ReplayRules:  # type: ignore[override]
        return self.rules


ITEM = b'{"type": "reasoning", "id": "rs_1", "encrypted_content": "gAAAAB", "summary": []}'


@pytest.mark.parametrize(
    ("rules", "state", "complaint"),
    [
        (RESPONSES, b'[{"type": "message", "content": "hi"}]', '{"type": "message"} block'),
        (RESPONSES, b'[{"type": "thinking", "thinking": "x"}]', '{"type": "thinking"} block'),
        (SIGNATURES, b'{"type": "function_call", "name": "rm"}', '{"type": "function_call"}'),
        (SIGNATURES, b"[42]", "a number"),
    ],
)
async def test_a_driver_s_allow_list_refuses_every_other_block(
    rules: ReplayRules, state: bytes, complaint: str
) -> None:
    driver = DeclaringDriver(rules, ["never"])
    reasoning = Reasoning(provider_reasoning=state, provider=OURS)
    history = [Message.user("q"), Message.assistant("a", reasoning=reasoning)]
    request = Client(driver, default_model=MODEL).request().with_messages(history)
    with pytest.raises(InvalidRequestError, match="message 1") as info:
        await request.with_prompt("again").run()
    assert complaint in str(info.value)
    assert driver.calls == []


async def test_a_driver_s_allowed_blocks_are_sent_and_counted_every_turn() -> None:
    @tool
    def clock() -> str:
        """The time."""
        return "noon"

    item = Reasoning(provider_reasoning=ITEM, provider=OURS)
    calling = Message.assistant(tool_calls=[ToolCall(id="c1", name="clock")], reasoning=item)
    driver = DeclaringDriver(RESPONSES, [calling, "noon it is"])
    counter = BuiltinTokenCounter()
    client = Client(driver, default_model=MODEL, token_counter=counter)
    result = await client.request().with_prompt("time?").with_tools([clock]).run()
    sent = driver.calls[1].messages
    assert sent[1].reasoning == item
    bound = counter.with_projection(RESPONSES)
    assert result.rounds[1].estimated_input_tokens == bound.count(sent, [clock])
    assert RESPONSES.replayed_reasoning(item) == ("gAAAAB",)


@pytest.mark.parametrize("blocks", ["thinking", [], [""], [1], 7])
def test_rules_refuse_blocks_that_are_not_a_set_of_names(blocks: object) -> None:
    with pytest.raises(InvalidRequestError, match="blocks must be"):
        ReplayRules(blocks)  # type: ignore[arg-type]


def test_rules_refuse_an_unknown_scope() -> None:
    with pytest.raises(InvalidRequestError, match="scope must be one of 'every turn'"):
        ReplayRules({"reasoning"}, scope="sometimes")  # type: ignore[arg-type]


def test_rules_are_values_counters_can_key_their_cache_by() -> None:
    assert ReplayRules(["reasoning"]) == RESPONSES
    assert hash(ReplayRules(("reasoning",))) == hash(RESPONSES)
    assert ReplayRules({"a"}, scope="open tool-use cycle").scope is ReplayScope.OPEN_TOOL_CYCLE
