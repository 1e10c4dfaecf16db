"""Versions and last-writer-wins (kura.core.version, kura.storage.version_clock;
kura-behaviour.md §2.6)."""

from __future__ import annotations

import random
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from kura.core.errors import InvalidRequest
from kura.core.version import (
    ApplyOutcome,
    FutureVersion,
    ahead_of_skew_ms,
    decide_apply,
    next_version_ms,
)
from kura.storage.version_clock import VersionClock

MS = st.integers(0, 2**53)


@pytest.mark.parametrize(
    ("incoming", "stored", "tombstone", "outcome"),
    [
        (5, None, None, ApplyOutcome.APPLIED),
        (6, 5, None, ApplyOutcome.APPLIED),
        (5, 5, None, ApplyOutcome.IGNORED_STALE),  # equal is not newer
        (4, 5, None, ApplyOutcome.IGNORED_STALE),
        (6, None, 5, ApplyOutcome.APPLIED),
        (5, None, 5, ApplyOutcome.IGNORED_TOMBSTONE),  # equal to the tombstone is covered
        (4, None, 5, ApplyOutcome.IGNORED_TOMBSTONE),
        (0, None, 0, ApplyOutcome.IGNORED_TOMBSTONE),  # version 0 never beats a tombstone
        (4, 9, 5, ApplyOutcome.IGNORED_TOMBSTONE),  # the tombstone is checked first
        (7, 9, 5, ApplyOutcome.IGNORED_STALE),
        (10, 9, 5, ApplyOutcome.APPLIED),
    ],
)
def test_decide_apply_follows_lww_and_tombstone_rules(
    incoming: int, stored: int | None, tombstone: int | None, outcome: ApplyOutcome
) -> None:
    assert decide_apply(incoming, stored, tombstone) is outcome


@given(MS, st.none() | MS, st.none() | MS)
def test_applied_exactly_when_strictly_newer_than_both(
    incoming: int, stored: int | None, tombstone: int | None
) -> None:
    newer = (stored is None or incoming > stored) and (tombstone is None or incoming > tombstone)
    assert (decide_apply(incoming, stored, tombstone) is ApplyOutcome.APPLIED) == newer


@given(MS, MS, MS)
def test_applying_the_same_copy_twice_is_stale_the_second_time(
    incoming: int, stored: int, tombstone: int
) -> None:
    if decide_apply(incoming, stored, tombstone) is ApplyOutcome.APPLIED:
        assert decide_apply(incoming, incoming, tombstone) is ApplyOutcome.IGNORED_STALE


A, B = "a" * 64, "b" * 64  # B > A as hex strings


@pytest.mark.parametrize(
    ("incoming_sha", "stored_sha", "outcome"),
    [
        (B, A, ApplyOutcome.APPLIED),  # equal version: the larger digest wins
        (A, B, ApplyOutcome.IGNORED_STALE),
        (A, A, ApplyOutcome.IGNORED_STALE),  # an identical copy is not applied again
    ],
)
def test_an_equal_version_is_broken_by_the_digest(
    incoming_sha: str, stored_sha: str, outcome: ApplyOutcome
) -> None:
    assert decide_apply(7, 7, None, incoming_sha, stored_sha) is outcome
    # The digest never beats a newer version or a tombstone.
    assert decide_apply(6, 7, None, incoming_sha, stored_sha) is ApplyOutcome.IGNORED_STALE
    assert decide_apply(7, 7, 7, incoming_sha, stored_sha) is ApplyOutcome.IGNORED_TOMBSTONE


DIGESTS = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)


@given(st.lists(st.tuples(st.integers(0, 5), DIGESTS), min_size=1, max_size=8), st.randoms())
def test_every_node_converges_on_the_same_copy_whatever_the_arrival_order(
    copies: list[tuple[int, str]], rnd: random.Random
) -> None:
    def converge(order: list[tuple[int, str]]) -> tuple[int, str]:
        stored: tuple[int, str] | None = None
        for version, digest in order:
            outcome = decide_apply(
                version,
                None if stored is None else stored[0],
                None,
                digest,
                "" if stored is None else stored[1],
            )
            if outcome is ApplyOutcome.APPLIED:
                stored = (version, digest)
        assert stored is not None
        return stored

    shuffled = copies[:]
    rnd.shuffle(shuffled)
    assert converge(copies) == converge(shuffled) == max(copies)


def test_outcome_values_are_the_metric_labels() -> None:
    assert {o.value for o in ApplyOutcome} == {"applied", "ignored_stale", "ignored_tombstone"}


@given(st.lists(MS, min_size=1, max_size=50))
def test_next_version_is_strictly_increasing_whatever_the_clock_does(clock_ms: list[int]) -> None:
    last = 0
    for now in clock_ms:
        issued = next_version_ms(now, last)
        assert issued > last
        assert issued >= now  # never behind the wall clock
        last = issued


def test_two_writes_in_one_millisecond_get_distinct_versions() -> None:
    first = next_version_ms(1000, 0)
    second = next_version_ms(1000, first)
    assert (first, second) == (1000, 1001)
    assert next_version_ms(900, second) == 1002  # a clock step backwards
    assert next_version_ms(5000, 1002) == 5000


@given(MS, MS, st.none() | MS, st.none() | MS)
def test_a_local_version_beats_the_stored_copy_and_the_tombstone_it_was_issued_against(
    now: int, last: int, stored: int | None, tombstone: int | None
) -> None:
    issued = next_version_ms(now, last, stored, tombstone)
    assert issued >= now
    assert issued > last
    # The rule's purpose: the local write is applied locally (and so by every peer).
    assert decide_apply(issued, stored, tombstone, "0" * 64, "f" * 64) is ApplyOutcome.APPLIED
    # ...and it is the smallest such version: no needless jump ahead of the wall clock.
    floor = max(x for x in (last, stored, tombstone) if x is not None)
    assert issued == max(now, floor + 1)


def test_a_node_behind_its_peer_issues_versions_above_the_peers_copy() -> None:
    # The field report: a peer 60 s ahead wrote at 1_060_000; this node's clock says 1_000_000.
    assert next_version_ms(1_000_000, 999_990, stored_version_ms=1_060_000) == 1_060_001
    assert next_version_ms(1_000_000, 0, tombstone_version_ms=1_060_000) == 1_060_001
    assert next_version_ms(1_070_000, 0, 1_060_000, 1_050_000) == 1_070_000


@given(st.lists(st.tuples(st.booleans(), MS), max_size=60))
def test_the_version_clock_issues_above_everything_it_issued_or_observed(
    events: list[tuple[bool, int]],
) -> None:
    clock = VersionClock()
    seen = 0
    for is_observation, ms in events:
        if is_observation:
            clock.observe(ms)
            seen = max(seen, ms)
        else:
            issued = clock.issue(ms)
            assert issued > seen
            assert issued >= ms
            seen = issued
        assert clock.last_ms == seen


def test_observations_from_other_threads_are_never_lost() -> None:
    clock = VersionClock(5)
    observed = [[t * 1_000_000 + i for i in range(2000)] for t in range(1, 5)]

    def observe(values: list[int]) -> None:
        for v in values:
            clock.observe(v)
            clock.issue(0)

    threads = [threading.Thread(target=observe, args=(v,)) for v in observed]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert clock.issue(0) > max(max(v) for v in observed)


@pytest.mark.parametrize(
    ("version", "now", "skew", "ahead"),
    [
        (1_000, 1_000, 300_000, 0),
        (301_000, 1_000, 300_000, 0),  # exactly at the limit is accepted
        (301_001, 1_000, 300_000, 1),
        (1_000 + 86_400_000, 1_000, 300_000, 86_100_000),
        (0, 1_000, 300_000, 0),  # the past is never "ahead"
    ],
)
def test_ahead_of_skew_measures_only_what_lies_beyond_the_limit(
    version: int, now: int, skew: int, ahead: int
) -> None:
    assert ahead_of_skew_ms(version, now, skew) == ahead


def test_a_future_version_is_a_permanent_bad_request() -> None:
    assert issubclass(FutureVersion, InvalidRequest)  # 400: the sender must not retry it
