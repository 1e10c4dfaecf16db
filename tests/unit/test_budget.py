"""The tmp staging budget: ``core.budget.ByteLedger`` (the accounting) and
``storage.budget.TmpBudget`` (fail-fast and waiting reservations on one event loop).

The invariant behind Kura's bootstrap stall (kura-behaviour.md §0): reserved bytes never exceed
the capacity, every reservation is given back exactly once, and a waiter is woken by a release.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kura.core.budget import ByteLedger
from kura.core.errors import PayloadTooLarge, ResourceExhausted
from kura.storage.budget import Reservation, TmpBudget

# -- ByteLedger ------------------------------------------------------------------------------


def test_ledger_takes_what_fits_exactly_and_refuses_one_byte_more() -> None:
    ledger = ByteLedger(100)
    assert ledger.take(60)
    assert ledger.take(40)
    assert ledger.reserved_bytes == 100
    assert not ledger.take(1)
    assert ledger.reserved_bytes == 100


def test_ledger_counts_outside_bytes_against_the_capacity() -> None:
    ledger = ByteLedger(100)
    assert ledger.fits(70, outside_bytes=30)
    assert not ledger.fits(71, outside_bytes=30)
    assert not ledger.take(71, outside_bytes=30)
    assert ledger.reserved_bytes == 0
    assert ledger.take(70, outside_bytes=30)
    assert ledger.reserved_bytes == 70  # outside bytes are never recorded as reserved


def test_ledger_refuses_to_give_back_more_than_is_reserved_or_negative_amounts() -> None:
    ledger = ByteLedger(100)
    ledger.take(10)
    with pytest.raises(ValueError, match="cannot give back 11"):
        ledger.give_back(11)
    with pytest.raises(ValueError, match="cannot give back"):
        ledger.give_back(-1)
    with pytest.raises(ValueError, match="n_bytes"):
        ledger.take(-5)
    assert ledger.reserved_bytes == 10


@pytest.mark.parametrize("capacity", [0, -1])
def test_ledger_needs_a_positive_capacity(capacity: int) -> None:
    with pytest.raises(ValueError, match="capacity_bytes"):
        ByteLedger(capacity)


@pytest.mark.parametrize(("asked", "clamped"), [(0, 1), (-3, 1), (50, 50), (100, 100), (101, 100)])
def test_ledger_clamps_a_single_request_to_between_one_byte_and_the_capacity(
    asked: int, clamped: int
) -> None:
    assert ByteLedger(100).clamp(asked) == clamped


# -- TmpBudget: fail-fast reservations --------------------------------------------------------


def test_try_reserve_takes_bytes_that_fit_and_release_returns_them() -> None:
    budget = TmpBudget(100)
    r = budget.try_reserve(60)
    assert (r.size_bytes, budget.reserved_bytes) == (60, 60)
    r.release()
    assert budget.reserved_bytes == 0


def test_try_reserve_raises_resource_exhausted_when_full_and_takes_nothing() -> None:
    budget = TmpBudget(100)
    held = budget.try_reserve(80)
    with pytest.raises(ResourceExhausted) as raised:
        budget.try_reserve(21)
    for part in ("80 bytes reserved", "21 bytes requested", "100 bytes allowed"):
        assert part in raised.value.message
    assert raised.value.retry_after_seconds >= 1
    assert budget.reserved_bytes == 80
    held.release()


def test_try_reserve_larger_than_the_capacity_is_payload_too_large() -> None:
    budget = TmpBudget(100)
    with pytest.raises(PayloadTooLarge) as raised:
        budget.try_reserve(101)
    assert raised.value.limit_bytes == 100
    assert budget.reserved_bytes == 0


def test_try_reserve_counts_bytes_found_outside_the_ledger() -> None:
    outside = [0]
    budget = TmpBudget(100, outside_bytes=lambda: outside[0])
    outside[0] = 90
    with pytest.raises(ResourceExhausted):
        budget.try_reserve(11)
    budget.try_reserve(10).release()
    outside[0] = 0
    budget.try_reserve(100).release()
    assert budget.reserved_bytes == 0


def test_release_is_idempotent_and_a_context_manager_releases_on_error() -> None:
    budget = TmpBudget(100)
    keep = budget.try_reserve(30)
    r = budget.try_reserve(50)
    r.release()
    r.release()
    assert budget.reserved_bytes == 30  # the second release did not give back keep's bytes
    seen_inside: list[int] = []

    def fail_while_holding() -> None:
        with budget.try_reserve(70):
            seen_inside.append(budget.reserved_bytes)
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        fail_while_holding()
    assert seen_inside == [100]
    assert budget.reserved_bytes == 30
    keep.release()
    assert budget.reserved_bytes == 0


def test_try_grow_to_grows_when_room_and_raises_without_changing_anything_when_not() -> None:
    budget = TmpBudget(100)
    other = budget.try_reserve(20)
    r = budget.try_reserve(10)
    r.try_grow_to(50)
    assert (r.size_bytes, budget.reserved_bytes) == (50, 70)
    r.try_grow_to(40)  # never shrinks
    assert (r.size_bytes, budget.reserved_bytes) == (50, 70)
    with pytest.raises(ResourceExhausted):
        r.try_grow_to(81)
    assert (r.size_bytes, budget.reserved_bytes) == (50, 70)
    r.try_grow_to(80)
    assert budget.reserved_bytes == 100
    r.release()
    other.release()
    assert budget.reserved_bytes == 0


def test_try_grow_to_beyond_the_whole_capacity_is_payload_too_large() -> None:
    # A streamed body that could never fit must get the same answer as a declared one (413),
    # not a 503 that tells the client to retry forever.
    budget = TmpBudget(100)
    r = budget.try_reserve(10)
    with pytest.raises(PayloadTooLarge) as raised:
        r.try_grow_to(101)
    assert raised.value.limit_bytes == 100
    assert (r.size_bytes, budget.reserved_bytes) == (10, 10)
    r.release()


def test_a_body_of_unknown_length_takes_a_step_when_it_fits_else_only_what_arrived() -> None:
    budget = TmpBudget(100)
    other = budget.try_reserve(70)
    r = budget.try_reserve_up_to(50)  # a step of 50 does not fit beside 70: 1 byte instead
    assert (r.size_bytes, budget.reserved_bytes) == (1, 71)
    r.grow_for(12, step_to=51)  # the step does not fit either: exactly what arrived
    assert (r.size_bytes, budget.reserved_bytes) == (12, 82)
    r.grow_for(30, step_to=62)
    assert (r.size_bytes, budget.reserved_bytes) == (30, 100)
    with pytest.raises(ResourceExhausted):
        r.grow_for(31, step_to=80)  # not even what arrived fits: refused, nothing changed
    assert (r.size_bytes, budget.reserved_bytes) == (30, 100)
    other.release()
    r.grow_for(31, step_to=60)  # room again: the whole step
    assert (r.size_bytes, budget.reserved_bytes) == (60, 60)
    r.release()
    full = budget.try_reserve(100)
    with pytest.raises(ResourceExhausted):
        budget.try_reserve_up_to(50)
    assert budget.reserved_bytes == 100
    full.release()
    assert budget.try_reserve_up_to(50).size_bytes == 50


def test_try_grow_to_after_release_is_a_bug() -> None:
    budget = TmpBudget(100)
    r = budget.try_reserve(10)
    r.release()
    with pytest.raises(RuntimeError, match="released"):
        r.try_grow_to(20)
    assert budget.reserved_bytes == 0


# -- TmpBudget: waiting reservations ----------------------------------------------------------


async def _until(predicate: object, *, rounds: int = 100) -> None:
    """Let the loop run until ``predicate()`` holds (no wall-clock waiting)."""
    for _ in range(rounds):
        if predicate():  # type: ignore[operator]
            return
        await asyncio.sleep(0)
    raise AssertionError("condition not reached")


async def test_reserve_returns_at_once_when_there_is_room() -> None:
    budget = TmpBudget(100)
    r = await budget.reserve(40)
    assert (r.size_bytes, budget.reserved_bytes, budget.waiting) == (40, 40, 0)
    r.release()


async def test_reserve_waits_while_full_and_a_release_wakes_it() -> None:
    budget = TmpBudget(100)
    hog = budget.try_reserve(90)
    waiter = asyncio.create_task(budget.reserve(50))
    await _until(lambda: budget.waiting == 1)
    assert not waiter.done()
    assert budget.reserved_bytes == 90
    hog.release()
    r = await asyncio.wait_for(waiter, 5)
    assert (r.size_bytes, budget.reserved_bytes, budget.waiting) == (50, 50, 0)
    r.release()
    assert budget.reserved_bytes == 0


async def test_a_release_too_small_to_help_leaves_the_waiter_waiting() -> None:
    budget = TmpBudget(100)
    a = budget.try_reserve(50)
    b = budget.try_reserve(50)
    waiter = asyncio.create_task(budget.reserve(80))
    await _until(lambda: budget.waiting == 1)
    a.release()
    await _until(lambda: budget.waiting == 1 and budget.reserved_bytes == 50)
    for _ in range(10):
        await asyncio.sleep(0)
    assert not waiter.done()
    b.release()
    r = await asyncio.wait_for(waiter, 5)
    assert budget.reserved_bytes == 80
    r.release()


async def test_reserve_larger_than_the_capacity_is_clamped_so_it_can_ever_run() -> None:
    budget = TmpBudget(100)
    r = await asyncio.wait_for(budget.reserve(10_000), 5)
    assert (r.size_bytes, budget.reserved_bytes) == (100, 100)
    r.release()
    assert budget.reserved_bytes == 0


async def test_a_cancelled_waiter_leaves_nothing_reserved_and_is_not_counted() -> None:
    budget = TmpBudget(100)
    hog = budget.try_reserve(100)
    waiter = asyncio.create_task(budget.reserve(10))
    await _until(lambda: budget.waiting == 1)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert (budget.waiting, budget.reserved_bytes) == (0, 100)
    hog.release()
    assert budget.reserved_bytes == 0


async def test_a_waiter_cancelled_after_being_woken_takes_nothing() -> None:
    budget = TmpBudget(100)
    hog = budget.try_reserve(100)
    waiter = asyncio.create_task(budget.reserve(10))
    await _until(lambda: budget.waiting == 1)
    hog.release()  # wakes the waiter; it has not run yet
    waiter.cancel()  # ...and is cancelled before it could re-check
    with pytest.raises(asyncio.CancelledError):
        await waiter
    assert (budget.waiting, budget.reserved_bytes) == (0, 0)


async def test_a_waiter_notices_outside_bytes_going_away_without_any_release() -> None:
    outside = [100]
    budget = TmpBudget(100, outside_bytes=lambda: outside[0])
    waiter = asyncio.create_task(budget.reserve(10))
    await _until(lambda: budget.waiting == 1)
    outside[0] = 0  # a leftover file was deleted: nobody calls release()
    r = await asyncio.wait_for(waiter, 5)
    assert budget.reserved_bytes == 10
    r.release()


def test_files_a_reservation_tracks_are_not_counted_again_as_outside_bytes(
    tmp_path: Path,
) -> None:
    # Outside bytes are measured by a walk (refresh_now here; a background task in a node).
    budget = TmpBudget(100, tmp_dir=tmp_path)
    (tmp_path / "leftover").write_bytes(b"l" * 60)
    budget.refresh_now()
    assert budget.outside_bytes == 60
    with pytest.raises(ResourceExhausted, match="60 bytes of other files"):
        budget.try_reserve(41)
    r = budget.try_reserve(40)
    staged = tmp_path / "uploads" / "upload-1"
    staged.parent.mkdir()
    r.track(staged)
    staged.write_bytes(b"s" * 40)
    budget.refresh_now()
    assert budget.outside_bytes == 60  # the staged file is counted once, as reserved
    assert budget.tmp_dir_bytes == 100
    assert budget.reserved_bytes == 40
    r.release()
    budget.refresh_now()
    assert budget.outside_bytes == 100  # left on disk after release: now it is outside
    staged.unlink()
    (tmp_path / "leftover").unlink()
    budget.refresh_now()
    budget.try_reserve(100).release()


async def test_every_waiter_is_served_once_enough_is_released() -> None:
    budget = TmpBudget(100)
    hog = budget.try_reserve(100)
    waiters = [asyncio.create_task(budget.reserve(25)) for _ in range(4)]
    await _until(lambda: budget.waiting == 4)
    hog.release()
    got = await asyncio.wait_for(asyncio.gather(*waiters), 5)
    assert budget.reserved_bytes == 100
    assert budget.waiting == 0
    for r in got:
        r.release()
    assert budget.reserved_bytes == 0


# -- property: random reserve/release sequences -----------------------------------------------

OPS = st.lists(
    st.tuples(st.sampled_from(["try", "wait", "grow", "release", "cancel"]), st.integers(0, 130)),
    max_size=60,
)


@given(capacity=st.integers(1, 120), ops=OPS, seed=st.integers(0, 2**16))
@settings(max_examples=200, deadline=None)
def test_random_reserve_and_release_never_exceed_capacity_and_end_at_zero(
    capacity: int, ops: list[tuple[str, int]], seed: int
) -> None:
    asyncio.run(_run_ops(capacity, ops, random.Random(seed)))


async def _run_ops(capacity: int, ops: list[tuple[str, int]], rng: random.Random) -> None:
    budget = TmpBudget(capacity)
    held: list[Reservation] = []
    waiting: list[asyncio.Task[Reservation]] = []

    def check() -> None:
        assert 0 <= budget.reserved_bytes <= capacity
        live = [r for r in held if not r.released]
        assert budget.reserved_bytes == sum(r.size_bytes for r in live)

    for op, n in ops:
        if op == "try":
            with contextlib.suppress(ResourceExhausted, PayloadTooLarge):
                held.append(budget.try_reserve(n))
        elif op == "wait":
            waiting.append(asyncio.create_task(budget.reserve(n)))
        elif op == "grow" and any(not r.released for r in held):
            r = rng.choice([r for r in held if not r.released])
            with contextlib.suppress(ResourceExhausted, PayloadTooLarge):
                r.try_grow_to(r.size_bytes + n)
        elif op == "release" and held:
            rng.choice(held).release()
        elif op == "cancel" and waiting:
            rng.choice(waiting).cancel()
        for _ in range(3):
            await asyncio.sleep(0)
        for t in [t for t in waiting if t.done()]:
            waiting.remove(t)
            if not t.cancelled():
                held.append(t.result())
        check()
    for t in waiting:
        t.cancel()
    await asyncio.gather(*waiting, return_exceptions=True)
    for t in waiting:
        if not t.cancelled():
            held.append(t.result())
    check()
    for r in held:
        r.release()
    assert budget.reserved_bytes == 0
    assert budget.waiting == 0
