"""``kured doctor``'s ``pdb`` check against the Kubernetes API double (tests/kured/k8s_double.py,
whose PodDisruptionBudgets carry the controller's ``status.disruptionsAllowed``): it names a pod
whose budget allows 0 disruptions, with the budget, and passes once the budget allows 1."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from kured.apiserver import ApiServer
from kured.core.errors import ApiError
from tests.kured.doctor_host import good_apt, in_process, release
from tests.kured.k8s_double import KubeDouble

# pytest finds fixtures by name in the module (``release`` is used by name below).
__all__ = ["good_apt", "release"]
pytestmark = pytest.mark.usefixtures("good_apt")


def run_doctor(
    capsys: pytest.CaptureFixture[str], release: str, *args: str
) -> tuple[int, dict[str, Any]]:
    return in_process(capsys, release, "--lock-backend", "kubernetes", *args)


async def refused_eviction(kubeconfig: Path, namespace: str, name: str) -> str:
    api = ApiServer.connect(str(kubeconfig))
    try:
        with pytest.raises(ApiError) as refused:
            await api.evict_pod(namespace, name)
    finally:
        await api.close()
    assert refused.value.too_many_requests, refused.value.message
    return refused.value.message


def pdb(report: dict[str, Any]) -> list[tuple[str, str]]:
    return [(f["level"], f["message"]) for f in report["findings"] if f["check"] == "pdb"]


@pytest.fixture
def cluster(kube: KubeDouble) -> KubeDouble:
    kube.add_node("n1")
    kube.add_node("n2")
    # A database primary: one replica, a budget that keeps it.
    kube.add_pod(
        "db", "postgres-0", "n1", labels={"app": "postgres"}, owner=("StatefulSet", "postgres")
    )
    kube.add_pdb("db", "postgres-pdb", {"app": "postgres"}, min_available=1)
    # Noise the check must ignore: a DaemonSet pod under a 0 budget, the same budget's pod on
    # another node, a finished pod.
    kube.add_pod(
        "kube-system", "agent-x", "n1", labels={"app": "agent"}, owner=("DaemonSet", "agent")
    )
    kube.add_pdb("kube-system", "agent-pdb", {"app": "agent"}, max_unavailable=0)
    kube.add_pod("web", "web-a", "n2", labels={"app": "web"})
    kube.add_pdb("web", "web-pdb", {"app": "web"}, max_unavailable=0)
    kube.add_pod("web", "job-1", "n1", labels={"app": "web"}, phase="Succeeded")
    return kube


def test_the_api_reports_each_budgets_disruptions_allowed(
    cluster: KubeDouble, kubeconfig: Path
) -> None:
    async def read() -> dict[str, int]:
        api = ApiServer.connect(str(kubeconfig))
        try:
            budgets = await api.list_pod_disruption_budgets()
        finally:
            await api.close()
        return {b["metadata"]["name"]: b["status"]["disruptionsAllowed"] for b in budgets}

    assert asyncio.run(read()) == {"postgres-pdb": 0, "agent-pdb": 0, "web-pdb": 0}
    cluster.add_pod(
        "db", "postgres-1", "n2", labels={"app": "postgres"}, owner=("StatefulSet", "postgres")
    )
    assert asyncio.run(read())["postgres-pdb"] == 1


def test_names_the_pod_a_drain_could_never_evict_and_passes_once_the_budget_allows_one(
    cluster: KubeDouble, kubeconfig: Path, capsys: pytest.CaptureFixture[str], release: str
) -> None:
    code, report = run_doctor(capsys, release, "--kubeconfig", str(kubeconfig))
    [(level, message)] = pdb(report)
    assert level == "FAIL"
    assert message.startswith(
        "pod db/postgres-0 on node n1 cannot be evicted now: PodDisruptionBudget "
        "db/postgres-pdb allows 0 disruptions (currentHealthy 1, desiredHealthy 1)"
    ), message
    assert "for ever (--drain-timeout 0)" in message
    assert code == 1
    # The eviction agrees: it is refused with 429, naming the same budget.
    assert "postgres-pdb" in asyncio.run(refused_eviction(kubeconfig, "db", "postgres-0"))
    # The budget now allows one disruption.
    cluster.add_pdb("db", "postgres-pdb", {"app": "postgres"}, max_unavailable=1)
    code, report = run_doctor(capsys, release, "--kubeconfig", str(kubeconfig))
    [(level, message)] = pdb(report)
    assert level == "OK", message
    assert "every pod a drain of node n1 would evict can be evicted now (1 subject" in message
    assert code == 0


def test_a_drain_pod_selector_that_leaves_the_pod_alone_passes(
    cluster: KubeDouble, kubeconfig: Path, capsys: pytest.CaptureFixture[str], release: str
) -> None:
    code, report = run_doctor(
        capsys, release, "--kubeconfig", str(kubeconfig), "--drain-pod-selector", "app!=postgres"
    )
    assert [level for level, _ in pdb(report)] == ["OK"]
    assert code == 0


def test_two_budgets_on_one_pod_fail_and_unreadable_budgets_fail(
    cluster: KubeDouble, kubeconfig: Path, capsys: pytest.CaptureFixture[str], release: str
) -> None:
    cluster.add_pod("web", "web-b", "n1", labels={"app": "web", "tier": "front"})
    cluster.add_pdb("web", "front-pdb", {"tier": "front"}, max_unavailable=1)
    _code, report = run_doctor(capsys, release, "--kubeconfig", str(kubeconfig))
    messages = [m for level, m in pdb(report) if level == "FAIL"]
    assert any(
        m.startswith("pod web/web-b on node n1 is selected by 2 PodDisruptionBudgets")
        and "front-pdb" in m
        and "web-pdb" in m
        for m in messages
    ), messages
    # Wrong credentials: the API answers 401, and the check says it could not read.
    bad = kubeconfig.parent / "bad-kubeconfig"
    bad.write_text(kubeconfig.read_text().replace(cluster.token, "wrong-token"))
    code, report = run_doctor(capsys, release, "--kubeconfig", str(bad))
    [(level, message)] = pdb(report)
    assert level == "FAIL"
    assert "HTTP 401" in message, message
    assert code == 1
