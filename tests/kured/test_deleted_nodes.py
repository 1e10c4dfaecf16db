"""``--release-lock-of-deleted-nodes`` (kured #137, #847) with the ``--lock-backend=lease``
against the Kubernetes API double (tests/kured/k8s_double.py): the release as a real ``kured``
process (its reboot command records the reboot and kills the agent, which ``Host`` restarts as a
boot would); the locks that must be kept with the agent kured wires from the same flags,
in-process on virtual time (``wired_agent``), each check's decision asserted.

* a lock held by a node the API answers 404 for is released after the grace period, loudly (an
  ERROR line and ``kured_lock_releases_of_deleted_nodes_total``), and the waiting node reboots;
* without the flag (the default) the same lock is kept for ever, as kured does;
* kured's ``{"nodeID":"manual"}`` pause record is never released, however long it stays;
* a holder whose Node exists is never released.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from kit.wait import wait_until_async
from tests import oneshot
from tests.kured.agents import Host, read_events, wired_agent
from tests.kured.conftest import LOCK_ANNOTATION
from tests.kured.k8s_double import KubeDouble

NO_ETCD = "http://127.0.0.1:9"  # the lease backend never uses it
NS, LEASE = "kube-system", "kured"
GRACE = 2.0


def _record(node: str) -> str:
    return (
        f'{{"nodeID":"{node}","metadata":{{"unschedulable":false}},'
        '"created":"2026-03-01T08:12:44Z","TTL":0}'
    )


def _stored(kube: KubeDouble) -> str | None:
    lease = kube.lease(NS, LEASE)
    if lease is None:
        return None
    value = (lease["metadata"].get("annotations") or {}).get(LOCK_ANNOTATION)
    return value if isinstance(value, str) else None


def _metric(url: str, name: str) -> float | None:
    for line in oneshot.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    return None


def _checks(url: str) -> float:
    """How many decisions the agent has made (one per check, more when it acts)."""
    total = 0.0
    for line in oneshot.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith("kured_decisions_total{"):
            total += float(line.rsplit(" ", 1)[1])
    return total


async def _until(predicate: Callable[[], object], within: float) -> bool:
    return await wait_until_async(predicate, within, interval=0.1)


def _host(tmp_path: Path, kubeconfig: Path, *flags: str) -> Host:
    host = Host(tmp_path, "n2", NO_ETCD, tmp_path / "events", *_flags(kubeconfig, *flags))
    host.sentinel.touch()
    return host


async def test_the_lock_of_a_deleted_node_is_released_after_the_grace_period_loudly(
    tmp_path: Path, kube: KubeDouble, kubeconfig: Path
) -> None:
    kube.add_node("n2")  # "gone" holds the lock and has no Node object
    kube.set_lease(
        NS, LEASE, spec={"holderIdentity": "gone"}, annotations={LOCK_ANNOTATION: _record("gone")}
    )
    host = _host(tmp_path, kubeconfig, "--release-lock-of-deleted-nodes")
    host.sentinel.unlink()  # first only watch the release
    started = time.monotonic()
    host.start()
    try:
        assert await _until(lambda: _stored(kube) is None, 60), host.log()
        took = time.monotonic() - started
        assert took >= GRACE  # not before the grace period
        assert _metric(host.url, "kured_lock_releases_of_deleted_nodes_total") == 1
        lines = [line for line in host.log().splitlines() if "held by node gone" in line]
        assert len(lines) == 1
        assert " ERROR " in lines[0]
        assert "absent (404)" in lines[0]
        # The freed slot is usable: n2 now needs a reboot, takes the lock and reboots.
        host.sentinel.touch()
        assert await _until(
            lambda: "reboot" in [w for _, _, w in read_events(tmp_path / "events")], 60
        ), host.log()
        assert await _until(lambda: _stored(kube) is None and host.boots >= 2, 30)
        holders = [(v["spec"].get("holderIdentity") or "") for v in kube.lease_history(NS, LEASE)]
        changes = [h for i, h in enumerate(holders) if h and (i == 0 or holders[i - 1] != h)]
        assert changes == ["gone", "n2"]  # nobody else was ever let in
    finally:
        host.stop()


def _flags(kubeconfig: Path, *more: str) -> tuple[str, ...]:
    return (
        "--lock-backend",
        "lease",
        "--kubeconfig",
        str(kubeconfig),
        "--period",
        "0.5s",
        "--deleted-node-grace",
        f"{GRACE:g}s",
        *more,
    )


async def test_without_the_flag_a_deleted_nodes_lock_is_kept(
    tmp_path: Path, kube: KubeDouble, kubeconfig: Path
) -> None:
    kube.add_node("n2")
    kube.set_lease(
        NS, LEASE, spec={"holderIdentity": "gone"}, annotations={LOCK_ANNOTATION: _record("gone")}
    )
    async with wired_agent(tmp_path, "n2", *_flags(kubeconfig)) as host:
        host.sentinel.touch()
        # Checks every 0.5 s of virtual time, well past the grace period: each one waits.
        assert await host.check(times=12) == ["acquire: lock_held_elsewhere"] * 12
        assert _stored(kube) == _record("gone")
        assert host.rebooter.calls == 0
        assert host.agent.deleted_holders is None  # no release of deleted nodes to count


async def test_the_manual_pause_and_a_live_holder_are_never_released(
    tmp_path: Path, kube: KubeDouble, kubeconfig: Path
) -> None:
    kube.add_node("n2")
    kube.add_node("alive")
    multi = (
        '{"maxOwners":2,"locks":['
        '{"nodeID":"manual","metadata":{"unschedulable":false},"created":"2026-03-01T08:12:44Z","TTL":0},'
        '{"nodeID":"alive","metadata":{"unschedulable":false},"created":"2026-03-01T08:12:44Z","TTL":0}'
        "]}"
    )
    kube.set_lease(NS, LEASE, annotations={LOCK_ANNOTATION: multi})
    flags = _flags(kubeconfig, "--release-lock-of-deleted-nodes", "--concurrency", "2")
    async with wired_agent(tmp_path, "n2", *flags) as host:
        host.sentinel.touch()
        # 3 grace periods of virtual time, a check every 0.5 s: each one waits.
        assert await host.check(times=13) == ["acquire: lock_held_elsewhere"] * 13
        assert _stored(kube) == multi  # byte for byte: nothing written at all
        assert host.rebooter.calls == 0
        assert host.agent.deleted_holders is not None
        assert host.agent.deleted_holders.released_total == 0
        assert kube.count("GET", "/api/v1/nodes/manual$") == 0  # the pause is no node
        assert kube.count("GET", "/api/v1/nodes/alive$") >= 4


async def test_a_node_that_comes_back_resets_its_absence(
    kube: KubeDouble, kubeconfig: Path
) -> None:
    """``DeletedHolders`` on a manual clock: absence must be continuous for the whole grace."""
    from kit.clock import ManualClock
    from kured.actuators.deleted_nodes import DeletedHolders
    from kured.apiserver import ApiServer

    released: list[str] = []

    async def release(node: str) -> None:
        released.append(node)

    clock = ManualClock()
    api = ApiServer.connect(kubeconfig)
    try:
        check = DeletedHolders(api, release, "me", 60, clock)
        assert await check.check(["me", "flaky", "manual"]) == []
        clock.advance(59)
        kube.add_node("flaky")  # back (a re-registered node) just before the grace ran out
        assert await check.check(["flaky"]) == []
        with kube._lock:  # deleted again
            del kube._objects[("Node", "", "flaky")]
        clock.advance(30)
        assert await check.check(["flaky"]) == []  # its absence starts again here
        clock.advance(59)
        assert await check.check(["flaky"]) == []
        clock.advance(1)
        assert await check.check(["flaky", "manual"]) == ["flaky"]
        assert released == ["flaky"]
        assert check.released_total == 1
        assert kube.count("GET", "/api/v1/nodes/(me|manual)$") == 0
    finally:
        await api.close()
