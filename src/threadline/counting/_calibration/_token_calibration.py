"""Calibration: how far a counter's estimate is from what the provider reports.

A :class:`TokenCalibration` keeps one ratio per model: the input tokens a
provider reported for a prompt over the tokens the request's counter
estimated for that same prompt. Every response with reported usage is an
observation. Requests that send tools keep a ratio of their own per tool
set (``"model [tools: a, b]"``): a chat template renders tool schemas in its
own way (a system prompt of instructions, often), so their ratio is not the
messages'. Until a tool set has been seen, the model's own ratio stands in.

A ratio only ratchets up: the first observation sets it, a later one raises
it when it is higher, nothing lowers it. A calibrated estimate therefore errs
towards counting too much (a turn that keeps a unit less) rather than too
little (a turn the provider refuses).

One ratio cannot price every script (SmolLM2 spends about o200k's tokens on
English and three times as many on Russian), so from the second report on a
key also has a fit by class (``_slopes``): an intercept plus a slope per
class of the estimate (``_classes``), learned from every report kept. A
transcript is then counted from the last report, what is gone from its
prompt and what is new priced by class
(:class:`~threadline.counting._calibration._slopes.ClassAnchoredCounter`), whether
or not the transcript holds most of that prompt; where nothing is decided, what is
gone at what the steps between reports measured it at (``_measured``).

Before a fit, the last report is used as it was: a transcript that holds
most of its prompt is counted from the report (:class:`ReportAnchoredCounter`),
the report less what is gone from it (at that prompt's own ratio) plus what
is new (at the calibration's ratio); any other is the estimate times the
ratio (:class:`CalibratedCounter`).

No one report decides all that (``_bounds``): a report no provider could give
is left out, with a warning on the ``threadline.counting`` logger; one far
below what the calibration priced its prompt at is left out unless the
report before it was too (the dangerous direction: a turn priced too low is
sent whole and refused), and learned after all when the next report agrees
with it (a template that renders no tool schemas has a first report far below
o200k's count of them); one far above is taken as :data:`MAX_STEP` times
that price, and a fit's slopes move at most that factor per report.
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import attrs

from threadline._errors import InvalidRequestError
from threadline._validate import fail, non_negative_int
from threadline.counting._anchored import AnchoredCounter, message_key
from threadline.counting._calibration._bounds import (
    MAX_RATIO,
    MAX_STEP,
    MIN_RATIO,
    MIN_REPLY_TOKENS,
    bounded_slopes,
    implausible,
    implausible_reply,
    stepped,
)
from threadline.counting._calibration._classes import (
    CLASSES,
    ClassCounts,
    message_classes,
    reply_classes,
    transcript_classes,
)
from threadline.counting._calibration._measured import MeasuredCosts
from threadline.counting._calibration._saved import (
    SavedEntry,
    SavedValueError,
    check_saved,
    ratio_of,
    restored_fit,
    saved_fit,
)
from threadline.counting._calibration._slopes import (
    MAX_OBSERVATIONS,
    MIN_FIT_REPORTS,
    ClassAnchoredCounter,
    Posterior,
    SlopeFit,
    fit,
    price_of,
)
from threadline.counting._scaling import scaled

if TYPE_CHECKING:
    from threadline._messages import Message
    from threadline.counting._protocol import TokenCounter
    from threadline.tools._tools import Tool

__all__ = [
    "DEFAULT_MIN_ESTIMATED_TOKENS",
    "MIN_ANCHOR_OVERLAP",
    "CalibratedCounter",
    "ReportAnchoredCounter",
    "TokenCalibration",
    "calibrated_estimate",
    "calibration_key",
    "calibration_without",
    "scaled",
]

logger = logging.getLogger("threadline.counting")

_DROPPED = CLASSES.index("system_dropped")


@attrs.frozen
class _Held:
    """A report left out as far below its price, kept until the next report."""

    sent: tuple[Message, ...]
    tokens: int
    reply: Message | None
    output_tokens: int
    reasoning_tokens: int


MIN_ANCHOR_OVERLAP = 0.5
"""How much of the last reported prompt (by its estimate) a transcript must hold to be
counted from that report."""

DEFAULT_MIN_ESTIMATED_TOKENS = 64
"""Rounds estimated below this many tokens teach a calibration nothing.

A tiny prompt's ratio is mostly framing (a template's default system
message, a tokenizer's start token), which says little about the next,
larger prompt; and a ratio that only ratchets up would keep that noise.
"""


def calibration_key(model: str, tools: Iterable[str] = ()) -> str:
    """Where a calibration keeps the ratio of ``model`` sent with the tools named ``tools``:
    the model's name, or ``"model [tools: a, b]"``."""
    names = sorted(set(tools))
    return f"{model} [tools: {', '.join(names)}]" if names else model


def _ratio(name: str, value: object, *, learned: bool = False) -> float:
    """``value`` as a ratio; with ``learned``, one a provider could have taught (1/128
    to 128, see ``_bounds``)."""
    expected = "a positive, finite number" + (" from 1/128 to 128" if learned else "")
    if isinstance(value, bool) or not isinstance(value, int | float):
        fail(name, expected, value)
    ratio = float(value)
    if not math.isfinite(ratio) or ratio <= 0:
        fail(name, expected, value)
    if learned and not MIN_RATIO <= ratio <= MAX_RATIO:
        fail(name, expected, value)
    return ratio


class TokenCalibration:
    """Per-model ratios of reported to estimated input tokens, learned from responses.

    Give one to a client (``Client(driver, calibration=TokenCalibration())``)
    and every round of its requests teaches it: after each response that
    reports its input tokens, the ratio for the request's model becomes the
    larger of the old ratio and ``reported / estimated``, and from the second
    report the fit by class is made again (see the module docstring); limiting
    counts with the fit, or ``ceil(estimate * ratio)`` before there is one. A
    conversation saves its model's ratios and fits with its state and gives
    them back to its client's calibration when loaded, so a resumed
    conversation does not start uncalibrated.

    ``ratios`` seeds it (a model's name, or a :func:`calibration_key`, to its ratio);
    ``min_estimated_tokens`` is the smallest estimate a round must have to
    be learned from (see :data:`DEFAULT_MIN_ESTIMATED_TOKENS`). One
    calibration may serve many requests and threads at once.

    Raises:
        InvalidRequestError: a ratio that is not a number from 1/128 to 128 (what
            a tokenizer can spend per o200k token), or a negative
            ``min_estimated_tokens``.

    Example::

        calibration = TokenCalibration()
        client = Client(OpenAIChatDriver(url), calibration=calibration)
        ...
        calibration.ratio("smollm2")  # e.g. 1.31 after a few turns
    """

    __slots__ = (
        "_below",
        "_fits",
        "_held",
        "_last",
        "_lock",
        "_measured",
        "_min_estimated_tokens",
        "_observed",
        "_prior",
        "_priors",
        "_ratios",
        "_replies",
    )

    def __init__(
        self,
        ratios: Mapping[str, float] | None = None,
        *,
        min_estimated_tokens: int = DEFAULT_MIN_ESTIMATED_TOKENS,
    ) -> None:
        self._min_estimated_tokens = non_negative_int("min_estimated_tokens", min_estimated_tokens)
        self._lock = threading.Lock()
        self._ratios: dict[str, float] = {}
        # The last report per key, with the prompt it counted: (messages, tokens).
        self._last: dict[str, tuple[tuple[Message, ...], int]] = {}
        # Per key: the reports by class (the latest MAX_OBSERVATIONS), and their fit.
        self._observed: dict[str, list[tuple[ClassCounts, int]]] = {}
        # Per key: the replies of text alone, by class, and their output tokens.
        self._replies: dict[str, list[tuple[ClassCounts, int]]] = {}
        self._fits: dict[str, SlopeFit] = {}
        # Per key, what steps between reports measured messages at (``_measured``).
        self._measured: dict[str, MeasuredCosts] = {}
        # Per key, the fit a saved document held: what later fits are pulled towards;
        # any other key's fits are pulled towards the measured prior.
        self._priors: dict[str, Posterior] = {}
        self._prior = Posterior.prior()
        # The keys whose last report was far below what it was priced at.
        self._below: set[str] = set()
        # Per key, the last report left out as far below its price, with its prompt,
        # until the next report says whether it was right (:meth:`_take_back`).
        self._held: dict[str, _Held] = {}
        if ratios is not None:
            self.absorb(ratios)

    @property
    def min_estimated_tokens(self) -> int:
        """The smallest estimate a round needs to teach the calibration."""
        return self._min_estimated_tokens

    def ratio(self, model: str, tools: Iterable[str] = ()) -> float | None:
        """The ratio learned for ``model`` sent with the tools named ``tools`` (the model's
        own ratio until that tool set is seen); ``None`` before any observation."""
        ratios = self._ratios
        found = ratios.get(calibration_key(model, tools))
        return ratios.get(model) if found is None else found

    def ratios(self) -> dict[str, float]:
        """Every ratio, by :func:`calibration_key` (a copy)."""
        with self._lock:
            return dict(self._ratios)

    def ratios_of(self, model: str) -> dict[str, float]:
        """The ratios of ``model``: its own and those of its tool sets."""
        tooled = f"{model} [tools: "
        return {k: v for k, v in self.ratios().items() if k == model or k.startswith(tooled)}

    def saved_of(self, model: str) -> dict[str, SavedEntry]:
        """What a saved conversation keeps of ``model`` (see ``_saved``): per key of its
        own and of its tool sets, the ratio, with the fit by class where there is one."""
        saved: dict[str, SavedEntry] = {}
        for key, ratio in self.ratios_of(model).items():
            fitted = self._fits.get(key)
            if fitted is None:
                saved[key] = ratio
                continue
            saved[key] = saved_fit(ratio, fitted.intercept, fitted.posterior)
        return saved

    def restore(self, saved: Mapping[str, object]) -> None:
        """Take in what a saved conversation kept (:meth:`saved_of`): each ratio becomes
        the larger of the two, and a saved fit prices a key until a report of its own
        (its slopes then pull the fit, as a prior).

        Raises:
            InvalidRequestError: an entry that is neither a positive, finite ratio nor a
                fit (the error names the key).
        """
        checked: dict[str, SavedEntry] = {}
        for key, value in saved.items():
            try:
                checked[key] = check_saved(value)
            except SavedValueError as exc:
                raise InvalidRequestError(f"token calibration {key!r}{exc.field}: {exc}") from None
        for key, entry in checked.items():
            self._raise(key, ratio_of(entry))
            if isinstance(entry, dict):
                self._restore_fit(key, entry)

    def _restore_fit(self, key: str, entry: dict[str, object]) -> None:
        posterior, intercept = restored_fit(entry)
        with self._lock:
            self._priors[key] = posterior
            if key not in self._observed:
                self._fits[key] = SlopeFit.restored(posterior, intercept)

    def observe(
        self,
        model: str,
        *,
        estimated_tokens: int,
        reported_tokens: int,
        tools: Iterable[str] = (),
        sent: Sequence[Message] | None = None,
        counter: TokenCounter | None = None,
        window: int | None = None,
        reply: Message | None = None,
        output_tokens: int = 0,
        reasoning_tokens: int = 0,
    ) -> float | None:
        """Learn from one response: the prompt (sent with the tools named ``tools``) was
        estimated at ``estimated_tokens`` and the provider reported ``reported_tokens``.
        ``sent``, the prompt's messages, is kept with the report, to count the next
        transcripts from (see the module docstring); with ``counter``, the request's
        estimate, the report also joins the fit by class. Returns the ratio that
        applies now.

        ``reply`` is the response's message and ``output_tokens`` what the provider
        counted for it (``reasoning_tokens`` of them its hidden reasoning): a reply of
        text alone, at least :data:`MIN_REPLY_TOKENS` of o200k's, is its text spelled
        by the provider's vocabulary with no template around it, so it joins the fit
        too (``_slopes.fit``). One with tool calls, reasoning (``reasoning_tokens``
        above 0 included) or an image is not learned from, nor one whose count no
        vocabulary gives its text (``_bounds.implausible_reply``), nor one whose
        prompt's report is left out.

        An estimate under :attr:`min_estimated_tokens` or a report of 0 changes nothing.
        Nor, but for a warning logged, does a report no provider could give: more than
        ``window`` (the model's context window), or a ratio to the estimate outside
        1/128 to 128. A report under a quarter of what the calibration priced the
        prompt at is left out too, unless the report before it was as well (then it
        is taken as that quarter), until the next report: if that one agrees with it,
        it is learned after all (:meth:`_take_back`); one over four times that price is
        taken as four times it.
        """
        tools = tuple(tools)
        non_negative_int("output_tokens", output_tokens)
        non_negative_int("reasoning_tokens", reasoning_tokens)
        if estimated_tokens < max(1, self._min_estimated_tokens) or reported_tokens <= 0:
            return self.ratio(model, tools)
        key = calibration_key(model, tools)
        if sent is not None:
            sent = tuple(sent)
        predicted = self._predicted(model, tools, estimated_tokens, sent, counter)
        report = None
        if sent is not None and counter is not None:
            report = _Held(sent, reported_tokens, reply, output_tokens, reasoning_tokens)
        believed, held = self._believed(
            key, reported_tokens, estimated_tokens, predicted, window, report
        )
        if believed is None:
            return self.ratio(model, tools)
        if (
            held is not None
            and sent is not None
            and counter is not None
            and believed == reported_tokens
        ):
            self._take_back(key, counter, held, sent, believed)
        if sent is not None:
            with self._lock:
                self._last[key] = (sent, believed)
                if counter is not None and believed == reported_tokens:
                    self._measure(key, counter, sent, believed)
            # A report taken as other than it said is no measurement of its prompt: it
            # moves the ratio a step, but a fit that took it in would see a step
            # between reports no template makes, and trust every report less.
            if counter is not None and believed == reported_tokens:
                if reply is not None and not reasoning_tokens:
                    self._hear(key, counter, reply, output_tokens)
                self._learn(key, counter, sent, believed)
        return self._raise(key, believed / estimated_tokens)

    def _predicted(
        self,
        model: str,
        tools: tuple[str, ...],
        estimated: int,
        sent: tuple[Message, ...] | None,
        counter: TokenCounter | None,
    ) -> float:
        """What the calibration prices a prompt at: by its fit, or the estimate times the
        ratio (the estimate itself before any report)."""
        fitted = self._fits.get(calibration_key(model, tools))
        if fitted is not None and sent is not None and counter is not None:
            counts = transcript_classes(counter, sent)
            price = fitted.intercept + price_of(counts, fitted.slopes)
            if price > 0:
                return price
        ratio = self.ratio(model, tools)
        return estimated * (1.0 if ratio is None else ratio)

    def _believed(
        self,
        key: str,
        reported: int,
        estimated: int,
        predicted: float,
        window: int | None,
        report: _Held | None,
    ) -> tuple[int | None, _Held | None]:
        """The tokens a report is learned as (see :meth:`observe`), or ``None`` to leave
        it out; logged whenever that is not the report as given. With it, the report
        held until this one (none when this one is left out): ``report``, when this one
        is left out as far below its price, is held in its place."""
        problem = implausible(reported, estimated, window)
        if problem is not None:
            logger.warning(
                "token calibration %r: a report of %d input tokens is left out: %s",
                key,
                reported,
                problem,
            )
            return None, None
        price = math.ceil(predicted)
        far_below = reported * MAX_STEP < predicted
        with self._lock:
            confirmed = key in self._below
            held = self._held.pop(key, None)
            if far_below:
                self._below.add(key)
                if not confirmed and report is not None:
                    self._held[key] = report
            else:
                self._below.discard(key)
        if far_below and not confirmed:
            logger.warning(
                "token calibration %r: a report of %d input tokens is left out: far below "
                "the %d its prompt was priced at (learned after all if the next report agrees "
                "with it; a second such report in a row is believed)",
                key,
                reported,
                price,
            )
            return None, None
        believed = (
            max(1, math.ceil(predicted / MAX_STEP)) if far_below else stepped(reported, predicted)
        )
        if believed != reported:
            logger.warning(
                "token calibration %r: a report of %d input tokens is taken as %d: one "
                "report moves the calibration at most %g times from the %d it priced the "
                "prompt at",
                key,
                reported,
                believed,
                MAX_STEP,
                price,
            )
        return believed, held

    def _take_back(
        self, key: str, counter: TokenCounter, held: _Held, sent: tuple[Message, ...], tokens: int
    ) -> None:
        """Learn ``held``, a report left out as far below its price, before the report of
        ``sent`` (``tokens``), if that one says it was right: its prompt holds every
        class of the held one's, and it grew from it by no more than what was added
        costs at the upper bound (``_slopes``). A template that renders no tool
        schemas reports a first prompt far below what o200k's count of the schemas
        priced it at; a report that left most of its prompt uncounted is followed by
        one that grew by that much more."""
        now, then = transcript_classes(counter, sent), transcript_classes(counter, held.sent)
        grown = [a - b for a, b in zip(now, then, strict=True)]
        # A system message a tool result leaves out is priced by the bound as it is.
        if any(change < 0 for i, change in enumerate(grown) if i != _DROPPED):
            return
        fitted = self._fits.get(key)
        posterior = fitted.posterior if fitted is not None else self._priors.get(key, self._prior)
        if tokens - held.tokens > posterior.bounds(tuple(grown))[1]:
            return
        with self._lock:
            self._measure(key, counter, held.sent, held.tokens)
        if held.reply is not None and not held.reasoning_tokens:
            self._hear(key, counter, held.reply, held.output_tokens)
        self._learn(key, counter, held.sent, held.tokens)

    def _measure(
        self, key: str, counter: TokenCounter, sent: tuple[Message, ...], tokens: int
    ) -> None:
        """Let the report of ``sent`` measure the messages it added (``_measured``), shared
        by their fitted prices (the prior's before a fit). Under the lock."""
        fitted = self._fits.get(key)
        slopes = fitted.slopes if fitted is not None else self._prior.slopes
        measured = self._measured.setdefault(key, MeasuredCosts())
        measured.observe(sent, tokens, lambda m: price_of(message_classes(counter, m), slopes))

    def _hear(self, key: str, counter: TokenCounter, reply: Message, tokens: int) -> None:
        """Keep ``reply`` and its output ``tokens`` for the fit, if it is text alone and
        the count can be its text's (see :meth:`observe`)."""
        counts = reply_classes(counter, reply)
        if counts is None:
            return
        estimated = sum(counts)
        if estimated < MIN_REPLY_TOKENS or implausible_reply(tokens, estimated):
            return
        with self._lock:
            replies = self._replies.setdefault(key, [])
            replies.append((counts, tokens))
            del replies[:-MAX_OBSERVATIONS]

    def _learn(
        self, key: str, counter: TokenCounter, sent: tuple[Message, ...], reported_tokens: int
    ) -> None:
        """Fit the slopes of ``key`` again with one more report (see ``_slopes``)."""
        counts = transcript_classes(counter, sent)
        with self._lock:
            observed = self._observed.setdefault(key, [])
            observed.append((counts, reported_tokens))
            del observed[:-MAX_OBSERVATIONS]
            if len(observed) >= MIN_FIT_REPORTS or key in self._priors:
                prior = self._priors.get(key, self._prior)
                before = self._fits.get(key)
                previous = before.posterior if before is not None else prior
                found = fit(observed, prior, self._replies.get(key, ()))
                slopes = bounded_slopes(found.slopes, previous.slopes)
                posterior = attrs.evolve(found, slopes=slopes)
                self._fits[key] = SlopeFit.of_report(posterior, sent, reported_tokens, counts)

    def fitted(self, model: str, tools: Iterable[str] = ()) -> SlopeFit | None:
        """The slopes fitted for ``model`` sent with the tools named ``tools``, and the
        report they price from; ``None`` before a report with its prompt's counter."""
        return self._fits.get(calibration_key(model, tools))

    def estimate(
        self,
        model: str,
        counter: TokenCounter,
        transcript: Sequence[Message],
        tools: Sequence[Tool] = (),
        *,
        budget: int | None = None,
    ) -> TokenCounter:
        """The calibrated counter for ``transcript`` of ``model`` sent with ``tools``:
        priced by class from the last report once there is a fit; before, counted
        from the last report when the transcript holds most of its prompt, else
        ``counter`` times the ratio; ``counter`` itself before any observation.

        A fit prices what changed since the report at its bound (high by as much as
        the fit is unsure), where the count decides what is sent: always, unless
        ``budget`` (the prompt budget) is given and ``transcript`` fits it even at
        the bound; then nothing is dropped whichever count is taken, and the
        fitted price, the likeliest count, is the one given.
        """
        names = [t.name for t in tools]
        key = calibration_key(model, names)
        fitted = self._fits.get(key)
        if fitted is not None:
            bound = fitted.counter(counter, tools, transcript=transcript)
            if budget is not None and bound.count(transcript, tools) <= budget:
                measured = self._measured.get(key)
                return fitted.counter(
                    counter, tools, bound=False, transcript=transcript, measured=measured
                )
            return bound
        ratio = self.ratio(model, names)
        if ratio is None:
            return counter
        last = self._last.get(calibration_key(model, names))
        if last is not None:
            anchored = ReportAnchoredCounter.if_it_holds(
                counter, last[0], tools, reported_tokens=last[1], ratio=ratio, within=transcript
            )
            if anchored is not None:
                return anchored
        return CalibratedCounter(counter, ratio)

    def absorb(self, ratios: Mapping[str, float]) -> None:
        """Take in ratios learned elsewhere (a saved conversation, another process),
        by :func:`calibration_key`: each ratio becomes the larger of the two.

        Raises:
            InvalidRequestError: a ratio that is not a number from 1/128 to 128.
        """
        checked = {
            key: _ratio(f"ratios[{key!r}]", value, learned=True) for key, value in ratios.items()
        }
        for key, value in checked.items():
            self._raise(key, value)

    def calibrate(self, model: str, tokens: int, tools: Iterable[str] = ()) -> int:
        """``tokens`` scaled by the ratio that applies, rounded up; as given without one."""
        ratio = self.ratio(model, tools)
        return tokens if ratio is None else scaled(tokens, ratio)

    def _raise(self, key: str, ratio: float) -> float:
        with self._lock:
            current = self._ratios.get(key)
            if current is None or ratio > current:
                self._ratios[key] = current = ratio
            return current

    def __repr__(self) -> str:
        shown = ", ".join(f"{key!r}: {ratio:.4f}" for key, ratio in self.ratios().items())
        return f"TokenCalibration({{{shown}}})"


def calibration_without(
    vocabularies: Collection[str], calibration: TokenCalibration | None = None
) -> TokenCalibration:
    """``calibration`` (a new :class:`TokenCalibration` by default), its prior measured
    without ``vocabularies`` (names of :data:`~._priors.MEASURED` rows, or of templates
    of :data:`~._priors.TOOL_CALL_SPELLED`): how ``bench_counting_heldout.py`` measures
    a family on a prior that never saw its vocabulary or its template.

    Raises:
        ValueError: a name that is neither a measured vocabulary's nor a template's, or
            a calibration that has learned something already (on the prior it had).
    """
    calibration = TokenCalibration() if calibration is None else calibration
    if calibration._observed or calibration._priors:
        raise ValueError("the calibration has learned already: give a new one")
    calibration._prior = Posterior.prior(excluding=vocabularies)
    return calibration


class CalibratedCounter:
    """``counter``'s estimate times ``ratio``, rounded up.

    The count of a whole transcript is scaled (not each message), so a
    calibrated count carries at most one token of rounding. Limiting builds
    one per round from the client's :class:`TokenCalibration`; a handler sees
    it as ``event.counter``.

    Raises:
        InvalidRequestError: a ratio that is not a positive, finite number.
    """

    __slots__ = ("_counter", "_ratio")

    def __init__(self, counter: TokenCounter, ratio: float) -> None:
        self._counter = counter
        self._ratio = _ratio("ratio", ratio)

    @property
    def counter(self) -> TokenCounter:
        """The counter whose estimate is scaled."""
        return self._counter

    @property
    def ratio(self) -> float:
        """What the estimate is multiplied by."""
        return self._ratio

    def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        """The calibrated estimate of ``messages`` and ``tools``."""
        return scaled(self._counter.count(messages, tools), self._ratio)

    def __repr__(self) -> str:
        return f"CalibratedCounter({self._counter!r}, ratio={self._ratio:.4f})"


class ReportAnchoredCounter(AnchoredCounter):
    """A transcript counted from the provider's last report (an
    :class:`~threadline.counting.AnchoredCounter` whose anchor is the reported prompt):
    what it lacks of that prompt is priced at the prompt's own ratio of report to
    estimate, what it adds at the calibration's ratio."""

    __slots__ = ()

    @classmethod
    def if_it_holds(
        cls,
        counter: TokenCounter,
        reported: Sequence[Message],
        tools: Sequence[Tool],
        *,
        reported_tokens: int,
        ratio: float,
        within: Sequence[Message],
    ) -> ReportAnchoredCounter | None:
        """The counter anchored on ``reported``, when ``within`` holds at least
        :data:`MIN_ANCHOR_OVERLAP` of it by the estimate; otherwise ``None``."""
        estimated = counter.count(reported, tools)
        if estimated <= 0:
            return None
        present = {message_key(m) for m in within}
        shared = [m for m in reported if message_key(m) in present]
        overhead = counter.count([], tools)
        if counter.count(shared, tools) - overhead < MIN_ANCHOR_OVERLAP * (estimated - overhead):
            return None
        return cls(
            counter,
            reported,
            tools,
            exact_tokens=reported_tokens,
            dropped_ratio=reported_tokens / estimated,
            added_ratio=ratio,
        )


def calibrated_estimate(counter: TokenCounter) -> TokenCounter | None:
    """The uncalibrated counter under a calibrated one; ``None`` for any other counter."""
    if isinstance(counter, CalibratedCounter):
        return counter.counter
    if isinstance(counter, ReportAnchoredCounter | ClassAnchoredCounter):
        return counter.estimate
    return None
