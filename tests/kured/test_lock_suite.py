"""One lock test suite for every backend: etcd (a real etcd from Debian), the DaemonSet
annotation and the Lease (both against the Kubernetes API double, ``tests/kured/k8s_double.py``
and ``k8s_leases.py``: no API server runs here).

Each test runs once per backend (``store`` is parametrised) and checks kured's lock semantics
(``kured.locks.base``): one holder at ``--concurrency`` 1, release by a non-holder writes
nothing, TTL 0 never expires, an expired entry is taken over, a re-acquire does not refresh
``created``, expired entries are pruned before counting, kured's ``{"nodeID":"manual"}`` pause
holds a slot at every concurrency, an empty multi record is free, an unparsable record fails
closed and is left alone - and 50 contending agents, each its own client, never overlap.
Backend-specific bytes and faults stay in test_etcd_lock.py, test_kubernetes_lock.py and
test_lease_lock.py.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from kit.clock import Clock, ManualClock, SystemClock
from kured.apiserver import ApiServer
from kured.core.errors import LockConflict, LockError
from kured.locks.etcd import EtcdKV, EtcdLock
from kured.locks.kubernetes import KubernetesLock
from kured.locks.lease import LeaseLock
from kured.locks.record import RecordLock
from tests.kured.conftest import LOCK_ANNOTATION, LOCK_DAEMONSET, LOCK_NAMESPACE
from tests.kured.k8s_double import KubeDouble

LEASE = "kured"


@dataclass
class Store:
    """One backend: ``make(max_holders, clock)`` a new lock (its own client), ``raw()`` the
    stored record text (None: no record), ``put(text)`` another writer's record, ``writes()``
    how many successful writes the store has taken."""

    name: str
    make: Callable[[int, Clock], RecordLock]
    raw: Callable[[], Any]
    put: Callable[[str], Any]
    writes: Callable[[], Any]
    locks: list[RecordLock] = field(default_factory=list)

    def lock(self, max_holders: int = 1, clock: Clock | None = None) -> RecordLock:
        made = self.make(max_holders, clock or SystemClock())
        self.locks.append(made)
        return made


async def _value(result: Any) -> Any:
    return await result if asyncio.iscoroutine(result) else result


def _etcd_store(url: str, kv: EtcdKV, key: str) -> Store:
    async def raw() -> str | None:
        current = await kv.get(key.encode())
        return current.value.decode() if current is not None else None

    async def put(text: str) -> None:
        current = await kv.get(key.encode())
        revision = current.mod_revision if current is not None else 0
        assert (await kv.put_if(key.encode(), text.encode(), revision)).succeeded

    async def writes() -> int:
        current = await kv.get(key.encode())
        return current.mod_revision if current is not None else 0

    return Store("etcd", lambda n, clock: EtcdLock([url], key, n, clock), raw, put, writes)


def _kube_store(name: str, kube: KubeDouble, kubeconfig: Path) -> Store:
    def api() -> ApiServer:
        return ApiServer.connect(kubeconfig, request_timeout_seconds=5)

    if name == "annotation":
        return Store(
            name,
            lambda n, clock: KubernetesLock(
                api(), LOCK_NAMESPACE, LOCK_DAEMONSET, LOCK_ANNOTATION, n, clock, owns_api=True
            ),
            lambda: kube.annotation(LOCK_NAMESPACE, LOCK_DAEMONSET, LOCK_ANNOTATION),
            lambda text: kube.set_annotation(LOCK_NAMESPACE, LOCK_DAEMONSET, LOCK_ANNOTATION, text),
            lambda: kube.count("PUT", rf"/daemonsets/{LOCK_DAEMONSET}$", status=200),
        )

    def lease_raw() -> str | None:
        lease = kube.lease(LOCK_NAMESPACE, LEASE)
        if lease is None:
            return None
        value = (lease["metadata"].get("annotations") or {}).get(LOCK_ANNOTATION)
        return value if isinstance(value, str) else None

    return Store(
        name,
        lambda n, clock: LeaseLock(
            api(), LOCK_NAMESPACE, LEASE, LOCK_ANNOTATION, n, clock, owns_api=True
        ),
        lease_raw,
        lambda text: kube.set_lease(LOCK_NAMESPACE, LEASE, annotations={LOCK_ANNOTATION: text}),
        lambda: (
            kube.count("PUT", rf"/leases/{LEASE}$", status=200)
            + kube.count("POST", r"/leases$", status=201)
        ),
    )


@pytest.fixture(params=["etcd", "annotation", "lease"])
async def store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Store]:
    kv: EtcdKV | None = None
    if request.param == "etcd":
        url = request.getfixturevalue("etcd")
        kv = EtcdKV([url])
        made = _etcd_store(url, kv, request.getfixturevalue("lock_key"))
    else:
        kube: KubeDouble = request.getfixturevalue("kube")
        made = _kube_store(request.param, kube, kube.kubeconfig(tmp_path / "kubeconfig"))
    yield made
    for lock in made.locks:
        await lock.close()  # type: ignore[attr-defined]
    if kv is not None:
        await kv.close()


async def test_acquire_holds_and_release_frees(store: Store) -> None:
    lock = store.lock()
    assert await lock.acquire("a", False, 0)
    assert await lock.holding("a")
    assert [h.node_id for h in await lock.holders()] == ["a"]
    assert not await lock.acquire("b", False, 0)
    assert not await lock.holding("b")
    await lock.release("a")
    assert await _value(store.raw()) is None
    assert await lock.holders() == []
    assert await lock.acquire("b", True, 0)
    (holder,) = await lock.holders()
    assert (holder.node_id, holder.unschedulable) == ("b", True)


async def test_release_by_a_non_holder_writes_nothing(store: Store) -> None:
    lock = store.lock()
    await lock.release("nobody")
    assert await lock.acquire("a", False, 0)
    before = await _value(store.writes())
    await lock.release("b")
    assert await lock.acquire("a", False, 0)  # already held: no write either
    assert await _value(store.writes()) == before
    assert [h.node_id for h in await lock.holders()] == ["a"]


async def test_ttl_zero_never_expires(store: Store) -> None:
    clock = ManualClock()
    lock = store.lock(clock=clock)
    assert await lock.acquire("hung", False, 0)
    clock.advance(100 * 365 * 24 * 3600)
    assert not await lock.acquire("other", False, 60)
    assert await lock.holding("hung")


async def test_an_expired_entry_is_taken_over(store: Store) -> None:
    clock = ManualClock()
    lock = store.lock(clock=clock)
    assert await lock.acquire("a", False, 60)
    clock.advance(59.999)
    assert not await lock.acquire("b", False, 0)
    clock.advance(0.001)
    assert not await lock.holding("a")
    assert await lock.acquire("b", False, 0)
    assert [h.node_id for h in await lock.holders()] == ["b"]


async def test_reacquire_does_not_refresh_created(store: Store) -> None:
    clock = ManualClock()
    lock = store.lock(clock=clock)
    assert await lock.acquire("a", False, 60)
    (first,) = await lock.holders()
    clock.advance(30)
    assert await lock.acquire("a", True, 600)
    assert await lock.holders() == [first]
    clock.advance(30)
    assert not await lock.holding("a")


async def test_multi_holder_admits_max_holders_and_prunes_expired(store: Store) -> None:
    clock = ManualClock()
    lock = store.lock(max_holders=2, clock=clock)
    assert await lock.acquire("a", False, 10)
    assert await lock.acquire("b", False, 0)
    assert await lock.acquire("a", False, 10)
    assert not await lock.acquire("c", False, 0)
    clock.advance(10)
    assert await lock.acquire("c", False, 0)
    assert [h.node_id for h in await lock.holders()] == ["b", "c"]
    await lock.release("b")
    await lock.release("c")
    assert await _value(store.raw()) == '{"maxOwners":2,"locks":[]}'


async def test_the_manual_pause_holds_a_slot_at_every_concurrency(store: Store) -> None:
    await _value(store.put('{"nodeID":"manual"}'))
    assert not await store.lock(max_holders=1).acquire("a", False, 0)
    assert await _value(store.raw()) == '{"nodeID":"manual"}'
    two = store.lock(max_holders=2)
    assert await two.acquire("a", False, 0)
    assert not await two.acquire("b", False, 0)
    assert [h.node_id for h in await two.holders()] == ["manual", "a"]


async def test_an_empty_multi_record_is_free_at_concurrency_one(store: Store) -> None:
    await _value(store.put('{"maxOwners":3,"locks":[]}'))
    assert await store.lock().acquire("a", False, 0)
    raw = await _value(store.raw())
    assert raw is not None
    assert raw.startswith('{"nodeID":"a",')


async def test_an_unparsable_record_fails_closed_and_is_left_alone(store: Store) -> None:
    await _value(store.put("{not json"))
    lock = store.lock()
    with pytest.raises(LockError):
        await lock.acquire("a", False, 0)
    with pytest.raises(LockError):
        await lock.holders()
    assert await _value(store.raw()) == "{not json"


async def _contend(store: Store, agents: int, max_holders: int) -> list[tuple[float, float]]:
    """``agents`` agents, each its own lock and client, each take the lock once, hold it a few
    ms and release it. Each interval is stamped after acquire returned and before release was
    called, on one monotonic clock, so it lies inside the real hold."""
    intervals: list[tuple[float, float]] = []

    async def agent(index: int) -> None:
        node = f"node-{index:02d}"
        lock = store.lock(max_holders=max_holders)
        rng = random.Random(index)
        while True:
            try:
                got = await lock.acquire(node, False, 0)
            except LockConflict:
                got = False
            if got:
                break
            await asyncio.sleep(rng.uniform(0.01, 0.05))  # the agent's next tick
        start = time.monotonic()
        await asyncio.sleep(rng.uniform(0.001, 0.005))
        end = time.monotonic()
        while True:
            try:
                await lock.release(node)
                break
            except LockConflict:
                continue
        intervals.append((start, end))

    async with asyncio.timeout(120), asyncio.TaskGroup() as tg:
        for index in range(agents):
            tg.create_task(agent(index))
    return intervals


def _max_overlap(intervals: list[tuple[float, float]]) -> int:
    events = sorted([(s, 1) for s, _ in intervals] + [(e, -1) for _, e in intervals])
    current = peak = 0
    for _, step in events:
        current += step
        peak = max(peak, current)
    return peak


async def test_fifty_contending_agents_never_overlap(store: Store) -> None:
    intervals = await _contend(store, agents=50, max_holders=1)
    assert len(intervals) == 50
    assert _max_overlap(intervals) == 1
    assert await _value(store.raw()) is None  # every one released


async def test_concurrency_two_never_admits_a_third(store: Store) -> None:
    intervals = await _contend(store, agents=12, max_holders=2)
    assert len(intervals) == 12
    assert _max_overlap(intervals) <= 2
    assert await _value(store.raw()) == '{"maxOwners":2,"locks":[]}'
