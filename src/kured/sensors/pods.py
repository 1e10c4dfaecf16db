"""The blocking-pod gate (``--blocking-pod-selector``, repeatable; kured-behaviour.md §2.7).

For each selector in order, pods in **all namespaces** matching it and running on this node
are listed with the field selector ``spec.nodeName=<node>,status.phase!=Succeeded,
status.phase!=Failed``; the first selector that finds any blocks the reboot, naming up to
``MAX_SHOWN`` pods. Separate selectors are ORed; commas inside one selector mean AND (the
Kubernetes label-selector syntax, evaluated by the API server).

Finished pods (``Succeeded``, ``Failed``) never block: a completed CronJob pod must not stop
reboots forever (kured #227, field report B37). ``Unknown`` pods **do** block, unlike kured,
which excludes them too: ``Unknown`` means the kubelet cannot report the pod, not that it
finished, and B37's rule is that only finished pods stop counting.

Fail-closed: any API error (unreachable, timeout, a selector the server refuses) makes the
gate "unknown", which blocks, with the reason. ``check()`` never raises.
"""

from __future__ import annotations

from collections.abc import Sequence

from kured.apiserver import ApiServer
from kured.core.errors import ApiError
from kured.core.policy import GateResult

FINISHED_PHASES = ("Succeeded", "Failed")
MAX_SHOWN = 10


def field_selector(node_id: str) -> str:
    """The field selector for pods on ``node_id`` that have not finished."""
    return ",".join([f"spec.nodeName={node_id}", *(f"status.phase!={p}" for p in FINISHED_PHASES)])


class BlockingPodGate:
    """Blocks while a pod matching one of ``selectors`` runs (or waits to run) on the node."""

    name = "pods"

    def __init__(self, api: ApiServer, node_id: str, selectors: Sequence[str]) -> None:
        if not selectors:
            raise ValueError("at least one selector is required")
        self._api = api
        self.node_id = node_id
        self.selectors = tuple(selectors)

    async def check(self) -> GateResult:
        fields = field_selector(self.node_id)
        for selector in self.selectors:
            try:
                pods = await self._api.list_pods(
                    label_selector=selector,
                    field_selector=fields,
                    limit=MAX_SHOWN,
                    max_items=MAX_SHOWN,
                )
            except ApiError as exc:
                return GateResult(
                    self.name, None, f"cannot list pods for selector {selector!r}: {exc.message}"
                )
            if pods:
                shown = ", ".join(
                    f"{(p.get('metadata') or {}).get('namespace', '')}/"
                    f"{(p.get('metadata') or {}).get('name', '')}"
                    f" ({(p.get('status') or {}).get('phase', 'no phase')})"
                    for p in pods
                )
                return GateResult(
                    self.name, True, f"pods matching {selector!r} on this node: {shown}"
                )
        return GateResult(self.name, False, "no blocking pods")
