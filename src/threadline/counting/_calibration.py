"""Calibration: how far a counter's estimate is from what the provider reports.

A :class:`TokenCalibration` keeps one ratio per model: the input tokens a
provider reported for a prompt over the tokens the request's counter
estimated for that same prompt. Every response with reported usage is an
observation. Requests that send tools keep a ratio of their own per tool
set (``"model [tools: a, b]"``): a chat template renders tool schemas in its
own way (a system prompt of instructions, often), so their ratio is not the
messages'. Until a tool set has been seen, the model's own ratio stands in.

A ratio only ratchets up: the first observation sets it, a later one raises
it when it is higher, nothing lowers it. A calibrated
estimate therefore errs towards counting too much (a turn that keeps a unit
less) rather than too little (a turn the provider refuses).

:class:`CalibratedCounter` is a counter's estimate scaled by one ratio,
rounded up: what limiting counts with when a client has a calibration.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from threadline._validate import fail, non_negative_int

if TYPE_CHECKING:
    from threadline._messages import Message
    from threadline.counting._protocol import TokenCounter
    from threadline.tools._tools import Tool

__all__ = [
    "DEFAULT_MIN_ESTIMATED_TOKENS",
    "CalibratedCounter",
    "TokenCalibration",
    "calibration_key",
    "scaled",
]

DEFAULT_MIN_ESTIMATED_TOKENS = 64
"""Rounds estimated below this many tokens teach a calibration nothing.

A tiny prompt's ratio is mostly framing (a template's default system
message, a tokenizer's start token), which says little about the next,
larger prompt; and a ratio that only ratchets up would keep that noise.
"""

# A product such as 1.1 * 100 is 110.00000000000001 in binary floating point;
# rounding it up must still give 110.
_EPSILON = 1e-9


def scaled(tokens: int, ratio: float) -> int:
    """``tokens`` times ``ratio``, rounded up (never below a count it should equal)."""
    return max(0, math.ceil(tokens * ratio - _EPSILON))


def calibration_key(model: str, tools: Iterable[str] = ()) -> str:
    """Where a calibration keeps the ratio of ``model`` sent with the tools named ``tools``:
    the model's name, or ``"model [tools: a, b]"``."""
    names = sorted(set(tools))
    return f"{model} [tools: {', '.join(names)}]" if names else model


def _ratio(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        fail(name, "a positive, finite number", value)
    ratio = float(value)
    if not math.isfinite(ratio) or ratio <= 0:
        fail(name, "a positive, finite number", value)
    return ratio


class TokenCalibration:
    """Per-model ratios of reported to estimated input tokens, learned from responses.

    Give one to a client (``Client(driver, calibration=TokenCalibration())``)
    and every round of its requests teaches it: after each response that
    reports its input tokens, the ratio for the request's model becomes the
    larger of the old ratio and ``reported / estimated``. Limiting then
    counts ``ceil(estimate * ratio)``. A conversation saves the ratio of its
    model with its state and gives it back to its client's calibration when
    loaded, so a resumed conversation does not start uncalibrated.

    ``ratios`` seeds it (a model's name, or a :func:`calibration_key`, to its ratio);
    ``min_estimated_tokens`` is the smallest estimate a round must have to
    be learned from (see :data:`DEFAULT_MIN_ESTIMATED_TOKENS`). One
    calibration may serve many requests and threads at once.

    Raises:
        InvalidRequestError: a ratio that is not a positive, finite number, or
            a negative ``min_estimated_tokens``.

    Example::

        calibration = TokenCalibration()
        client = Client(OpenAIChatDriver(url), calibration=calibration)
        ...
        calibration.ratio("smollm2")  # e.g. 1.31 after a few turns
    """

    __slots__ = ("_lock", "_min_estimated_tokens", "_ratios")

    def __init__(
        self,
        ratios: Mapping[str, float] | None = None,
        *,
        min_estimated_tokens: int = DEFAULT_MIN_ESTIMATED_TOKENS,
    ) -> None:
        self._min_estimated_tokens = non_negative_int("min_estimated_tokens", min_estimated_tokens)
        self._lock = threading.Lock()
        self._ratios: dict[str, float] = {}
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

    def observe(
        self,
        model: str,
        *,
        estimated_tokens: int,
        reported_tokens: int,
        tools: Iterable[str] = (),
    ) -> float | None:
        """Learn from one response: the prompt (sent with the tools named ``tools``) was
        estimated at ``estimated_tokens`` and the provider reported ``reported_tokens``.
        Returns the ratio that applies now.

        An estimate under :attr:`min_estimated_tokens` or a report of 0 changes nothing.
        """
        tools = tuple(tools)
        if estimated_tokens < max(1, self._min_estimated_tokens) or reported_tokens <= 0:
            return self.ratio(model, tools)
        return self._raise(calibration_key(model, tools), reported_tokens / estimated_tokens)

    def absorb(self, ratios: Mapping[str, float]) -> None:
        """Take in ratios learned elsewhere (a saved conversation, another process),
        by :func:`calibration_key`: each ratio becomes the larger of the two.

        Raises:
            InvalidRequestError: a ratio that is not a positive, finite number.
        """
        checked = {key: _ratio(f"ratios[{key!r}]", value) for key, value in ratios.items()}
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
