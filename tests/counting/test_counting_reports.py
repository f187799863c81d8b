"""Usage reports a calibration cannot believe: those no provider could give are left out
with a warning, and any other moves the calibration only so far."""

from __future__ import annotations

import logging

import pytest

from threadline import InvalidRequestError, Message, ToolCall
from threadline.counting import BuiltinTokenCounter, TokenCalibration

COUNTER = BuiltinTokenCounter()
LOGGER = "threadline.counting"

ENGLISH = [
    "Tell me about the old town, its bridges and the best time of year to walk there.",
    "The old town is best in spring, when the bridges are quiet and the river is high.",
    "Which museum should I see first if I only have one morning, and is it far away?",
    "Start with the history museum by the cathedral: it opens early and is ten minutes away.",
]


def history(turns: int) -> list[Message]:
    """A growing English conversation: ``turns`` questions and answers."""
    messages: list[Message] = []
    for n in range(turns):
        messages += [
            Message.user(f"{ENGLISH[(2 * n) % 4]} (question {n})"),
            Message.assistant(f"{ENGLISH[(2 * n + 1) % 4]} (answer {n})"),
        ]
    return messages


def observe(
    calibration: TokenCalibration, sent: list[Message], reported: int, *, window: int | None = None
) -> float | None:
    given = {} if window is None else {"window": window}
    return calibration.observe(
        "m",
        estimated_tokens=COUNTER.count(sent),
        reported_tokens=reported,
        sent=sent,
        counter=COUNTER,
        **given,
    )


def test_a_report_over_the_models_window_is_left_out(caplog: pytest.LogCaptureFixture) -> None:
    calibration = TokenCalibration()
    sent = history(4)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert observe(calibration, sent, 9_000, window=8_192) is None
    assert calibration.ratio("m") is None
    assert calibration.fitted("m") is None
    assert calibration.estimate("m", COUNTER, sent) is COUNTER
    assert "more than the model's window of 8192" in caplog.text


@pytest.mark.parametrize("reported", [10**12, 1])
def test_a_report_no_tokenizer_could_give_is_left_out(
    caplog: pytest.LogCaptureFixture, reported: int
) -> None:
    calibration = TokenCalibration()
    sent = history(4)
    observe(calibration, sent, round(1.2 * COUNTER.count(sent)))
    learned = calibration.ratio("m")
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert observe(calibration, history(5), reported) == learned
    assert calibration.ratio("m") == learned
    assert calibration.fitted("m") is None  # the report did not join a fit either
    assert f"{reported} input tokens" in caplog.text
    # The next transcript is still counted from the believable report.
    later = history(6)
    counted = calibration.estimate("m", COUNTER, later).count(later)
    assert COUNTER.count(later) <= counted <= 1.3 * COUNTER.count(later)


def test_one_report_moves_the_ratio_by_a_bounded_amount(caplog: pytest.LogCaptureFixture) -> None:
    calibration = TokenCalibration(min_estimated_tokens=0)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        assert calibration.observe("m", estimated_tokens=100, reported_tokens=1_000) == 4.0
    assert "taken as 400" in caplog.text
    # A provider that keeps saying so is believed, a bounded step at a time.
    assert calibration.observe("m", estimated_tokens=100, reported_tokens=1_000) == 10.0


def test_one_report_far_below_the_prediction_is_not_the_anchor(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calibration = TokenCalibration()
    for turns in (3, 4, 5):
        sent = history(turns)
        observe(calibration, sent, round(1.2 * COUNTER.count(sent)))
    before = calibration.fitted("m")
    assert before is not None
    sent = history(6)
    estimated = COUNTER.count(sent)
    # 10 tokens for a prompt of over 300: a ratio a tokenizer could give, not this one.
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        observe(calibration, sent, 10)
    assert "far below" in caplog.text
    assert calibration.fitted("m") is before
    later = history(7)
    counted = calibration.estimate("m", COUNTER, later).count(later)
    assert counted >= 1.15 * COUNTER.count(later)
    assert estimated > 300


def test_reports_far_below_in_a_row_are_believed_a_step_at_a_time() -> None:
    # A provider whose tokenizer is far cheaper than the estimate (small images, say):
    # a second report in a row moves the calibration a bounded step down.
    calibration = TokenCalibration()
    sent = history(5)
    estimated = COUNTER.count(sent)
    observe(calibration, sent, estimated // 10)
    assert calibration.estimate("m", COUNTER, sent).count(sent) == estimated
    observe(calibration, sent, estimated // 10)
    counted = calibration.estimate("m", COUNTER, sent).count(sent)
    assert counted == pytest.approx(estimated / 4, abs=1)


def test_one_wild_report_moves_the_fit_by_a_bounded_amount() -> None:
    calibration = TokenCalibration()
    for turns in (3, 4, 5, 6):
        sent = history(turns)
        observe(calibration, sent, COUNTER.count(sent))
    before = calibration.fitted("m")
    assert before is not None
    sent = history(7)
    observe(calibration, sent, 100 * COUNTER.count(sent))
    after = calibration.fitted("m")
    assert after is not None
    for old, new in zip(before.slopes, after.slopes, strict=True):
        assert old / 4 <= new <= max(4 * old, old + 1)
    # Priced from that report, a message the next turn adds costs a few times what it
    # cost before, not a hundred.
    added = Message.user("One more question about the weather by the sea, please.")
    base = calibration.estimate("m", COUNTER, sent)
    assert base.count([*sent, added]) - base.count(sent) <= 5 * COUNTER.count([added])


def test_ratios_given_to_a_calibration_must_be_ones_a_tokenizer_could_give() -> None:
    for ratio in (1e-300, 1e300, 129.0):
        with pytest.raises(InvalidRequestError, match="1/128 to 128"):
            TokenCalibration({"m": ratio})
    assert TokenCalibration({"m": 128.0}).ratio("m") == 128.0


def _observe_unshown(calibration: TokenCalibration, sent: list[Message], reported: int) -> None:
    # What a template that renders no tool schemas reports: the estimate counts 300 tokens
    # of schemas the prompt never holds.
    calibration.observe(
        "m",
        estimated_tokens=COUNTER.count(sent) + 300,
        reported_tokens=reported,
        sent=sent,
        counter=COUNTER,
    )


def test_a_report_left_out_as_far_below_is_learned_when_the_next_agrees(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calibration = TokenCalibration()
    first, second = history(1), history(3)
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        _observe_unshown(calibration, first, COUNTER.count(first))
    assert "far below" in caplog.text
    assert calibration.fitted("m") is None
    # The next prompt is not far below its price, and it grew by what its messages cost:
    # both reports are learned, so there are two, and a fit.
    _observe_unshown(calibration, second, COUNTER.count(second))
    fitted = calibration.fitted("m")
    assert fitted is not None
    assert fitted.anchor_tokens == COUNTER.count(second)
    # Without the first report there would be one, and no fit yet.
    alone = TokenCalibration()
    _observe_unshown(alone, second, COUNTER.count(second))
    assert alone.fitted("m") is None


def test_a_report_left_out_as_far_below_stays_out_when_the_next_grew_past_it() -> None:
    # A first report that counted a fraction of its prompt (10 tokens for over 80): the
    # next one grows by far more than its new messages can cost, so the first stays out.
    calibration = TokenCalibration()
    first, second = history(2), history(3)
    observe(calibration, first, 10)
    assert COUNTER.count(first) > 80
    observe(calibration, second, COUNTER.count(second))
    assert calibration.fitted("m") is None
    assert calibration.ratio("m") == pytest.approx(1.0)


def test_a_held_report_outlives_a_report_no_provider_could_give() -> None:
    # The report between them is left out as impossible (over the window): it is neither
    # held in the far-below report's place nor learned when the next report agrees.
    calibration = TokenCalibration()
    first, middle, last = history(1), history(2), history(3)
    _observe_unshown(calibration, first, COUNTER.count(first))
    calibration.observe(
        "m",
        estimated_tokens=COUNTER.count(middle) + 300,
        reported_tokens=5_000,
        sent=middle,
        counter=COUNTER,
        window=4_096,
    )
    _observe_unshown(calibration, last, COUNTER.count(last))
    fitted = calibration.fitted("m")
    assert fitted is not None  # the first and the last, which agree...
    without = TokenCalibration()
    _observe_unshown(without, first, COUNTER.count(first))
    _observe_unshown(without, last, COUNTER.count(last))
    fitted_without = without.fitted("m")
    assert fitted_without is not None
    assert fitted.slopes == fitted_without.slopes  # ...and nothing of the one between


def test_a_held_reply_with_hidden_reasoning_is_not_learned_as_text() -> None:
    # Each report comes with its reply; replies are learned in steps between them, so the
    # held report's reply moves the fit only if it is learned.
    later = Message.assistant(ENGLISH[2])

    def fitted_after(reply: Message | None, reasoning: int) -> tuple[float, ...]:
        calibration = TokenCalibration()
        first, second = history(1), history(3)
        for prompt, said, output, hidden in (
            (first, reply, 2 * COUNTER.count([reply]) if reply else 0, reasoning),
            (second, later, COUNTER.count([later]), 0),
        ):
            calibration.observe(
                "m",
                estimated_tokens=COUNTER.count(prompt) + 300,
                reported_tokens=COUNTER.count(prompt),
                sent=prompt,
                counter=COUNTER,
                reply=said,
                output_tokens=output,
                reasoning_tokens=hidden,
            )
        fitted = calibration.fitted("m")
        assert fitted is not None
        return fitted.slopes

    answer = Message.assistant(f"{ENGLISH[1]} {ENGLISH[3]}")
    assert fitted_after(answer, reasoning=0) != fitted_after(None, reasoning=0)
    assert fitted_after(answer, reasoning=400) == fitted_after(None, reasoning=0)


def test_a_held_report_is_learned_when_the_next_prompt_ends_with_a_tool_result() -> None:
    # The next prompt leaves out the system message (the tool result ends it), which a
    # template may drop: that is no cut, and the held report is learned.
    system = Message.system("You are a travel assistant. Answer in one short sentence.")
    first = [system, *history(1)]
    call = ToolCall(id="call-1", name="lookup", arguments='{"city": "Porto"}')
    second = [
        *first,
        Message.user("What is the weather in Porto today, and tomorrow?"),
        Message.assistant(tool_calls=[call]),
        Message.tool(call.id, "Sunny, 24 degrees; tomorrow cloudy, 19.", name="lookup"),
    ]
    calibration = TokenCalibration()
    _observe_unshown(calibration, first, COUNTER.count(first))
    _observe_unshown(calibration, second, COUNTER.count(second))
    assert calibration.fitted("m") is not None
