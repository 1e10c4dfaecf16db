"""EtcdLock against a real etcd (Debian's etcd-server 3.4, started per test by the ``etcd``
fixture): kured's lock semantics, its stored bytes, and mutual exclusion under contention.

The contention tests are the proof the issue asks for: 200 acquirers (each its own ``EtcdLock``
and HTTP session) race for the lock, each holding it for a short random time, and the recorded
history - stamped on one shared monotonic clock *after* acquire returned and *before* release
was called, so each recorded interval lies inside the real one - must never show more than
``max_holders`` overlapping holders.
"""

from __future__ import annotations

import asyncio
import random
import sys
import time
from collections.abc import AsyncIterator, Callable

import aiohttp
import pytest
from aiohttp import web

from kit.clock import ManualClock, SystemClock
from kured.core import lockrecord
from kured.core.errors import LockConflict, LockError
from kured.locks.base import Lock
from kured.locks.etcd import EtcdKV, EtcdLock

# This test's --lock-key in the shared etcd (conftest's lock_key), set for each test below.
KEY = ""
FREE = b'{"maxOwners":1,"locks":[]}'
MakeLock = Callable[..., EtcdLock]


@pytest.fixture(autouse=True)
def _own_key(lock_key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys.modules[__name__], "KEY", lock_key)


@pytest.fixture
async def kv(etcd: str) -> AsyncIterator[EtcdKV]:
    client = EtcdKV([etcd])
    yield client
    await client.close()


@pytest.fixture
async def make_lock(etcd: str) -> AsyncIterator[MakeLock]:
    """``make_lock(max_holders=1, clock=SystemClock(), key=KEY)``; every lock closed at the end."""
    locks: list[EtcdLock] = []

    def make(max_holders: int = 1, clock: object = None, key: str = "") -> EtcdLock:
        lock = EtcdLock([etcd], key or KEY, max_holders, clock or SystemClock())  # type: ignore[arg-type]
        locks.append(lock)
        return lock

    yield make
    for lock in locks:
        await lock.close()


async def stored(kv: EtcdKV, key: str = "") -> bytes | None:
    current = await kv.get((key or KEY).encode())
    return current.value if current is not None else None


def test_etcd_lock_implements_the_lock_protocol() -> None:
    lock: Lock = EtcdLock(["http://127.0.0.1:1"], KEY, 1, SystemClock())
    assert lock is not None


async def test_acquire_holds_and_release_frees(make_lock: MakeLock, kv: EtcdKV) -> None:
    lock = make_lock()
    assert await lock.acquire("a", unschedulable=False, ttl_seconds=0)
    assert await lock.holding("a")
    assert [h.node_id for h in await lock.holders()] == ["a"]
    assert not await lock.acquire("b", unschedulable=False, ttl_seconds=0)
    assert not await lock.holding("b")
    await lock.release("a")
    assert await stored(kv) is None  # a single-format release deletes the key, as kured does
    assert await lock.holders() == []
    assert await lock.acquire("b", unschedulable=True, ttl_seconds=0)
    (holder,) = await lock.holders()
    assert holder.node_id == "b"
    assert holder.unschedulable


async def test_release_by_a_non_holder_is_a_no_op(make_lock: MakeLock, kv: EtcdKV) -> None:
    lock = make_lock()
    await lock.release("nobody")  # free lock: nothing to do, no error
    assert await lock.acquire("a", False, 0)
    before = await kv.get(KEY.encode())
    await lock.release("b")
    after = await kv.get(KEY.encode())
    assert before is not None
    assert after is not None
    assert after.mod_revision == before.mod_revision  # nothing written


async def test_stored_bytes_are_kureds_single_format(make_lock: MakeLock, kv: EtcdKV) -> None:
    clock = ManualClock(now_ms=1_772_352_764_123)  # 2026-03-01T08:12:44.123Z
    lock = make_lock(clock=clock)
    assert await lock.acquire("worker-2", False, 3600)
    assert await stored(kv) == (
        b'{"nodeID":"worker-2","metadata":{"unschedulable":false},'
        b'"created":"2026-03-01T08:12:44.123Z","TTL":3600000000000}'
    )


async def test_stored_bytes_are_kureds_multi_format(make_lock: MakeLock, kv: EtcdKV) -> None:
    clock = ManualClock(now_ms=1_772_352_764_000)
    lock = make_lock(max_holders=3, clock=clock)
    assert await lock.acquire("w1", False, 0)
    clock.advance(1.5)
    assert await lock.acquire("w2", True, 0)
    raw = await stored(kv)
    assert raw == (
        b'{"maxOwners":3,"locks":['
        b'{"nodeID":"w1","metadata":{"unschedulable":false},"created":"2026-03-01T08:12:44Z","TTL":0},'
        b'{"nodeID":"w2","metadata":{"unschedulable":true},"created":"2026-03-01T08:12:45.5Z","TTL":0}]}'
    )
    assert raw is not None
    assert lockrecord.serialise(lockrecord.parse(raw)) == raw
    await lock.release("w1")
    await lock.release("w2")
    assert await stored(kv) == b'{"maxOwners":3,"locks":[]}'  # kured's multi release keeps it


async def test_ttl_zero_never_expires(make_lock: MakeLock) -> None:
    clock = ManualClock()
    lock = make_lock(clock=clock)
    assert await lock.acquire("hung", False, ttl_seconds=0)
    clock.advance(100 * 365 * 24 * 3600)
    assert not await lock.acquire("other", False, ttl_seconds=60)
    assert await lock.holding("hung")


async def test_expired_record_is_taken_over_by_another_node(make_lock: MakeLock) -> None:
    clock = ManualClock()
    lock = make_lock(clock=clock)
    assert await lock.acquire("a", False, ttl_seconds=60)
    clock.advance(59.999)
    assert not await lock.acquire("b", False, ttl_seconds=0)
    clock.advance(0.001)
    assert not await lock.holding("a")
    # b's own TTL is 0; a's entry expired by *its* TTL.
    assert await lock.acquire("b", False, ttl_seconds=0)
    assert [h.node_id for h in await lock.holders()] == ["b"]


async def test_reacquire_does_not_refresh_created(make_lock: MakeLock, kv: EtcdKV) -> None:
    clock = ManualClock()
    lock = make_lock(clock=clock)
    assert await lock.acquire("a", False, ttl_seconds=60)
    first = await kv.get(KEY.encode())
    (holder,) = await lock.holders()
    clock.advance(30)
    assert await lock.acquire("a", True, ttl_seconds=600)
    again = await kv.get(KEY.encode())
    assert first is not None
    assert again is not None
    assert again.mod_revision == first.mod_revision
    (same,) = await lock.holders()
    assert same == holder
    clock.advance(30)  # expiry counts from the first acquisition
    assert not await lock.holding("a")


async def test_multi_holder_lock_admits_max_holders_and_prunes_expired(make_lock: MakeLock) -> None:
    clock = ManualClock()
    lock = make_lock(max_holders=2, clock=clock)
    assert await lock.acquire("a", False, 10)
    assert await lock.acquire("b", False, 0)
    assert await lock.acquire("a", False, 10)  # re-lock: no second slot
    assert not await lock.acquire("c", False, 0)
    clock.advance(10)
    assert await lock.acquire("c", False, 0)
    assert [h.node_id for h in await lock.holders()] == ["b", "c"]


async def test_manual_pause_record_blocks_every_concurrency(
    make_lock: MakeLock, kv: EtcdKV
) -> None:
    # kured's documented pause; kured with --concurrency >= 2 silently overwrites it.
    assert (await kv.put_if(KEY.encode(), b'{"nodeID":"manual"}', 0)).succeeded
    assert not await make_lock(max_holders=1).acquire("a", False, 0)
    two = make_lock(max_holders=2)
    assert await two.acquire("a", False, 0)
    assert not await two.acquire("b", False, 0)
    assert [h.node_id for h in await two.holders()] == ["manual", "a"]


async def test_empty_multi_record_is_free_for_concurrency_one(
    make_lock: MakeLock, kv: EtcdKV
) -> None:
    # kured with --concurrency 1 reads it as held by "" forever.
    assert (await kv.put_if(KEY.encode(), b'{"maxOwners":3,"locks":[]}', 0)).succeeded
    lock = make_lock(max_holders=1)
    assert await lock.acquire("a", False, 0)
    raw = await stored(kv)
    assert raw is not None
    assert raw.startswith(b'{"nodeID":"a",')


async def test_unparsable_record_fails_closed_and_is_left_alone(
    make_lock: MakeLock, kv: EtcdKV
) -> None:
    assert (await kv.put_if(KEY.encode(), b"{not json", 0)).succeeded
    lock = make_lock()
    with pytest.raises(LockError, match="not JSON"):
        await lock.acquire("a", False, 0)
    with pytest.raises(LockError):
        await lock.release("a")
    assert await stored(kv) == b"{not json"


async def test_unreachable_etcd_raises_lock_error_quickly() -> None:
    lock = EtcdLock(["http://127.0.0.1:1"], KEY, 1, SystemClock(), request_timeout_seconds=1)
    try:
        with pytest.raises(LockError, match="etcd unavailable"):
            await lock.acquire("a", False, 0)
    finally:
        await lock.close()


async def test_fails_over_to_the_next_endpoint(etcd: str) -> None:
    lock = EtcdLock(["http://127.0.0.1:1", etcd], KEY, 1, SystemClock())
    try:
        assert await lock.acquire("a", False, 0)
        assert await lock.holding("a")
    finally:
        await lock.close()


async def test_exhausted_compare_retries_raise_lock_conflict(etcd: str, kv: EtcdKV) -> None:
    # A writer that rewrites the (free) record between every read and write: the lock must
    # give up after max_attempts instead of spinning.
    lock = EtcdLock([etcd], KEY, 1, SystemClock(), max_attempts=3)
    original = lock._kv.put_if

    async def put_after_interference(key: bytes, value: bytes, mod_revision: int):  # type: ignore[no-untyped-def]
        current = await kv.get(key)
        await kv.put_if(key, FREE, current.mod_revision if current else 0)
        return await original(key, value, mod_revision)

    lock._kv.put_if = put_after_interference  # type: ignore[method-assign]
    try:
        await kv.put_if(KEY.encode(), FREE, 0)
        with pytest.raises(LockConflict):
            await lock.acquire("a", False, 0)
    finally:
        await lock.close()


async def _serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


async def test_falls_back_to_v3beta_and_past_a_failing_endpoint(etcd: str) -> None:
    # Two fronts for the real etcd: one answers 503 like a member without a leader; the other
    # serves the gateway only under /v3beta (as etcd 3.3 did) and 404s /v3.
    seen: list[str] = []

    async def no_leader(request: web.Request) -> web.Response:
        seen.append("down " + request.path)
        error = {"error": "etcdserver: no leader", "message": "etcdserver: no leader", "code": 14}
        return web.json_response(error, status=503)

    async def v3beta_only(request: web.Request) -> web.Response:
        seen.append("beta " + request.path)
        if not request.path.startswith("/v3beta/"):
            return web.Response(status=404, text="404 page not found")
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                etcd + request.path.replace("/v3beta/", "/v3/", 1), data=await request.read()
            ) as r,
        ):
            return web.Response(
                status=r.status, body=await r.read(), content_type="application/json"
            )

    down_app, beta_app = web.Application(), web.Application()
    down_app.router.add_post("/{tail:.*}", no_leader)
    beta_app.router.add_post("/{tail:.*}", v3beta_only)
    down_runner, down_url = await _serve(down_app)
    beta_runner, beta_url = await _serve(beta_app)
    lock = EtcdLock([down_url, beta_url], KEY, 1, SystemClock())
    try:
        assert await lock.acquire("a", False, 0)
        assert await lock.holding("a")
        await lock.release("a")
        assert await lock.holders() == []
    finally:
        await lock.close()
        await down_runner.cleanup()
        await beta_runner.cleanup()
    # The first call probed /v3 then /v3beta; afterwards the answering endpoint and its prefix
    # were remembered, so the broken one and the /v3 probe were not tried again.
    assert seen[:3] == ["down /v3/kv/range", "beta /v3/kv/range", "beta /v3beta/kv/range"]
    assert all(entry.startswith("beta /v3beta/") for entry in seen[3:])
    assert len(seen) > 3


# --- contention -----------------------------------------------------------------------------


async def contend(
    etcd: str, max_holders: int, acquirers: int
) -> tuple[list[tuple[float, float, int]], int]:
    """Run ``acquirers`` tasks that each acquire once, hold 1-10 ms, and release. Returns the
    history ``(acquired_at, released_at, id)`` on one monotonic clock, and how many
    ``LockConflict``s (``max_attempts`` lost compares in a row) were seen; an acquire that
    raised it is retried like a busy lock, a release is retried at once."""
    history: list[tuple[float, float, int]] = []
    conflicts = 0
    clock = SystemClock()

    async def acquirer(index: int) -> None:
        nonlocal conflicts
        node = f"node-{index:03d}"
        lock = EtcdLock([etcd], KEY, max_holders, clock)
        try:
            while True:
                try:
                    acquired = await lock.acquire(node, False, 0)
                except LockConflict:
                    conflicts += 1
                    acquired = False
                if acquired:
                    start = time.monotonic()
                    await asyncio.sleep(random.uniform(0.001, 0.01))
                    end = time.monotonic()
                    while True:  # as the agent loop would on its next tick; the recorded
                        try:  # interval only gets further inside the real one
                            await lock.release(node)
                            break
                        except LockConflict:
                            conflicts += 1
                    history.append((start, end, index))
                    return
                await asyncio.sleep(random.uniform(0.02, 0.1))
        finally:
            await lock.close()

    async with asyncio.TaskGroup() as group:
        for index in range(acquirers):
            group.create_task(acquirer(index))
    return history, conflicts


def max_overlap(history: list[tuple[float, float, int]]) -> int:
    """The largest number of recorded intervals open at one instant (an interval ending at t
    does not overlap one starting at t)."""
    events = sorted([(start, 1) for start, _, _ in history] + [(end, -1) for _, end, _ in history])
    open_now = peak = 0
    for _, delta in events:
        open_now += delta
        peak = max(peak, open_now)
    return peak


def test_max_overlap_counts_concurrent_intervals() -> None:
    assert max_overlap([(0, 1, 0), (1, 2, 1)]) == 1
    assert max_overlap([(0, 2, 0), (1, 3, 1), (1.5, 1.6, 2)]) == 3


async def test_200_concurrent_acquirers_never_produce_two_holders(etcd: str, kv: EtcdKV) -> None:
    history, _ = await contend(etcd, max_holders=1, acquirers=200)
    assert sorted(index for _, _, index in history) == list(range(200))  # everyone got a turn
    assert max_overlap(history) == 1
    assert await stored(kv) is None  # all released; single format deletes the key


async def test_200_concurrent_acquirers_with_two_slots_never_produce_three(
    etcd: str, kv: EtcdKV
) -> None:
    history, _ = await contend(etcd, max_holders=2, acquirers=200)
    assert sorted(index for _, _, index in history) == list(range(200))
    # 2, not just <= 2: the second slot was really used, so the test did race for it.
    assert max_overlap(history) == 2
    raw = await stored(kv)
    assert raw == b'{"maxOwners":2,"locks":[]}'
