"""The resolution chain: request, client, driver, process default, built-in."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import pytest

import threadline.counting
from threadline import Message, Model, Reasoning, Tool
from threadline.counting import (
    ApproximateCounter,
    BuiltinTokenCounter,
    DefaultReplayProjection,
    ModelTokenCounter,
    TokenCounter,
    default_token_counter,
    resolve_token_counter,
    set_default_token_counter,
)
from threadline.counting._resolution import builtin_token_counter

MODEL = Model("gpt-4o-mini", context_size=128_000)


class FixedCounter:
    """A counter that answers one number and has a name, so a test can tell who won."""

    def __init__(self, name: str, tokens: int = 1) -> None:
        self.name = name
        self.tokens = tokens

    def count(self, messages: Sequence[Message], tools: Sequence[Tool] = ()) -> int:
        return self.tokens

    def __repr__(self) -> str:
        return f"FixedCounter({self.name!r})"


class PerModelCounter(FixedCounter, ModelTokenCounter):
    """A ``ModelTokenCounter``: binds to the model it is resolved for."""

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.bound_to: list[Model] = []

    def for_model(self, model: Model) -> TokenCounter:
        self.bound_to.append(model)
        return FixedCounter(f"{self.name} for {model.name}")


class ReplaysDisplayText:
    def replayed_reasoning(self, reasoning: Reasoning) -> Sequence[str]:
        return (reasoning.text,)


class FakeDriver:
    """Just what counting asks of a driver."""

    def __init__(self, counter: TokenCounter | None = None) -> None:
        self.counter = counter
        self.projection = ReplaysDisplayText()
        self.projection_models: list[Model] = []

    def token_counter(self) -> TokenCounter | None:
        return self.counter

    def replay_projection(self, model: Model) -> ReplaysDisplayText:
        self.projection_models.append(model)
        return self.projection


@pytest.fixture(autouse=True)
def reset_default() -> Iterator[None]:
    set_default_token_counter(None)
    yield
    set_default_token_counter(None)


def test_the_request_tier_wins_over_every_other() -> None:
    set_default_token_counter(FixedCounter("default"))
    request = FixedCounter("request")
    driver = FakeDriver(FixedCounter("driver"))
    assert resolve_token_counter(request, FixedCounter("client"), driver, MODEL) is request


def test_the_client_tier_wins_over_driver_default_and_built_in() -> None:
    set_default_token_counter(FixedCounter("default"))
    client = FixedCounter("client")
    driver = FakeDriver(FixedCounter("driver"))
    assert resolve_token_counter(None, client, driver, MODEL) is client


def test_the_driver_tier_wins_over_default_and_built_in() -> None:
    set_default_token_counter(FixedCounter("default"))
    driver_counter = FixedCounter("driver")
    assert resolve_token_counter(None, None, FakeDriver(driver_counter), MODEL) is driver_counter


def test_the_process_default_wins_over_the_built_in() -> None:
    default = FixedCounter("default")
    set_default_token_counter(default)
    assert resolve_token_counter(None, None, FakeDriver(None), MODEL) is default
    assert resolve_token_counter(None, None, None, MODEL) is default


def test_the_built_in_is_last_and_bound_to_the_drivers_projection() -> None:
    driver = FakeDriver(None)
    counter = resolve_token_counter(None, None, driver, MODEL)
    assert isinstance(counter, BuiltinTokenCounter)
    assert counter.projection is driver.projection
    assert driver.projection_models == [MODEL]
    # Bound to the driver, it counts what the driver replays, with the shared cache.
    message = Message.assistant("ok", reasoning=Reasoning(text="display text"))
    assert counter.message_tokens(message) > builtin_token_counter().message_tokens(message)
    assert counter._shared is builtin_token_counter()._shared


def test_without_a_driver_the_built_in_is_used_as_it_is() -> None:
    assert resolve_token_counter(None, None, None, MODEL) is builtin_token_counter()


def test_a_built_in_with_its_own_projection_keeps_it() -> None:
    own = BuiltinTokenCounter(projection=DefaultReplayProjection())
    resolved = resolve_token_counter(own, None, FakeDriver(), MODEL)
    assert resolved is own


def test_an_unbound_built_in_at_any_tier_is_bound_to_the_driver() -> None:
    mine = BuiltinTokenCounter()
    driver = FakeDriver()
    resolved = resolve_token_counter(None, mine, driver, MODEL)
    assert isinstance(resolved, BuiltinTokenCounter)
    assert resolved.projection is driver.projection
    assert resolved._shared is mine._shared


def test_an_unbound_approximate_counter_counts_reasoning_as_the_driver_replays_it() -> None:
    driver = FakeDriver()
    resolved = resolve_token_counter(ApproximateCounter(), None, driver, MODEL)
    assert isinstance(resolved, ApproximateCounter)
    assert resolved.projection is driver.projection
    message = Message.assistant("ok", reasoning=Reasoning(text="display text " * 40))
    # This driver replays the display text, so it costs; unbound, it would not.
    assert resolved.message_tokens(message) > ApproximateCounter().message_tokens(message)


def test_a_model_counter_is_bound_to_the_model() -> None:
    per_model = PerModelCounter("client")
    resolved = resolve_token_counter(None, per_model, FakeDriver(), MODEL)
    assert per_model.bound_to == [MODEL]
    assert repr(resolved) == "FixedCounter('client for gpt-4o-mini')"


def test_a_model_counter_from_the_driver_or_default_is_bound_too() -> None:
    from_driver = PerModelCounter("driver")
    resolve_token_counter(None, None, FakeDriver(from_driver), MODEL)
    assert from_driver.bound_to == [MODEL]
    default = PerModelCounter("default")
    set_default_token_counter(default)
    resolve_token_counter(None, None, None, MODEL)
    assert default.bound_to == [MODEL]


def test_a_plain_counter_is_not_wrapped() -> None:
    plain = FixedCounter("plain")
    assert resolve_token_counter(plain, None, FakeDriver(), MODEL) is plain
    bound = ApproximateCounter(projection=DefaultReplayProjection())
    assert resolve_token_counter(bound, None, FakeDriver(), MODEL) is bound


def test_default_token_counter_reports_what_is_installed() -> None:
    assert default_token_counter() is builtin_token_counter()
    installed = ApproximateCounter()
    set_default_token_counter(installed)
    assert default_token_counter() is installed


def test_none_resets_to_the_built_in_rather_than_a_previous_counter() -> None:
    set_default_token_counter(FixedCounter("first"))
    set_default_token_counter(FixedCounter("second"))
    set_default_token_counter(None)
    assert default_token_counter() is builtin_token_counter()
    assert isinstance(resolve_token_counter(None, None, None, MODEL), BuiltinTokenCounter)


def test_something_that_cannot_count_is_refused() -> None:
    with pytest.raises(TypeError, match="count"):
        set_default_token_counter(42)  # type: ignore[arg-type]
    assert default_token_counter() is builtin_token_counter()


def test_concurrent_defaults_never_leave_a_half_set_state() -> None:
    writers = [FixedCounter(f"writer {n}", tokens=n) for n in range(16)]
    allowed = {id(counter) for counter in writers} | {id(builtin_token_counter())}
    start = threading.Barrier(len(writers) + 4)
    stop = threading.Event()
    seen_bad: list[object] = []

    def write(counter: FixedCounter, index: int) -> None:
        start.wait()
        for round_ in range(300):
            set_default_token_counter(None if (round_ + index) % 7 == 0 else counter)
        set_default_token_counter(counter)

    def read() -> None:
        start.wait()
        while not stop.is_set():
            current = default_token_counter()
            if id(current) not in allowed or not isinstance(current, TokenCounter):
                seen_bad.append(current)

    readers = [threading.Thread(target=read) for _ in range(4)]
    threads = [
        threading.Thread(target=write, args=(counter, index))
        for index, counter in enumerate(writers)
    ]
    for thread in readers + threads:
        thread.start()
    for thread in threads:
        thread.join()
    stop.set()
    for thread in readers:
        thread.join()

    assert seen_bad == []
    final = default_token_counter()
    assert final in writers
    # The counter installed is whole: the one object, counting as itself.
    assert final.count([]) == writers.index(final)


def test_the_package_exports_are_complete_and_sorted() -> None:
    names = threadline.counting.__all__
    assert names == sorted(names)
    for name in names:
        assert getattr(threadline.counting, name) is not None
