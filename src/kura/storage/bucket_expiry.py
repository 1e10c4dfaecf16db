"""Bucket expiry: the shared tier drops artifacts no node has used for ``KURA_MAX_AGE``.

The rule (last use = the later of the object's and its touch marker's last-modified time; the
cut-off leaves the markers' refresh slack; pending uploads and newer objects are never taken)
is ``core.bucket_expiry``; ``storage.bucket_touch`` writes the markers. This module runs it:

* A pass starts every ``interval_seconds`` (``KURA_EXPIRY_INTERVAL``, beside the local
  ``storage.expiry`` pass, which keeps dropping local copies unused here). It lists the tenant's
  prefix once (objects and markers, held in memory for the pass: about 100 bytes per object),
  reads which uploads are pending on this node, and selects the victims, oldest use first.
* Deletions are paced like local expiry: at most ``max_deletes_per_second`` artifacts per
  second on average (``KURA_EXPIRY_MAX_DELETES_PER_SECOND``), in batches of ``batch_size``.
  Just before a batch is deleted every victim is checked again (a HEAD of object and marker,
  and the pending uploads re-read), so a use or write since the listing keeps it; the window
  left is the time of one HEAD (S3 has no conditional delete).
* Several nodes may run passes at once: deleting an absent key is a success, so the passes are
  idempotent; an object another pass deleted before the re-check is not counted again, but
  two passes that re-check at the same moment both count it (``deleted_total`` counts
  deletions sent, an upper bound on the objects removed).
* A failed pass (store down, a refused request) is logged and counted and retried at the next
  interval; a pass never touches the local tier.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Awaitable, Callable

from kit.backoff import every
from kit.clock import Clock
from kit.pace import Pace
from kura.core.bucket_expiry import (
    Victim,
    artifact_of,
    bucket_cutoff_ms,
    last_use_ms,
    marker_refresh_ms,
)
from kura.core.bucket_expiry import select_expired as select
from kura.core.namespace_rule import NO_RULES, NamespaceRules
from kura.core.object_layout import OUTBOX_TARGET, is_object_key, marker_object_key, namespace_of
from kura.storage.bucket_touch import BucketToucher
from kura.storage.object_store import ObjectStore, ObjectStoreError
from kura.storage.outbox import UPSERT
from kura.storage.service import CacheService

log = logging.getLogger(__name__)

CHECKS = 8  # HEADs in flight while a batch is re-checked


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


class BucketExpiry:
    """See module docstring. ``run()`` in the app's TaskGroup; ``max_age_seconds`` 0: off."""

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
        self.refresh_ms = marker_refresh_ms(rules.shortest_max_age_seconds(max_age_seconds))
        self.interval_seconds = interval_seconds
        self.max_deletes_per_second = max_deletes_per_second
        self.batch_size = min(batch_size, max_deletes_per_second)
        self._sleep = sleep
        self.stats = BucketExpiryStats()

    async def run(self) -> None:
        """Forever: sleep one interval, run a pass. Returns at once when expiry is off (no
        ``KURA_MAX_AGE``, no rule with a ``max_age``)."""
        if not self.rules.expires(self.max_age_seconds):
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
        markers: dict[str, tuple[str, int]] = {}
        async for page in self._store.list_prefix(f"{tenant}/"):
            for obj in page:
                modified_ms = int(obj.last_modified.timestamp() * 1000)
                stands_for = marker_object_key(tenant, obj.key)
                if stands_for is not None:
                    markers[stands_for] = (obj.key, modified_ms)
                elif is_object_key(tenant, obj.key):
                    objects[obj.key] = modified_ms
        pending = await self._service._read_index(pending_uploads)
        victims = select(objects, markers, cutoff_ms, pending)
        deleted = 0
        for start in range(0, len(victims), self.batch_size):
            batch = await self._recheck(victims[start : start + self.batch_size], cutoff_ms)
            keys = [k for v in batch for k in (v.object_key, v.marker_key) if k is not None]
            if keys:
                await self._store.delete_many(keys)
            gone = sum(1 for v in batch if v.object_key is not None)
            self.stats.deleted_total += gone
            self.stats.markers_deleted_total += len(batch) - gone
            deleted += gone
            done = min(start + self.batch_size, len(victims))
            await pace.wait(done)
        self.stats.passes_total += 1
        if deleted:
            log.info(
                "bucket expiry pass: %d artifacts unused on every node for longer than their "
                "max age deleted in %.1f s",
                deleted,
                self._clock.monotonic() - started,
            )
        return deleted

    async def _recheck(
        self, batch: list[Victim], cutoff_ms: Callable[[str], int | None]
    ) -> list[Victim]:
        """The victims of ``batch`` still unused and not pending now (fresh HEADs)."""
        pending = await self._service._read_index(pending_uploads)
        sem = asyncio.Semaphore(CHECKS)

        async def modified(key: str | None) -> int | None:
            if key is None:
                return None
            async with sem:
                return await self._store.modified_ms(key)

        async def still(v: Victim) -> Victim | None:
            if v.object_key is not None and artifact_of(v.object_key) in pending:
                return None
            object_ms, marker_ms = await asyncio.gather(
                modified(v.object_key), modified(v.marker_key)
            )
            if v.object_key is not None and object_ms is None:  # another pass deleted it
                return None if v.marker_key is None else Victim(None, v.marker_key, 0)
            cutoff = cutoff_ms(v.object_key or v.marker_key or "")
            if cutoff is None or last_use_ms(object_ms or 0, marker_ms) >= cutoff:
                return None
            return v

        checked = await asyncio.gather(*(still(v) for v in batch))
        kept = [v for v in checked if v is not None]
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
    the shortest age ``rules`` and ``max_age_seconds`` give) and its pass."""
    toucher = BucketToucher(
        service,
        store,
        clock,
        max_age_seconds=rules.shortest_max_age_seconds(max_age_seconds),
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
