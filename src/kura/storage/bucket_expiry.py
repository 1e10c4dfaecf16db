"""Bucket expiry: the shared tier drops artifacts no node has used for ``KURA_MAX_AGE``, and
keeps each namespace of the bucket within its rule's quota (``KURA_NAMESPACE_RULES``).

The rule (last use = the later of the object's and its touch marker's last-modified time; the
cut-off leaves the markers' refresh slack; pending uploads and newer objects are never taken)
is ``core.bucket_expiry``; ``storage.bucket_touch`` writes the markers. This module runs it:

* A pass starts every ``interval_seconds`` (``KURA_EXPIRY_INTERVAL``, beside the local
  ``storage.expiry`` pass, which keeps dropping local copies unused here). It lists the tenant's
  prefix once (objects with their sizes and markers, held in memory for the pass: about 280
  bytes per object with a 64-hex id, measured with tracemalloc), reads which uploads are
  pending on this node, and selects the victims: those past their age (``select_expired``),
  then, of what is left, those that bring each namespace over its quota back within it, its
  own least recently used objects (``select_over_quota``; the listing's sizes are the
  bytes), each group oldest use first.
* Deletions are paced like local expiry: at most ``max_deletes_per_second`` artifacts per
  second on average (``KURA_EXPIRY_MAX_DELETES_PER_SECOND``), in batches of ``batch_size``.
  Just before a batch is deleted every victim is checked again (a HEAD of object and marker,
  and the pending uploads re-read), so a use or write since the listing keeps it (an
  over-quota namespace then waits for the next pass); the window left is the time of one HEAD
  (S3 has no conditional delete).
* Several nodes may run passes at once: deleting an absent key is a success, so the passes are
  idempotent; an object another pass deleted before the re-check is not counted again, but
  two passes that re-check at the same moment both count it (``deleted_total`` counts
  deletions sent, an upper bound on the objects removed). Deletions are also counted by
  their namespace's rule and reason (``max_age``, ``quota``, ``forced``: the labels of the
  local ``kura_namespace_*``), with their bytes.
* A failed pass (store down, a refused request) is logged and counted and retried at the next
  interval; a pass never touches the local tier.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from typing import TypeVar

from kit.backoff import every
from kit.clock import Clock
from kit.pace import Pace
from kura.core.bucket_expiry import (
    MAX_AGE,
    Victim,
    artifact_of,
    bucket_cutoff_ms,
    last_use_ms,
    marker_age_seconds,
    marker_refresh_ms,
    retention_in_bucket,
    select_over_quota,
)
from kura.core.bucket_expiry import select_expired as select
from kura.core.namespace_rule import NO_RULES, NamespaceRules
from kura.core.object_layout import OUTBOX_TARGET, is_object_key, marker_object_key, namespace_of
from kura.storage.bucket_touch import BucketToucher
from kura.storage.object_store import ObjectStore, ObjectStoreError
from kura.storage.outbox import UPSERT
from kura.storage.service import CacheService

log = logging.getLogger(__name__)

CHECKS = 8  # victims re-checked at once (each with one or two requests) before a batch

T = TypeVar("T")


async def rechecked(batch: Sequence[T], still: Callable[[T], Awaitable[T | None]]) -> list[T]:
    """What ``still`` answers for each victim of ``batch`` (``CHECKS`` at once), in order,
    without the None ones: the victims a fresh read just before their deletion keeps doomed.
    Raises what ``still`` raises (ObjectStoreError)."""
    sem = asyncio.Semaphore(CHECKS)

    async def one(victim: T) -> T | None:
        async with sem:
            return await still(victim)

    return [v for v in await asyncio.gather(*(one(v) for v in batch)) if v is not None]


async def paced_deletes(
    store: ObjectStore,
    victims: Sequence[T],
    recheck: Callable[[list[T]], Awaitable[list[T]]],
    keys: Callable[[T], Iterable[str | None]],
    pace: Pace,
    batch_size: int,
) -> AsyncIterator[list[T]]:
    """Delete ``victims`` from ``store`` in batches of ``batch_size``, in order: each batch is
    re-checked just before (``recheck`` returns the victims still to delete; the window left is
    one read, as S3 has no conditional delete), its survivors' ``keys`` deleted in one request,
    and the batch yielded; then ``pace`` waits so that at most its rate of victims per second go
    (``KURA_EXPIRY_MAX_DELETES_PER_SECOND``). Bucket expiry and a writer's purge
    (``ObjectTier``) both delete this way. Raises ObjectStoreError (what was deleted stays)."""
    for start in range(0, len(victims), batch_size):
        batch = await recheck(list(victims[start : start + batch_size]))
        doomed = [k for v in batch for k in keys(v) if k is not None]
        if doomed:
            await store.delete_many(doomed)
        yield batch
        await pace.wait(min(start + batch_size, len(victims)))


def pending_uploads(conn: sqlite3.Connection) -> set[str]:
    """The artifact ids whose upload to the bucket is queued in this node's outbox."""
    rows = conn.execute(
        "SELECT DISTINCT artifact_id FROM outbox WHERE peer = ? AND kind = ?",
        (OUTBOX_TARGET, UPSERT),
    ).fetchall()
    return {str(r[0]) for r in rows}


class BucketExpiryStats:
    """Counters the metrics layer reads at scrape time (``api.expiry_metrics``)."""

    def __init__(self) -> None:
        self.deleted_total = 0  # artifacts (object and marker) deleted from the bucket
        self.markers_deleted_total = 0  # markers whose object was gone already
        self.kept_total = 0  # victims a re-check before deletion kept (used meanwhile)
        self.passes_total = 0
        self.failures_total = 0
        # (rule label, reason) -> artifacts and bytes deleted (labels: core.namespace_rule)
        self.evictions_total: dict[tuple[str, str], int] = {}
        self.evicted_bytes_total: dict[tuple[str, str], int] = {}


class BucketExpiry:
    """See module docstring. ``run()`` in the app's TaskGroup; off without an age
    (``max_age_seconds`` 0 and no rule's ``max_age``) and without a rule's ``quota``."""

    def __init__(
        self,
        service: CacheService,
        store: ObjectStore,
        clock: Clock,
        *,
        max_age_seconds: float,
        interval_seconds: float,
        max_deletes_per_second: int,
        batch_size: int,
        rules: NamespaceRules = NO_RULES,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if max_deletes_per_second <= 0 or batch_size <= 0:
            raise ValueError("max_deletes_per_second and batch_size must be above 0")
        self._service = service
        self._store = store
        self._clock = clock
        self.max_age_seconds = max_age_seconds
        self.rules = rules
        # Markers are refreshed at the pace of the shortest age (bucket_aging's toucher).
        self.refresh_ms = marker_refresh_ms(
            marker_age_seconds(rules, max_age_seconds, interval_seconds)
        )
        self.interval_seconds = interval_seconds
        self.max_deletes_per_second = max_deletes_per_second
        self.batch_size = min(batch_size, max_deletes_per_second)
        self._sleep = sleep
        self.stats = BucketExpiryStats()

    async def run(self) -> None:
        """Forever: sleep one interval, run a pass. Returns at once when there is nothing to
        enforce (no ``KURA_MAX_AGE``, no rule with a ``max_age`` or a ``quota``)."""
        if not retention_in_bucket(self.rules, self.max_age_seconds):
            return

        async def one_pass() -> None:
            try:
                await self.expiry_pass()
            except ObjectStoreError as exc:  # the store's: one line, retried at the interval
                self.stats.failures_total += 1
                log.warning(
                    "bucket expiry pass failed (next in %g s): %s",
                    self.interval_seconds,
                    exc.message,
                )
            except Exception:  # an index problem: every() logs its traceback and backs off
                self.stats.failures_total += 1
                raise

        await self._sleep(self.interval_seconds)
        await every(
            one_pass, self.interval_seconds, what="bucket expiry pass", log=log, sleep=self._sleep
        )

    async def expiry_pass(self) -> int:
        """One pass (module docstring); the number of artifacts deleted from the bucket.
        Raises ObjectStoreError when the store fails (what was deleted stays deleted)."""
        started = self._clock.monotonic()
        pace = Pace(self.max_deletes_per_second, self._clock.monotonic, self._sleep)
        now_ms = self._clock.now_ms()
        tenant = self._service.tenant_id
        cutoffs: dict[str, int | None] = {}  # namespace -> its cut-off (None: never)

        def cutoff_ms(key: str) -> int | None:
            """The cut-off of an object or marker key: its namespace's rule's age, else
            KURA_MAX_AGE (a marker's namespace is that of the object it stands for)."""
            namespace = namespace_of(tenant, marker_object_key(tenant, key) or key)
            if namespace not in cutoffs:
                age = self.rules.max_age_seconds(namespace, self.max_age_seconds)
                cutoffs[namespace] = (
                    bucket_cutoff_ms(now_ms, age, self.refresh_ms) if age > 0 else None
                )
            return cutoffs[namespace]

        objects: dict[str, int] = {}
        sizes: dict[str, int] = {}
        markers: dict[str, tuple[str, int]] = {}
        async for page in self._store.list_prefix(f"{tenant}/"):
            for obj in page:
                modified_ms = int(obj.last_modified.timestamp() * 1000)
                stands_for = marker_object_key(tenant, obj.key)
                if stands_for is not None:
                    markers[stands_for] = (obj.key, modified_ms)
                elif is_object_key(tenant, obj.key):
                    objects[obj.key] = modified_ms
                    sizes[obj.key] = obj.size
        pending = await self._service._read_index(pending_uploads)
        victims = select(objects, markers, cutoff_ms, pending)
        expired = {v.object_key for v in victims if v.object_key is not None}
        victims += select_over_quota(
            tenant, objects, sizes, markers, self.rules, now_ms, self.refresh_ms, pending, expired
        )
        aged = 0  # deleted for age; the rest of ``deleted`` for a quota
        deleted = 0
        batches = paced_deletes(
            self._store,
            victims,
            lambda batch: self._recheck(batch, cutoff_ms),
            lambda v: (v.object_key, v.marker_key),
            pace,
            self.batch_size,
        )
        async for batch in batches:
            gone = [(v.object_key, v.reason) for v in batch if v.object_key is not None]
            for key, reason in gone:
                self._count(namespace_of(tenant, key), reason, sizes[key])
            self.stats.deleted_total += len(gone)
            self.stats.markers_deleted_total += len(batch) - len(gone)
            deleted += len(gone)
            aged += sum(1 for _key, reason in gone if reason == MAX_AGE)
        self.stats.passes_total += 1
        if deleted:
            log.info(
                "bucket expiry pass: %d artifacts deleted (%d unused on every node for longer "
                "than their max age, %d over their namespace's quota) in %.1f s",
                deleted,
                aged,
                deleted - aged,
                self._clock.monotonic() - started,
            )
        return deleted

    def _count(self, namespace: str, reason: str, size: int) -> None:
        """Count one deletion by its namespace's rule label and ``reason``, with its bytes."""
        label = (self.rules.label(namespace), reason)
        counts, nbytes = self.stats.evictions_total, self.stats.evicted_bytes_total
        counts[label] = counts.get(label, 0) + 1
        nbytes[label] = nbytes.get(label, 0) + size

    async def _recheck(
        self, batch: list[Victim], cutoff_ms: Callable[[str], int | None]
    ) -> list[Victim]:
        """The victims of ``batch`` still to delete now (fresh HEADs): not pending, and for
        an expired one still unused past its cut-off, for an over-quota one not used since the
        listing."""
        pending = await self._service._read_index(pending_uploads)

        async def modified(key: str | None) -> int | None:
            return None if key is None else await self._store.modified_ms(key)

        async def still(v: Victim) -> Victim | None:
            if v.object_key is not None and artifact_of(v.object_key) in pending:
                return None
            object_ms, marker_ms = await asyncio.gather(
                modified(v.object_key), modified(v.marker_key)
            )
            if v.object_key is not None and object_ms is None:  # another pass deleted it
                return None if v.marker_key is None else Victim(None, v.marker_key, 0)
            used_ms = last_use_ms(object_ms or 0, marker_ms)
            if v.reason != MAX_AGE:  # over its quota: kept if used since the listing
                return None if used_ms > v.last_use_ms else v
            cutoff = cutoff_ms(v.object_key or v.marker_key or "")
            if cutoff is None or used_ms >= cutoff:
                return None
            return v

        kept = await rechecked(batch, still)
        self.stats.kept_total += len(batch) - len(kept)
        return kept


def bucket_aging(
    service: CacheService,
    store: ObjectStore,
    clock: Clock,
    *,
    max_age_seconds: float,
    interval_seconds: float,
    max_deletes_per_second: int,
    batch_size: int,
    rules: NamespaceRules = NO_RULES,
) -> tuple[BucketToucher, BucketExpiry]:
    """The two halves of bucket expiry for one node: its touch-marker writer (at most
    ``max_deletes_per_second`` markers per second, each marker refreshed within a quarter of
    the shortest age ``rules`` and ``max_age_seconds`` give, or with quotas only once per
    ``interval_seconds``: ``core.bucket_expiry.marker_age_seconds``) and its pass."""
    toucher = BucketToucher(
        service,
        store,
        clock,
        max_age_seconds=marker_age_seconds(rules, max_age_seconds, interval_seconds),
        max_writes_per_second=max_deletes_per_second,
    )
    expiry = BucketExpiry(
        service,
        store,
        clock,
        max_age_seconds=max_age_seconds,
        interval_seconds=interval_seconds,
        max_deletes_per_second=max_deletes_per_second,
        batch_size=batch_size,
        rules=rules,
    )
    return toucher, expiry
