"""Everything the agent does to its own Node object with the Kubernetes backend: the drain
(``kured.actuators.drain``), kured's node labels and kured's node annotations.

* ``--pre-reboot-node-labels`` go on before the cordon, ``--post-reboot-node-labels`` when the
  agent gives the lock back after preparing the node (after the reboot, after a failed drain).
  Each is one JSON merge patch of ``metadata.labels``.

  Where we differ from kured (#1328): kured applies the post labels only after *it* uncordoned
  the node, so a node that was cordoned before kured took the lock keeps its pre labels for
  ever (``reboot-pending=true`` after the reboot is done). The labels describe the reboot, not
  schedulability, and the pre labels went on regardless of the cordon, so here the post labels
  go on after every reboot; the node itself stays cordoned as its operator left it.
* ``--annotate-nodes``: ``weave.works/kured-reboot-in-progress`` and
  ``weave.works/kured-most-recent-reboot-needed`` are written together, with one RFC 3339
  timestamp (UTC, seconds), when a reboot is needed inside the window and the in-progress one
  is absent - before the gates run, so "most recent reboot needed" records the first time it
  was seen even if the reboot was then blocked (kured PR #749). In-progress is removed after
  the reboot once the sentinel is gone; most-recent is never removed.
* ``--prefer-no-schedule-taint KEY``: while the node needs a reboot and waits for the lock, the
  taint ``KEY:PreferNoSchedule`` asks the scheduler to put new pods elsewhere (they would only
  be evicted again by this node's drain); it is removed once no reboot is pending (after the
  reboot, or when the sentinel or the window says no), as kured does.

Methods raise ``DrainError`` (cordon, drain, uncordon) or ``ApiError`` (labels, annotations);
both are ``KuredError``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

from kit.clock import Clock
from kured.actuators.drain import Drainer, DrainOptions, DrainReport
from kured.apiserver import MERGE_PATCH, ApiServer
from kured.core.errors import ApiError

log = logging.getLogger(__name__)

REBOOT_IN_PROGRESS_ANNOTATION = "weave.works/kured-reboot-in-progress"
MOST_RECENT_REBOOT_NEEDED_ANNOTATION = "weave.works/kured-most-recent-reboot-needed"

Labels = tuple[tuple[str, str], ...]
PREFER = "PreferNoSchedule"
TAINT_ATTEMPTS = 5


@dataclass(frozen=True)
class NodeOptions:
    """kured's node bookkeeping flags."""

    pre_reboot_labels: Labels = ()
    post_reboot_labels: Labels = ()
    annotate: bool = False  # --annotate-nodes
    prefer_no_schedule_taint: str = ""  # --prefer-no-schedule-taint; '' = off


def annotation_time(at: datetime) -> str:
    """kured's annotation timestamp: RFC 3339, whole seconds, UTC."""
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class KubernetesNode:
    """This node's Kubernetes object, as the agent changes it (see the module docstring)."""

    def __init__(
        self,
        api: ApiServer,
        node_id: str,
        drain: DrainOptions,
        options: NodeOptions,
        clock: Clock | None = None,
    ) -> None:
        self._api = api
        self.node_id = node_id
        self.options = options
        self.drainer = Drainer(api, node_id, drain, clock)

    # -- cordon and drain (kured.actuators.drain) ------------------------------------------------

    async def unschedulable(self) -> bool:
        return await self.drainer.unschedulable()

    async def cordon(self) -> bool:
        return await self.drainer.cordon()

    async def uncordon(self) -> None:
        await self.drainer.uncordon()

    async def undo_own_cordon(self) -> bool:
        return await self.drainer.undo_own_cordon()

    async def drain(self) -> DrainReport:
        return await self.drainer.drain()

    async def undo_orphaned_cordon(self) -> bool:
        return await self.drainer.undo_orphaned_cordon()

    # -- labels ----------------------------------------------------------------------------------

    async def apply_labels(self, when: str) -> bool:
        """Apply the ``"pre"`` or ``"post"`` reboot labels; False when there are none."""
        labels = (
            self.options.pre_reboot_labels if when == "pre" else self.options.post_reboot_labels
        )
        if not labels:
            return False
        await self._patch({"metadata": {"labels": dict(labels)}})
        return True

    # -- annotations -----------------------------------------------------------------------------

    async def note_reboot_needed(self, at: datetime) -> bool:
        """With ``--annotate-nodes``, write both annotations stamped ``at`` unless a reboot is
        already marked in progress. Returns whether it wrote."""
        if not self.options.annotate:
            return False
        node = await self._api.get_node(self.node_id)
        annotations = (node.get("metadata") or {}).get("annotations") or {}
        if REBOOT_IN_PROGRESS_ANNOTATION in annotations:
            return False
        stamp = annotation_time(at)
        await self._patch(
            {
                "metadata": {
                    "annotations": {
                        REBOOT_IN_PROGRESS_ANNOTATION: stamp,
                        MOST_RECENT_REBOOT_NEEDED_ANNOTATION: stamp,
                    }
                }
            }
        )
        return True

    async def clear_reboot_in_progress(self) -> bool:
        """With ``--annotate-nodes``, remove the in-progress annotation (absent is fine)."""
        if not self.options.annotate:
            return False
        await self._patch({"metadata": {"annotations": {REBOOT_IN_PROGRESS_ANNOTATION: None}}})
        return True

    # -- the PreferNoSchedule taint ----------------------------------------------------------------

    async def prefer_no_schedule(self, on: bool) -> bool:
        """With ``--prefer-no-schedule-taint``, add (``on``) or remove our taint (that key,
        effect ``PreferNoSchedule``, no value: kured's ``internal/taints``). Returns whether it
        wrote. Other taints are kept: the patch carries the node's ``resourceVersion`` and a
        409 is re-read. Raises ``ApiError``."""
        key = self.options.prefer_no_schedule_taint
        if not key:
            return False
        for _ in range(TAINT_ATTEMPTS):
            node = await self._api.get_node(self.node_id)
            taints = list((node.get("spec") or {}).get("taints") or [])
            ours = [t for t in taints if t.get("key") == key and t.get("effect") == PREFER]
            if bool(ours) == on:
                return False
            kept = [t for t in taints if t not in ours]
            patch = {
                "metadata": {
                    "resourceVersion": (node.get("metadata") or {}).get("resourceVersion")
                },
                "spec": {"taints": [*kept, {"key": key, "effect": PREFER}] if on else kept},
            }
            try:
                await self._patch(patch)
            except ApiError as exc:
                if exc.conflict:
                    continue
                raise
            log.info(
                "%s taint %s:%s on node %s", "added" if on else "removed", key, PREFER, self.node_id
            )
            return True
        raise ApiError(f"cannot change the taints of node {self.node_id}: it kept changing")

    async def _patch(self, patch: dict[str, object]) -> None:
        await self._api.patch_node(self.node_id, patch, MERGE_PATCH)


def label_keys_differ(pre: Sequence[tuple[str, str]], post: Sequence[tuple[str, str]]) -> bool:
    """kured warns when the pre and post label keys differ (a post label then never undoes
    its pre label)."""
    return sorted(k for k, _ in pre) != sorted(k for k, _ in post)
