"""Why the cache missed: each round's prompt compared with the one before it, the
provider's cached share and its own diagnosis beside, on the round's record and span."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, cast, overload

import attrs
import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import threadline.engine._run
from threadline import (
    Agent,
    Client,
    Conversation,
    Message,
    Model,
    ToolCall,
    Usage,
    tool,
)
from threadline import telemetry as threadline_telemetry

# What a conversation keeps of its last prompt is private, as is the comparison
# itself; the run fills RoundRecord.cache with it.
from threadline.conversation._transcript import KeptPrompt
from threadline.counting import ApproximateCounter
from threadline.drivers import ProviderCall, ProviderResponse
from threadline.limiting import (
    CacheDiagnosis,
    CacheReport,
    PrefixChange,
    SentPrompt,
    cache_stable_units,
    clear_tool_results,
)
from threadline.limiting._prefix import compare_prompts
from threadline.testing import ScriptedDriver

pytestmark = [pytest.mark.anyio, pytest.mark.both_backends]

MODEL = Model("scripted-model", context_size=100_000)


class CachingDriver(ScriptedDriver):
    """Reports usage as a caching server would: the prompt it saw before is cached,
    and a diagnosis on every reply."""

    def __init__(self, replies: list[str | Message]) -> None:
        super().__init__(replies)
        self.seen: tuple[Message, ...] = ()

    async def complete(self, call: ProviderCall) -> ProviderResponse:
        response = await super().complete(call)
        same = 0
        for a, b in zip(self.seen, call.messages, strict=False):
            if (a.role, a.content, a.tool_calls) != (b.role, b.content, b.tool_calls):
                break
            same += 1
        self.seen = call.messages
        usage = Usage(input_tokens=10 * len(call.messages), cached_input_tokens=10 * same)
        diagnosis = CacheDiagnosis(provider="test", reason="messages_changed", missed_tokens=7)
        return attrs.evolve(response, usage=usage, cache_diagnosis=diagnosis)


def agent_on(driver: ScriptedDriver, **options: object) -> Agent:
    return Agent(
        Client(driver),
        model=MODEL,
        instructions="Be brief.",
        token_counter=ApproximateCounter(),
        **options,  # type: ignore[arg-type]
    )


async def test_a_conversation_says_its_prefix_was_kept_and_what_the_provider_cached() -> None:
    driver = CachingDriver(["one", "two", "three"])
    conv = Conversation(agent_on(driver))
    first = await conv.run("hello")
    second = await conv.run("again")
    third = await conv.run("and again")

    assert first.rounds[0].cache is not None
    assert first.rounds[0].cache.prefix.reason == "first call"
    cache = second.rounds[0].cache
    assert cache is not None
    assert cache.prefix == PrefixChange(reason="unchanged", previous_messages=2, kept_messages=2)
    assert cache.cached_share == pytest.approx(2 / 4)
    assert cache.diagnosis == CacheDiagnosis(
        provider="test", reason="messages_changed", missed_tokens=7
    )
    assert "prefix kept (4 messages)" in str(third.rounds[0].cache)


async def test_a_cut_a_changed_system_prompt_and_changed_tools_are_named() -> None:
    driver = CachingDriver(["r"] * 30)
    budget = {"max_context_tokens": 260, "output_reserve_tokens": 50}
    agent = agent_on(driver, pre_max_tokens_reached=cache_stable_units(0.5), **budget)
    conv = Conversation(agent)
    reasons = []
    for t in range(12):
        result = await conv.run(f"question {t} " + "word " * 20)
        assert result.rounds[0].cache is not None
        reasons.append(result.rounds[0].cache.prefix.reason)
    assert "cut by limiting" in reasons
    assert set(reasons) == {"first call", "unchanged", "cut by limiting"}

    previous = result.last_prompt
    assert previous is not None
    edited = (Message.system("Be long."), *previous.messages[1:])
    assert compare_prompts(previous, edited, ()).reason == "system prompt changed"

    @tool
    def lookup(city: str) -> str:
        """Look a city up."""
        return city

    @tool
    def weather(city: str) -> str:
        """The weather in a city."""
        return city

    two = SentPrompt(messages=previous.messages, tools=(lookup, weather))
    assert compare_prompts(two, previous.messages, (weather, lookup)).reason == "tools reordered"
    assert compare_prompts(two, previous.messages, (lookup,)).reason == "tools changed"


def test_a_cleared_result_and_an_edit_are_told_apart() -> None:
    call = ToolCall(id="c1", name="read")
    before = (
        Message.user("q"),
        Message.assistant(tool_calls=[call]),
        Message.tool("c1", "a long result"),
        Message.assistant("done"),
    )
    cleared = (*before[:2], Message.tool("c1", "[tool result cleared: read, 4 tokens]"), before[3])
    edited = (Message.user("another q"), *before[1:])
    previous = SentPrompt(messages=before)

    found = compare_prompts(previous, cleared, ())
    assert (found.reason, found.position, found.kept_messages) == ("cleared", 2, 2)
    assert compare_prompts(previous, edited, ()).reason == "edited message"
    assert compare_prompts(previous, (*before, Message.user("more")), ()).kept
    assert compare_prompts(None, before, ()).reason == "first call"


async def test_clearing_in_a_conversation_is_named_once_and_then_the_prefix_holds() -> None:
    @tool
    def read(n: int) -> str:
        """Read page n."""
        return f"page {n} " + "text " * 150

    replies: list[str | Message] = []
    for t in range(8):
        replies += [
            Message.assistant(
                tool_calls=[ToolCall(id=f"c{t}", name="read", arguments=f'{{"n": {t}}}')]
            ),
            f"a{t}",
        ]
    driver = CachingDriver(replies)
    agent = agent_on(
        driver,
        tools=[read],
        max_context_tokens=1_250,
        output_reserve_tokens=50,
        pre_max_tokens_reached=clear_tool_results(keep=1),
        post_max_tokens_reached=cache_stable_units(),
    )
    conv = Conversation(agent)
    reasons = []
    for t in range(8):
        result = await conv.run(f"read page {t}")
        reasons += [r.cache.prefix.reason for r in result.rounds if r.cache is not None]
    assert "cleared" in reasons
    assert reasons.count("cleared") <= 2  # a batch at a time, not a result per turn
    assert reasons.count("unchanged") >= len(reasons) - 4


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    provider = TracerProvider()
    memory = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(memory))
    threadline_telemetry.set_tracer_provider(provider)
    yield memory
    threadline_telemetry.set_tracer_provider(None)
    provider.shutdown()


async def test_round_spans_carry_the_cache_report(exporter: InMemorySpanExporter) -> None:
    driver = CachingDriver(["one", "two"])
    conv = Conversation(agent_on(driver))
    await conv.run("hello")
    await conv.run("again")

    rounds = [s for s in exporter.get_finished_spans() if s.name.startswith("chat ")]
    first, second = (dict(span.attributes or {}) for span in rounds)
    assert first["threadline.cache.prefix"] == "first call"
    assert second["threadline.cache.prefix"] == "unchanged"
    assert second["threadline.cache.kept_messages"] == 2
    assert second["threadline.cache.cached_share"] == 0.5
    assert second["threadline.cache.provider_diagnosis"] == "messages_changed"
    assert second["threadline.cache.provider_missed_tokens"] == 7


def test_a_report_reads_for_a_person() -> None:
    report = CacheReport(
        prefix=PrefixChange(
            reason="cut by limiting", position=3, previous_messages=9, kept_messages=3
        ),
        input_tokens=1_000,
        cached_input_tokens=250,
    )
    assert str(report) == (
        "cache: 25% of the prompt; prefix changed at message 3: cut by limiting "
        "(3 of 9 messages kept)"
    )
    assert CacheReport(prefix=PrefixChange(reason="first call")).cached_share is None


async def test_each_call_names_the_response_before_it_for_the_providers_diagnosis() -> None:
    class Numbered(ScriptedDriver):
        async def complete(self, call: ProviderCall) -> ProviderResponse:
            response = await super().complete(call)
            return attrs.evolve(response, request_id=f"resp-{len(self.calls)}")

    driver = Numbered(["one", "two"])
    conv = Conversation(agent_on(driver))
    await conv.run("hello")
    await conv.run("again")
    assert [call.previous_response_id for call in driver.calls] == [None, "resp-1"]


class _Reads(Sequence[Message]):
    """A prompt's messages that count how many of them are read."""

    def __init__(self, messages: Sequence[Message], reads: list[int]) -> None:
        self.messages, self.reads = tuple(messages), reads

    def __len__(self) -> int:
        return len(self.messages)

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Message, ...]: ...

    def __getitem__(self, index: int | slice) -> Message | tuple[Message, ...]:
        found = self.messages[index]
        self.reads[-1] += len(found) if isinstance(found, tuple) else 1
        return found


async def test_a_long_conversations_turn_compares_only_what_is_new_since_the_last_prompt(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    reads: list[int] = []

    def counted(
        previous: SentPrompt | None, messages: Sequence[Message], *args: Any
    ) -> PrefixChange:
        reads.append(0)
        if previous is not None:
            before = _Reads(previous.messages, reads)
            previous = attrs.evolve(previous, messages=cast(tuple[Message, ...], before))
        return compare_prompts(previous, _Reads(messages, reads), *args)

    monkeypatch.setattr(threadline.engine._run, "compare_prompts", counted)
    turns = 150
    conv = Conversation(agent_on(ScriptedDriver(["ok"] * (turns + 1))))
    for turn in range(turns):
        result = await conv.run(f"question {turn}")
        prefix = result.rounds[0].cache.prefix  # type: ignore[union-attr]
        if turn:
            # The system message, the last turn's history, then its prompt again.
            assert prefix.kept
            assert prefix.kept_messages == 2 * turn
    # The history sent again is known to be the last one grown at its end: the
    # messages around it are read, never the 300 of it (a pass would read them twice).
    assert max(reads[1:]) <= 12

    # A rewritten transcript is another source: its edit is found by comparing.
    events = list(conv.events)
    events[4] = attrs.evolve(events[4], message=Message.user("another question"))
    await conv.replace_events(events)
    result = await conv.run("and now?")
    change = result.rounds[0].cache.prefix  # type: ignore[union-attr]
    assert (change.reason, change.position) == ("edited message", 5)


async def test_what_a_conversation_keeps_of_its_last_prompt_compares_as_the_prompt() -> None:
    # Between turns a conversation keeps its last prompt as a window onto its
    # transcript (the turn's own messages there as seed copies), not the prompt.
    # Each turn's first round is compared with it; compared with the prompt as the
    # run sent it (result.last_prompt), field by field, the answer is the same: over
    # tool rounds, cuts by limiting and a rewritten transcript.
    @tool
    def read(n: int) -> str:
        """Read page n."""
        return f"page {n} " + "text " * 40

    replies: list[str | Message] = []
    for t in range(14):
        if t % 3 == 1:
            call = ToolCall(id=f"c{t}", name="read", arguments=f'{{"n": {t}}}')
            replies.append(Message.assistant(tool_calls=[call]))
        replies.append(f"answer {t} " + "word " * 10)
    driver = CachingDriver(replies)
    agent = agent_on(
        driver,
        tools=[read],
        max_context_tokens=500,
        output_reserve_tokens=50,
        pre_max_tokens_reached=cache_stable_units(0.5),
    )
    conv = Conversation(agent)
    previous = None
    reasons = []
    windows = 0
    for t in range(14):
        if t == 9:
            await conv.replace_events(conv.events[conv.user_event_indices()[2] :])
        calls = len(driver.calls)
        result = await conv.run(f"question {t} " + "word " * 12)
        first = result.rounds[0]
        assert first.cache is not None
        steps = [step for step in (first.limiting, first.retry_limiting) if step is not None]
        sent = driver.calls[calls].messages
        assert first.cache.prefix == compare_prompts(previous, sent, (read,), steps), t
        reasons.append(first.cache.prefix.reason)
        previous = result.last_prompt
        assert previous is not None
        assert type(previous.messages) is tuple
        windows += isinstance(conv._last_prompt, KeptPrompt)
    assert {"unchanged", "cut by limiting"} <= set(reasons)
    assert windows >= 10  # the window, not the prompt, after most turns
