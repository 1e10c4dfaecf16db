"""The blocking-pod gate through the official client against the Kubernetes API double: kured's
selector semantics, finished pods not blocking (B37, kured #227), fail-closed on API errors,
and a blocked node never sitting on the lock (B37, kured #792)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from kured.apiserver import ApiServer
from kured.core.policy import Action, Why
from kured.sensors.pods import BlockingPodGate, field_selector
from tests.kured.conftest import LOCK_ANNOTATION, LOCK_DAEMONSET, LOCK_NAMESPACE
from tests.kured.k8s_double import KubeDouble
from tests.kured.kube_agent import KubeHost


@pytest.fixture
async def api(kubeconfig: Path) -> AsyncIterator[ApiServer]:
    server = ApiServer.connect(kubeconfig, request_timeout_seconds=5)
    yield server
    await server.close()


def test_the_field_selector_is_this_node_and_unfinished_pods() -> None:
    assert field_selector("n1") == "spec.nodeName=n1,status.phase!=Succeeded,status.phase!=Failed"


@pytest.mark.parametrize(
    ("phase", "blocks"),
    [
        ("Running", True),
        ("Pending", True),
        ("Unknown", True),
        ("Succeeded", False),
        ("Failed", False),
    ],
)
async def test_only_unfinished_pods_block(
    kube: KubeDouble, api: ApiServer, phase: str, blocks: bool
) -> None:
    kube.add_pod("backup", "backup-123", "n1", labels={"job-name": "backup"}, phase=phase)
    result = await BlockingPodGate(api, "n1", ["job-name"]).check()
    assert result.blocking is blocks
    if blocks:
        assert result.detail == (
            f"pods matching 'job-name' on this node: backup/backup-123 ({phase})"
        )


async def test_pods_on_other_nodes_or_with_other_labels_do_not_block(
    kube: KubeDouble, api: ApiServer
) -> None:
    kube.add_pod("a", "elsewhere", "n2", labels={"app": "db"})
    kube.add_pod("a", "other-label", "n1", labels={"app": "web"})
    assert (await BlockingPodGate(api, "n1", ["app=db"]).check()).blocking is False


async def test_selectors_are_ored_and_commas_inside_one_mean_and(
    kube: KubeDouble, api: ApiServer
) -> None:
    kube.add_pod("a", "db", "n1", labels={"app": "db", "tier": "primary"})
    assert (await BlockingPodGate(api, "n1", ["app=db,tier=replica"]).check()).blocking is False
    assert (await BlockingPodGate(api, "n1", ["app=db,tier=primary"]).check()).blocking is True
    either = await BlockingPodGate(api, "n1", ["app=web", "tier in (primary)"]).check()
    assert either.blocking is True
    assert "'tier in (primary)'" in either.detail


async def test_an_api_error_fails_closed(kube: KubeDouble, api: ApiServer, tmp_path: Path) -> None:
    refused = await BlockingPodGate(api, "n1", ["app in (unclosed"]).check()
    assert refused.blocking is None
    assert "HTTP 400" in refused.detail
    dead = KubeDouble()
    dead.url = "http://127.0.0.1:9"
    down_api = ApiServer.connect(dead.kubeconfig(tmp_path / "dead"), request_timeout_seconds=2)
    try:
        down = await BlockingPodGate(down_api, "n1", ["app=db"]).check()
    finally:
        await down_api.close()
    assert down.blocking is None
    assert "cannot list pods" in down.detail


async def test_a_blocked_node_does_not_take_the_lock_and_reboots_once_the_pod_finished(
    kube: KubeDouble, hosts: Callable[..., KubeHost]
) -> None:
    """B37: node-a has a running backup pod, node-b does not; both need a reboot."""
    kube.add_node("node-a")
    kube.add_node("node-b")
    kube.add_pod("backup", "backup-1", "node-a", labels={"job-name": "backup"})
    a = hosts("node-a", blocking_pod_selectors=("job-name",))
    b = hosts("node-b", blocking_pod_selectors=("job-name",))
    a.sentinel.touch()
    b.sentinel.touch()
    agent_a, agent_b = await a.boot(), await b.boot()

    decision = await agent_a.tick()
    assert decision.action is Action.NOTHING
    assert decision.why is Why.GATE_BLOCKED
    assert "backup/backup-1" in decision.first
    assert kube.annotation(LOCK_NAMESPACE, LOCK_DAEMONSET, LOCK_ANNOTATION) is None
    assert (await agent_b.tick()).action is Action.REBOOT
    assert b.rebooter.calls == 1
    await (await b.boot()).tick()  # node-b back: releases
    assert kube.annotation(LOCK_NAMESPACE, LOCK_DAEMONSET, LOCK_ANNOTATION) is None

    kube.set_pod_phase("backup", "backup-1", "Succeeded")  # the job finished
    assert (await agent_a.tick()).action is Action.REBOOT
    assert a.rebooter.calls == 1
