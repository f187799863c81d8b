"""A conversation under the cache-stable policy: its window's start stays put between cuts,
is saved with it, and carries a summary along."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from threadline import (
    Agent,
    Client,
    Conversation,
    ConversationFormatError,
    Message,
    Model,
    Role,
)
from threadline.counting import ApproximateCounter
from threadline.limiting import (
    SUMMARY_HEADING,
    TokenLimitEvent,
    UnitKind,
    cache_stable_units,
    check_integrity,
    drop_oldest_units,
    summarize_oldest,
)
from threadline.stores.memory import MemoryStore
from threadline.stores.sqlite import SQLiteStore
from threadline.testing import ScriptedDriver

pytestmark = pytest.mark.anyio

MODEL = Model("scripted-model", context_size=100_000)
BUDGET = 400  # prompt tokens: limit 450, reserve 50
PROMPT = "tell me one more thing about the weather in the mountains today"
REPLY = "it is cold and windy up there, bring a warm coat and good boots"


def agent_for(driver: ScriptedDriver, **options: object) -> Agent:
    return Agent(
        Client(driver),
        model=MODEL,
        instructions="You answer in one sentence.",
        max_context_tokens=BUDGET + 50,
        output_reserve_tokens=50,
        token_counter=ApproximateCounter(),
        **options,  # type: ignore[arg-type]
    )


def sent(driver: ScriptedDriver, call: int) -> tuple[Message, ...]:
    return driver.calls[call].messages


def is_prefix(before: tuple[Message, ...], after: tuple[Message, ...]) -> bool:
    """``after`` begins with ``before``, message for message (origins aside)."""
    strip = [(m.role, m.content) for m in before]
    return [(m.role, m.content) for m in after[: len(before)]] == strip


async def run_turns(conv: Conversation, driver: ScriptedDriver, count: int) -> list[bool]:
    """Run ``count`` turns; say for each whether limiting cut before it."""
    driver.add_replies([REPLY] * count)
    cuts = []
    for t in range(count):
        result = await conv.run(f"{PROMPT} {t}")
        cuts.append(any(record.limited for record in result.limiting))
    return cuts


async def test_between_cuts_every_prompt_begins_with_the_one_before() -> None:
    driver = ScriptedDriver()
    conv = Conversation(agent_for(driver, pre_max_tokens_reached=cache_stable_units(0.5)))
    cuts = await run_turns(conv, driver, 40)

    assert 3 <= sum(cuts) <= 8  # a block at a time, not a unit every turn
    for call in range(1, 40):
        before, after = sent(driver, call - 1), sent(driver, call)
        if cuts[call]:
            assert after[0] == before[0]  # the instructions stay
            assert after[1].role is Role.USER
        else:
            # The last prompt, its reply and a new prompt are all that was added.
            assert is_prefix(before, after)
            assert len(after) == len(before) + 2
        check_integrity(after)


async def test_the_sliding_window_changes_the_prefix_every_turn_once_over_budget() -> None:
    driver = ScriptedDriver()
    conv = Conversation(agent_for(driver, pre_max_tokens_reached=drop_oldest_units(None)))
    cuts = await run_turns(conv, driver, 40)

    over = [call for call in range(1, 40) if cuts[call]]
    assert len(over) > 25
    assert not any(is_prefix(sent(driver, c - 1), sent(driver, c)) for c in over)
    assert conv.window_start == 0  # it keeps no window: it slides over the whole transcript


async def test_the_window_start_moves_only_when_a_cut_happens() -> None:
    driver = ScriptedDriver()
    conv = Conversation(agent_for(driver, pre_max_tokens_reached=cache_stable_units(0.5)))
    driver.add_replies([REPLY] * 30)
    starts, cuts = [0], [False]
    for t in range(30):
        result = await conv.run(f"{PROMPT} {t}")
        cuts.append(any(record.limited for record in result.limiting))
        starts.append(conv.window_start)
    for i in range(1, len(starts)):
        assert (starts[i] > starts[i - 1]) == cuts[i]
    # Each start is a user message: a window never opens inside a turn.
    assert all(conv.events[s].message.role is Role.USER for s in starts if s)
    assert conv.messages == tuple(e.message for e in conv.events[conv.window_start :])


async def test_a_restored_conversation_keeps_its_window_start_and_prefix() -> None:
    driver = ScriptedDriver()
    agent = agent_for(driver, pre_max_tokens_reached=cache_stable_units(0.5))
    conv = Conversation(agent)
    cuts = await run_turns(conv, driver, 15)
    assert any(cuts)
    start = conv.window_start
    assert start > 0

    saved = json.loads(conv.to_json())
    assert saved["format_version"] == 1
    assert saved["settings"]["window"] == {"start": start, "head": []}

    restored = Conversation.from_json(agent, conv.to_json())
    assert restored.window_start == start
    assert restored.messages == conv.messages
    driver.add_replies([REPLY, REPLY])
    await conv.run("one more")
    await restored.run("one more")
    assert sent(driver, -1) == sent(driver, -2)
    assert is_prefix(sent(driver, -3), sent(driver, -1))


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
async def test_a_stored_conversation_loads_with_its_window(kind: str, tmp_path: Path) -> None:
    store = MemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "threads.db")
    async with store:
        driver = ScriptedDriver()
        agent = agent_for(driver, pre_max_tokens_reached=cache_stable_units(0.5))
        conv = Conversation(agent, store=store)
        await run_turns(conv, driver, 15)
        assert conv.window_start > 0
        loaded = await Conversation.load(agent, store, conv.id)
        assert loaded.window_start == conv.window_start
        assert loaded.model_input == conv.model_input


async def test_a_summary_replaces_a_block_once_and_stays_in_front_of_the_window() -> None:
    writer = ScriptedDriver([f"summary number {n}" for n in range(10)])
    summarize = summarize_oldest(Client(writer), model=MODEL, keep_last_turns=2)
    driver = ScriptedDriver()
    agent = agent_for(
        driver, pre_max_tokens_reached=summarize, post_max_tokens_reached=cache_stable_units(0.5)
    )
    conv = Conversation(agent)
    cuts = await run_turns(conv, driver, 40)

    assert len(writer.calls) == sum(cuts)  # one summary per cut, none in between
    for call in range(1, 40):
        if not cuts[call]:
            assert is_prefix(sent(driver, call - 1), sent(driver, call))
    head = conv.messages[0]
    assert head.text.startswith(SUMMARY_HEADING)
    assert head.text.endswith(f"summary number {len(writer.calls) - 1}")

    restored = Conversation.from_json(agent, conv.to_json())
    assert restored.messages == conv.messages  # the summary comes back as it was


async def test_reset_and_replace_events_forget_the_window() -> None:
    driver = ScriptedDriver()
    conv = Conversation(agent_for(driver, pre_max_tokens_reached=cache_stable_units(0.5)))
    await run_turns(conv, driver, 15)
    assert conv.window_start > 0
    await conv.replace_events(conv.events[-4:])
    assert conv.window_start == 0
    await run_turns(conv, driver, 15)
    await conv.reset()
    assert conv.window_start == 0
    assert "window" not in json.loads(conv.to_json())["settings"]


async def test_choosing_another_policy_drops_the_kept_window() -> None:
    driver = ScriptedDriver()
    conv = Conversation(agent_for(driver, pre_max_tokens_reached=cache_stable_units(0.5)))
    await run_turns(conv, driver, 15)
    assert conv.window_start > 0
    conv.settings = conv.settings.evolve(pre_max_tokens_reached=drop_oldest_units(None))
    assert conv.window_start == 0
    await run_turns(conv, driver, 1)
    assert "window" not in json.loads(conv.to_json())["settings"]


@pytest.mark.parametrize(
    ("window", "path"),
    [
        ({"start": 2}, "$.settings.window"),
        ({"start": "2", "head": []}, "$.settings.window.start"),
        ({"start": 99, "head": []}, "$.settings.window.start"),
        ({"start": 1, "head": []}, "$.settings.window.start"),  # an answer, not a question
        ({"start": 2, "head": [{"role": "narrator", "content": "x"}]}, "$.settings.window.head[0]"),
    ],
)
async def test_a_malformed_window_is_refused_with_its_path(
    window: dict[str, object], path: str
) -> None:
    driver = ScriptedDriver(["a", "b"])
    agent = agent_for(driver, pre_max_tokens_reached=cache_stable_units(0.5))
    conv = Conversation(agent)
    await conv.run("one")
    await conv.run("two")
    document = json.loads(conv.to_json())
    document["settings"]["window"] = window
    with pytest.raises(ConversationFormatError) as caught:
        Conversation.from_json(agent, json.dumps(document))
    assert caught.value.path.startswith(path)


async def test_cache_stable_is_a_conversations_default_and_drop_oldest_a_requests() -> None:
    driver = ScriptedDriver()
    agent = agent_for(driver)
    conv = Conversation(agent)
    cuts = await run_turns(conv, driver, 30)
    assert conv.settings.pre_max_tokens_reached is None  # nothing was set...
    assert 2 <= sum(cuts) <= 8  # ...and yet it cut in blocks
    assert conv.window_start > 0

    history = [e.message for e in conv.events]
    driver.add_replies(["plain"])
    result = await agent.request().with_messages(history).with_prompt("plain request").run()
    assert [h.handler for h in result.limiting[0].handlers] == ["drop_oldest_units"]


async def test_a_window_never_starts_at_an_answer_whose_question_a_handler_dropped() -> None:
    def drop_first_question(event: TokenLimitEvent) -> None:
        first = next(u for u in event.units() if u.kind is UnitKind.USER and not u.pinned)
        event.drop_units([first], reason="a handler of ours")

    driver = ScriptedDriver()
    agent = agent_for(
        driver,
        pre_max_tokens_reached=drop_first_question,
        post_max_tokens_reached=cache_stable_units(0.5),
    )
    conv = Conversation(agent)
    await run_turns(conv, driver, 25)
    assert conv.window_start > 0
    assert conv.events[conv.window_start].message.role is Role.USER
    check_integrity(sent(driver, -1))
