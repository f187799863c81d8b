"""Calibration: ratios learned from reported usage, ratcheting up, scaling later estimates,
kept with the client and saved with a conversation."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence

import attrs
import pytest

from threadline import (
    Agent,
    Client,
    Conversation,
    ConversationFormatError,
    InvalidRequestError,
    Message,
    Model,
    Tool,
)
from threadline._provider import ProviderCall, ProviderResponse
from threadline.counting import (
    ApproximateCounter,
    CalibratedCounter,
    TokenCalibration,
    TokenCounter,
)
from threadline.counting._calibration._classes import CLASSES
from threadline.counting._calibration._priors import PRIOR_UNCERTAINTY
from threadline.testing import ScriptedDriver

MODEL = Model("m", context_size=100_000)


class PerMessageCounter:
    """Ten tokens a message, nothing else: estimates a test can do in its head."""

    def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        return 10 * len(messages)


class ReportingDriver(ScriptedDriver):
    """A scripted driver whose provider reports ``ratio`` times the request's estimate."""

    def __init__(self, replies: list[str], ratio: float, counter: TokenCounter) -> None:
        super().__init__(replies)
        self.ratio = ratio
        self.counter = counter

    def _next(self, call: ProviderCall) -> ProviderResponse:
        response = super()._next(call)
        reported = round(self.counter.count(call.messages, call.tools) * self.ratio)
        return attrs.evolve(response, usage=attrs.evolve(response.usage, input_tokens=reported))


# -- the ratio ---------------------------------------------------------------------------


def test_the_first_observation_sets_the_ratio_and_later_ones_only_raise_it() -> None:
    calibration = TokenCalibration(min_estimated_tokens=0)
    assert calibration.ratio("m") is None
    assert calibration.observe("m", estimated_tokens=100, reported_tokens=90) == 0.9
    assert calibration.observe("m", estimated_tokens=100, reported_tokens=120) == 1.2
    assert calibration.observe("m", estimated_tokens=100, reported_tokens=80) == 1.2
    assert calibration.ratio("m") == 1.2
    assert calibration.ratio("other") is None


def test_small_prompts_and_empty_reports_teach_nothing() -> None:
    calibration = TokenCalibration(min_estimated_tokens=64)
    assert calibration.observe("m", estimated_tokens=63, reported_tokens=200) is None
    assert calibration.observe("m", estimated_tokens=100, reported_tokens=0) is None
    assert calibration.observe("m", estimated_tokens=64, reported_tokens=80) == 1.25


def test_absorb_keeps_the_larger_ratio_per_model() -> None:
    calibration = TokenCalibration({"a": 1.1, "b": 1.5})
    calibration.absorb({"a": 1.3, "b": 1.2, "c": 0.9})
    assert calibration.ratios() == {"a": 1.3, "b": 1.5, "c": 0.9}


@pytest.mark.parametrize("ratio", [0, -1.0, math.inf, math.nan, True, "1.2"])
def test_a_ratio_must_be_a_positive_finite_number(ratio: object) -> None:
    with pytest.raises(InvalidRequestError, match="positive, finite number"):
        TokenCalibration({"m": ratio})  # type: ignore[dict-item]


def test_a_calibrated_count_is_rounded_up_but_never_past_an_exact_product() -> None:
    calibration = TokenCalibration({"m": 1.1})
    assert calibration.calibrate("m", 100) == 110  # 1.1 * 100 is 110.00000000000001
    assert calibration.calibrate("m", 101) == 112
    assert calibration.calibrate("unknown", 101) == 101
    counter = CalibratedCounter(PerMessageCounter(), 1.05)
    assert counter.count([Message.user("a")] * 3) == 32  # ceil(31.5)


# -- learned by a client, used by its next requests ------------------------------------


@pytest.mark.anyio
async def test_a_client_learns_from_each_round_and_scales_the_next_estimate() -> None:
    counter = PerMessageCounter()
    calibration = TokenCalibration(min_estimated_tokens=0)
    driver = ReportingDriver(["one", "two"], ratio=1.5, counter=counter)
    client = Client(driver, token_counter=counter, calibration=calibration, default_model=MODEL)

    first = await client.request().with_prompt("hello").run()
    assert first.rounds[0].calibrated_input_tokens is None
    assert first.rounds[0].estimated_input_tokens == 10
    assert first.rounds[0].reported_input_tokens == 15
    assert calibration.ratio("m") == 1.5

    second = await client.request().with_messages(first.messages).with_prompt("again").run()
    record = second.rounds[0]
    assert record.estimated_input_tokens == 30
    assert record.calibrated_input_tokens == 45
    assert record.limiting is not None
    assert record.limiting.tokens_before == 45
    assert record.estimate_error == 0.0


@pytest.mark.anyio
async def test_a_calibrated_estimate_drops_what_the_raw_estimate_would_have_kept() -> None:
    counter = PerMessageCounter()
    history = [Message.user("q1"), Message.assistant("a1"), Message.user("q2")]
    history += [Message.assistant("a2")]
    driver = ScriptedDriver(["fine"])
    client = Client(
        driver,
        token_counter=counter,
        calibration=TokenCalibration({"m": 1.5}),
        default_model=MODEL,
    )
    # 5 messages: 50 estimated (fits 60), 75 calibrated (does not).
    request = (
        client.request()
        .with_messages(history)
        .with_prompt("q3")
        .with_max_context_tokens(60)
        .with_output_reserve_tokens(0)
    )
    result = await request.run()
    assert [m.text for m in driver.calls[0].messages] == ["q2", "a2", "q3"]
    assert result.rounds[0].calibrated_input_tokens == 45


def test_a_client_refuses_a_calibration_of_the_wrong_type() -> None:
    with pytest.raises(InvalidRequestError, match="calibration"):
        Client(ScriptedDriver(), calibration={"m": 1.2})  # type: ignore[arg-type]


# -- saved with a conversation ----------------------------------------------------------


@pytest.mark.anyio
async def test_a_resumed_conversation_does_not_start_uncalibrated() -> None:
    counter = ApproximateCounter()
    driver = ReportingDriver(["hi"] * 3, ratio=1.3, counter=counter)
    calibration = TokenCalibration(min_estimated_tokens=0)
    agent = Agent(Client(driver, token_counter=counter, calibration=calibration), model=MODEL)
    conversation = Conversation(agent)
    await conversation.run("hello there, how are you today?")
    learned = calibration.ratio("m")
    assert learned is not None
    assert learned > 1.2
    saved = conversation.to_json()
    assert json.loads(saved)["settings"]["token_calibration"] == {"m": learned}

    fresh = TokenCalibration()
    other = Agent(Client(driver, token_counter=counter, calibration=fresh), model=MODEL)
    Conversation.from_json(other, saved)
    assert fresh.ratio("m") == learned


@pytest.mark.anyio
async def test_a_client_without_calibration_keeps_the_saved_ratio_for_the_next_save() -> None:
    text = Conversation(Agent(Client(ScriptedDriver()), model=MODEL)).to_json()
    document = json.loads(text)
    document["settings"]["token_calibration"] = {"m": 1.4}
    agent = Agent(Client(ScriptedDriver()), model=MODEL)
    restored = Conversation.from_json(agent, json.dumps(document))
    assert json.loads(restored.to_json())["settings"]["token_calibration"] == {"m": 1.4}


@pytest.mark.parametrize(
    "saved",
    [
        [1.2],
        {"m": -1},
        {"m": "x"},
        {"m": True},
        {"m": {"ratio": 1.2}},
        {"m": {"ratio": 1.2, "intercept": "x", "slopes": {}}},
        {"m": {"ratio": 0, "intercept": 3.0, "slopes": {}}},
        {"m": {"ratio": 1.2, "intercept": 3.0, "slopes": {"latin": -1}}},
        {"m": {"ratio": 1.2, "intercept": 3.0, "slopes": [1.0]}},
    ],
)
def test_a_malformed_saved_calibration_is_refused_with_its_path(saved: object) -> None:
    document = json.loads(Conversation(Agent(Client(ScriptedDriver()), model=MODEL)).to_json())
    document["settings"]["token_calibration"] = saved
    agent = Agent(Client(ScriptedDriver()), model=MODEL)
    with pytest.raises(ConversationFormatError) as caught:
        Conversation.from_json(agent, json.dumps(document))
    assert "token_calibration" in str(caught.value)


_FIT = {"ratio": 1.2, "intercept": 30.0, "slopes": {"latin": 1.1}}
_ZERO = dict.fromkeys(("framing", "tool", "latin", "cyrillic", "cjk", "other"), 0.0)


@pytest.mark.parametrize(
    ("saved", "path"),
    [
        (math.nan, "$.settings.token_calibration.m"),
        ({**_FIT, "ratio": math.inf}, "$.settings.token_calibration.m.ratio"),
        ({**_FIT, "slopes": {"cjk": -math.inf}}, "$.settings.token_calibration.m.slopes.cjk"),
        ({**_FIT, "intercept": 1e300}, "$.settings.token_calibration.m.intercept"),
        ({**_FIT, "intercept": -1e300}, "$.settings.token_calibration.m.intercept"),
        ({**_FIT, "slopes": {"latin": 1e300}}, "$.settings.token_calibration.m.slopes.latin"),
        ({**_FIT, "ratio": 1e-300}, "$.settings.token_calibration.m.ratio"),
        (1e-300, "$.settings.token_calibration.m"),
        (1e300, "$.settings.token_calibration.m"),
        ({**_FIT, "slopes": _ZERO}, "$.settings.token_calibration.m.slopes.latin"),
        ({**_FIT, "version": 3}, "$.settings.token_calibration.m.version"),
        ({**_FIT, "version": "2"}, "$.settings.token_calibration.m.version"),
        ({**_FIT, "version": 2}, "$.settings.token_calibration.m"),  # no uncertainty
        (
            {**_FIT, "version": 2, "uncertainty": {"latin": -0.1}},
            "$.settings.token_calibration.m.uncertainty.latin",
        ),
    ],
)
def test_a_saved_calibration_no_provider_could_have_taught_is_refused_naming_the_field(
    saved: object, path: str
) -> None:
    # NaN and Infinity are not JSON; json.dumps writes them all the same, as a careless
    # writer would. A finite value can be absurd too: priced from it, the first resumed
    # turn would cost 1e300 tokens or none.
    document = json.loads(Conversation(Agent(Client(ScriptedDriver()), model=MODEL)).to_json())
    document["settings"]["token_calibration"] = {"m": saved}
    agent = Agent(Client(ScriptedDriver()), model=MODEL)
    with pytest.raises(ConversationFormatError) as caught:
        Conversation.from_json(agent, json.dumps(document))
    assert caught.value.path == path


def test_a_tool_set_keeps_a_ratio_of_its_own_with_the_models_until_it_is_seen() -> None:
    calibration = TokenCalibration(min_estimated_tokens=0)
    calibration.observe("m", estimated_tokens=100, reported_tokens=110)
    assert calibration.ratio("m", ["lookup"]) == 1.1  # not seen yet: the model's own
    calibration.observe("m", estimated_tokens=100, reported_tokens=150, tools=["lookup"])
    assert calibration.ratio("m", ["lookup"]) == 1.5
    assert calibration.ratio("m") == 1.1  # a tool round leaves plain rounds alone
    assert calibration.ratios_of("m") == {"m": 1.1, "m [tools: lookup]": 1.5}
    assert calibration.ratios_of("m2") == {}


@pytest.mark.anyio
async def test_a_request_with_tools_learns_and_uses_its_tool_sets_ratio() -> None:
    def lookup(word: str) -> str:
        """Look a word up."""
        return word

    counter = PerMessageCounter()
    calibration = TokenCalibration(min_estimated_tokens=0)
    driver = ReportingDriver(["one", "two"], ratio=2.0, counter=counter)
    client = Client(driver, token_counter=counter, calibration=calibration, default_model=MODEL)
    await client.request().with_prompt("hello").with_tools([lookup]).run()
    assert calibration.ratios() == {"m [tools: lookup]": 2.0}
    second = await client.request().with_prompt("again").with_tools([lookup]).run()
    assert second.rounds[0].calibrated_input_tokens == 20


class ChangingReports(ScriptedDriver):
    """Reports each call's estimate times the next of ``ratios``."""

    def __init__(self, ratios: list[float], counter: TokenCounter) -> None:
        super().__init__([f"answer {n}" for n in range(len(ratios))])
        self.ratios = ratios
        self.counter = counter

    def _next(self, call: ProviderCall) -> ProviderResponse:
        response = super()._next(call)
        ratio = self.ratios[len(self.calls) - 1]
        reported = round(self.counter.count(call.messages, call.tools) * ratio)
        return attrs.evolve(response, usage=attrs.evolve(response.usage, input_tokens=reported))


@pytest.mark.anyio
async def test_a_transcript_that_repeats_the_last_prompt_is_counted_from_its_report() -> None:
    counter = PerMessageCounter()
    calibration = TokenCalibration(min_estimated_tokens=0)
    driver = ChangingReports([2.0, 1.5, 1.5], counter)
    client = Client(driver, token_counter=counter, calibration=calibration, default_model=MODEL)
    first = await client.request().with_prompt("one").run()  # 10 estimated, 20 reported
    second = await client.request().with_messages(first.messages).with_prompt("two").run()
    assert second.rounds[0].reported_input_tokens == 45  # 30 estimated: the ratio stays 2.0
    third = await client.request().with_messages(second.messages).with_prompt("three").run()
    # Two reports: the 45 reported for the three messages sent before, and the two new
    # ones at the slopes the reports fitted (25 tokens for two messages), where scaling
    # the whole estimate would say 5 * 10 * 2.0 = 100. The server reports 75.
    calibrated = third.rounds[0].calibrated_input_tokens
    assert calibrated is not None
    assert third.rounds[0].reported_input_tokens == 75
    assert 45 + 2 * 10 < calibrated < 100
    assert abs(calibrated - 75) <= 0.1 * 75


@pytest.mark.anyio
async def test_a_transcript_unlike_the_last_prompt_is_scaled_by_the_ratio() -> None:
    counter = PerMessageCounter()
    calibration = TokenCalibration(min_estimated_tokens=0)
    driver = ChangingReports([2.0, 1.5, 1.5], counter)
    client = Client(driver, token_counter=counter, calibration=calibration, default_model=MODEL)
    await client.request().with_messages(history(3)).with_prompt("one").run()
    other = await client.request().with_prompt("something else entirely").run()
    assert other.rounds[0].calibrated_input_tokens == 20  # 10 estimated, times 2.0


def history(turns: int) -> list[Message]:
    messages: list[Message] = []
    for n in range(turns):
        messages += [Message.user(f"q{n}"), Message.assistant(f"a{n}")]
    return messages


def test_a_fit_saved_before_calibration_knew_its_uncertainty_still_loads() -> None:
    # Version 1: no version, no uncertainty, and one "other" class for every script but
    # Latin, Cyrillic and CJK.
    old = {"ratio": 1.5, "intercept": 20.0, "slopes": {"latin": 1.1, "cyrillic": 2.5, "other": 3.0}}
    calibration = TokenCalibration()
    calibration.restore({"m": old})
    fitted = calibration.fitted("m")
    assert fitted is not None
    names = list(CLASSES)
    assert fitted.slopes[names.index("latin")] == 1.1
    assert fitted.slopes[names.index("other")] == 3.0
    prior = PRIOR_UNCERTAINTY
    # As unsure as the prior: a resumed conversation's first turn is priced high.
    assert fitted.uncertainty == prior
    saved = calibration.saved_of("m")["m"]
    assert isinstance(saved, dict)
    assert saved["version"] == 2  # saved again in the current form
    again = TokenCalibration()
    again.restore({"m": saved})
    refitted = again.fitted("m")
    assert refitted is not None
    assert refitted.slopes == pytest.approx(fitted.slopes)
    assert refitted.uncertainty == pytest.approx(fitted.uncertainty)
