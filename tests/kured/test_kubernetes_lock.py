"""KubernetesLock through the official ``kubernetes`` client against the API server double
(tests/kured/k8s_double.py: no API server runs here; the double enforces resourceVersion 409s).

Compatibility fixtures are hand-written from kured's lock annotation format (kubereboot/kured, pkg/daemonsetlock), not
produced by our serialiser: a record we write must be byte-identical to what kured writes, and
a record kured wrote must be honoured by us, in both the single and the multi format, so a
fleet can move between kured and us in the middle of a rollout.

The contention test is the issue's proof: 50 agents, each its own client and lock, race for a
concurrency-1 lock; neither the double's stored history nor the agents' own hold intervals may
ever show two holders.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from kit.clock import ManualClock, SystemClock
from kured.apiserver import ApiServer
from kured.core import lockrecord
from kured.core.errors import ConfigurationError, LockConflict, LockError
from kured.locks.base import Lock
from kured.locks.kubernetes import KubernetesLock
from tests.kured.conftest import LOCK_ANNOTATION, LOCK_DAEMONSET, LOCK_NAMESPACE
from tests.kured.k8s_double import KubeDouble

NS, DS, KEY = LOCK_NAMESPACE, LOCK_DAEMONSET, LOCK_ANNOTATION
# 2026-03-01T08:12:44.123Z, the instant of kured-behaviour.md's example record.
T0_MS = 1_772_352_764_123

# --- kured's own bytes, hand-written from kured-behaviour.md §2.5 -----------------------------
KURED_SINGLE = (
    '{"nodeID":"worker-2","metadata":{"unschedulable":false},'
    '"created":"2026-03-01T08:12:44.123456789Z","TTL":0}'
)
KURED_MULTI = (
    '{"maxOwners":3,"locks":['
    '{"nodeID":"w1","metadata":{"unschedulable":false},"created":"2026-03-01T08:12:44.123456789Z","TTL":0},'
    '{"nodeID":"w2","metadata":{"unschedulable":true},"created":"2026-03-01T08:13:00Z","TTL":3600000000000}'
    "]}"
)
KURED_MULTI_EMPTY = '{"maxOwners":3,"locks":[]}'
KURED_PAUSE = '{"nodeID":"manual"}'  # kured's documented way to pause every reboot
# The shape kured writes for one entry: keys in this order, no spaces, RFC 3339 UTC created
# with trailing zeros of the fraction trimmed, TTL as integer nanoseconds.
ENTRY = (
    r'\{"nodeID":"[^"]*","metadata":\{"unschedulable":(true|false)\},'
    r'"created":"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d*[1-9])?Z","TTL":\d+\}'
)

MakeLock = Callable[..., KubernetesLock]


@pytest.fixture
async def make_lock(kubeconfig: Path) -> AsyncIterator[MakeLock]:
    """``make_lock(max_holders=1, clock=SystemClock())``: each its own ApiServer (closed at the
    end), built from the kubeconfig file as the agent builds it."""
    locks: list[KubernetesLock] = []

    def make(max_holders: int = 1, clock: object = None, **kwargs: object) -> KubernetesLock:
        api = ApiServer.connect(kubeconfig, request_timeout_seconds=5)
        lock = KubernetesLock(
            api,
            NS,
            DS,
            KEY,
            max_holders,
            clock or SystemClock(),  # type: ignore[arg-type]
            owns_api=True,
            **kwargs,  # type: ignore[arg-type]
        )
        locks.append(lock)
        return lock

    yield make
    for lock in locks:
        await lock.close()


def test_kubernetes_lock_implements_the_lock_protocol(kubeconfig: Path) -> None:
    lock: Lock = KubernetesLock(
        ApiServer.connect(kubeconfig), NS, DS, KEY, 1, SystemClock(), owns_api=True
    )
    assert lock is not None


async def test_acquire_holds_and_release_removes_the_annotation(
    make_lock: MakeLock, kube: KubeDouble
) -> None:
    kube.set_annotation(NS, DS, "other.example/keep", "me")
    lock = make_lock()
    assert await lock.acquire("a", unschedulable=False, ttl_seconds=0)
    assert await lock.holding("a")
    assert [h.node_id for h in await lock.holders()] == ["a"]
    assert not await lock.acquire("b", unschedulable=False, ttl_seconds=0)
    await lock.release("a")
    assert kube.annotation(NS, DS, KEY) is None  # a single release deletes it, as kured does
    assert await lock.acquire("b", unschedulable=True, ttl_seconds=0)
    (holder,) = await lock.holders()
    assert (holder.node_id, holder.unschedulable) == ("b", True)
    # The PUT carried the whole object as read: other annotations and fields the client's
    # models do not know survive every lock write.
    stored = kube.daemonset(NS, DS)
    assert stored["metadata"]["annotations"]["other.example/keep"] == "me"
    assert stored["spec"]["futureField"] == {"kept": True}


async def test_every_write_is_a_get_then_a_put_never_a_patch(
    make_lock: MakeLock, kube: KubeDouble
) -> None:
    lock = make_lock()
    await lock.acquire("a", unschedulable=False, ttl_seconds=0)
    await lock.release("a")
    path = rf"/daemonsets/{DS}$"
    assert kube.count("PUT", path) == 2
    assert kube.count("PATCH", path) == 0
    assert kube.count("GET", path) >= 2


async def test_our_single_record_is_kureds_bytes(make_lock: MakeLock, kube: KubeDouble) -> None:
    lock = make_lock(clock=ManualClock(now_ms=T0_MS))
    assert await lock.acquire("worker-2", unschedulable=True, ttl_seconds=3600)
    assert kube.annotation(NS, DS, KEY) == (
        '{"nodeID":"worker-2","metadata":{"unschedulable":true},'
        '"created":"2026-03-01T08:12:44.123Z","TTL":3600000000000}'
    )
    await lock.release("worker-2")
    lock = make_lock()  # the system clock: any instant has kured's shape
    await lock.acquire("n1", unschedulable=False, ttl_seconds=0)
    value = kube.annotation(NS, DS, KEY)
    assert value is not None
    assert re.fullmatch(ENTRY, value), value
    assert json.loads(value)["TTL"] == 0


async def test_our_multi_record_is_kureds_bytes(make_lock: MakeLock, kube: KubeDouble) -> None:
    lock = make_lock(max_holders=3, clock=ManualClock(now_ms=T0_MS))
    assert await lock.acquire("w1", unschedulable=False, ttl_seconds=0)
    assert await lock.acquire("w2", unschedulable=True, ttl_seconds=60)
    assert kube.annotation(NS, DS, KEY) == (
        '{"maxOwners":3,"locks":['
        '{"nodeID":"w1","metadata":{"unschedulable":false},"created":"2026-03-01T08:12:44.123Z","TTL":0},'
        '{"nodeID":"w2","metadata":{"unschedulable":true},"created":"2026-03-01T08:12:44.123Z","TTL":60000000000}'
        "]}"
    )
    await lock.release("w1")
    await lock.release("w2")
    assert kube.annotation(NS, DS, KEY) == KURED_MULTI_EMPTY  # kured keeps the empty list


async def test_a_single_record_written_by_kured_is_honoured(
    make_lock: MakeLock, kube: KubeDouble
) -> None:
    kube.set_annotation(NS, DS, KEY, KURED_SINGLE)
    lock = make_lock()
    (holder,) = await lock.holders()
    assert holder.node_id == "worker-2"
    assert holder.created_raw == "2026-03-01T08:12:44.123456789Z"  # nanoseconds kept
    assert holder.ttl_seconds == 0
    assert not holder.unschedulable
    assert not await lock.acquire("n1", unschedulable=False, ttl_seconds=0)  # TTL 0: held
    assert await lock.holding("worker-2")
    assert await lock.acquire("worker-2", unschedulable=True, ttl_seconds=0)
    assert kube.annotation(NS, DS, KEY) == KURED_SINGLE  # re-acquire does not rewrite it
    await lock.release("worker-2")  # mid-rollout: our agent on worker-2 releases kured's lock
    assert kube.annotation(NS, DS, KEY) is None


async def test_an_expired_kured_record_is_taken_over(make_lock: MakeLock, kube: KubeDouble) -> None:
    expired = (
        '{"nodeID":"gone","metadata":{"unschedulable":false},'
        '"created":"2026-03-01T08:12:44.123456789Z","TTL":1800000000000}'
    )
    kube.set_annotation(NS, DS, KEY, expired)
    lock = make_lock(clock=ManualClock(now_ms=T0_MS + 1_800_001))  # TTL 30 min passed
    assert await lock.acquire("n1", unschedulable=False, ttl_seconds=0)
    assert [h.node_id for h in await lock.holders()] == ["n1"]


async def test_a_multi_record_written_by_kured_is_honoured(
    make_lock: MakeLock, kube: KubeDouble
) -> None:
    kube.set_annotation(NS, DS, KEY, KURED_MULTI)
    lock = make_lock(max_holders=3, clock=ManualClock(now_ms=T0_MS + 60_000))
    assert [h.node_id for h in await lock.holders()] == ["w1", "w2"]
    assert [h.unschedulable for h in await lock.holders()] == [False, True]
    assert await lock.acquire("w3", unschedulable=False, ttl_seconds=0)  # a third slot is free
    assert not await lock.acquire("w4", unschedulable=False, ttl_seconds=0)  # full
    await lock.release("w1")
    stored = kube.annotation(NS, DS, KEY)
    assert stored is not None
    # kured's entries are carried over untouched, nanoseconds included.
    assert stored.startswith(
        '{"maxOwners":3,"locks":[{"nodeID":"w2","metadata":{"unschedulable":true},'
        '"created":"2026-03-01T08:13:00Z","TTL":3600000000000},{"nodeID":"w3",'
    )
    assert all(
        re.fullmatch(ENTRY, json.dumps(e, separators=(",", ":")))
        for e in json.loads(stored)["locks"]
    )


async def test_kureds_pause_record_blocks_and_is_never_overwritten(
    make_lock: MakeLock, kube: KubeDouble
) -> None:
    kube.set_annotation(NS, DS, KEY, KURED_PAUSE)
    assert not await make_lock().acquire("n1", unschedulable=False, ttl_seconds=0)
    assert kube.annotation(NS, DS, KEY) == KURED_PAUSE
    # kured with --concurrency 2 reads the pause as a free lock and overwrites it; we count it
    # as one holder that never expires (kured.core.lockrecord), so it keeps one slot.
    wide = make_lock(max_holders=2)
    assert await wide.acquire("n1", unschedulable=False, ttl_seconds=0)
    assert not await wide.acquire("n2", unschedulable=False, ttl_seconds=0)
    assert [h.node_id for h in await wide.holders()] == ["manual", "n1"]


async def test_lowering_concurrency_keeps_existing_holders_and_admits_nobody_new(
    make_lock: MakeLock, kube: KubeDouble
) -> None:
    """B42: --concurrency 2 → 1 while two nodes hold the lock."""
    wide = make_lock(max_holders=2)
    assert await wide.acquire("a", unschedulable=False, ttl_seconds=0)
    assert await wide.acquire("b", unschedulable=False, ttl_seconds=0)
    narrow = make_lock(max_holders=1)
    assert not await narrow.acquire("c", unschedulable=False, ttl_seconds=0)
    assert [h.node_id for h in await narrow.holders()] == ["a", "b"]
    await narrow.release("a")
    assert not await narrow.acquire("c", unschedulable=False, ttl_seconds=0)  # b still holds
    remaining = kube.annotation(NS, DS, KEY)
    assert remaining is not None
    assert re.fullmatch(ENTRY, remaining)  # one holder left: kured's single format again
    await narrow.release("b")
    assert await narrow.acquire("c", unschedulable=False, ttl_seconds=0)


def test_a_kubeconfig_that_cannot_be_loaded_is_a_configuration_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigurationError, match="cannot load Kubernetes credentials"):
        ApiServer.connect(tmp_path / "missing")
    (tmp_path / "garbage").write_text("{not: [valid")
    with pytest.raises(ConfigurationError):
        ApiServer.connect(tmp_path / "garbage")


async def test_a_409_is_reread_and_retried(make_lock: MakeLock, kube: KubeDouble) -> None:
    lock = make_lock()
    kube.conflict_next_puts(3)  # another writer (a Helm sync) wins the next three races
    assert await lock.acquire("n1", unschedulable=False, ttl_seconds=0)
    assert lock.conflicts_total == 3
    assert kube.count("PUT", rf"/daemonsets/{DS}$", status=409) == 3
    assert kube.count("PUT", rf"/daemonsets/{DS}$", status=200) == 1
    assert [h.node_id for h in await lock.holders()] == ["n1"]
    assert kube.daemonset(NS, DS)["metadata"]["labels"]["touched"] == "3"  # theirs kept too


async def test_endless_conflicts_raise_lock_conflict(make_lock: MakeLock, kube: KubeDouble) -> None:
    lock = make_lock(max_attempts=3)
    kube.conflict_next_puts(10)
    with pytest.raises(LockConflict):
        await lock.acquire("n1", unschedulable=False, ttl_seconds=0)
    assert kube.annotation(NS, DS, KEY) is None


async def test_unparsable_annotation_fails_closed_and_is_left_alone(
    make_lock: MakeLock, kube: KubeDouble
) -> None:
    kube.set_annotation(NS, DS, KEY, "not json")
    lock = make_lock()
    with pytest.raises(LockError):
        await lock.acquire("n1", unschedulable=False, ttl_seconds=0)
    with pytest.raises(LockError):
        await lock.holders()
    assert kube.annotation(NS, DS, KEY) == "not json"


async def test_a_missing_daemonset_or_api_is_a_lock_error(
    kube: KubeDouble, kubeconfig: Path, tmp_path: Path
) -> None:
    lock = KubernetesLock(
        ApiServer.connect(kubeconfig), NS, "elsewhere", KEY, 1, SystemClock(), owns_api=True
    )
    with pytest.raises(LockError, match=r"daemonset kube-system/elsewhere not found"):
        await lock.acquire("n1", unschedulable=False, ttl_seconds=0)
    await lock.close()
    dead = KubeDouble()
    dead.url = "http://127.0.0.1:9"  # nothing listens there
    down = KubernetesLock(
        ApiServer.connect(dead.kubeconfig(tmp_path / "dead"), request_timeout_seconds=2),
        NS,
        DS,
        KEY,
        1,
        SystemClock(),
        owns_api=True,
    )
    with pytest.raises(LockError, match="cannot read the lock"):
        await down.holders()
    await down.close()


async def _contend(
    make_lock: MakeLock, agents: int, max_holders: int, rounds: int
) -> list[tuple[float, float, str]]:
    """``agents`` agents (each its own client) each take the lock ``rounds`` times, hold it
    briefly and release it. Returns every hold as (start, end, node) on one monotonic clock,
    stamped after acquire returned and before release was called, so each recorded interval
    lies inside the real one."""
    intervals: list[tuple[float, float, str]] = []

    async def agent(index: int) -> None:
        node = f"node-{index:02d}"
        lock = make_lock(max_holders=max_holders)
        rng = random.Random(index)
        for _ in range(rounds):
            # Retrying is the agent's tick, not a wait for an event.
            while not await lock.acquire(node, unschedulable=False, ttl_seconds=0):  # noqa: ASYNC110
                await asyncio.sleep(rng.uniform(0.005, 0.03))
            start = time.monotonic()
            await asyncio.sleep(rng.uniform(0, 0.005))
            end = time.monotonic()
            await lock.release(node)
            intervals.append((start, end, node))

    async with asyncio.timeout(50):
        async with asyncio.TaskGroup() as tg:
            for index in range(agents):
                tg.create_task(agent(index))
    return intervals


def _max_overlap(intervals: list[tuple[float, float, str]]) -> int:
    events = sorted([(s, 1) for s, _, _ in intervals] + [(e, -1) for _, e, _ in intervals])
    current = peak = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


def _holders_in_history(kube: KubeDouble) -> list[int]:
    counts = []
    for value in kube.annotation_history(NS, DS, KEY):
        counts.append(0 if value is None else len(lockrecord.parse(value).entries))
    return counts


async def test_fifty_agents_never_produce_two_holders(
    make_lock: MakeLock, kube: KubeDouble
) -> None:
    intervals = await _contend(make_lock, agents=50, max_holders=1, rounds=2)
    assert len(intervals) == 100
    assert _max_overlap(intervals) == 1
    history = _holders_in_history(kube)
    assert max(history) == 1  # no stored version of the DaemonSet ever named two holders
    assert history.count(1) == 100  # every acquisition stored exactly once
    assert kube.count("PUT", rf"/daemonsets/{DS}$", status=409) > 0  # they did collide


async def test_concurrency_two_never_admits_a_third(make_lock: MakeLock, kube: KubeDouble) -> None:
    intervals = await _contend(make_lock, agents=12, max_holders=2, rounds=2)
    assert len(intervals) == 24
    assert _max_overlap(intervals) <= 2
    assert max(_holders_in_history(kube)) == 2
