"""``kura.mesh.peer_pace`` on virtual time: the public-load tracker, the slowdown factor
(upstream Kura's max(inflight + 1, EWMA / target)) and the shared limiter's schedule."""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncIterator

import pytest

from kit.clock import ManualClock
from kura.mesh.peer_pace import (
    EWMA_ALPHA,
    FLOOR_BYTES_PER_SECOND,
    IDLE_DECAY_SECONDS,
    IDLE_GRACE_SECONDS,
    MiB,
    PeerPace,
    PublicLoad,
)


def test_a_quiet_node_has_factor_one() -> None:
    load = PublicLoad(ManualClock(), target_seconds=0.1)
    assert load.inflight == 0
    assert load.latency_ewma_seconds() == 0.0
    assert load.factor() == 1.0


def test_fast_requests_leave_the_factor_at_one() -> None:
    clock = ManualClock()
    load = PublicLoad(clock, target_seconds=0.1)
    for _ in range(100):
        load.started()
        clock.advance(0.005)
        load.finished(0.005)
    assert load.latency_ewma_seconds() == pytest.approx(0.005, rel=0.01)
    assert load.factor() == 1.0


def test_each_request_in_flight_adds_one() -> None:
    load = PublicLoad(ManualClock(), target_seconds=0.1)
    for expected in (2.0, 3.0, 4.0):
        load.started()
        assert load.factor() == expected
    load.finished(0.0)
    load.ended()
    assert load.inflight == 1
    assert load.factor() == 2.0


def test_latency_above_the_target_divides_in_proportion() -> None:
    load = PublicLoad(ManualClock(), target_seconds=0.1)
    for _ in range(200):  # converge on 0.5 s per request
        load.started()
        load.finished(0.5)
    assert load.latency_ewma_seconds() == pytest.approx(0.5, rel=1e-6)
    assert load.factor() == pytest.approx(5.0, rel=1e-6)  # 0.5 s / 0.1 s beats inflight + 1


def test_sparse_requests_keep_their_average() -> None:
    """One request a second (gaps under the grace): the EWMA is the requests' latency."""
    clock = ManualClock()
    load = PublicLoad(clock, target_seconds=0.1)
    for _ in range(100):
        clock.advance(0.9)
        load.started()
        clock.advance(0.05)
        load.finished(0.3)
    assert load.latency_ewma_seconds() == pytest.approx(0.3, rel=0.01)
    assert load.factor() == pytest.approx(3.0, rel=0.01)


def test_one_sample_moves_the_ewma_by_alpha() -> None:
    load = PublicLoad(ManualClock(), target_seconds=0.1)
    load.started()
    load.finished(1.0)
    assert load.latency_ewma_seconds() == pytest.approx(EWMA_ALPHA)


def test_the_ewma_decays_while_idle() -> None:
    """A burst of slow requests, then silence: the node must not stay paced."""
    clock = ManualClock()
    load = PublicLoad(clock, target_seconds=0.1)
    for _ in range(200):
        load.started()
        load.finished(1.0)
    assert load.factor() == pytest.approx(10.0, rel=1e-6)
    clock.advance(IDLE_GRACE_SECONDS)
    assert load.latency_ewma_seconds() == pytest.approx(1.0, rel=1e-6)
    clock.advance(IDLE_DECAY_SECONDS)
    assert load.latency_ewma_seconds() == pytest.approx(math.exp(-1), rel=1e-6)
    clock.advance(10 * IDLE_DECAY_SECONDS)
    assert load.factor() == 1.0


def test_target_zero_is_off() -> None:
    load = PublicLoad(ManualClock(), target_seconds=0.0)
    for _ in range(5):
        load.started()
    load.finished(10.0)
    assert load.factor() == 1.0
    pace = PeerPace(512 * MiB, load, ManualClock())
    assert not pace.enabled
    assert not pace.slowing()
    assert pace.rate() == math.inf


def test_the_rate_is_the_base_divided_by_the_factor_with_a_floor() -> None:
    load = PublicLoad(ManualClock(), target_seconds=0.1)
    pace = PeerPace(64 * MiB, load, ManualClock())
    assert pace.rate() == 64 * MiB
    assert not pace.slowing()
    load.started()
    assert pace.rate() == 32 * MiB
    assert pace.slowing()
    for _ in range(1000):  # constant heavy load: 1001 requests in flight
        load.started()
    assert pace.rate() == FLOOR_BYTES_PER_SECOND
    # A base below the floor is never raised to it.
    assert PeerPace(256 * 1024, load, ManualClock()).rate() == 256 * 1024


class VirtualSleep:
    """A test double for ``asyncio.sleep`` that advances a ``ManualClock`` instead."""

    def __init__(self, clock: ManualClock) -> None:
        self.clock = clock
        self.slept: list[float] = []

    async def __call__(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.clock.advance(seconds)


def test_transfers_share_one_schedule_at_the_current_rate() -> None:
    clock = ManualClock()
    load = PublicLoad(clock, target_seconds=0.1)
    sleep = VirtualSleep(clock)
    pace = PeerPace(10 * MiB, load, clock, sleep)

    async def move(total: int) -> None:
        for _ in range(total // MiB):
            await pace.acquire(MiB)

    started = clock.monotonic()
    asyncio.run(move(20 * MiB))
    # 20 MiB at 10 MiB/s: 2 s (the first MiB goes at once, it is paid for by the next).
    assert clock.monotonic() - started == pytest.approx(1.9, abs=1e-6)
    load.started()  # one public request in flight from now on: 5 MiB/s
    started = clock.monotonic()
    asyncio.run(move(20 * MiB))
    assert clock.monotonic() - started == pytest.approx(4.0, abs=0.2)
    assert pace.paced_bytes == 40 * MiB


def test_idle_time_earns_no_burst() -> None:
    clock = ManualClock()
    sleep = VirtualSleep(clock)
    pace = PeerPace(1 * MiB, PublicLoad(clock, 0.1), clock, sleep)
    asyncio.run(pace.acquire(MiB))
    clock.advance(60.0)  # a minute of silence
    started = clock.monotonic()

    async def burst() -> None:
        for _ in range(5):
            await pace.acquire(MiB)

    asyncio.run(burst())
    assert clock.monotonic() - started == pytest.approx(4.0, abs=1e-6)


def test_paced_passes_every_chunk_through() -> None:
    clock = ManualClock()
    pace = PeerPace(1 * MiB, PublicLoad(clock, 0.1), clock, VirtualSleep(clock))

    async def source() -> AsyncIterator[bytes]:
        for i in range(4):
            yield bytes([i]) * (MiB // 2)

    async def drain() -> list[bytes]:
        return [chunk async for chunk in pace.paced(source())]

    started = clock.monotonic()
    chunks = asyncio.run(drain())
    assert b"".join(chunks) == b"".join(bytes([i]) * (MiB // 2) for i in range(4))
    assert clock.monotonic() - started == pytest.approx(1.5, abs=1e-6)
