"""Calibration by class: an intercept plus a slope per class of tokens, learned from reports.

A chat template renders a request as a fixed part (its framing, the tool
schemas as it words them: constant for one tool set) plus every message, and
a tokenizer spends on a message's text what that text's script costs it. So
the tokens a provider reports for a prompt ``T`` are close to

    R(T) = c + sum(b[k] * E[k](T))

where ``E[k](T)`` is the o200k estimate of ``T``'s tokens of class ``k``
(:mod:`~threadline.counting._calibration._classes`) and ``b[k]`` is what the
provider spends per estimated token of that class. :func:`fit` learns ``c``
and ``b`` from the reports of one model and tool set, and how sure it is of
each ``b[k]``: a Bayesian linear regression with the intercept free and each
slope's prior the class's :data:`~._priors.PRIORS` (a mean and a standard
deviation measured over many vocabularies). The ridge of a class is the
reports' noise variance over its prior variance, and the noise is estimated
from the fit's own residuals (pulled towards :data:`PRIOR_NOISE` while the
reports are few). A class seen in a few hundred tokens is fitted from them
and its uncertainty shrinks; a class never seen keeps its prior uncertainty.

A transcript is then priced from the last report (:class:`ClassAnchoredCounter`):
the report, less the price of what is gone from its prompt, plus the price
of what is new. What is new is priced at each class's slope plus
:data:`BOUND_Z` times its uncertainty, and what is gone at its slope less
that (never below 0): the count is a one-sided 95% bound, high by as much
as the fit is unsure, so a class the reports have said little about is
priced high. Everything here is deterministic: the same reports give the
same fit.

One class is the template's choice, not a price: ``system_dropped``, the
system messages of a prompt a tool result ends, counted negative (Mistral
Nemo's template puts the system message into the last user message, and such
a prompt has none after its results). A template either shows the system
message (the slope is 0) or drops it (the slope is what its text costs), so
the fit is a mixture of the two (:func:`_either`), weighed by the share of
templates that drop it and by the evidence of the steps. A template can only
leave text out: the slope is never below 0.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Final

import attrs

from threadline._messages import Role
from threadline.counting._anchored import AnchoredCounter, message_key
from threadline.counting._calibration._chance import Residuals, worse_by_chance
from threadline.counting._calibration._classes import (
    CLASSES,
    ClassCounts,
    dropped_system,
    message_classes,
)
from threadline.counting._calibration._measured import rounded_in_order
from threadline.counting._calibration._priors import (
    BOUND_Z,
    DROPPING_SHARE,
    PRIOR_COVARIANCE,
    PRIOR_SLOPES,
    prior_of,
)

if TYPE_CHECKING:
    from threadline._messages import Message
    from threadline.counting._calibration._measured import MeasuredCosts
    from threadline.counting._protocol import TokenCounter
    from threadline.tools._tools import Tool

__all__ = [
    "AGREEMENT_P",
    "BOUND_Z",
    "MAX_OBSERVATIONS",
    "MIN_FIT_REPORTS",
    "MIN_UNCERTAINTY",
    "PRIOR_NOISE",
    "RULED_OUT",
    "ClassAnchoredCounter",
    "Posterior",
    "SlopeFit",
    "fit",
]

PRIOR_NOISE: Final = 0.25
"""The variance, per o200k token changed, of a step between reports around any linear
model, believed before the residuals say: a tokenizer's merges and a template's
whitespace move a message's cost by a token or two from its class's price."""

_GUESSED = frozenset((CLASSES.index("framing"), CLASSES.index("tool")))
"""The template's classes whose prior is a guess: a template spends on a message's
framing and on a tool call anything from nothing to a few times o200k's. (A tool
result's factor is the share of its text the template shows: all of it, but in
templates that show no tool exchange at all.)"""

_NOISE_WEIGHT = 2.0
"""How many steps :data:`PRIOR_NOISE` counts as, against the residuals' own."""

AGREEMENT_P: Final = 0.01
"""How unlikely by chance the growth of the prompts' residuals with the replies must be
for the replies to be taken as counted otherwise (:func:`fit`)."""

RULED_OUT: Final = 0.01
"""The share below which the reports rule out a template that drops the system message
(:func:`_either`): until then, the system message coming back is priced as that template
would show it (:meth:`ClassAnchoredCounter._system_shown`)."""

MIN_UNCERTAINTY: Final = 1e-3
"""The smallest uncertainty a slope is believed to (a saved fit's included)."""

MIN_FIT_REPORTS: Final = 2
"""The reports a fit needs before it prices anything: one report cannot tell the
intercept from the slopes (until a second, calibration scales by the ratio)."""

MAX_OBSERVATIONS: Final = 64
"""The reports a fit is made from, per model and tool set (the latest)."""


_SIZE = len(CLASSES)
_RESULTS = CLASSES.index("tool_result")
_DROPPED = CLASSES.index("system_dropped")
_TEXT = CLASSES.index("latin")
_PROMPTS, _REPLIES = 0, 1  # the kinds of step: between reports, between replies


def _undecided(slopes: Sequence[float], covariance: Covariance) -> tuple[float, float]:
    """The ``system_dropped`` slope of a template that drops the system message, and its
    variance, before any step weighs it: the text it drops costs what Latin text does.
    :func:`_dropping`'s prior, and the :attr:`Posterior.dropping` of slopes no step has
    weighed (a prior, a saved fit), where that template is not ruled out."""
    return slopes[_TEXT], covariance[_TEXT][_TEXT]


def price_of(counts: ClassCounts, slopes: Sequence[float]) -> float:
    """The price of ``counts`` at ``slopes``: each class's count times its slope, a
    tool result's text at its scripts' slopes times the ``tool_result`` slope."""
    own = zip(slopes, counts[:_SIZE], strict=True)
    price = sum(b * e for k, (b, e) in enumerate(own) if k != _RESULTS)
    results = counts[_SIZE:]
    if any(results):
        text = zip(slopes[_TEXT:], results, strict=True)
        price += slopes[_RESULTS] * sum(b * e for b, e in text)
    return price


def _gradient(counts: Sequence[float], slopes: Sequence[float]) -> list[float]:
    """How :func:`price_of` ``counts`` moves with each slope, at ``slopes``."""
    gradient = [float(e) for e in counts[:_SIZE]]
    results = counts[_SIZE:]
    gradient[_RESULTS] = sum(b * e for b, e in zip(slopes[_TEXT:], results, strict=True))
    factor = slopes[_RESULTS]
    for index, e in enumerate(results):
        gradient[_TEXT + index] += factor * e
    return gradient


Covariance = tuple[tuple[float, ...], ...]
"""The covariance of the slopes, by :data:`CLASSES` both ways."""


def _diagonal(uncertainty: Sequence[float]) -> Covariance:
    size = len(uncertainty)
    return tuple(
        tuple(uncertainty[i] ** 2 if i == j else 0.0 for j in range(size)) for i in range(size)
    )


@attrs.frozen
class Posterior:
    """A fit's slope of each class of :data:`CLASSES`, and their covariance: the
    classes of a message are learned together (its framing and its text grow
    together), so their errors lean against each other, and a message's price is
    surer than its classes' one by one."""

    slopes: tuple[float, ...]
    covariance: Covariance
    noise: float = PRIOR_NOISE
    """The variance of a message's cost around its price, per o200k token."""
    seen: frozenset[int] = frozenset()
    """The classes (indices into :data:`CLASSES`) some step between reports changed."""
    dropping: tuple[float, float] = (0.0, 0.0)
    """The ``system_dropped`` slope of a template that leaves the system message out of
    a prompt a tool result ends, and its variance, while the reports have not ruled such
    a template out (its share is at least :data:`RULED_OUT`); ``(0, 0)`` once they
    have."""

    @classmethod
    def prior(cls, excluding: Collection[str] = ()) -> Posterior:
        """What calibration believes before any report (``_priors``); with
        ``excluding``, measured without those vocabularies (:func:`~._priors.prior_of`)."""
        if not excluding:
            return _PRIOR
        slopes, covariance = prior_of(excluding)
        return cls(slopes, covariance, PRIOR_NOISE, dropping=_undecided(slopes, covariance))

    @classmethod
    def of(
        cls, slopes: Sequence[float], uncertainty: Sequence[float], noise: float = PRIOR_NOISE
    ) -> Posterior:
        """Slopes with independent uncertainties (a saved fit's, whose classes all
        count as seen, and whose template is weighed again from the steps after it: a
        template that drops the system message is not ruled out)."""
        covariance = _diagonal(uncertainty)
        seen = frozenset(range(len(slopes)))
        return cls(tuple(slopes), covariance, noise, seen, _undecided(slopes, covariance))

    @property
    def uncertainty(self) -> tuple[float, ...]:
        """The standard deviation of each class's slope."""
        return tuple(math.sqrt(row[i]) for i, row in enumerate(self.covariance))

    def bounds(self, counts: ClassCounts) -> tuple[float, float]:
        """The price of a message of ``counts`` (by class): its fitted price less and
        plus :data:`BOUND_Z` standard deviations (the lower one never below 0). The
        upper one counts the slopes' uncertainty and the message's own departure from
        them; the lower one, what leaving a message out saves, only the slopes': the
        departures of many messages left out at once are independent and mostly
        cancel, where an error of the slopes adds up."""
        price = price_of(counts, self.slopes)
        gradient = _gradient(counts, self.slopes)
        present = [i for i, e in enumerate(gradient) if e]
        shared = sum(
            gradient[i] * gradient[j] * self.covariance[i][j] for i in present for j in present
        )
        own = self.noise * sum(counts[:_SIZE])
        lower = price - BOUND_Z * math.sqrt(max(0.0, shared))
        return max(0.0, lower), price + BOUND_Z * math.sqrt(max(0.0, shared + own))

    def likely(self, counts: ClassCounts) -> float:
        """The price of a message of ``counts`` where nothing is decided: its fitted
        price, but for the framing and tool call classes while no report has shown
        them, which are priced at their bound. Their prior is a guess, not a
        measurement, and a template either leaves tool calls out or spells them at
        length, so its mean is no likelier than the ends."""
        slopes = [
            b + BOUND_Z * math.sqrt(self.covariance[k][k])
            if counts[k] and k in _GUESSED and k not in self.seen
            else b
            for k, b in enumerate(self.slopes)
        ]
        return price_of(counts, slopes)


class SlopeFit:
    """One model's and tool set's fitted slopes (one per class of :data:`CLASSES`)
    and their uncertainty, with the last report they price from (its prompt and its
    tokens) and the intercept that report implies (its tokens less its messages'
    fitted price). A fit restored from a saved document has no prompt: its anchor
    is empty and its ``anchor_tokens`` the intercept."""

    __slots__ = ("anchor", "anchor_tokens", "intercept", "posterior")

    def __init__(
        self,
        posterior: Posterior,
        anchor: Sequence[Message],
        anchor_tokens: int,
        *,
        intercept: float,
    ) -> None:
        self.posterior = posterior
        self.anchor = tuple(anchor)
        self.anchor_tokens = anchor_tokens
        self.intercept = intercept

    @property
    def slopes(self) -> tuple[float, ...]:
        """The fitted slope of each class."""
        return self.posterior.slopes

    @property
    def uncertainty(self) -> tuple[float, ...]:
        """The standard deviation of each class's slope."""
        return self.posterior.uncertainty

    @classmethod
    def of_report(
        cls,
        posterior: Posterior,
        anchor: Sequence[Message],
        anchor_tokens: int,
        counts: ClassCounts,
    ) -> SlopeFit:
        """The fit pricing from one report whose prompt's class counts are ``counts``."""
        price = price_of(counts, posterior.slopes)
        return cls(posterior, anchor, anchor_tokens, intercept=anchor_tokens - price)

    @classmethod
    def restored(cls, posterior: Posterior, intercept: float) -> SlopeFit:
        """A saved fit: every message priced from the intercept and the slopes."""
        return cls(posterior, (), max(0, round(intercept)), intercept=intercept)

    def counter(
        self,
        counter: TokenCounter,
        tools: Sequence[Tool],
        *,
        bound: bool = True,
        transcript: Sequence[Message] = (),
        measured: MeasuredCosts | None = None,
    ) -> ClassAnchoredCounter:
        """The counter pricing transcripts sent with ``tools`` from this fit: at the
        bound (what is new high, what is gone low), or with ``bound=False`` at the
        fitted price, what is gone at what the reports measured it at where they did
        (``measured``, of this fit's key). ``transcript`` (what is priced, and its
        cuts, which keep its system messages and its last message) says whether its
        template may drop the system messages."""
        return ClassAnchoredCounter(
            counter,
            self.anchor,
            tools,
            exact_tokens=self.anchor_tokens,
            posterior=self.posterior,
            bound=bound,
            dropped=dropped_system(counter, transcript),
            measured=measured,
            transcript=() if bound else transcript,
        )

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{k}={b:.3f}±{u:.3f}"
            for k, b, u in zip(CLASSES, self.slopes, self.uncertainty, strict=True)
        )
        return f"SlopeFit({shown}, anchor_tokens={self.anchor_tokens})"


def fit(
    observations: Sequence[tuple[ClassCounts, int]],
    prior: Posterior | None = None,
    replies: Sequence[tuple[ClassCounts, int]] = (),
) -> Posterior:
    """The slopes that best explain ``observations`` (class counts, reported tokens, in
    the order reported) and ``replies`` (the text classes of replies of text alone, and
    the output tokens reported for each), their covariance and the noise per token of
    the prompts: a Bayesian linear regression whose prior is ``prior`` (default
    :meth:`Posterior.prior`; a saved fit when one was restored). Slopes are never below
    0.

    A report is the sum of every message's cost, and each message's cost departs
    from any linear model in its own way (a tokenizer's merges, a template's
    whitespace), so the departures add up along a conversation: the levels of
    the reports are far noisier than their steps. The fit is therefore made on
    the steps, each report less the one before (the intercept cancels), each
    weighed by how many tokens changed between them (a step's noise grows with
    its size). A tool result's price is a product (its scripts' slopes times the
    ``tool_result`` slope), so the regression is made twice, the second time
    around the first one's slopes (a Gauss-Newton step).

    A reply's output tokens are its text as the vocabulary spells it, beside at most
    an end of turn, with no template around it: a reply in one script says what that
    script costs even where the prompts' steps hold it together with another. So the
    replies are steps too (each less the one before: the end of turn cancels), with a
    noise of their own, estimated from their own residuals: replies whose counts
    scatter (a sampled spelling longer than the tokenizer's own, hidden tokens a
    provider does not report apart) weigh less. Replies counted otherwise than the
    prompts, but alike (another tokenizer's estimate of the output), would pull the
    slopes from what the prompts say. So the fit is the prompts' alone where the
    replies make the prompts' residuals grow more than chance would, at
    :data:`AGREEMENT_P` (an F-test, :func:`~._chance.worse_by_chance`).
    """
    prior = Posterior.prior() if prior is None else prior
    prompts = _steps(observations, _PROMPTS)
    alone, apart = _fitted(prompts, prior)
    between = _steps(replies, _REPLIES)
    if not between:
        return alone
    both, spread = _fitted(prompts + between, prior)
    if _PROMPTS in apart and worse_by_chance(apart[_PROMPTS], spread[_PROMPTS]) < AGREEMENT_P:
        return alone  # with the replies, the prompts are explained worse than by chance
    return both


def _fitted(steps: Sequence[_Step], prior: Posterior) -> tuple[Posterior, dict[int, Residuals]]:
    """The mixture's fit of ``steps`` (see :func:`fit`), and the residuals of each kind
    of step."""
    if not steps:
        return prior, {}
    around = prior.slopes
    dropping = _dropping(prior)
    for _ in range(2):
        regressed, spread = _regress(steps, dropping, around)
        posterior = _either(regressed, dropping)
        around = posterior.slopes
    return posterior, spread


def _dropping(prior: Posterior) -> Posterior:
    """``prior`` for a template that leaves the system message out of a prompt a tool
    result ends: its ``system_dropped`` slope is then what the system message's text
    costs, Latin text's slope (most system messages are English), as unsure."""
    slopes = list(prior.slopes)
    covariance = [list(row) for row in prior.covariance]
    for k in range(_SIZE):
        covariance[k][_DROPPED] = covariance[_DROPPED][k] = 0.0
    slopes[_DROPPED], covariance[_DROPPED][_DROPPED] = _undecided(prior.slopes, prior.covariance)
    return Posterior(tuple(slopes), tuple(map(tuple, covariance)), prior.noise, prior.seen)


def _either(dropping: Posterior, prior: Posterior) -> Posterior:
    """The fit of a template that either shows the system message in every prompt (the
    ``system_dropped`` slope is 0) or leaves it out of a prompt a tool result ends
    (``dropping``, fitted from ``prior``, :func:`_dropping`'s), each weighed by its prior
    share (:data:`~._priors.DROPPING_SHARE`) and by how well it explains the steps, as
    one mean and covariance (the mixture's). The evidence for "shows it" is the
    Savage-Dickey ratio: the fitted density of the slope at 0 over its prior's (both
    cut at 0, as a template can only leave text out); the fit of "shows it" is
    ``dropping``'s given the slope is 0."""
    least = MIN_UNCERTAINTY**2
    slope = dropping.slopes[_DROPPED]
    variance = max(least, dropping.covariance[_DROPPED][_DROPPED])
    cost, unsure = prior.slopes[_DROPPED], max(least, prior.covariance[_DROPPED][_DROPPED])
    evidence = _log_density_at_zero(cost, unsure) - _log_density_at_zero(slope, variance)
    odds = evidence + math.log(DROPPING_SHARE / (1 - DROPPING_SHARE))
    weight = 1 / (1 + math.exp(-odds)) if odds > -700 else 0.0
    lean = [row[_DROPPED] / variance for row in dropping.covariance]
    shown = [b - g * slope for b, g in zip(dropping.slopes, lean, strict=True)]
    shown[_DROPPED] = 0.0
    dropped = list(dropping.slopes)
    dropped[_DROPPED] = max(0.0, slope)
    apart = [a - b for a, b in zip(dropped, shown, strict=True)]
    covariance = tuple(
        tuple(
            weight * c
            + (1 - weight) * (c - lean[i] * dropping.covariance[_DROPPED][j])
            + weight * (1 - weight) * apart[i] * apart[j]
            for j, c in enumerate(row)
        )
        for i, row in enumerate(dropping.covariance)
    )
    slopes = tuple(
        max(0.0, weight * a + (1 - weight) * b) for a, b in zip(dropped, shown, strict=True)
    )
    undecided = (dropped[_DROPPED], variance) if weight >= RULED_OUT else (0.0, 0.0)
    return Posterior(slopes, covariance, dropping.noise, dropping.seen, undecided)


def _log_density_at_zero(mean: float, variance: float) -> float:
    """The log density at 0 of a normal distribution of ``mean`` and ``variance`` cut
    below 0 (and scaled to 1 above it)."""
    spread = math.sqrt(variance)
    z = mean / spread
    # log P(X > 0) = log Phi(z), by its asymptote where erfc underflows.
    above = (
        math.log(0.5 * math.erfc(-z / math.sqrt(2)))
        if z > -30
        else (-0.5 * z * z - math.log(-z * math.sqrt(2 * math.pi)))
    )
    return -0.5 * z * z - math.log(spread * math.sqrt(2 * math.pi)) - above


def _regress(
    steps: Sequence[_Step], prior: Posterior, around: Sequence[float]
) -> tuple[Posterior, dict[int, Residuals]]:
    """One Bayesian regression of ``steps`` on the price's gradient at ``around``, and
    the residuals of each kind of step (prompts', replies'). The
    ``system_dropped`` slope is left as fitted, below 0 too (:func:`_either` weighs
    it)."""
    rows = [_gradient(step.change, around) for step in steps]
    # The price is linear in the slopes near ``around``: a step is the gradient times the
    # slopes, plus what the linearization leaves (0 but for tool results).
    targets = [
        step.tokens
        - price_of(step.change, around)
        + sum(g * b for g, b in zip(row, around, strict=True))
        - sum(g * b for g, b in zip(row, prior.slopes, strict=True))
        for step, row in zip(steps, rows, strict=True)
    ]
    seen = [k for k in range(_SIZE) if any(row[k] for row in rows)]
    kinds = sorted({step.kind for step in steps})
    gram = {kind: [[0.0] * _SIZE for _ in range(_SIZE)] for kind in kinds}
    moment = {kind: [0.0] * _SIZE for kind in kinds}
    for step, row, target in zip(steps, rows, targets, strict=True):
        for i in seen:
            moment[step.kind][i] += row[i] * target * step.weight
            for j in seen:
                gram[step.kind][i][j] += row[i] * row[j] * step.weight
    precision = _inverse([list(r) for r in prior.covariance])
    noise = dict.fromkeys(kinds, prior.noise)
    spread: dict[int, Residuals] = {}
    for _ in range(2):  # the weight of the reports depends on the noise, the noise on the fit
        covariance = _inverse(
            [
                [p + sum(gram[k][i][j] / noise[k] for k in kinds) for j, p in enumerate(line)]
                for i, line in enumerate(precision)
            ]
        )
        weighed = [sum(moment[kind][i] / noise[kind] for kind in kinds) for i in range(_SIZE)]
        delta = [sum(c * m for c, m in zip(line, weighed, strict=True)) for line in covariance]
        misses = [
            (t - sum(d * x for d, x in zip(delta, row, strict=True))) ** 2 * step.weight
            for step, row, t in zip(steps, rows, targets, strict=True)
        ]
        for kind in kinds:
            residual = sum(m for m, step in zip(misses, steps, strict=True) if step.kind == kind)
            used = _trace(covariance, gram[kind]) / noise[kind]
            free = max(0.0, sum(step.kind == kind for step in steps) - used)
            noise[kind] = (residual + _NOISE_WEIGHT * prior.noise) / (free + _NOISE_WEIGHT)
            spread[kind] = Residuals(noise[kind], residual, free)
    slopes = tuple(
        b + d if k == _DROPPED else max(0.0, b + d)
        for k, (b, d) in enumerate(zip(prior.slopes, delta, strict=True))
    )
    # The prompts' noise prices a message's own spread; the replies' stays here.
    shown = noise.get(_PROMPTS, prior.noise)
    posterior = Posterior(slopes, tuple(map(tuple, covariance)), shown, prior.seen | set(seen))
    return posterior, spread


def _trace(a: Sequence[Sequence[float]], b: Sequence[Sequence[float]]) -> float:
    """The trace of the product of two square matrices."""
    total = 0.0
    for i, line in enumerate(a):
        total += sum(x * b[j][i] for j, x in enumerate(line))
    return total


@attrs.frozen
class _Step:
    """One report (or reply) less the one before: the change of the class counts and
    of the tokens, the step's weight (one over the tokens changed), and its kind."""

    change: tuple[int, ...]
    tokens: int
    weight: float
    kind: int


def _steps(observations: Sequence[tuple[ClassCounts, int]], kind: int) -> list[_Step]:
    """Each of ``observations`` less the one before, as steps of ``kind``. A step's
    noise grows with the tokens it holds: between two reports, what changed (they
    share the rest); between two replies, both (they share nothing)."""
    steps = []
    for (before, was), (after, now) in itertools.pairwise(observations):
        change = [a - b for a, b in zip(after, before, strict=True)]
        moved = sum(map(abs, change[:_SIZE]))
        if kind == _REPLIES:
            moved = sum(before[:_SIZE]) + sum(after[:_SIZE]) if moved else 0
        if moved:
            steps.append(_Step(tuple(change), now - was, 1.0 / moved, kind))
    return steps


def _inverse(matrix: list[list[float]]) -> list[list[float]]:
    """The inverse of a symmetric positive definite matrix (Gauss-Jordan with partial
    pivoting; the fit's matrices are a few classes wide)."""
    size = len(matrix)
    rows = [[*row, *(1.0 if i == j else 0.0 for j in range(size))] for i, row in enumerate(matrix)]
    for col in range(size):
        pivot = max(range(col, size), key=lambda r: abs(rows[r][col]))
        rows[col], rows[pivot] = rows[pivot], rows[col]
        lead = rows[col][col]
        rows[col] = [a / lead for a in rows[col]]
        for r in range(size):
            factor = rows[r][col]
            if r != col and factor:
                rows[r] = [a - factor * b for a, b in zip(rows[r], rows[col], strict=True)]
    return [row[size:] for row in rows]


class ClassAnchoredCounter(AnchoredCounter):
    """A transcript counted from the last report, what changed priced per class.

    With ``bound`` (the default), what leaving messages of the reported prompt
    out saves is priced low, and any other message at its upper price
    (:meth:`Posterior.bounds`), rounded up. Without, both count their fitted
    price: the new messages of ``transcript`` (what is priced) rounded in its
    order, so that together they count the sum of their prices to the nearest
    token (:func:`~._measured.rounded_in_order`), any other rounded up. The
    reported prompt itself counts exactly the report.

    Limiting drops the oldest messages first, and an error of the slopes is the
    same in every message dropped, so the bound of what a cut saves is the
    bound of the dropped messages together, not the sum of their own (which is
    as much wider as the messages' scripts differ). So the reported prompt's
    messages share their bound in order: the n-th saves the lower bound of the
    first n together less that of the first n - 1. System messages, which are
    not dropped with the rest, save their own lower bound.

    ``dropped`` is what the transcripts priced may leave out of their system
    messages (:func:`dropped_system` of them: a cut keeps the system messages and
    the last message): the change from the anchor's is priced at the
    ``system_dropped`` slope, a part of the overhead.

    Without ``bound``, what leaving a message of the reported prompt out saves is
    what the reports measured it at, where a step between them did (``measured``,
    :class:`~._measured.MeasuredCosts`): after a cut, the count is then off by the
    fit's error on what is sent, not on what was dropped.
    """

    __slots__ = ("_bound", "_ending", "_new", "_posterior", "_shares")

    def __init__(
        self,
        estimate: TokenCounter,
        anchor: Sequence[Message],
        tools: Sequence[Tool],
        *,
        exact_tokens: int,
        posterior: Posterior,
        bound: bool = True,
        dropped: int = 0,
        measured: MeasuredCosts | None = None,
        transcript: Sequence[Message] = (),
    ) -> None:
        self._posterior = posterior
        self._bound = bound
        self._ending = self._system_shown(dropped_system(estimate, anchor) - dropped)
        if bound:
            self._shares = self._in_order(estimate, anchor)
        else:
            self._shares = {} if measured is None else measured.shares()
        super().__init__(
            estimate,
            anchor,
            tools,
            exact_tokens=exact_tokens,
            dropped_ratio=1.0,
            added_ratio=1.0,
        )
        self._new: dict[Message, int] = {}
        if not bound and transcript:
            keys = ((message_key(m), m) for m in transcript)
            prices = ((k, self._likely(m)) for k, m in keys if k not in self._anchor_costs)
            self._new = rounded_in_order(prices)

    def overhead_tokens(self, tools: Sequence[Tool] = ()) -> int:
        """The part of the count no message accounts for (see :class:`AnchoredCounter`),
        with what the template shows of the system messages beyond the anchor's."""
        return super().overhead_tokens(tools) + self._ending

    def _system_shown(self, shown: int) -> int:
        """What ``shown`` more tokens of system messages than the anchor's template
        showed cost (fewer when negative): the ``system_dropped`` slope (never below 0:
        a template can only drop them) times the change, at the bound's side. A system
        message that comes back costs at least what a template that drops it would show
        while the reports have not ruled that template out (:attr:`Posterior.dropping`):
        a template's way is one or the other, never the mixture's mean, and the one that
        drops it would have the count under by the whole message."""
        if not shown:
            return 0
        posterior = self._posterior
        slope = posterior.slopes[_DROPPED]
        cost, unsure = posterior.dropping
        if self._bound:
            spread = BOUND_Z * math.sqrt(posterior.covariance[_DROPPED][_DROPPED])
            slope = slope + spread if shown > 0 else max(0.0, slope - spread)
            cost += BOUND_Z * math.sqrt(unsure)
        if shown > 0:
            slope = max(slope, cost)
        return math.ceil(slope * shown - 1e-9)

    @property
    def slopes(self) -> tuple[float, ...]:
        """The fitted slope of each class of :data:`CLASSES`."""
        return self._posterior.slopes

    def price(self, message: Message) -> float:
        """``message``'s fitted price: its class counts times the slopes."""
        counts = message_classes(self.estimate, message)
        return price_of(counts, self.slopes)

    def bounds(self, message: Message) -> tuple[float, float]:
        """``message``'s price less and plus :data:`BOUND_Z` standard deviations."""
        return self._posterior.bounds(message_classes(self.estimate, message))

    @property
    def bound(self) -> bool:
        """Whether changes are priced at the bound (else at the fitted price)."""
        return self._bound

    def _in_order(self, estimate: TokenCounter, anchor: Sequence[Message]) -> dict[Message, int]:
        """Each anchor message's share of the lower bound of it and those before it."""
        posterior = self._posterior
        slopes, covariance = posterior.slopes, posterior.covariance
        gradient = [0.0] * _SIZE
        spread = [0.0] * _SIZE  # the covariance times the gradient so far
        price = variance = below = 0.0
        shares: dict[Message, int] = {}
        for message in anchor:
            counts = message_classes(estimate, message)
            if message.role is Role.SYSTEM:
                shares[message_key(message)] = math.floor(posterior.bounds(counts)[0] + 1e-9)
                continue
            step = _gradient(counts, slopes)
            present = [i for i, g in enumerate(step) if g]
            moved = [sum(covariance[i][j] * step[j] for j in present) for i in range(_SIZE)]
            variance += sum(step[i] * (2 * spread[i] + moved[i]) for i in present)
            gradient = [a + b for a, b in zip(gradient, step, strict=True)]
            spread = [a + b for a, b in zip(spread, moved, strict=True)]
            price += price_of(counts, slopes)
            lower = max(0.0, price - BOUND_Z * math.sqrt(max(0.0, variance)))
            shares[message_key(message)] = math.floor(lower - below + 1e-9)
            below += shares[message_key(message)]
        return shares

    def _share(self, message: Message) -> int:
        found = self._shares.get(message_key(message))
        if found is not None:
            return found
        if not self._bound:
            return math.floor(self.price(message) + 0.5)
        return math.floor(self.bounds(message)[0] + 1e-9)

    def _likely(self, message: Message) -> float:
        return self._posterior.likely(message_classes(self.estimate, message))

    def _added(self, message: Message) -> int:
        if self._bound:
            price = self._posterior.bounds(message_classes(self.estimate, message))[1]
            return max(0, math.ceil(price - 1e-9))
        found = self._new.get(message_key(message))
        if found is not None:
            return max(0, found)
        return max(0, math.ceil(self._likely(message) - 1e-9))

    def __repr__(self) -> str:
        return (
            f"ClassAnchoredCounter(exact_tokens={self.exact_tokens}, slopes="
            f"{[round(b, 3) for b in self.slopes]}, estimate={self.estimate!r})"
        )


_PRIOR = Posterior(
    PRIOR_SLOPES,
    PRIOR_COVARIANCE,
    PRIOR_NOISE,
    dropping=_undecided(PRIOR_SLOPES, PRIOR_COVARIANCE),
)
