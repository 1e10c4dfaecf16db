"""Cordon, drain and uncordon through the official client against the Kubernetes API double
(tests/kured/k8s_double.py): evictions through policy/v1 with PodDisruptionBudgets enforced
(429), pods replaced by their controllers, the agent's choreography around the drain, and
kured's cordon bookkeeping bugs (#63, #1129, #1328) as tests.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from kit.clock import ManualClock
from kured.actuators.drain import CORDON_ANNOTATION, Drainer, DrainOptions
from kured.actuators.node import (
    MOST_RECENT_REBOOT_NEEDED_ANNOTATION,
    REBOOT_IN_PROGRESS_ANNOTATION,
    NodeOptions,
)
from kured.apiserver import MERGE_PATCH, ApiServer
from kured.console import status_of
from kured.core.errors import DrainError
from kured.core.lockrecord import parse
from kured.core.policy import Action
from kured.metrics import AgentCollector, exposition, registry_for
from tests.kured.conftest import LOCK_ANNOTATION, LOCK_DAEMONSET, LOCK_NAMESPACE
from tests.kured.k8s_double import KubeDouble
from tests.kured.kube_agent import KubeHost

NS, DS, KEY = LOCK_NAMESPACE, LOCK_DAEMONSET, LOCK_ANNOTATION
FAST = DrainOptions(timeout_seconds=20, poll_interval_seconds=0.05)


@pytest.fixture
async def api(kubeconfig: Path) -> AsyncIterator[ApiServer]:
    server = ApiServer.connect(kubeconfig, request_timeout_seconds=5)
    yield server
    await server.close()


def on_node(kube: KubeDouble, node: str) -> list[str]:
    return sorted(p["metadata"]["name"] for p in kube.pods() if p["spec"]["nodeName"] == node)


def cordoned(kube: KubeDouble, node: str) -> bool:
    return bool(kube.node(node)["spec"].get("unschedulable"))


def mark(kube: KubeDouble, node: str) -> str | None:
    value = (kube.node(node)["metadata"].get("annotations") or {}).get(CORDON_ANNOTATION)
    return value if isinstance(value, str) else None


# --- the drain itself ------------------------------------------------------------------------


async def test_drain_evicts_all_but_daemonset_and_mirror_pods_and_waits_for_them(
    kube: KubeDouble, api: ApiServer
) -> None:
    for node in ("n1", "n2"):
        kube.add_node(node)
    kube.add_pod("web", "web-abc", "n1", labels={"app": "web"}, owner=("ReplicaSet", "web"))
    kube.add_pod("db", "db-0", "n1", labels={"app": "db"}, owner=("StatefulSet", "db"))
    kube.add_pod("default", "bare", "n1")  # unmanaged: evicted and never comes back
    kube.add_pod("default", "done", "n1", phase="Succeeded", owner=("Job", "once"))
    kube.add_pod("kube-system", "proxy-n1", "n1", owner=("DaemonSet", "kube-proxy"))
    kube.add_pod("kube-system", "etcd-n1", "n1", mirror=True)
    kube.add_pod("web", "web-other", "n2", labels={"app": "web"}, owner=("ReplicaSet", "web"))
    db_uid = kube.pod("db", "db-0")["metadata"]["uid"]  # type: ignore[index]

    drainer = Drainer(api, "n1", FAST)
    assert await drainer.cordon() is False  # it was schedulable: this cordon is ours
    report = await drainer.drain()

    assert sorted(report.evicted) == ["db/db-0", "default/bare", "default/done", "web/web-abc"]
    assert report.skipped == {
        "kube-system/proxy-n1": "managed by DaemonSet kube-proxy",
        "kube-system/etcd-n1": "mirror pod",
    }
    evicted = sorted(f"{e.namespace}/{e.name}" for e in kube.evictions)
    assert evicted == ["db/db-0", "default/bare", "default/done", "web/web-abc"]
    assert on_node(kube, "n1") == ["etcd-n1", "proxy-n1"]
    # The drain waited for the StatefulSet pod to be gone and recreated (same name, new UID).
    db = kube.pod("db", "db-0")
    assert db is not None
    assert db["metadata"]["uid"] != db_uid
    assert db["spec"]["nodeName"] == "n2"
    assert cordoned(kube, "n1")
    assert mark(kube, "n1") == "n1"
    await drainer.uncordon()
    assert not cordoned(kube, "n1")
    assert mark(kube, "n1") is None


async def test_the_grace_period_goes_into_every_eviction(kube: KubeDouble, api: ApiServer) -> None:
    kube.add_node("n1")
    kube.add_pod("default", "a", "n1")
    await Drainer(
        api, "n1", DrainOptions(grace_period_seconds=7, poll_interval_seconds=0.05)
    ).drain()
    kube.add_pod("default", "b", "n1")
    await Drainer(
        api, "n1", DrainOptions(grace_period_seconds=0, poll_interval_seconds=0.05)
    ).drain()
    kube.add_pod("default", "c", "n1")
    await Drainer(api, "n1", DrainOptions(poll_interval_seconds=0.05)).drain()  # -1: pod's own
    assert [(e.name, e.grace_period_seconds) for e in kube.evictions] == [
        ("a", 7),
        ("b", 0),
        ("c", None),
    ]


async def test_pods_stuck_terminating_are_skipped_after_the_skip_wait_timeout(
    kube: KubeDouble, api: ApiServer
) -> None:
    kube.add_node("n1")
    kube.add_pod("default", "stuck", "n1", terminating_since="2020-01-01T00:00:00Z")
    kube.add_pod("default", "fine", "n1")
    options = DrainOptions(
        timeout_seconds=10, skip_wait_for_delete_timeout_seconds=60, poll_interval_seconds=0.05
    )
    report = await Drainer(api, "n1", options).drain()  # real time: the double deletes "fine"
    assert report.evicted == ["default/fine"]
    assert "skip-wait-for-delete-timeout" in report.skipped["default/stuck"]
    # Without it the drain waits for the stuck pod until --drain-timeout, and says so.
    without = DrainOptions(timeout_seconds=1, poll_interval_seconds=0.05)
    clock = ManualClock(now_ms=int(time.time() * 1000))  # the wait for a non-event: virtual
    started = clock.monotonic()
    with pytest.raises(DrainError, match=r"default/stuck: evicted; waiting for it to terminate"):
        await Drainer(api, "n1", without, clock).drain()
    assert 1 <= clock.monotonic() - started < 1.2  # polled until --drain-timeout, no longer


async def test_a_zero_disruption_budget_is_retried_with_backoff_until_the_timeout(
    kube: KubeDouble, api: ApiServer
) -> None:
    kube.add_node("n1")
    kube.add_node("n2")
    kube.add_pod("mesh", "mesh-ctrl-0", "n1", labels={"app": "mesh"}, owner=("ReplicaSet", "m"))
    kube.add_pod("mesh", "mesh-ctrl-1", "n2", labels={"app": "mesh"}, owner=("ReplicaSet", "m"))
    kube.add_pdb("mesh", "mesh-pdb", {"app": "mesh"}, max_unavailable=0)
    started = time.monotonic()
    with pytest.raises(DrainError) as raised:
        await Drainer(api, "n1", DrainOptions(timeout_seconds=3.5)).drain()
    elapsed = time.monotonic() - started
    assert 3.5 <= elapsed < 6
    message = raised.value.message
    assert "timed out after 3.5s" in message
    assert "mesh/mesh-ctrl-0" in message
    assert "mesh-pdb" in message
    assert raised.value.pods == ("mesh/mesh-ctrl-0",)
    times = [e.at for e in kube.evictions]
    assert all(e.status == 429 for e in kube.evictions)
    assert len(times) == 3  # at 0 s, ~1 s, ~3 s: spaced, doubling, never back-to-back
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert 0.9 <= gaps[0] < 1.5, gaps
    assert 1.9 <= gaps[1] < 2.6, gaps
    assert kube.pod("mesh", "mesh-ctrl-0") is not None  # nothing was evicted


async def test_a_minavailable_budget_lets_one_pod_go_at_a_time(
    kube: KubeDouble, api: ApiServer
) -> None:
    for node in ("n1", "n2", "n3"):
        kube.add_node(node)
    for i, node in enumerate(("n1", "n2", "n3")):
        kube.add_pod("web", f"web-{i}", node, labels={"app": "web"}, owner=("ReplicaSet", "web"))
    kube.add_pdb("web", "web-pdb", {"app": "web"}, min_available=2)
    report = await Drainer(api, "n1", FAST).drain()
    assert report.evicted == ["web/web-0"]
    assert report.refusals == 0
    assert on_node(kube, "n1") == []


async def test_cordon_leaves_an_existing_cordon_unmarked(kube: KubeDouble, api: ApiServer) -> None:
    kube.add_node("n1", unschedulable=True)
    drainer = Drainer(api, "n1", FAST)
    assert await drainer.cordon() is True  # already cordoned: not ours
    assert mark(kube, "n1") is None
    assert not await drainer.undo_orphaned_cordon()
    assert cordoned(kube, "n1")


# --- the agent around the drain --------------------------------------------------------------


async def test_a_budget_stuck_drain_releases_the_lock_and_uncordons_without_the_release_delay(
    kube: KubeDouble, hosts: Callable[..., KubeHost]
) -> None:
    """B38 / kured #82 and #1129: give up cleanly, at once, and say why."""
    kube.add_node("n1")
    kube.add_node("n2")
    kube.add_pod("mesh", "mesh-ctrl", "n1", labels={"app": "mesh"}, owner=("ReplicaSet", "m"))
    kube.add_pdb("mesh", "mesh-pdb", {"app": "mesh"}, max_unavailable=0)
    clock = ManualClock(now_ms=int(time.time() * 1000))
    host = hosts(
        "n1",
        clock=clock,
        drain_clock=clock,
        release_delay_seconds=600,
        drain=DrainOptions(timeout_seconds=2),
        node_options=NodeOptions(
            pre_reboot_labels=(("example.com/reboot", "pending"),),
            post_reboot_labels=(("example.com/reboot", "done"),),
        ),
    )
    host.sentinel.touch()
    agent = await host.boot()

    started = clock.monotonic()
    decision = await agent.tick()
    elapsed = clock.monotonic() - started  # virtual: every pause the agent took, summed

    assert 2 <= elapsed < 6, elapsed  # the drain timeout, not the 600 s release delay
    assert host.rebooter.calls == 0
    assert kube.annotation(NS, DS, KEY) is None  # lock released
    assert not cordoned(kube, "n1")
    assert mark(kube, "n1") is None
    assert kube.node("n1")["metadata"]["labels"]["example.com/reboot"] == "done"
    assert decision.action is Action.REBOOT  # what the policy wanted; the drain said no
    status = status_of(agent, "always")
    assert status["reason"] == "drain_failed"
    assert "mesh/mesh-ctrl" in status["blocked_by"]
    assert "mesh-pdb" in status["blocked_by"]
    assert status["failures"] == {"drain": 1}
    assert status["last_drain_failure"]["action"] == "released"
    assert status["last_drain_failure"]["pods"] == ["mesh/mesh-ctrl"]
    metrics = exposition(registry_for(AgentCollector(agent))).decode()
    assert 'kured_blocking_reason{node="n1",reason="drain_failed"} 1.0' in metrics
    assert 'kured_failures_total{kind="drain",node="n1"} 1.0' in metrics
    # The lock is free for the next node at once (B38: "node-b can proceed").
    other = hosts("n2")
    other.sentinel.touch()
    await (await other.boot()).tick()
    assert other.rebooter.calls == 1


async def test_force_reboot_reboots_after_a_failed_drain(
    kube: KubeDouble, hosts: Callable[..., KubeHost]
) -> None:
    kube.add_node("n1")
    kube.add_pod("mesh", "mesh-ctrl", "n1", labels={"app": "mesh"})
    kube.add_pdb("mesh", "mesh-pdb", {"app": "mesh"}, max_unavailable=0)
    clock = ManualClock(now_ms=int(time.time() * 1000))
    host = hosts(
        "n1",
        clock=clock,
        drain_clock=clock,
        force_reboot=True,
        drain=DrainOptions(timeout_seconds=1),
    )
    host.sentinel.touch()
    agent = await host.boot()
    await agent.tick()
    assert host.rebooter.calls == 1
    assert cordoned(kube, "n1")
    record = kube.annotation(NS, DS, KEY)
    assert record is not None
    assert parse(record).entries[0].node_id == "n1"
    assert status_of(agent, "")["last_drain_failure"]["action"] == "rebooting anyway"
    # After the reboot: uncordon (it was schedulable) and release.
    after = await host.boot()
    await after.tick()
    assert not cordoned(kube, "n1")
    assert kube.annotation(NS, DS, KEY) is None


async def test_a_full_reboot_cordons_drains_and_afterwards_uncordons_labels_and_releases(
    kube: KubeDouble, hosts: Callable[..., KubeHost]
) -> None:
    kube.add_node("n1")
    kube.add_node("n2")
    kube.add_pod("web", "web-abc", "n1", labels={"app": "web"}, owner=("ReplicaSet", "web"))
    host = hosts(
        "n1",
        drain=FAST,
        node_options=NodeOptions(
            pre_reboot_labels=(("example.com/reboot", "pending"),),
            post_reboot_labels=(("example.com/reboot", "done"),),
            annotate=True,
        ),
    )
    host.sentinel.touch()
    agent = await host.boot()
    await agent.tick()
    assert host.rebooter.calls == 1
    node = kube.node("n1")
    assert node["spec"]["unschedulable"] is True
    assert mark(kube, "n1") == "n1"
    assert node["metadata"]["labels"]["example.com/reboot"] == "pending"
    annotations = node["metadata"]["annotations"]
    stamp = annotations[REBOOT_IN_PROGRESS_ANNOTATION]
    assert annotations[MOST_RECENT_REBOOT_NEEDED_ANNOTATION] == stamp
    assert on_node(kube, "n1") == []
    record = parse(kube.annotation(NS, DS, KEY) or "")
    assert record.entries[0].unschedulable is False  # it was schedulable when locked

    after = await host.boot()  # the machine came back
    decision = await after.tick()
    assert decision.action is Action.RELEASE
    node = kube.node("n1")
    assert not node["spec"].get("unschedulable")
    assert mark(kube, "n1") is None
    assert node["metadata"]["labels"]["example.com/reboot"] == "done"
    assert REBOOT_IN_PROGRESS_ANNOTATION not in node["metadata"]["annotations"]
    assert node["metadata"]["annotations"][MOST_RECENT_REBOOT_NEEDED_ANNOTATION] == stamp
    assert kube.annotation(NS, DS, KEY) is None


async def test_a_node_cordoned_before_the_lock_stays_cordoned_and_still_gets_post_labels(
    kube: KubeDouble, hosts: Callable[..., KubeHost]
) -> None:
    """kured's "CordonningIsKept" e2e, and #1328 fixed: the post labels (here undoing the pre
    label) still go on, because the pre labels did; the cordon is the operator's to lift."""
    kube.add_node("n1", unschedulable=True)
    host = hosts(
        "n1",
        drain=FAST,
        node_options=NodeOptions(
            pre_reboot_labels=(("example.com/reboot-pending", "true"),),
            post_reboot_labels=(("example.com/reboot-pending", "false"),),
        ),
    )
    host.sentinel.touch()
    await (await host.boot()).tick()
    assert host.rebooter.calls == 1
    record = parse(kube.annotation(NS, DS, KEY) or "")
    assert record.entries[0].unschedulable is True  # recorded before we touched the node
    assert mark(kube, "n1") is None  # the cordon was never ours

    await (await host.boot()).tick()
    assert kube.annotation(NS, DS, KEY) is None
    node = kube.node("n1")
    assert node["spec"]["unschedulable"] is True
    assert node["metadata"]["labels"]["example.com/reboot-pending"] == "false"


async def test_a_node_cordoned_by_an_operator_after_the_lock_was_taken_stays_cordoned(
    kube: KubeDouble, hosts: Callable[..., KubeHost], api: ApiServer
) -> None:
    """B41: "a node cordoned by someone else stays cordoned", also when the cordon came after
    the lock recorded the node as schedulable (here during ``--drain-delay``, before kured's
    own cordon): kured's rule reads the record only, and uncordoned it after the reboot."""
    kube.add_node("n1")
    host = hosts("n1", drain=FAST, drain_delay_seconds=30)
    host.sentinel.touch()
    agent = await host.boot()
    delays: list[float] = []

    async def operator_cordons_during_the_delay(seconds: float) -> None:
        delays.append(seconds)  # virtual: the operator acts while the agent waits
        await api.patch_node("n1", {"spec": {"unschedulable": True}}, MERGE_PATCH)

    agent.sleep = operator_cordons_during_the_delay
    await agent.tick()
    assert delays == [30]
    assert host.rebooter.calls == 1
    assert parse(kube.annotation(NS, DS, KEY) or "").entries[0].unschedulable is False
    assert mark(kube, "n1") is None  # kured found it cordoned: not its cordon

    back = await host.boot()
    assert (await back.tick()).action is Action.RELEASE
    assert kube.annotation(NS, DS, KEY) is None  # the lock is released all the same
    assert cordoned(kube, "n1")  # main: uncordoned, the operator's cordon lost


async def test_an_orphaned_cordon_of_ours_is_undone_on_start(
    kube: KubeDouble, hosts: Callable[..., KubeHost]
) -> None:
    """kured #63: a node left cordoned by a reboot whose lock is gone (force-unlocked by an
    operator, an uncordon that failed) is found by our mark and uncordoned."""
    kube.add_node("n1", unschedulable=True, annotations={CORDON_ANNOTATION: "n1"})
    kube.add_node("n2", unschedulable=True)  # an operator's cordon: no mark
    kube.add_node("n3", unschedulable=True, annotations={CORDON_ANNOTATION: "n3"})
    kube.set_annotation(
        NS,
        DS,
        KEY,
        '{"nodeID":"n3","metadata":{"unschedulable":false},"created":"2026-03-01T08:12:44Z","TTL":0}',
    )
    for node in ("n1", "n2"):
        await hosts(node).boot()  # start-up only: no tick
    assert not cordoned(kube, "n1")
    assert mark(kube, "n1") is None
    assert cordoned(kube, "n2")
    # n3 still holds the lock: its reboot may be in progress, so the start leaves it alone...
    n3 = await hosts("n3").boot()
    assert cordoned(kube, "n3")
    # ...and its next tick (no reboot needed any more) restores the node and releases.
    await n3.tick()
    assert not cordoned(kube, "n3")
    assert kube.annotation(NS, DS, KEY) is None


def test_kured_processes_drain_and_reboot_one_node_at_a_time_through_the_daemonset_lock(
    kube: KubeDouble, kubeconfig: Path, tmp_path: Path
) -> None:
    """The CLI end to end: ``kured --lock-backend=kubernetes --kubeconfig …`` processes (the
    tests/kured/agents.py harness: the reboot script kills the agent, which is restarted)."""
    import itertools

    from tests.kured.agents import Host, read_events
    from tests.kured.test_agents import COMMON, wait_for

    events = tmp_path / "events.log"
    for node in ("n1", "n2"):
        kube.add_node(node)
        kube.add_pod("web", f"web-{node}", node, labels={"app": "web"}, owner=("ReplicaSet", "w"))
    extra = (
        *COMMON,
        "--lock-backend",
        "kubernetes",
        "--kubeconfig",
        str(kubeconfig),
        "--drain-timeout",
        "30s",
        "--drain-grace-period",
        "0",
        "--post-reboot-node-labels",
        "example.com/rebooted=yes",
    )
    hosts = [Host(tmp_path, node, "http://127.0.0.1:9", events, *extra) for node in ("n1", "n2")]
    for h in hosts:
        h.sentinel.touch()
    try:
        for h in hosts:
            h.start()

        def settled() -> bool:
            reboots = sum(1 for e in read_events(events) if e[2] == "reboot")
            return reboots == 2 and kube.annotation(NS, DS, KEY) is None

        assert wait_for(settled, 45), (read_events(events), hosts[0].log()[-1500:])
        assert wait_for(
            lambda: all(
                not cordoned(kube, n)
                and kube.node(n)["metadata"]["labels"].get("example.com/rebooted") == "yes"
                for n in ("n1", "n2")
            ),
            15,
        )
        assert mark(kube, "n1") is None
        assert mark(kube, "n2") is None
        history = [v for v in kube.annotation_history(NS, DS, KEY) if v is not None]
        holders = [parse(v).entries[0].node_id for v in history]
        # One holder at a time: the lock went to one node, was released, then to the other.
        assert [k for k, _ in itertools.groupby(holders)] in (["n1", "n2"], ["n2", "n1"])
        assert all(e.grace_period_seconds == 0 for e in kube.evictions)
    finally:
        for h in hosts:
            h.stop()


async def test_the_double_replaces_controller_pods_like_their_controllers(
    kube: KubeDouble, api: ApiServer
) -> None:
    """The double's own contract (its docstring): a ReplicaSet pod is replaced under a new name
    as soon as it terminates, a StatefulSet pod under the same name with a new UID once gone,
    an unmanaged pod not at all; grace 0 or not."""
    kube.add_node("n1")
    kube.add_node("n2")
    kube.add_pod("a", "rs-x", "n1", owner=("ReplicaSet", "rs"))
    kube.add_pod("a", "sts-0", "n1", owner=("StatefulSet", "sts"))
    kube.add_pod("a", "bare", "n1")
    sts_uid = kube.pod("a", "sts-0")["metadata"]["uid"]  # type: ignore[index]
    for name in ("rs-x", "sts-0", "bare"):
        await api.evict_pod("a", name, 0)
    pods = {p["metadata"]["name"]: p for p in kube.pods()}
    assert sorted(pods) == ["rs-r0001", "sts-0"]
    assert pods["rs-r0001"]["spec"]["nodeName"] == "n2"
    assert pods["sts-0"]["metadata"]["uid"] != sts_uid
    assert pods["sts-0"]["spec"]["nodeName"] == "n2"


async def test_the_double_answers_with_real_status_errors(
    kube: KubeDouble, api: ApiServer, tmp_path: Path
) -> None:
    """Through the real client: 422 Invalid for what a real server refuses, 404 NotFound,
    401 without the token - each translated once into ``ApiError``."""
    from kured.apiserver import JSON_PATCH, MERGE_PATCH
    from kured.core.errors import ApiError

    kube.add_node("n1")
    with pytest.raises(ApiError) as invalid:
        await api.patch_node("n1", {"metadata": {"labels": {"bad key!": "x"}}}, MERGE_PATCH)
    assert (invalid.value.status, invalid.value.reason) == (422, "Invalid")
    with pytest.raises(ApiError) as missing_path:
        await api.patch_node("n1", [{"op": "remove", "path": "/metadata/labels/nope"}], JSON_PATCH)
    assert missing_path.value.status == 422
    with pytest.raises(ApiError) as gone:
        await api.get_node("n9")
    assert (gone.value.status, gone.value.reason) == (404, "NotFound")
    assert 'nodes "n9" not found' in gone.value.message
    stranger = KubeDouble(token="another")
    stranger.url = kube.url
    other = ApiServer.connect(stranger.kubeconfig(tmp_path / "stranger"))
    try:
        with pytest.raises(ApiError) as unauthorized:
            await other.get_node("n1")
    finally:
        await other.close()
    assert (unauthorized.value.status, unauthorized.value.reason) == (401, "Unauthorized")
    assert kube.node("n1")["metadata"]["labels"] == {"kubernetes.io/hostname": "n1"}
