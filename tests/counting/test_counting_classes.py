"""Calibration by class: a message's tokens split by script, and slopes fitted from reports."""

# The text is meant to be Russian and Japanese, full-width punctuation included.
# ruff: noqa: RUF001

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from threadline import Agent, Client, Conversation, InvalidRequestError, Message, Model, ToolCall
from threadline._provider import ProviderCall, ProviderResponse
from threadline.counting import BuiltinTokenCounter, TokenCalibration

# The class features and the fit are private to the counting room; their arithmetic is
# what these tests pin down.
from threadline.counting._calibration._classes import (
    CLASSES,
    classify_text,
    message_classes,
    transcript_classes,
)
from threadline.counting._calibration._slopes import PRIOR_SLOPES, UPWARD_BIAS, fit
from threadline.testing import ScriptedDriver

COUNTER = BuiltinTokenCounter()
MODEL = Model("m", context_size=100_000)
LATIN, CYRILLIC, CJK, OTHER = range(4)


def test_text_is_split_into_runs_of_one_script() -> None:
    assert classify_text("Hello, world 42!") == [(LATIN, "Hello, world 42!")]
    assert classify_text("Привет, мир! Как дела? OK") == [
        (CYRILLIC, "Привет, мир! Как дела? "),
        (LATIN, "OK"),
    ]
    assert classify_text("東京は、どこですか？ Tokyo") == [
        (CJK, "東京は、どこですか？ "),
        (LATIN, "Tokyo"),
    ]
    assert classify_text("Grüße aus München, señor") == [(LATIN, "Grüße aus München, señor")]
    assert classify_text("مرحبا") == [(OTHER, "مرحبا")]
    assert classify_text("") == []
    assert classify_text("¡…!") == [(LATIN, "¡…!")]  # no letter at all: Latin


@given(st.text(max_size=60))
def test_the_runs_put_the_text_back_together(text: str) -> None:
    assert "".join(run for _, run in classify_text(text)) == text


def test_a_message_is_split_into_framing_tool_and_script_classes() -> None:
    english = message_classes(COUNTER, Message.user("Where is the station?"))
    russian = message_classes(COUNTER, Message.user("Где вокзал?"))
    assert english[CLASSES.index("latin")] > 0
    assert english[CLASSES.index("cyrillic")] == 0
    assert russian[CLASSES.index("cyrillic")] > 0
    call = ToolCall(id="call-1", name="get_weather", arguments='{"city": "Oslo"}')
    tooled = message_classes(COUNTER, Message.assistant(tool_calls=[call]))
    assert tooled[CLASSES.index("tool")] > 0
    assert tooled[CLASSES.index("latin")] == 0
    for message in (Message.user("Where is the station?"), Message.assistant(tool_calls=[call])):
        # The classes add up to the estimate (the framing class is what the text leaves).
        assert sum(message_classes(COUNTER, message)) == COUNTER.message_tokens(message)


def test_a_transcripts_classes_are_its_messages_summed() -> None:
    messages = [Message.user("hello"), Message.assistant("Привет"), Message.user("hello")]
    total = transcript_classes(COUNTER, messages)
    parts = [message_classes(COUNTER, m) for m in messages]
    assert total == tuple(map(sum, zip(*parts, strict=True)))


def test_without_reports_every_slope_is_the_prior() -> None:
    assert fit([]) == PRIOR_SLOPES
    assert fit([((4, 0, 10, 0, 0, 0), 50)]) == PRIOR_SLOPES
    assert fit([((4, 0, 10, 0, 0, 0), 50)], prior=(2.0,) * 6) == (2.0,) * 6


def synthetic(
    truth: Sequence[float], intercept: float, seed: int
) -> list[tuple[tuple[int, ...], int]]:
    """Reports of a growing transcript whose cost is ``intercept + truth . counts``."""
    observations = []
    counts = [4, 0, 20, 0, 0, 0]
    for step in range(12):
        counts[0] += 4 * (1 + step % 3)
        counts[2 + (step + seed) % 4] += 15 + (step * 7 + seed) % 40
        counts[1] += 20 if step % 5 == 3 else 0
        reported = round(intercept + sum(b * c for b, c in zip(truth, counts, strict=True)))
        observations.append((tuple(counts), reported))
    return observations


@pytest.mark.parametrize("seed", range(4))
def test_the_fit_finds_each_scripts_slope_from_a_growing_transcript(seed: int) -> None:
    truth = (1.25, 0.5, 1.05, 3.0, 1.5, 2.0)  # Latin near 1: its ridge holds it there
    slopes = fit(synthetic(truth, intercept=120, seed=seed))
    for found, true in zip(slopes[2:], truth[2:], strict=True):
        assert found == pytest.approx(true, rel=0.1)


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(st.lists(st.integers(0, 500), min_size=6, max_size=6), st.integers(1, 5000)),
        max_size=12,
    )
)
def test_the_fit_is_deterministic_and_never_negative(
    observations: list[tuple[list[int], int]],
) -> None:
    given_ = [(tuple(c), r) for c, r in observations]
    slopes = fit(given_)
    assert slopes == fit(list(given_))
    assert all(b >= 0 for b in slopes)


# -- through a client ------------------------------------------------------------------


class ScriptReports(ScriptedDriver):
    """Reports 30 tokens of framing plus 1.1 per o200k token of Latin text, 3 per token
    of Cyrillic and 5 per message: a tokenizer that is not o200k."""

    def __init__(self, replies: list[str]) -> None:
        super().__init__(replies)

    def _next(self, call: ProviderCall) -> ProviderResponse:
        response = super()._next(call)
        counts = transcript_classes(COUNTER, call.messages)
        latin, cyrillic = counts[CLASSES.index("latin")], counts[CLASSES.index("cyrillic")]
        reported = round(30 + 5 * len(call.messages) + 1.1 * latin + 3 * cyrillic)
        return attrs.evolve(response, usage=attrs.evolve(response.usage, input_tokens=reported))


ENGLISH = [
    "Tell me about the old town, its bridges and the best time of year to walk there.",
    "Which museum first?",
    "And where do people eat breakfast near the river, and how early do they open?",
    "Is the train to the coast faster than the bus, and which one is cheaper in June?",
]
RUSSIAN = [
    "Расскажи о старом городе, его мостах и о лучшем времени года для прогулок.",
    "Где купить билеты?",
    "Сколько стоит ужин в хорошем ресторане у реки и нужно ли заранее бронировать столик?",
]
PROMPTS = [
    text for pair in itertools.zip_longest(ENGLISH * 2, RUSSIAN * 2) for text in pair if text
]


@pytest.mark.anyio
async def test_a_client_prices_new_text_by_its_script() -> None:
    calibration = TokenCalibration(min_estimated_tokens=0)
    prompts = PROMPTS
    driver = ScriptReports([f"Answer {n}." for n in range(len(prompts))])
    client = Client(driver, calibration=calibration, default_model=MODEL)
    messages: list[Message] = []
    errors = []
    for prompt in prompts:
        result = await client.request().with_messages(messages).with_prompt(prompt).run()
        record = result.rounds[0]
        messages = list(result.messages)
        if record.calibrated_input_tokens is not None:
            reported = record.reported_input_tokens
            assert reported is not None
            errors.append((record.calibrated_input_tokens - reported) / reported)
    # Once three reports of each script are in (from the seventh request), within 3%
    # both ways, and closer as reports add up.
    assert all(abs(e) <= 0.03 for e in errors[5:])
    assert all(abs(e) <= 0.015 for e in errors[-3:])
    fitted = calibration.fitted("m")
    assert fitted is not None
    assert fitted.slopes[CLASSES.index("cyrillic")] == pytest.approx(3.0, rel=0.15)


@pytest.mark.anyio
async def test_a_cut_transcript_is_priced_from_the_report_less_what_is_gone() -> None:
    calibration = TokenCalibration(min_estimated_tokens=0)
    prompts = PROMPTS
    driver = ScriptReports([f"Answer {n}." for n in range(len(prompts) + 1)])
    client = Client(driver, calibration=calibration, default_model=MODEL)
    messages: list[Message] = []
    for prompt in prompts:
        result = await client.request().with_messages(messages).with_prompt(prompt).run()
        messages = list(result.messages)
    # Keep the last four messages only: most of the reported prompt is gone.
    kept = messages[-4:]
    counter = calibration.estimate("m", COUNTER, kept)
    result = await client.request().with_messages(kept).with_prompt("And the museums?").run()
    reported = result.rounds[0].reported_input_tokens
    assert reported is not None
    estimate = counter.count([*kept, Message.user("And the museums?")])
    assert abs(estimate - reported) / reported <= 0.03


def test_a_class_priced_from_the_report_leans_towards_too_many() -> None:
    calibration = TokenCalibration(min_estimated_tokens=0)
    first, sent = [Message.user(ENGLISH[1])], [Message.user(ENGLISH[1]), Message.user(ENGLISH[0])]
    assert calibration.fitted("m") is None
    for prompt, reported in ((first, 30), (sent, 60)):
        estimated = COUNTER.count(prompt)
        calibration.observe(
            "m", estimated_tokens=estimated, reported_tokens=reported, sent=prompt, counter=COUNTER
        )
    fitted = calibration.fitted("m")
    assert fitted is not None  # two reports: a fit
    counter = calibration.estimate("m", COUNTER, sent)
    assert counter.count(sent) == 60  # the reported prompt counts exactly its report
    added = Message.user("One more question about the weather.")
    price = sum(b * e for b, e in zip(fitted.slopes, message_classes(COUNTER, added), strict=True))
    assert counter.count([*sent, added]) == 60 + math.ceil(price * (1 + UPWARD_BIAS))
    assert counter.count([*sent, added]) > 60 + price


@pytest.mark.anyio
async def test_a_saved_fit_prices_a_resumed_conversations_first_turn() -> None:
    calibration = TokenCalibration(min_estimated_tokens=0)
    driver = ScriptReports([f"Answer {n}." for n in range(len(PROMPTS) + 1)])
    agent = Agent(Client(driver, calibration=calibration), model=MODEL)
    conversation = Conversation(agent)
    for prompt in PROMPTS[:-1]:
        await conversation.run(prompt)
    saved = json.loads(conversation.to_json())["settings"]["token_calibration"]["m"]
    fitted = calibration.fitted("m")
    assert fitted is not None
    assert saved["slopes"] == dict(zip(CLASSES, fitted.slopes, strict=True))
    assert saved["intercept"] == pytest.approx(fitted.intercept)
    assert saved["ratio"] == calibration.ratio("m")

    fresh = TokenCalibration(min_estimated_tokens=0)
    again = Agent(Client(driver, calibration=fresh), model=MODEL)
    resumed = Conversation.from_json(again, conversation.to_json())
    result = await resumed.run(PROMPTS[-1])
    record = result.rounds[0]
    assert record.calibrated_input_tokens is not None
    assert record.reported_input_tokens is not None
    error = record.calibrated_input_tokens - record.reported_input_tokens
    assert abs(error) <= 0.03 * record.reported_input_tokens


def test_an_old_document_with_a_plain_ratio_still_loads() -> None:
    calibration = TokenCalibration()
    calibration.restore({"m": 1.25, "m [tools: a]": {"ratio": 1.5, "intercept": 7, "slopes": {}}})
    assert calibration.ratio("m") == 1.25
    assert calibration.fitted("m") is None
    fitted = calibration.fitted("m", ["a"])
    assert fitted is not None
    assert fitted.slopes == PRIOR_SLOPES  # no slope saved: the prior
    assert fitted.intercept == 7
    assert calibration.saved_of("m")["m"] == 1.25
    with pytest.raises(InvalidRequestError, match="token calibration 'm'"):
        calibration.restore({"m": {"ratio": 1.5}})
