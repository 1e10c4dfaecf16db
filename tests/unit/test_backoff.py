"""The one jittered exponential backoff (kit.backoff): bounds of each delay, the cap, reset,
deadlines on the caller's clock, determinism with an injected RNG, and a cancellable sleep."""

from __future__ import annotations

import asyncio
import logging
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kit.backoff import ERROR_CAP_SECONDS, Backoff, every
from kit.clock import ManualClock


@given(
    base=st.floats(0.001, 10),
    cap=st.floats(0.001, 600),
    jitter=st.floats(0, 1),
    seed=st.integers(0, 2**32),
    failures=st.integers(1, 60),
)
def test_every_delay_lies_between_the_jittered_floor_and_the_capped_ceiling(
    base: float, cap: float, jitter: float, seed: int, failures: int
) -> None:
    backoff = Backoff(base, cap, jitter=jitter, rng=random.Random(seed))
    for n in range(1, failures + 1):
        ceiling = min(cap, base * 2 ** (n - 1))
        assert backoff.ceiling(n) == pytest.approx(ceiling)
        delay = backoff.failed()
        assert backoff.failures == n
        assert ceiling * (1 - jitter) - 1e-9 <= delay <= ceiling + 1e-9
        assert delay <= cap + 1e-9


def test_without_jitter_the_delay_doubles_from_the_base_and_stops_at_the_cap() -> None:
    backoff = Backoff(1.0, 16.0, jitter=0)
    assert [backoff.failed() for _ in range(7)] == [1.0, 2.0, 4.0, 8.0, 16.0, 16.0, 16.0]


def test_a_cap_below_the_base_caps_the_first_delay_too() -> None:
    # The shipper's base is 2 s; KURA_REPLICATION_BACKOFF_MAX_MS=500 must mean 0.5 s pauses.
    backoff = Backoff(2.0, 0.5, jitter=0)
    assert [backoff.failed() for _ in range(3)] == [0.5, 0.5, 0.5]


def test_a_very_long_outage_stays_at_the_cap_without_overflowing() -> None:
    backoff = Backoff(0.02, 1.0, jitter=0)
    assert backoff.ceiling(10_000) == 1.0
    backoff.failures = 5_000
    assert backoff.failed() == 1.0


def test_equal_jitter_never_goes_below_half_the_ceiling_and_does_spread() -> None:
    backoff = Backoff(2.0, 60.0, jitter=0.5, rng=random.Random(1))
    draws = [backoff.draw(4) for _ in range(1000)]  # ceiling 16 s
    assert min(draws) >= 8.0
    assert max(draws) <= 16.0
    # Spread, not one value: a herd of 1000 nodes would not return in the same second.
    assert len({round(d) for d in draws}) >= 8
    assert backoff.failures == 0, "draw() leaves the state alone"


def test_reset_starts_over_at_the_base_and_clears_the_deadline() -> None:
    clock = ManualClock()
    backoff = Backoff(1.0, 60.0, jitter=0)
    for _ in range(5):
        backoff.failed(clock.monotonic())
    assert backoff.delay_seconds == 16.0
    assert backoff.waiting(clock.monotonic())
    backoff.reset()
    assert (backoff.failures, backoff.delay_seconds, backoff.until) == (0, 0.0, 0.0)
    assert not backoff.waiting(clock.monotonic())
    assert backoff.remaining(clock.monotonic()) == 0.0
    assert backoff.failed(clock.monotonic()) == 1.0


def test_the_deadline_is_on_the_callers_clock_and_passes_with_it() -> None:
    clock = ManualClock(monotonic=500.0)
    backoff = Backoff(2.0, 60.0, jitter=0)
    assert backoff.failed(clock.monotonic()) == 2.0
    assert backoff.until == 502.0
    clock.advance(1.5)
    assert backoff.waiting(clock.monotonic())
    assert backoff.remaining(clock.monotonic()) == pytest.approx(0.5)
    clock.advance(0.5)
    assert not backoff.waiting(clock.monotonic())
    assert backoff.remaining(clock.monotonic()) == 0.0


def test_the_same_seed_gives_the_same_delays_and_another_seed_others() -> None:
    def delays(seed: int) -> list[float]:
        backoff = Backoff(0.02, 1.0, rng=random.Random(seed))
        return [backoff.failed() for _ in range(12)]

    assert delays(42) == delays(42)
    assert delays(42) != delays(43)
    # Full jitter is exactly uniform(0, ceiling) on the injected generator.
    rng = random.Random(42)
    assert delays(42) == [rng.uniform(0, min(1.0, 0.02 * 2**n)) for n in range(12)]


@pytest.mark.parametrize(
    ("base", "cap", "jitter"),
    [(0, 1, 0.5), (-1, 1, 0.5), (1, 0, 0.5), (1, 2, -0.1), (1, 2, 1.5), (float("nan"), 1, 0)],
)
def test_an_impossible_policy_is_refused_up_front(base: float, cap: float, jitter: float) -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(base, cap, jitter=jitter)


async def test_sleep_counts_the_failure_and_sleeps_its_delay_with_the_injected_sleep() -> None:
    slept: list[float] = []

    async def virtual_sleep(seconds: float) -> None:
        slept.append(seconds)

    backoff = Backoff(0.5, 4.0, jitter=0)
    assert [await backoff.sleep(virtual_sleep) for _ in range(5)] == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert slept == [0.5, 1.0, 2.0, 4.0, 4.0]
    assert backoff.failures == 5


async def test_sleep_can_be_cancelled_and_the_failure_stays_counted() -> None:
    backoff = Backoff(3600.0, 3600.0, jitter=0)
    task = asyncio.create_task(backoff.sleep())
    await asyncio.sleep(0)  # let it start sleeping its hour
    task.cancel()
    async with asyncio.timeout(5):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert backoff.failures == 1
    assert backoff.delay_seconds == 3600.0


class _Stop(BaseException):
    """Ends an ``every()`` loop from its injected sleep (it propagates like cancellation)."""


async def test_every_backs_off_after_crashing_iterations_and_resets_on_success(
    caplog: pytest.LogCaptureFixture,
) -> None:
    outcomes = iter([False, False, False, True, False, True])
    pauses: list[float] = []

    async def iteration() -> None:
        if not next(outcomes):
            raise RuntimeError("injected crash")

    async def virtual_sleep(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 6:
            raise _Stop

    log = logging.getLogger("test.every")
    with pytest.raises(_Stop):
        await every(
            iteration, 1.0, what="probe round", log=log, rng=random.Random(3), sleep=virtual_sleep
        )
    # Crashes: ceilings 1, 2, 4 s (never below the interval, at least half the ceiling);
    # the success resets, so the next crash starts over at one interval.
    assert pauses[0] == 1.0
    assert 1.0 <= pauses[1] <= 2.0
    assert 2.0 <= pauses[2] <= 4.0
    assert pauses[3] == 1.0
    assert pauses[4] == 1.0
    assert pauses[5] == 1.0
    crashes = [r for r in caplog.records if r.name == "test.every"]
    assert len(crashes) == 4
    assert all(r.exc_info is not None for r in crashes)
    assert "probe round failed (3 in a row)" in crashes[2].getMessage()


async def test_every_pauses_are_capped_and_never_shorter_than_the_interval() -> None:
    pauses: list[float] = []

    async def crash() -> None:
        raise RuntimeError("always")

    async def virtual_sleep(seconds: float) -> None:
        pauses.append(seconds)
        if len(pauses) == 40:
            raise _Stop

    with pytest.raises(_Stop):
        await every(crash, 0.5, what="x", log=logging.getLogger("test.every"), sleep=virtual_sleep)
    assert all(0.5 <= p <= ERROR_CAP_SECONDS for p in pauses)
    assert max(pauses[-10:]) > ERROR_CAP_SECONDS / 2, "it reaches the cap's range"


async def test_every_ends_when_its_task_is_cancelled_mid_pause() -> None:
    ran = asyncio.Event()
    runs = 0

    async def iteration() -> None:
        nonlocal runs
        runs += 1
        ran.set()

    task = asyncio.create_task(every(iteration, 3600.0, what="x", log=logging.getLogger("t")))
    async with asyncio.timeout(5):
        await ran.wait()
    await asyncio.sleep(0)  # into its hour-long pause
    task.cancel()
    async with asyncio.timeout(5):
        with pytest.raises(asyncio.CancelledError):
            await task
    assert runs == 1
