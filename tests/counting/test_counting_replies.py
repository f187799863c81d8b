"""Calibration learns from the output tokens of replies of text alone (``_slopes.fit``)."""

# The samples are in Russian and Chinese.
# ruff: noqa: RUF001

from __future__ import annotations

import attrs
import pytest

from threadline import Client, InvalidRequestError, Message, Model, ToolCall
from threadline._messages import ImagePart, Reasoning, Role, TextPart
from threadline._provider import ProviderCall, ProviderResponse
from threadline.counting import BuiltinTokenCounter, TokenCalibration
from threadline.counting._calibration._chance import Residuals, worse_by_chance
from threadline.counting._calibration._classes import (
    CLASSES,
    SCRIPTS,
    message_classes,
    reply_classes,
    transcript_classes,
)
from threadline.counting._calibration._slopes import fit
from threadline.testing import ScriptedDriver

COUNTER = BuiltinTokenCounter()
WIDTH = len(CLASSES) + len(SCRIPTS)
TRUTH = {"framing": 2.5, "cyrillic": 1.3, "cjk": 2.0}
"""A vocabulary against the prior's grain: cheap on Cyrillic, dear on Chinese."""


def counts_of(**by_class: int) -> tuple[int, ...]:
    counts = [0] * WIDTH
    for name, value in by_class.items():
        counts[CLASSES.index(name)] = value
    return tuple(counts)


def priced(counts: tuple[int, ...]) -> int:
    return round(sum(TRUTH.get(name, 0.0) * counts[k] for k, name in enumerate(CLASSES)))


def shared_steps() -> list[tuple[tuple[int, ...], int]]:
    """Reports whose every step holds Russian and Chinese in one proportion: the steps
    alone cannot tell the two scripts' prices apart."""
    observations = []
    framing = 0
    for step in range(1, 9):
        framing += (8, 4)[step % 2]  # two messages a step, or one
        counts = counts_of(framing=framing, cyrillic=40 * step, cjk=30 * step)
        observations.append((counts, 90 + priced(counts)))
    return observations


def replies(rule: dict[str, float], turns: int = 8) -> list[tuple[tuple[int, ...], int]]:
    """Replies in one script each, Russian and Chinese by turns, counted by ``rule``
    (tokens per o200k token) with one token for the end of the turn."""
    found = []
    for turn in range(turns):
        script = ("cyrillic", "cjk")[turn % 2]
        size = 20 + 7 * (turn % 8)
        found.append((counts_of(**{script: size}), round(rule[script] * size) + 1))
    return found


def slope(posterior: object, name: str) -> float:
    return posterior.slopes[CLASSES.index(name)]  # type: ignore[attr-defined, no-any-return]


def test_replies_tell_apart_two_scripts_that_every_step_holds_together() -> None:
    alone = fit(shared_steps())
    # The steps leave the split to the prior, whose Cyrillic is dearer than its Chinese.
    assert abs(slope(alone, "cjk") - TRUTH["cjk"]) > 0.2 * TRUTH["cjk"]
    both = fit(shared_steps(), replies=replies(TRUTH))
    for name in ("cyrillic", "cjk"):
        assert slope(both, name) == pytest.approx(TRUTH[name], rel=0.05)
        index = CLASSES.index(name)
        assert both.uncertainty[index] < alone.uncertainty[index] / 2


def varied_steps(jitter: bool = False) -> list[tuple[tuple[int, ...], int]]:
    """Eight reports whose steps hold Russian and Chinese in changing proportions (so
    the prompts themselves can tell the two apart, given time), each report a few
    tokens off with ``jitter`` (a template's whitespace)."""
    observations = []
    framing = cyrillic = cjk = 0
    off = (-3, 4, -4, -1, -4, 2, 2, 2) if jitter else (0,) * 8
    for step in range(8):
        framing += (8, 4)[step % 2]
        cyrillic += (40, 10, 25)[step % 3]
        cjk += (30, 35, 5)[step % 3]
        counts = counts_of(framing=framing, cyrillic=cyrillic, cjk=cjk)
        observations.append((counts, 90 + priced(counts) + off[step]))
    return observations


@pytest.mark.parametrize(
    "rule",
    [{"cyrillic": 1.0, "cjk": 1.0}, {"cyrillic": 3.0, "cjk": 0.7}],
    ids=["o200k's count", "against the grain"],
)
def test_replies_counted_otherwise_than_the_prompts_leave_the_fit_to_them(
    rule: dict[str, float],
) -> None:
    # One reply a report, as a conversation gives them: by the eighth report the
    # prompts' residuals have grown past chance with the replies in.
    assert fit(varied_steps(), replies=replies(rule)) == fit(varied_steps())


def test_replies_that_agree_with_noisy_prompts_are_kept() -> None:
    alone = fit(varied_steps(jitter=True))
    both = fit(varied_steps(jitter=True), replies=replies(TRUTH))

    def error(posterior: object) -> float:
        return sum(abs(slope(posterior, name) - TRUTH[name]) for name in ("cyrillic", "cjk"))

    assert error(both) < 0.8 * error(alone)
    for name in ("cyrillic", "cjk"):
        index = CLASSES.index(name)
        assert both.uncertainty[index] < alone.uncertainty[index]


def test_a_reply_is_text_alone_or_none() -> None:
    text = Message.assistant("Музей открывается в девять утра, экскурсии идут каждый час.")
    counts = reply_classes(COUNTER, text)
    assert counts is not None
    cyrillic = CLASSES.index("cyrillic")
    assert counts[cyrillic] == message_classes(COUNTER, text)[cyrillic] > 0
    assert counts[: CLASSES.index("latin")] == (0, 0, 0, 0)  # no framing, no template
    call = ToolCall(id="c1", name="lookup", arguments='{"q": "museum"}')
    assert reply_classes(COUNTER, Message.assistant("Looking it up.", tool_calls=[call])) is None
    thought = Message.assistant("It opens at nine.", reasoning=Reasoning(text="Check."))
    assert reply_classes(COUNTER, thought) is None
    assert reply_classes(COUNTER, Message.user("Когда открывается музей?")) is None
    parts = Message(role=Role.ASSISTANT, content=(TextPart(text=text.text), TextPart(text=" Да.")))
    assert reply_classes(COUNTER, parts) == reply_classes(COUNTER, Message.assistant(parts.text))
    image = ImagePart(url="https://example.invalid/museum.png")
    with_image = Message(role=Role.ASSISTANT, content=(TextPart(text=text.text), image))
    assert reply_classes(COUNTER, with_image) is None
    assert reply_classes(COUNTER, Message.assistant(text.text, name="guide")) is None


def test_observe_names_a_count_that_is_no_count() -> None:
    calibration = TokenCalibration()
    prompt = PROMPTS[0]
    for bad in (None, -1, 2.5, True):
        with pytest.raises((TypeError, ValueError, InvalidRequestError), match="output_tokens"):
            calibration.observe(
                "m",
                estimated_tokens=COUNTER.count(prompt),
                reported_tokens=90,
                sent=prompt,
                counter=COUNTER,
                reply=RUSSIAN,
                output_tokens=bad,  # type: ignore[arg-type]
            )


RUSSIAN = Message.assistant(
    "Музей открывается в девять утра, а по четвергам работает допоздна. Экскурсия "
    "начинается в главном зале, билеты можно купить на входе или заранее."
)
PROMPTS = [
    [Message.system("Be brief."), Message.user("Расскажи о музее и о том, когда он открыт.")],
    [Message.system("Be brief."), Message.user("Расскажи о музее."), RUSSIAN],
    [Message.system("Be brief."), Message.user("Расскажи о музее."), RUSSIAN, RUSSIAN],
]


LONGER = Message.assistant(RUSSIAN.text + " " + RUSSIAN.text)


def fitted_after(make: object, output: float, reasoning_tokens: int = 0) -> object:
    """The fit after :data:`PROMPTS`, each answered by ``make(text)`` of a longer or a
    shorter Russian text, counted ``output`` tokens per o200k token."""
    calibration = TokenCalibration(min_estimated_tokens=0)
    for prompt, text in zip(PROMPTS, (RUSSIAN, LONGER, RUSSIAN), strict=True):
        reply = make(text.text)  # type: ignore[operator]
        size = sum(reply_classes(COUNTER, text) or ())
        calibration.observe(
            "m",
            estimated_tokens=COUNTER.count(prompt),
            reported_tokens=20 + priced(transcript_classes(COUNTER, prompt)),
            sent=prompt,
            counter=COUNTER,
            reply=reply,
            output_tokens=round(output * size) + 1,
            reasoning_tokens=reasoning_tokens,
        )
    found = calibration.fitted("m")
    assert found is not None
    return found.posterior


def test_observe_learns_from_a_reply_of_text_alone_and_from_no_other() -> None:
    def text(said: str) -> Message:
        return Message.assistant(said)

    def calling(said: str) -> Message:
        call = ToolCall(id="c1", name="lookup", arguments='{"q": "museum"}')
        return Message.assistant(said, tool_calls=[call])

    def thinking(said: str) -> Message:
        return Message.assistant(said, reasoning=Reasoning(text="Hm."))

    without = fitted_after(text, 0.0)  # one token: no count of that text
    learned = fitted_after(text, TRUTH["cyrillic"])
    assert learned != without
    assert fitted_after(calling, TRUTH["cyrillic"]) == without
    assert fitted_after(thinking, TRUTH["cyrillic"]) == without
    assert fitted_after(text, TRUTH["cyrillic"], reasoning_tokens=40) == without
    # No vocabulary spends nine tokens per o200k token, nor a fifth of one.
    assert fitted_after(text, 9.0) == without
    assert fitted_after(text, 0.2) == without
    short = Message.assistant("Да.")
    assert fitted_after(lambda said: short if said == RUSSIAN.text else text(said), 1.3) == (
        without
    )


@pytest.mark.anyio
async def test_a_client_hands_each_reply_and_its_output_tokens_to_the_calibration() -> None:
    class CountsOutput(ScriptedDriver):
        """Prompts and replies counted alike: 1.3 a token of Russian, 2.0 of Chinese."""

        def __init__(self, replies: list[str], *, outputs: str) -> None:
            super().__init__(replies)
            self.outputs = outputs

        def _next(self, call: ProviderCall) -> ProviderResponse:
            response = super()._next(call)
            prompt = 30 + priced(transcript_classes(COUNTER, call.messages))
            counts = reply_classes(COUNTER, response.message) or counts_of()
            output = priced(counts) + 1 if self.outputs != "none" else 0
            hidden = 40 if self.outputs == "with hidden reasoning" else 0
            usage = attrs.evolve(response.usage, input_tokens=prompt, output_tokens=output + hidden)
            usage = attrs.evolve(usage, reasoning_tokens=hidden)
            omitted = self.outputs == "beside a server tool's"
            return attrs.evolve(response, usage=usage, omitted_output=omitted)

    answers = [
        "Музей открывается в девять утра, а по четвергам работает допоздна.",
        "博物馆早上九点开门，星期四晚上开放到很晚，导览从大厅开始。",
        "Экскурсия начинается в главном зале, билеты можно купить на входе.",
        "周末人很多，最好提前在网上买票，也可以参加晚上的导览。",
    ]
    questions = ["Когда открыт музей? А в четверг?", "什么时候开门？", "А экскурсии?", "周末呢？"]
    found = []
    kinds = ("none", "counted", "with hidden reasoning", "beside a server tool's")
    for outputs in kinds:
        calibration = TokenCalibration(min_estimated_tokens=0)
        client = Client(
            CountsOutput(answers, outputs=outputs),
            calibration=calibration,
            default_model=Model("m", context_size=100_000),
        )
        messages: list[Message] = []
        for question in questions:
            result = await client.request().with_messages(messages).with_prompt(question).run()
            messages = list(result.messages)
        fitted = calibration.fitted("m")
        assert fitted is not None
        found.append((slope(fitted, "cyrillic"), slope(fitted, "cjk")))
    without, with_replies, hidden, omitted = found

    def off(slopes: tuple[float, float]) -> float:
        return abs(slopes[0] - TRUTH["cyrillic"]) + abs(slopes[1] - TRUTH["cjk"])

    assert off(with_replies) < off(without)  # the replies split Russian from Chinese
    assert with_replies[1] == pytest.approx(TRUTH["cjk"], rel=0.1)
    assert hidden == omitted == without  # neither count is the reply's text


def test_one_reply_or_replies_without_prompt_steps_fit_as_far_as_they_go() -> None:
    (first, *_) = shared_steps()
    one = replies(TRUTH)[:1]
    assert fit([first], replies=one) == fit([first])  # no step at all: the prior
    both = fit([first], replies=replies(TRUTH))  # the replies' steps alone
    assert slope(both, "cjk") == pytest.approx(TRUTH["cjk"], rel=0.05)


@pytest.mark.parametrize(
    ("statistic", "settled", "free", "chance"),
    [(6.94, 2, 4, 0.05), (18.0, 2, 4, 0.01), (3.15, 2, 60, 0.05), (1.0, 5, 10, 0.4651)],
)
def test_the_chance_of_the_residuals_growing_is_an_f_tests(
    statistic: float, settled: float, free: float, chance: float
) -> None:
    # Published quantiles of Snedecor's F distribution (the last: its survival at 1).
    alone = Residuals(noise=0.1, squares=free * 1.0, free=free)
    joined = Residuals(noise=0.1, squares=alone.squares + statistic * settled, free=free + settled)
    assert worse_by_chance(alone, joined) == pytest.approx(chance, abs=2e-3)
    assert worse_by_chance(joined, alone) == 1.0  # the residuals did not grow
