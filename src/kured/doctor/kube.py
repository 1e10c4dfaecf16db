"""With a kubeconfig (or in-cluster): the pods on this node that a drain could never evict now
(``kured doctor``'s ``pdb`` check), and the cluster's node names for the scrape count.

The pods are the drain's own: every pod on ``--node-id`` that has not finished
(``kured.sensors.pods.field_selector``), limited by ``--drain-pod-selector``, minus the ones the
drain leaves alone (``kured.actuators.drain.skip_reason``: DaemonSet pods, mirror pods, pods
terminating past ``--skip-wait-for-delete-timeout``). Only a Running pod that is not
terminating is subject to budgets; the eviction API deletes the others without asking
(https://kubernetes.io/docs/concepts/scheduling-eviction/api-eviction/).

For each such pod, the policy/v1 PodDisruptionBudgets of its namespace whose ``selector``
selects it (``matchLabels`` and ``matchExpressions``; an empty selector selects every pod, a
missing one none) are read with their ``status``. A budget whose ``status.disruptionsAllowed``
is 0 (or that has no status yet, which the eviction API refuses too) makes that pod's eviction
a 429 now, so the drain waits until ``--drain-timeout`` — for ever by default: a FAIL naming
the pod and the budget. Two budgets on one pod are a FAIL as well: the eviction API answers 500
to every eviction of it.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from kured.actuators.drain import skip_reason
from kured.apiserver import ApiServer
from kured.core.errors import ApiError
from kured.doctor.finding import Finding, fail, ok
from kured.sensors.pods import field_selector
from kured.settings import Settings

CHECK = "pdb"


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """policy/v1 LabelSelector semantics (see the module docstring)."""
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr.get("key"), expr.get("operator"), expr.get("values") or []
        present = key in labels
        if op == "In" and not (present and labels[key] in values):
            return False
        if op == "NotIn" and present and labels[key] in values:
            return False
        if op == "Exists" and not present:
            return False
        if op == "DoesNotExist" and present:
            return False
    return True


def _name(obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


async def node_names(api: ApiServer) -> list[str]:
    """Every Node's name, sorted. Raises ``ApiError``."""
    return sorted(str((n.get("metadata") or {}).get("name", "")) for n in await api.list_nodes())


async def check_pdbs(api: ApiServer, s: Settings) -> list[Finding]:
    """The ``pdb`` findings for node ``s.node_id``."""
    try:
        pods = await api.list_pods(
            label_selector=s.drain_pod_selector, field_selector=field_selector(s.node_id)
        )
        budgets = await api.list_pod_disruption_budgets()
    except ApiError as exc:
        return [
            fail(
                CHECK,
                f"cannot read pods or PodDisruptionBudgets: {exc.message}",
                "check --kubeconfig and that kured's RBAC allows list on pods and "
                "policy/poddisruptionbudgets.",
            )
        ]
    now = time.time()
    findings: list[Finding] = []
    subject = 0
    for pod in pods:
        meta = pod.get("metadata") or {}
        if skip_reason(pod, s.skip_wait_for_delete_timeout, now) is not None:
            continue
        if (pod.get("status") or {}).get("phase") != "Running" or meta.get("deletionTimestamp"):
            continue
        subject += 1
        labels = meta.get("labels") or {}
        covering = [
            b
            for b in budgets
            if (b.get("metadata") or {}).get("namespace") == meta.get("namespace")
            and selects((b.get("spec") or {}).get("selector"), labels)
        ]
        if len(covering) > 1:
            findings.append(
                fail(
                    CHECK,
                    f"pod {_name(pod)} on node {s.node_id} is selected by "
                    f"{len(covering)} PodDisruptionBudgets ("
                    + ", ".join(_name(b) for b in covering)
                    + "): the eviction API refuses every eviction of it (500).",
                    "keep one budget per pod: narrow the budgets' selectors.",
                )
            )
            continue
        for budget in covering:
            status = budget.get("status")
            allowed = int((status or {}).get("disruptionsAllowed") or 0)
            if allowed > 0:
                continue
            figures = (
                f"currentHealthy {status.get('currentHealthy')}, desiredHealthy "
                f"{status.get('desiredHealthy')}"
                if status
                else "no status yet"
            )
            findings.append(
                fail(
                    CHECK,
                    f"pod {_name(pod)} on node {s.node_id} cannot be evicted now: "
                    f"PodDisruptionBudget {_name(budget)} allows 0 disruptions ({figures}); "
                    "a drain waits for it "
                    + (
                        f"until --drain-timeout {s.drain_timeout:g}s"
                        if s.drain_timeout
                        else "for ever (--drain-timeout 0)"
                    )
                    + ".",
                    f"add a replica or relax {_name(budget)} (minAvailable/maxUnavailable), "
                    "leave the pod to its operator with --drain-pod-selector, or accept a "
                    "forced reboot (--drain-timeout with --force-reboot).",
                )
            )
    if not findings:
        findings.append(
            ok(
                CHECK,
                f"every pod a drain of node {s.node_id} would evict can be evicted now "
                f"({subject} subject to budgets, {len(budgets)} budgets in the cluster)",
            )
        )
    return findings
