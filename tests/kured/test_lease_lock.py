"""LeaseLock specifics (``--lock-backend=lease``) through the official client against the API
double with Lease semantics (tests/kured/k8s_leases.py; no API server runs here). The shared
semantics, 50 contending agents included, are in test_lock_suite.py."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from kit.clock import ManualClock, SystemClock
from kured.apiserver import ApiServer
from kured.core.errors import ApiError, LockConflict
from kured.locks.lease import LeaseLock, micro_time
from tests.kured.conftest import LOCK_ANNOTATION
from tests.kured.k8s_double import KubeDouble

NS, NAME, KEY = "kube-system", "kured", LOCK_ANNOTATION
T0_MS = 1_772_352_764_123  # 2026-03-01T08:12:44.123Z
MakeLock = Callable[..., LeaseLock]


@pytest.fixture
async def make_lock(kubeconfig: Path) -> AsyncIterator[MakeLock]:
    locks: list[LeaseLock] = []

    def make(max_holders: int = 1, clock: object = None, **kwargs: object) -> LeaseLock:
        api = ApiServer.connect(kubeconfig, request_timeout_seconds=5)
        lock = LeaseLock(
            api,
            NS,
            NAME,
            KEY,
            max_holders,
            clock or SystemClock(),
            owns_api=True,
            **kwargs,  # type: ignore[arg-type]
        )
        locks.append(lock)
        return lock

    yield make
    for lock in locks:
        await lock.close()


def test_micro_time_has_six_fraction_digits() -> None:
    assert micro_time(T0_MS * 1_000_000) == "2026-03-01T08:12:44.123000Z"
    assert micro_time(1_772_352_764_000_000_000) == "2026-03-01T08:12:44.000000Z"
    assert micro_time(1_772_352_764_123_456_789) == "2026-03-01T08:12:44.123456Z"


async def test_the_first_acquire_creates_the_lease_and_the_spec_mirrors_the_record(
    make_lock: MakeLock, kube: KubeDouble
) -> None:
    assert kube.lease(NS, NAME) is None
    lock = make_lock(clock=ManualClock(now_ms=T0_MS))
    assert await lock.acquire("worker-2", unschedulable=True, ttl_seconds=1800.5)
    lease = kube.lease(NS, NAME)
    assert lease is not None
    assert kube.count("POST", r"/leases$", status=201) == 1
    assert lease["metadata"]["annotations"][KEY] == (
        '{"nodeID":"worker-2","metadata":{"unschedulable":true},'
        '"created":"2026-03-01T08:12:44.123Z","TTL":1800500000000}'
    )
    assert lease["spec"] == {
        "holderIdentity": "worker-2",
        "leaseDurationSeconds": 1801,  # rounded up: never shorter than the record's TTL
        "acquireTime": "2026-03-01T08:12:44.123000Z",
        "renewTime": "2026-03-01T08:12:44.123000Z",
        "leaseTransitions": 1,
    }
    await lock.release("worker-2")
    lease = kube.lease(NS, NAME)
    assert lease is not None  # kept for kubectl, free
    assert KEY not in (lease["metadata"].get("annotations") or {})
    assert lease["spec"] == {"leaseTransitions": 1}
    assert await lock.acquire("w3", unschedulable=False, ttl_seconds=0)
    lease = kube.lease(NS, NAME)
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "w3"
    assert "leaseDurationSeconds" not in lease["spec"]  # TTL 0: never expires
    assert lease["spec"]["leaseTransitions"] == 2


async def test_several_holders_are_named_in_holder_identity(
    make_lock: MakeLock, kube: KubeDouble
) -> None:
    lock = make_lock(max_holders=3)
    for node in ("w1", "w2"):
        assert await lock.acquire(node, unschedulable=False, ttl_seconds=0)
    lease = kube.lease(NS, NAME)
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "w1,w2"
    assert [e["nodeID"] for e in json.loads(lease["metadata"]["annotations"][KEY])["locks"]] == [
        "w1",
        "w2",
    ]


async def test_a_lost_create_race_is_a_409_and_is_retried(
    make_lock: MakeLock, kube: KubeDouble
) -> None:
    locks = [make_lock() for _ in range(8)]
    results = await asyncio.gather(
        *(lock.acquire(f"n{i}", unschedulable=False, ttl_seconds=0) for i, lock in enumerate(locks))
    )
    assert results.count(True) == 1
    assert kube.count("POST", r"/leases$", status=201) == 1
    lost = kube.count("POST", r"/leases$", status=409) + kube.count(
        "PUT", rf"/leases/{NAME}$", status=409
    )
    assert lost == sum(lock.conflicts_total for lock in locks)
    history = kube.lease_history(NS, NAME)
    assert all(
        len(json.loads(v["metadata"]["annotations"][KEY]).get("nodeID", "x").split(",")) == 1
        for v in history
        if KEY in (v["metadata"].get("annotations") or {})
    )


async def test_a_stale_resource_version_is_a_409_and_is_reread(
    make_lock: MakeLock, kube: KubeDouble, kubeconfig: Path
) -> None:
    lock = make_lock()
    assert await lock.acquire("a", unschedulable=False, ttl_seconds=0)
    stale = kube.lease(NS, NAME)
    assert stale is not None
    kube.set_lease(NS, NAME, spec={"leaseTransitions": 7})  # another writer (kubectl)
    api = ApiServer.connect(kubeconfig)
    try:
        with pytest.raises(ApiError) as raised:
            await api.replace_lease(NS, NAME, stale)
        assert raised.value.conflict
    finally:
        await api.close()
    await lock.release("a")  # re-reads, so it is not refused
    lease = kube.lease(NS, NAME)
    assert lease is not None
    assert "holderIdentity" not in lease["spec"]
    assert lease["spec"]["leaseTransitions"] == 7  # theirs kept


async def test_the_double_validates_leases_as_the_real_server(kubeconfig: Path) -> None:
    api = ApiServer.connect(kubeconfig)
    bad = {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": {"name": "bad"},
        "spec": {"leaseDurationSeconds": 0, "renewTime": "2026-03-01T08:12:44Z"},
    }
    try:
        with pytest.raises(ApiError) as raised:
            await api.create_lease(NS, bad)
        assert raised.value.status == 422
        assert "leaseDurationSeconds" in raised.value.message
        assert "renewTime" in raised.value.message
        with pytest.raises(ApiError) as missing:
            await api.get_lease(NS, "bad")
        assert missing.value.not_found
    finally:
        await api.close()


async def test_a_holder_identity_written_by_kubectl_pauses_reboots(
    make_lock: MakeLock, kube: KubeDouble
) -> None:
    kube.add_lease(NS, NAME, {"holderIdentity": "manual"})
    lock = make_lock()
    assert [h.node_id for h in await lock.holders()] == ["manual"]
    assert not await lock.acquire("n1", unschedulable=False, ttl_seconds=0)
    wide = make_lock(max_holders=2)
    assert await wide.acquire("n1", unschedulable=False, ttl_seconds=0)
    assert [h.node_id for h in await wide.holders()] == ["manual", "n1"]
    lease = kube.lease(NS, NAME)
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "manual,n1"


async def test_a_foreign_lease_expires_after_its_duration(
    make_lock: MakeLock, kube: KubeDouble
) -> None:
    kube.add_lease(
        NS,
        NAME,
        {
            "holderIdentity": "other-tool",
            "leaseDurationSeconds": 60,
            "renewTime": "2026-03-01T08:12:44.123000Z",
        },
    )
    clock = ManualClock(now_ms=T0_MS + 59_000)
    lock = make_lock(clock=clock)
    assert not await lock.acquire("n1", unschedulable=False, ttl_seconds=0)
    clock.advance(1)
    assert await lock.acquire("n1", unschedulable=False, ttl_seconds=0)
    lease = kube.lease(NS, NAME)
    assert lease is not None
    assert lease["spec"]["holderIdentity"] == "n1"


async def test_endless_conflicts_raise_lock_conflict(make_lock: MakeLock, kube: KubeDouble) -> None:
    """Another writer changes the Lease between each of our GETs and PUTs."""
    kube.add_lease(NS, NAME)
    lock = make_lock(max_attempts=3)
    real_get = lock._api.get_lease

    async def get_then_race(namespace: str, name: str):  # type: ignore[no-untyped-def]
        obj = await real_get(namespace, name)
        kube.set_lease(NS, NAME, spec={"leaseTransitions": int(obj["metadata"]["resourceVersion"])})
        return obj

    lock._api.get_lease = get_then_race  # type: ignore[method-assign]
    with pytest.raises(LockConflict):
        await lock.acquire("n1", unschedulable=False, ttl_seconds=0)
    assert lock.conflicts_total == 3
    assert kube.count("PUT", rf"/leases/{NAME}$", status=409) == 3
    lease = kube.lease(NS, NAME)
    assert lease is not None
    assert "holderIdentity" not in lease["spec"]


async def test_fifty_agents_never_store_two_holders_in_any_lease_version(
    make_lock: MakeLock, kube: KubeDouble
) -> None:
    """The suite's contention test (test_lock_suite.py) checks the agents' own hold intervals;
    this one checks every version the API server stored."""

    async def agent(index: int) -> None:
        lock = make_lock()
        node = f"node-{index:02d}"
        while True:
            try:
                if await lock.acquire(node, unschedulable=False, ttl_seconds=0):
                    break
            except LockConflict:
                pass
            await asyncio.sleep(0.01 + (index % 7) * 0.005)  # the agent's next tick
        await asyncio.sleep(0.002)
        while True:
            try:
                await lock.release(node)
                return
            except LockConflict:
                continue

    async with asyncio.timeout(120), asyncio.TaskGroup() as tg:
        for index in range(50):
            tg.create_task(agent(index))
    history = kube.lease_history(NS, NAME)
    holders = [v["spec"].get("holderIdentity") for v in history]
    records = [(v["metadata"].get("annotations") or {}).get(KEY) for v in history]
    assert all(h is None or "," not in h for h in holders)
    assert all(r is None or "nodeID" in json.loads(r) for r in records)  # single format only
    assert sum(1 for h in holders if h) == 50  # every acquisition stored exactly once
    assert len({h for h in holders if h}) == 50
    conflicts = kube.count("PUT", rf"/leases/{NAME}$", status=409) + kube.count(
        "POST", r"/leases$", status=409
    )
    assert conflicts > 0  # they did collide
