"""Calibration by class: a message's tokens split by script, and slopes fitted from reports."""

# The text is meant to be Russian and Japanese, full-width punctuation included.
# ruff: noqa: RUF001

from __future__ import annotations

import itertools
import json
import math
import statistics

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from threadline import Agent, Client, Conversation, InvalidRequestError, Message, Model, ToolCall
from threadline._provider import ProviderCall, ProviderResponse
from threadline.counting import BuiltinTokenCounter, IncrementalTokenCounter, TokenCalibration

# The class features and the fit are private to the counting room; their arithmetic is
# what these tests pin down.
from threadline.counting._calibration._classes import (
    CLASSES,
    SCRIPTS,
    classify_text,
    message_classes,
    transcript_classes,
)
from threadline.counting._calibration._priors import (
    BOUND_Z,
    DROPPING_SHARE,
    MEASURED,
    PRIOR_COVARIANCE,
    PRIOR_SLOPES,
    TOOL_CALL_SPELLED,
    correlation_shrinkage,
    prior_of,
)
from threadline.counting._calibration._slopes import Posterior, fit
from threadline.counting._calibration._token_calibration import calibration_without
from threadline.testing import ScriptedDriver

COUNTER = BuiltinTokenCounter()
MODEL = Model("m", context_size=100_000)
LATIN, CYRILLIC, CJK = (SCRIPTS.index(name) for name in ("latin", "cyrillic", "cjk"))
WIDTH = len(CLASSES) + len(SCRIPTS)


def test_text_is_split_into_runs_of_one_script() -> None:
    assert classify_text("Hello, world!") == [(LATIN, "Hello, world!")]
    assert classify_text("Hello, world 42!") == [
        (LATIN, "Hello, world "),
        (SCRIPTS.index("digits"), "42!"),
    ]
    assert classify_text("Привет, мир! Как дела? OK") == [
        (CYRILLIC, "Привет, мир! Как дела? "),
        (LATIN, "OK"),
    ]
    assert classify_text("東京は、どこですか？ Tokyo") == [
        (CJK, "東京は、どこですか？ "),
        (LATIN, "Tokyo"),
    ]
    assert classify_text("Grüße aus München, señor") == [(LATIN, "Grüße aus München, señor")]
    assert classify_text("") == []
    assert classify_text("¡…!") == [(LATIN, "¡…!")]  # no letter at all: Latin


@pytest.mark.parametrize(
    ("text", "script"),
    [
        ("مرحبا بالعالم", "arabic"),
        ("שלום עולם", "hebrew"),
        ("नमस्ते दुनिया", "indic"),
        ("สวัสดีชาวโลก", "thai"),
        ("Γειά σου κόσμε", "greek"),
        ("안녕하세요 세계", "hangul"),
        ("你好，世界", "cjk"),
        ("🎒👕🧦 ✅", "emoji"),
        ("2026-04-05 118.50", "digits"),
        ("Բարեւ աշխարհ", "other"),
    ],
)
def test_each_script_is_a_class_of_its_own(text: str, script: str) -> None:
    assert classify_text(text) == [(SCRIPTS.index(script), text)]


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
    result = message_classes(COUNTER, Message.tool("call-1", "Погода: 3 °C"))
    assert result[CLASSES.index("tool_result")] > 0
    assert result[CLASSES.index("cyrillic")] == 0  # a result's text is kept apart...
    assert result[len(CLASSES) + CYRILLIC] > 0  # ...by its script
    for message in (Message.user("Where is the station?"), Message.assistant(tool_calls=[call])):
        # The classes add up to the estimate (the framing class is what the text leaves).
        counts = message_classes(COUNTER, message)
        assert sum(counts[: len(CLASSES)]) == COUNTER.message_tokens(message)


def test_a_transcripts_classes_are_its_messages_summed() -> None:
    messages = [Message.user("hello"), Message.assistant("Привет"), Message.user("hello")]
    total = transcript_classes(COUNTER, messages)
    parts = [message_classes(COUNTER, m) for m in messages]
    assert total == tuple(map(sum, zip(*parts, strict=True)))


def counts_of(**by_class: int) -> tuple[int, ...]:
    counts = [0] * WIDTH
    for name, value in by_class.items():
        counts[CLASSES.index(name)] = value
    return tuple(counts)


def test_without_steps_between_reports_every_slope_is_the_prior() -> None:
    assert fit([]) == Posterior.prior()
    assert fit([(counts_of(framing=4, latin=10), 50)]) == Posterior.prior()
    given_prior = Posterior.of((2.0,) * len(CLASSES), (0.5,) * len(CLASSES))
    assert fit([(counts_of(framing=4, latin=10), 50)], prior=given_prior) == given_prior


def test_the_prior_is_the_measured_vocabularies_mean_and_a_held_out_one_leaves_its_row() -> None:
    assert prior_of() == (PRIOR_SLOPES, PRIOR_COVARIANCE)
    assert Posterior.prior(excluding=()) is Posterior.prior()
    slopes, covariance = prior_of({"llama-bpe"})
    others = [row for name, row in MEASURED.items() if name != "llama-bpe"]
    for index, name in enumerate(SCRIPTS):
        column = [row[index] for row in others]
        assert slopes[CLASSES.index(name)] == pytest.approx(sum(column) / len(column))
    assert slopes != PRIOR_SLOPES
    assert covariance != PRIOR_COVARIANCE
    # The template's classes are no vocabulary's: leaving one out does not move them, but
    # for the system message it may drop, whose text is priced as Latin text.
    dropped = CLASSES.index("system_dropped")
    assert slopes[:dropped] == PRIOR_SLOPES[:dropped]
    latin = CLASSES.index("latin")
    assert slopes[dropped] == pytest.approx(DROPPING_SHARE * slopes[latin])


def test_the_priors_correlations_shrink_by_how_unsure_the_rows_make_them() -> None:
    # Two columns of four, correlated 0.8: the products of their standardized values are
    # 1.35, -0.15, -0.15 and 1.35, so each correlation's variance is 4 / 27 * 2.25 = 1/3,
    # and the shrinkage (1/3 + 1/3) / (0.64 + 0.64) = 25/48.
    assert correlation_shrinkage([[1, 2, 3, 4], [1, 3, 2, 4]]) == pytest.approx(25 / 48)
    # Columns nearly alike keep most of their correlation, columns nearly unrelated (0.03)
    # none of it.
    steady = [float(x) for x in range(12)]
    assert correlation_shrinkage([steady, [x + (-0.1) ** x for x in steady]]) < 0.1
    assert correlation_shrinkage([[1, 2, 3, 4, 5, 6], [3, 6, 1, 4, 2, 5]]) == 1.0
    # A column that never moves says nothing of the others.
    assert correlation_shrinkage([[1, 1, 1], [1, 2, 3]]) == 1.0
    # The prior's text covariance is the measured rows' with their correlations shrunk so.
    columns = list(zip(*MEASURED.values(), strict=True))
    kept = 1 - correlation_shrinkage(columns)
    assert 0.5 < kept < 1
    latin, cyrillic = CLASSES.index("latin"), CLASSES.index("cyrillic")
    assert PRIOR_COVARIANCE[latin][cyrillic] == pytest.approx(
        kept * statistics.covariance(columns[0], columns[1])
    )
    assert PRIOR_COVARIANCE[latin][latin] == pytest.approx(statistics.variance(columns[0]))


def test_a_tool_call_no_report_showed_is_bounded_at_the_most_a_template_spends() -> None:
    # The tool call's prior spread puts its bound at the most any of llama.cpp's templates
    # spends per token of the class (markers spelled as text), never below the guess's.
    tool = CLASSES.index("tool")
    spelled = sorted(TOOL_CALL_SPELLED.values(), reverse=True)
    bound = PRIOR_SLOPES[tool] + BOUND_Z * math.sqrt(PRIOR_COVARIANCE[tool][tool])
    assert bound == pytest.approx(spelled[0])
    assert bound > 1 + BOUND_Z  # above the guess of 1 give or take 1
    # A benchmark that holds the costliest template out bounds the call at the next one.
    (costliest,) = [name for name, v in TOOL_CALL_SPELLED.items() if v == spelled[0]]
    slopes, covariance = prior_of({costliest})
    assert slopes[tool] + BOUND_Z * math.sqrt(covariance[tool][tool]) == pytest.approx(spelled[1])
    assert slopes[CLASSES.index("latin") :] == PRIOR_SLOPES[CLASSES.index("latin") :]
    # Every template has a measure, and none of them is negative.
    assert len(TOOL_CALL_SPELLED) > 50
    assert min(TOOL_CALL_SPELLED.values()) >= 0


def test_a_prior_refuses_a_vocabulary_it_never_measured() -> None:
    with pytest.raises(ValueError, match="'phi-3'"):
        prior_of({"phi-3"})
    with pytest.raises(ValueError, match="too few"):
        prior_of(set(MEASURED) - {"gpt-2", "falcon"})


def test_a_calibration_without_a_vocabulary_fits_from_the_prior_without_it() -> None:
    sent = [Message.user(ENGLISH[1])], [Message.user(ENGLISH[1]), Message.user(RUSSIAN[0])]
    calibrations = (
        TokenCalibration(min_estimated_tokens=0),
        calibration_without({"SmolLM2"}, TokenCalibration(min_estimated_tokens=0)),
    )
    for calibration in calibrations:
        observed(calibration, list(zip(sent, (30, 90), strict=True)))
    reports = [(transcript_classes(COUNTER, p), r) for p, r in zip(sent, (30, 90), strict=True)]
    full, held_out = (c.fitted("m") for c in calibrations)
    assert full is not None
    assert held_out is not None
    assert full.posterior == fit(reports)
    assert held_out.posterior == fit(reports, Posterior.prior(excluding={"SmolLM2"}))
    assert held_out.posterior != full.posterior
    with pytest.raises(ValueError, match="learned already"):
        calibration_without({"SmolLM2"}, calibrations[0])  # its fit was on the full prior


TRUTH = {"framing": 2.5, "latin": 1.05, "cyrillic": 3.0, "cjk": 1.5, "arabic": 2.0}


def synthetic(seed: int, intercept: float = 120) -> list[tuple[tuple[int, ...], int]]:
    """Reports of a growing transcript whose cost is ``intercept + truth . counts``,
    two messages (eight tokens of framing) and one script's text each step."""
    observations = []
    counts = dict.fromkeys(TRUTH, 0)
    scripts = list(TRUTH)[1:]
    for step in range(16):
        counts["framing"] += 8
        counts[scripts[(step + seed) % len(scripts)]] += 15 + (step * 7 + seed) % 40
        reported = round(intercept + sum(TRUTH[k] * v for k, v in counts.items()))
        observations.append((counts_of(**counts), reported))
    return observations


@pytest.mark.parametrize("seed", range(4))
def test_the_fit_finds_each_scripts_slope_from_a_growing_transcript(seed: int) -> None:
    posterior = fit(synthetic(seed))
    for name in ("cyrillic", "cjk", "arabic"):
        index = CLASSES.index(name)
        assert posterior.slopes[index] == pytest.approx(TRUTH[name], rel=0.1)
        # Seen in a few hundred tokens: far surer than the prior.
        assert posterior.uncertainty[index] < Posterior.prior().uncertainty[index] / 4
    # A script no report held keeps its prior's uncertainty, so it is priced high.
    thai = CLASSES.index("thai")
    assert posterior.uncertainty[thai] > 0.5 * Posterior.prior().uncertainty[thai]
    low, high = posterior.bounds(counts_of(thai=100))
    assert high > 100 * posterior.slopes[thai] > low


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.lists(st.integers(0, 500), min_size=WIDTH, max_size=WIDTH), st.integers(1, 5000)
        ),
        max_size=12,
    )
)
def test_the_fit_is_deterministic_and_never_negative(
    observations: list[tuple[list[int], int]],
) -> None:
    given_ = [(tuple(c), r) for c, r in observations]
    posterior = fit(given_)
    assert posterior == fit(list(given_))
    assert all(b >= 0 for b in posterior.slopes)
    assert all(u > 0 for u in posterior.uncertainty)


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
    likely = calibration.estimate("m", COUNTER, kept, budget=10_000)  # far from the budget
    bound = calibration.estimate("m", COUNTER, kept)
    result = await client.request().with_messages(kept).with_prompt("And the museums?").run()
    reported = result.rounds[0].reported_input_tokens
    assert reported is not None
    sent = [*kept, Message.user("And the museums?")]
    # Four tokens of a 103-token prompt are 4%: within 5%, and never under.
    assert reported <= likely.count(sent) <= 1.05 * reported
    assert reported <= bound.count(sent) <= 1.15 * reported  # the bound leans high


async def _trained() -> tuple[TokenCalibration, Client, ScriptReports, list[Message]]:
    """A client whose calibration has a fit, and the conversation it was fitted on."""
    calibration = TokenCalibration(min_estimated_tokens=0)
    driver = ScriptReports([f"Answer {n}." for n in range(len(PROMPTS) + 1)])
    client = Client(driver, calibration=calibration, default_model=MODEL)
    messages: list[Message] = []
    for prompt in PROMPTS:
        result = await client.request().with_messages(messages).with_prompt(prompt).run()
        messages = list(result.messages)
    return calibration, client, driver, messages


@pytest.mark.anyio
async def test_after_a_cut_the_bound_decides_and_the_kept_transcript_shows_its_fitted_count() -> (
    None
):
    calibration, client, driver, messages = await _trained()
    twin, _, _, _ = await _trained()  # the same reports: the same fit, to price the cut with
    whole = [*messages, Message.user("And the museums?")]
    budget = COUNTER.count(whole) // 2  # the whole does not fit: limiting cuts at the bound
    assert calibration.estimate("m", COUNTER, whole, budget=budget).count(whole) > budget
    result = await (
        client.request()
        .with_messages(messages)
        .with_prompt("And the museums?")
        .with_max_context_tokens(budget)
        .with_output_reserve_tokens(0)
        .run()
    )
    record = result.rounds[0]
    assert record.limiting is not None
    assert record.limiting.dropped
    sent = list(driver.calls[-1].messages)
    bound = twin.estimate("m", COUNTER, sent).count(sent)
    fitted = twin.estimate("m", COUNTER, sent, budget=budget).count(sent)
    assert bound <= budget  # the kept transcript fits even at its bound...
    assert record.limiting.tokens_after == bound  # ...which decided what was kept
    assert fitted < bound
    assert record.calibrated_input_tokens == fitted  # what is shown: its likeliest count


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
    low, high = fitted.posterior.bounds(message_classes(COUNTER, added))
    price = fitted.counter(COUNTER, ()).price(added)
    assert low < price < high
    assert counter.count([*sent, added]) == 60 + math.ceil(high)
    # Where the budget is far, nothing is decided: the fitted price is given, to the
    # nearest token (what is new, rounded in the transcript's order).
    likely = calibration.estimate("m", COUNTER, [*sent, added], budget=10_000)
    assert likely.count([*sent, added]) == 60 + round(price)
    # Near it, the bound.
    near = calibration.estimate("m", COUNTER, [*sent, added], budget=70)
    assert near.count([*sent, added]) == 60 + math.ceil(high)


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
    assert saved["version"] == 2
    assert saved["slopes"] == dict(zip(CLASSES, fitted.slopes, strict=True))
    assert saved["uncertainty"] == dict(zip(CLASSES, fitted.uncertainty, strict=True))
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


# -- a template that leaves the system message out of some prompts -----------------------

SYSTEM = Message.system(" ".join([ENGLISH[0], ENGLISH[2], ENGLISH[3]] * 3))
DROPPED = CLASSES.index("system_dropped")
TEMPLATE = {"framing": 1.0, "tool": 1.5, "tool_result": 1.0, "latin": 1.2, "cyrillic": 3.0}


def template_tokens(
    prompt: list[Message], *, ended_by_tool: float, system: Message = SYSTEM
) -> int:
    """A template's count of ``prompt``: 40 tokens of its own, each class at its
    :data:`TEMPLATE` slope, and, when a tool result ends the prompt, ``ended_by_tool``
    times the system message's cost (-1: Mistral Nemo's, which leaves it out)."""
    counts = transcript_classes(COUNTER, prompt)
    cost = 40.0 + sum(TEMPLATE.get(k, 0.0) * counts[CLASSES.index(k)] for k in TEMPLATE)
    results = counts[len(CLASSES) :]
    cost += sum(TEMPLATE.get(s, 0.0) * results[i] for i, s in enumerate(SCRIPTS))
    if prompt[-1].tool_call_id is not None:
        shown = transcript_classes(COUNTER, [system])
        cost += ended_by_tool * sum(
            TEMPLATE.get(k, 0.0) * shown[CLASSES.index(k)] for k in TEMPLATE
        )
    return round(cost)


def tool_rounds(
    *, ended_by_tool: float, turns: int = 12, system: Message = SYSTEM
) -> list[tuple[list[Message], int]]:
    """The prompts of a conversation with a tool round every third turn, and their counts."""
    prompts = []
    history = [system]
    for turn in range(turns):
        history.append(Message.user(PROMPTS[turn % len(PROMPTS)]))
        if turn % 3 == 2:
            prompts.append(list(history))
            call = ToolCall(id=f"call-{turn}", name="lookup", arguments='{"city": "Porto"}')
            history.append(Message.assistant(tool_calls=[call]))
            history.append(Message.tool(call.id, RUSSIAN[turn % len(RUSSIAN)], name="lookup"))
        prompts.append(list(history))
        history.append(Message.assistant(f"Answer {turn}: {ENGLISH[turn % len(ENGLISH)]}"))
    return [(p, template_tokens(p, ended_by_tool=ended_by_tool, system=system)) for p in prompts]


def observed(calibration: TokenCalibration, prompts: list[tuple[list[Message], int]]) -> None:
    for prompt, reported in prompts:
        calibration.observe(
            "m",
            estimated_tokens=COUNTER.count(prompt),
            reported_tokens=reported,
            sent=prompt,
            counter=COUNTER,
        )


def test_a_prompt_a_tool_result_ends_counts_its_system_messages_as_dropped() -> None:
    prompts = [p for p, _ in tool_rounds(ended_by_tool=-1.0, turns=3)]
    ended_by_user, ended_by_tool = prompts[0], prompts[-1]
    assert ended_by_tool[-1].tool_call_id is not None
    assert transcript_classes(COUNTER, ended_by_user)[DROPPED] == 0
    # Negative, so that a slope of 0 or more can only take the system message away.
    assert transcript_classes(COUNTER, ended_by_tool)[DROPPED] == -COUNTER.message_tokens(SYSTEM)
    assert transcript_classes(COUNTER, ended_by_tool[1:])[DROPPED] == 0  # no system message
    # Most templates show it (60 of 61 measured): before any report the slope is near 0.
    assert DROPPING_SHARE == 2 / 63
    assert PRIOR_SLOPES[DROPPED] == pytest.approx(
        DROPPING_SHARE * PRIOR_SLOPES[CLASSES.index("latin")]
    )


def test_the_fit_learns_a_template_that_drops_the_system_message_when_a_tool_result_ends() -> None:
    prompts = tool_rounds(ended_by_tool=-1.0, turns=13)
    calibration = TokenCalibration(min_estimated_tokens=0)
    observed(calibration, prompts[:-2])
    # The last report's prompt ended with a user's message: the next, a tool round's
    # second call, is priced without the system message, and never under at the bound.
    second, reported = prompts[-2]
    assert second[-1].tool_call_id is not None
    likely = calibration.estimate("m", COUNTER, second, budget=100_000).count(second)
    bound = calibration.estimate("m", COUNTER, second).count(second)
    assert abs(likely - reported) <= 0.01 * reported
    assert reported <= bound  # the tool call and its result are new: priced high there
    observed(calibration, prompts[-2:-1])
    fitted = calibration.fitted("m")
    assert fitted is not None
    system = transcript_classes(COUNTER, [SYSTEM])
    cost = sum(TEMPLATE.get(k, 0.0) * system[CLASSES.index(k)] for k in TEMPLATE)
    assert fitted.slopes[DROPPED] == pytest.approx(cost / COUNTER.message_tokens(SYSTEM), rel=0.1)
    # The last report's prompt ended with a tool result (its system message left out):
    # the next, a user's, is priced with it again, at its likeliest and at its bound.
    last, reported = prompts[-1]
    assert fitted.anchor[-1].tool_call_id is not None
    likely = calibration.estimate("m", COUNTER, last, budget=100_000).count(last)
    bound = calibration.estimate("m", COUNTER, last).count(last)
    assert abs(likely - reported) <= 0.01 * reported
    assert reported <= bound <= 1.03 * reported


def test_a_template_that_adds_on_tool_rounds_leaves_the_dropped_slope_at_zero() -> None:
    prompts = tool_rounds(ended_by_tool=+0.5)
    observations = [(transcript_classes(COUNTER, p), r) for p, r in prompts]
    posterior = fit(observations)
    # A template cannot show the system message more than once: the steps say it does not
    # drop it, so the slope is 0, and the other slopes are those of the fit that knows it
    # is 0 (not merely clamped).
    assert posterior.slopes[DROPPED] == pytest.approx(0.0, abs=1e-6)
    slopes, covariance = list(PRIOR_SLOPES), [list(row) for row in PRIOR_COVARIANCE]
    slopes[DROPPED], covariance[DROPPED][DROPPED] = 0.0, 1e-12
    known = fit(observations, Posterior(tuple(slopes), tuple(map(tuple, covariance))))
    for index, (b, expected) in enumerate(zip(posterior.slopes, known.slopes, strict=True)):
        assert b == pytest.approx(expected, rel=0.02, abs=0.02), CLASSES[index]


def test_a_system_message_that_comes_back_is_priced_as_a_template_that_dropped_it() -> None:
    # After the first tool round a short system message's drop is too little to tell from
    # what a template spends on a tool call: its return is priced as a template that
    # dropped it would show it, never under by the message.
    short = Message.system("You are a concise travel assistant. Answer in one sentence.")
    system = COUNTER.message_tokens(short)
    for ended_by_tool in (-1.0, 0.0):
        prompts = tool_rounds(ended_by_tool=ended_by_tool, turns=13, system=short)
        calibration = TokenCalibration(min_estimated_tokens=0)
        observed(calibration, prompts[:4])  # the first tool round, its second call last
        back, reported = prompts[4]
        assert prompts[3][0][-1].tool_call_id is not None
        assert back[-1].tool_call_id is None
        likely = calibration.estimate("m", COUNTER, back, budget=100_000).count(back)
        assert likely >= 0.97 * reported
        if ended_by_tool == 0.0:  # shown all along: over by about the message, this once
            assert likely - reported >= 0.8 * system
        # Once the reports rule the dropping template out (or in), the return is priced as
        # the template shows it.
        observed(calibration, prompts[4:-1])
        back, reported = prompts[-1]
        likely = calibration.estimate("m", COUNTER, back, budget=100_000).count(back)
        assert abs(likely - reported) <= 0.01 * reported


def test_a_fitted_count_rounds_the_new_messages_in_order() -> None:
    calibration = TokenCalibration(min_estimated_tokens=0)
    sent = [
        Message.user(f"{ENGLISH[n % len(ENGLISH)]} ({n})")
        if n % 2 == 0
        else Message.assistant(f"{ENGLISH[(n + 1) % len(ENGLISH)]} [{n}]")
        for n in range(6)
    ]
    for prompt in (sent[:4], sent):
        calibration.observe(
            "m",
            estimated_tokens=COUNTER.count(prompt),
            reported_tokens=round(1.37 * COUNTER.count(prompt)),
            sent=prompt,
            counter=COUNTER,
        )
    fitted = calibration.fitted("m")
    assert fitted is not None
    added = [Message.user(f"{ENGLISH[n % 4]} ({n})") for n in range(6)]
    transcript = [*sent, *added]
    likely = calibration.estimate("m", COUNTER, transcript, budget=100_000)
    prices = [fitted.counter(COUNTER, ()).price(m) for m in added]
    # Together the new messages count their prices' sum to the nearest token, where each
    # rounded up would count up to a token more a message...
    assert likely.count(transcript) == fitted.anchor_tokens + round(sum(prices))
    assert sum(math.ceil(p) for p in prices) > round(sum(prices))
    # ...and the count is still the sum of its messages' counts and its overhead.
    assert isinstance(likely, IncrementalTokenCounter)
    each = sum(likely.message_tokens(m) for m in transcript)
    assert likely.count(transcript) == each + likely.overhead_tokens(())
    # A message outside the transcript priced is rounded up, as at the bound.
    other = Message.user("A question the transcript does not hold, about the harbour.")
    assert likely.message_tokens(other) == math.ceil(fitted.counter(COUNTER, ()).price(other))


def test_no_step_weighed_rules_out_a_template_that_drops_the_system_message() -> None:
    # Before any step (the prior) and after a restore (a saved fit, whose template is
    # weighed again from the steps after it), a system message that comes back is priced
    # as a template that dropped it would show it: its text, at Latin text's slope.
    latin = CLASSES.index("latin")
    assert Posterior.prior().dropping == (PRIOR_SLOPES[latin], PRIOR_COVARIANCE[latin][latin])
    held_out = Posterior.prior(excluding={"SmolLM2"})
    assert held_out.dropping[0] == held_out.slopes[latin]
    restored = Posterior.of([1.2] * len(CLASSES), [0.1] * len(CLASSES))
    assert restored.dropping == (1.2, pytest.approx(0.01))
