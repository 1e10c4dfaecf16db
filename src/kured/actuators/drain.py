"""Cordon, drain and uncordon this node through the Kubernetes API (kured-behaviour.md §2.8).

* **Cordon** sets ``spec.unschedulable`` and, only when the node was schedulable until then,
  marks the cordon as ours with the annotation ``kured.kura.dev/cordoned-by: <node>`` in the
  same patch. The patch carries the node's ``resourceVersion``, so a cordon by someone else
  between our read and our write is a 409 and is re-read, never claimed. kured marks nothing,
  so an orphaned kured cordon cannot be told from an operator's (kured #63); ours can, and
  ``undo_orphaned_cordon`` undoes it.
* **Uncordon** clears ``spec.unschedulable`` and our mark. The caller decides *whether*: kured's
  rule is "only if the lock record says the node was schedulable when the lock was taken".
  ``undo_own_cordon`` adds the mark to that rule: a cordon without our mark is someone else's
  and stays, also when the record says schedulable. kured's record is read before the lock is
  taken, so a cordon an operator sets after that and before kured's own (during
  ``--drain-delay``, the pre-reboot labels, a slow drain notification) was undone after the
  reboot (field report B41: "a node cordoned by someone else stays cordoned").
* **Drain** lists every pod on the node and evicts each through the policy/v1 Eviction
  subresource, except DaemonSet-managed pods (they would come straight back; kured's
  ``IgnoreAllDaemonSets``) and mirror pods (the kubelet owns them). Unmanaged, emptyDir and
  finished pods are evicted, as kured's drain does with ``Force`` and ``DeleteEmptyDirData``.
  A pod whose ``deletionTimestamp`` is older than ``--skip-wait-for-delete-timeout`` (> 0) is
  neither evicted nor waited for.

  Each pod is handled concurrently: an eviction refused with **429** (a PodDisruptionBudget
  allows no disruption now) is retried after a pause that starts at 1 s and doubles up to 16 s
  (kured retries back-to-back, kubectl every 5 s; field report B38 asks for spaced retries,
  each logged with the pod and the budget's message). 404 means the pod is gone: done. Any
  other refusal fails the drain at once. After an accepted eviction the pod is polled every
  second until it is gone or replaced by one with another UID (a StatefulSet recreates the
  same name), like kubectl.

  ``--drain-timeout`` bounds the evictions and waits together (not the cordon); 0 means no
  bound. When it runs out, ``DrainError`` names every pod still on the node with the last
  answer about it. Pods evicted before the failure are not put back (nothing can).

``--drain-pod-selector`` limits the drain to the pods matching that label selector (kubectl's
``PodSelector``, as kured passes it); the others stay on the node through the reboot.

``--drain-grace-period``: a value ≥ 0 goes into each eviction's delete options (0 kills at
once); a negative one leaves each pod's own ``terminationGracePeriodSeconds``.

Every method raises ``DrainError`` on API failure (translated from ``ApiError``) and is safe to
call from one task at a time per node. Time (the pauses, the polls, ``--drain-timeout``, the age
of a terminating pod) is the injected clock's (``kit.clock``), so drains run on virtual time.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from kit.backoff import Backoff
from kit.clock import Clock, SystemClock
from kured.apiserver import MERGE_PATCH, ApiServer, JsonObject
from kured.core.errors import ApiError, DrainError

log = logging.getLogger(__name__)

CORDON_ANNOTATION = "kured.kura.dev/cordoned-by"
MIRROR_ANNOTATION = "kubernetes.io/config.mirror"
# Pods per page when listing the node's pods.
LIST_PAGE = 250
# Cordon/uncordon patches lost to a concurrent node update are re-read this many times.
CORDON_ATTEMPTS = 5


@dataclass(frozen=True)
class DrainOptions:
    """kured's drain flags. Seconds throughout."""

    timeout_seconds: float = 0.0  # --drain-timeout; 0 = no bound
    grace_period_seconds: int = -1  # --drain-grace-period; negative = each pod's own
    skip_wait_for_delete_timeout_seconds: int = 0  # --skip-wait-for-delete-timeout; 0 = off
    pod_selector: str = ""  # --drain-pod-selector; '' = every pod
    poll_interval_seconds: float = 1.0  # kubectl's wait poll
    backoff_initial_seconds: float = 1.0  # first pause after a 429
    backoff_cap_seconds: float = 16.0


@dataclass
class DrainReport:
    """What a drain did: pods as ``namespace/name``, in the order handled."""

    evicted: list[str] = field(default_factory=list)
    skipped: dict[str, str] = field(default_factory=dict)  # pod -> why
    refusals: int = 0  # 429 answers seen


def _name(pod: Mapping[str, Any]) -> str:
    meta = pod.get("metadata") or {}
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _parse_time(text: str) -> float | None:
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC).timestamp()
    except (TypeError, ValueError):
        try:
            return datetime.fromisoformat(text).timestamp()
        except (TypeError, ValueError):
            return None


def skip_reason(pod: Mapping[str, Any], skip_wait_seconds: int, now: float) -> str | None:
    """Why the drain leaves ``pod`` alone, or None to evict it."""
    meta = pod.get("metadata") or {}
    if MIRROR_ANNOTATION in (meta.get("annotations") or {}):
        return "mirror pod"
    for owner in meta.get("ownerReferences") or []:
        if owner.get("controller") and owner.get("kind") == "DaemonSet":
            return "managed by DaemonSet " + str(owner.get("name", ""))
    deleted = meta.get("deletionTimestamp")
    if deleted and skip_wait_seconds > 0:
        at = _parse_time(str(deleted))
        if at is not None and now - at > skip_wait_seconds:
            return f"terminating for over {skip_wait_seconds}s (--skip-wait-for-delete-timeout)"
    return None


class Drainer:
    """Cordon, drain and uncordon node ``node_id`` (see the module docstring)."""

    def __init__(
        self, api: ApiServer, node_id: str, options: DrainOptions, clock: Clock | None = None
    ) -> None:
        self._api = api
        self.node_id = node_id
        self.options = options
        self.clock: Clock = clock or SystemClock()

    # -- the node --------------------------------------------------------------------------------

    async def node(self) -> JsonObject:
        """This node as JSON. Raises ``DrainError``."""
        try:
            return await self._api.get_node(self.node_id)
        except ApiError as exc:
            raise DrainError(f"cannot read node {self.node_id}: {exc.message}") from exc

    async def unschedulable(self) -> bool:
        """Whether the node is cordoned now. Raises ``DrainError``."""
        return bool(((await self.node()).get("spec") or {}).get("unschedulable"))

    async def cordoned_by_us(self) -> bool:
        """True when the node is cordoned and carries our mark. Raises ``DrainError``."""
        node = await self.node()
        annotations = (node.get("metadata") or {}).get("annotations") or {}
        unschedulable = bool((node.get("spec") or {}).get("unschedulable"))
        return unschedulable and annotations.get(CORDON_ANNOTATION) == self.node_id

    async def cordon(self) -> bool:
        """Cordon the node; returns whether it was already cordoned (then nothing is written
        and no mark is set: that cordon is not ours). Raises ``DrainError``."""
        for _ in range(CORDON_ATTEMPTS):
            node = await self.node()
            meta = node.get("metadata") or {}
            if (node.get("spec") or {}).get("unschedulable"):
                return True
            patch = {
                "metadata": {
                    "resourceVersion": meta.get("resourceVersion"),
                    "annotations": {CORDON_ANNOTATION: self.node_id},
                },
                "spec": {"unschedulable": True},
            }
            try:
                await self._api.patch_node(self.node_id, patch, MERGE_PATCH)
            except ApiError as exc:
                if exc.conflict:
                    continue  # the node changed since we read it: look again
                raise DrainError(f"cannot cordon node {self.node_id}: {exc.message}") from exc
            log.info("cordoned node %s", self.node_id)
            return False
        raise DrainError(f"cannot cordon node {self.node_id}: it kept changing under us")

    async def uncordon(self) -> None:
        """Make the node schedulable and drop our mark. Raises ``DrainError``."""
        patch = {
            "metadata": {"annotations": {CORDON_ANNOTATION: None}},
            "spec": {"unschedulable": None},
        }
        try:
            await self._api.patch_node(self.node_id, patch, MERGE_PATCH)
        except ApiError as exc:
            raise DrainError(f"cannot uncordon node {self.node_id}: {exc.message}") from exc
        log.info("uncordoned node %s", self.node_id)

    async def undo_own_cordon(self) -> bool:
        """Uncordon the node if the cordon is ours (see the module docstring, B41). True when
        the node is schedulable afterwards; False when it stays cordoned because the cordon
        carries no mark of ours (logged). Raises ``DrainError``."""
        node = await self.node()
        if not (node.get("spec") or {}).get("unschedulable"):
            return True
        annotations = (node.get("metadata") or {}).get("annotations") or {}
        if annotations.get(CORDON_ANNOTATION) != self.node_id:
            log.warning(
                "node %s is cordoned, but not by kured (no %s mark): someone cordoned it after "
                "the lock was taken; leaving it cordoned",
                self.node_id,
                CORDON_ANNOTATION,
            )
            return False
        await self.uncordon()
        return True

    async def undo_orphaned_cordon(self) -> bool:
        """Uncordon the node if it carries a cordon of ours; the caller has checked that this
        node holds no lock (so no reboot of ours is in progress). Returns whether it did.
        Raises ``DrainError``."""
        if not await self.cordoned_by_us():
            return False
        log.warning(
            "node %s is still cordoned by an earlier kured run that no longer holds the lock: "
            "uncordoning it",
            self.node_id,
        )
        await self.uncordon()
        return True

    # -- the drain -------------------------------------------------------------------------------

    async def drain(self) -> DrainReport:
        """Evict every pod of the node that a drain should and wait until they are gone (see
        the module docstring). Raises ``DrainError`` on timeout or refusal; the node's cordon
        is left as it is for the caller to decide."""
        report = DrainReport()
        last_word: dict[str, str] = {}
        pending: set[str] = set()
        timeout = self.options.timeout_seconds or None
        started = self.clock.monotonic()
        try:
            async with self.clock.timeout(timeout):
                pods = await self._pods()
                now = self.clock.now_ms() / 1000
                targets = []
                for pod in pods:
                    reason = skip_reason(
                        pod, self.options.skip_wait_for_delete_timeout_seconds, now
                    )
                    if reason is not None:
                        report.skipped[_name(pod)] = reason
                    else:
                        targets.append(pod)
                        pending.add(_name(pod))
                async with asyncio.TaskGroup() as tg:
                    for pod in targets:
                        tg.create_task(self._evict_and_wait(pod, report, last_word, pending))
        except TimeoutError as exc:
            still = tuple(sorted(pending))
            detail = "; ".join(f"{p}: {last_word.get(p, 'waiting')}" for p in still)
            raise DrainError(
                f"drain of node {self.node_id} timed out after {timeout:g}s "
                f"(--drain-timeout) with {len(still)} pod(s) left: {detail}",
                still,
            ) from exc
        except ExceptionGroup as group:
            refused, rest = group.split(DrainError)
            if refused is None or rest is not None:
                raise
            first = refused.exceptions[0]
            assert isinstance(first, DrainError)
            raise DrainError(first.message, tuple(sorted(pending))) from first
        log.info(
            "drained node %s in %.1fs: %d pod(s) evicted, %d skipped",
            self.node_id,
            self.clock.monotonic() - started,
            len(report.evicted),
            len(report.skipped),
        )
        return report

    async def _pods(self) -> list[JsonObject]:
        try:
            return await self._api.list_pods(
                label_selector=self.options.pod_selector,
                field_selector=f"spec.nodeName={self.node_id}",
                limit=LIST_PAGE,
            )
        except ApiError as exc:
            raise DrainError(f"cannot list the pods of node {self.node_id}: {exc.message}") from exc

    async def _evict_and_wait(
        self,
        pod: JsonObject,
        report: DrainReport,
        last_word: dict[str, str],
        pending: set[str],
    ) -> None:
        name = _name(pod)
        meta = pod.get("metadata") or {}
        namespace, pod_name, uid = meta.get("namespace", ""), meta.get("name", ""), meta.get("uid")
        grace = self.options.grace_period_seconds
        # No jitter: only this node evicts its pods, there is no herd to spread.
        backoff = Backoff(
            self.options.backoff_initial_seconds, self.options.backoff_cap_seconds, jitter=0
        )
        while True:
            try:
                await self._api.evict_pod(namespace, pod_name, grace if grace >= 0 else None)
                break
            except ApiError as exc:
                if exc.not_found:
                    pending.discard(name)
                    return  # already gone
                if not exc.too_many_requests:
                    last_word[name] = exc.message
                    raise DrainError(f"cannot evict pod {name}: {exc.message}") from exc
                report.refusals += 1
                last_word[name] = exc.message
                pause = backoff.failed()
                log.warning(
                    "eviction of pod %s refused, retrying in %.0fs: %s", name, pause, exc.message
                )
            await self.clock.sleep(pause)
            if await self._gone(namespace, pod_name, uid, name, last_word):
                pending.discard(name)
                return
        report.evicted.append(name)
        last_word[name] = "evicted; waiting for it to terminate"
        # Polling the API server is the protocol here (kubectl polls every second too).
        while not await self._gone(namespace, pod_name, uid, name, last_word):
            await self.clock.sleep(self.options.poll_interval_seconds)
        pending.discard(name)

    async def _gone(
        self, namespace: str, pod_name: str, uid: Any, name: str, last_word: dict[str, str]
    ) -> bool:
        """True when the pod no longer exists, was replaced (another UID), or has been
        terminating for longer than --skip-wait-for-delete-timeout."""
        try:
            current = await self._api.get_pod(namespace, pod_name)
        except ApiError as exc:
            if exc.not_found:
                return True
            last_word[name] = f"cannot read it: {exc.message}"
            return False  # keep waiting; the timeout bounds this
        if (current.get("metadata") or {}).get("uid") != uid:
            return True
        skip = self.options.skip_wait_for_delete_timeout_seconds
        return skip > 0 and skip_reason(current, skip, self.clock.now_ms() / 1000) is not None
