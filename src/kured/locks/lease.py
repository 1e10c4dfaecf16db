"""The reboot lock in a Kubernetes ``coordination.k8s.io/v1`` Lease (kured #25,
https://github.com/kubereboot/kured/issues/25): ``--lock-backend=lease``.

A Lease is the object Kubernetes made for this (leader election, node heartbeats): an API object
of its own, so lock writes no longer touch (and conflict with) kured's DaemonSet, a Helm sync of
the DaemonSet no longer races the lock, and ``kubectl get lease -n kube-system kured`` shows
the holder. The Lease ``--lease-name`` in ``--lease-namespace`` keeps:

* **the record** - exactly kured's lock JSON (``kured.core.lockrecord``, single or multi
  format), in the annotation ``--lock-annotation`` of the Lease. It is the source of truth:
  it carries what a Lease has no field for (several holders with ``--concurrency`` > 1, each
  one's ``unschedulable``, TTL 0 = never expires, kured's ``{"nodeID":"manual"}`` pause);
* **the spec, mirrored from the record** at every write, for people and tools:
  ``holderIdentity`` (the holders' node ids joined by ``,``; absent when free),
  ``leaseDurationSeconds`` (the first holder's TTL rounded up to whole seconds; absent for
  TTL 0), ``acquireTime`` and ``renewTime`` (the first holder's ``created``, as a MicroTime:
  kured never renews a lock, so the two are equal) and ``leaseTransitions`` (+1 each time
  the holder identity changes to a new non-empty value).

A Lease without the record annotation but with a ``holderIdentity`` (written by another tool, or
``kubectl`` to pause reboots) counts as one holder: that identity, created at ``renewTime``
(else ``acquireTime``), expiring after ``leaseDurationSeconds`` (absent: never). So
``kubectl -n kube-system patch lease kured --type merge -p '{"spec":{"holderIdentity":"manual"}}'``
pauses every reboot, as the annotation ``{"nodeID":"manual"}`` does for kured.

Every change is the same cycle as the DaemonSet backend (``kured.locks.kubernetes``): GET →
apply the pure transition → PUT the Lease as read with the ``resourceVersion`` read; the API
server answers 409 to a stale one, and that alone gives mutual exclusion. A missing Lease is a
free lock; the first acquire creates it (POST), and a create that loses the race gets 409
``AlreadyExists`` and retries from the GET. A release never deletes the Lease: it clears the
annotation and the holder, so the object (and its ``leaseTransitions``) stays for ``kubectl``.
"""

from __future__ import annotations

import copy
import math
from typing import Any

from kured.apiserver import JsonObject
from kured.core import lockrecord
from kured.core.errors import ApiError, LockError
from kured.core.lockrecord import LockEntry, LockRecord, Outcome, Write
from kured.locks.kubernetes import ApiObjectLock

_NANOS = 1_000_000_000


def micro_time(created_ns: int) -> str:
    """A Kubernetes ``MicroTime``: RFC 3339 UTC with exactly six fraction digits."""
    text = lockrecord.format_created(created_ns - created_ns % 1000)
    head, _, fraction = text.removesuffix("Z").partition(".")
    return f"{head}.{fraction.ljust(6, '0')[:6]}Z"


def foreign_entry(spec: dict[str, Any]) -> LockEntry | None:
    """The holder a Lease's spec names when it carries no kured record (see the module
    docstring), or None when ``holderIdentity`` is empty. Raises ``LockError`` for a spec
    that is not a Lease's."""
    holder = spec.get("holderIdentity")
    if not holder:
        return None
    if not isinstance(holder, str):
        raise LockError("the Lease's spec.holderIdentity is not a string")
    stamp = spec.get("renewTime") or spec.get("acquireTime")
    created_ns = lockrecord.GO_ZERO_TIME_NS
    if stamp:
        created_ns, _ = lockrecord.parse_created(str(stamp))
    duration = spec.get("leaseDurationSeconds") or 0
    if not isinstance(duration, int) or duration < 0:
        raise LockError("the Lease's spec.leaseDurationSeconds is not a positive integer")
    return LockEntry(holder, False, created_ns, duration * _NANOS)


class LeaseLock(ApiObjectLock):
    """The ``Lock`` protocol on Lease ``namespace/name`` (record in annotation
    ``annotation``), admitting ``max_holders`` nodes. Arguments as ``ApiObjectLock``."""

    _kind = "Lease"

    @property
    def where(self) -> str:
        return f"lease {self._namespace}/{self._name}"

    async def _read(self) -> tuple[JsonObject | None, LockRecord | None]:
        """(the Lease as read or None when absent, its record or None when free)."""
        try:
            obj = await self._api.get_lease(self._namespace, self._name)
        except ApiError as exc:
            if exc.not_found:
                return None, None
            raise LockError(f"cannot read the lock: {exc.message}") from exc
        annotations = (obj.get("metadata") or {}).get("annotations") or {}
        value = annotations.get(self._annotation)
        if value is None:
            entry = foreign_entry(obj.get("spec") or {})
            return obj, None if entry is None else LockRecord(False, (entry,))
        if not isinstance(value, str):
            raise LockError(f"{self.where} annotation {self._annotation} is not a string")
        return obj, lockrecord.parse(value)

    def _updated(self, obj: JsonObject | None, outcome: Outcome) -> JsonObject:
        """``obj`` (or a new Lease) with the annotation and the mirrored spec set."""
        body: JsonObject = (
            copy.deepcopy(obj)
            if obj is not None
            else {
                "apiVersion": "coordination.k8s.io/v1",
                "kind": "Lease",
                "metadata": {"name": self._name, "namespace": self._namespace},
                "spec": {},
            }
        )
        metadata: dict[str, Any] = body.setdefault("metadata", {})
        annotations = metadata.get("annotations")
        if not isinstance(annotations, dict):
            annotations = metadata["annotations"] = {}
        spec: dict[str, Any] = body.get("spec") or {}
        body["spec"] = spec
        before = spec.get("holderIdentity") or ""
        for key in ("holderIdentity", "leaseDurationSeconds", "acquireTime", "renewTime"):
            spec.pop(key, None)
        entries = outcome.record.entries if outcome.record is not None else ()
        if outcome.write is Write.DELETE or outcome.record is None:
            annotations.pop(self._annotation, None)
        else:
            annotations[self._annotation] = lockrecord.serialise(outcome.record).decode()
        if outcome.write is not Write.DELETE and entries:
            first = entries[0]
            spec["holderIdentity"] = ",".join(e.node_id for e in entries)
            if first.ttl_ns > 0:
                spec["leaseDurationSeconds"] = max(1, math.ceil(first.ttl_ns / _NANOS))
            spec["acquireTime"] = spec["renewTime"] = micro_time(first.created_ns)
            if spec["holderIdentity"] != before:
                spec["leaseTransitions"] = int(spec.get("leaseTransitions") or 0) + 1
        return body

    async def _write(self, obj: JsonObject | None, outcome: Outcome) -> None:
        body = self._updated(obj, outcome)
        if obj is None:
            await self._api.create_lease(self._namespace, body)
        else:
            await self._api.replace_lease(self._namespace, self._name, body)
