"""The store's families (``kura.storage``), read at scrape time from its plain counters.

``StoreCollector``: ``kura_disk_*`` (used, limit, free bytes), ``kura_storage_*`` (artifacts,
evictions, the start-up report: read-only, index damaged, reconciled), ``kura_hot_cache_*``,
``kura_outbox_depth_messages``, ``kura_replication_apply_results_total`` and
``..._rejected_total``, and the tmp staging budget (``kura_tmp_*``). ``HotCacheCollector``
alone is a worker's (summed into the node's, ``kura.workers.metrics_merge``).
``commit_collector``: group commit (``kura_storage_commit_*``); ``uploads_collector``: the
multipart uploads reclaimed at the open-upload cap. The corrupt-artifact count is
``kura.api.integrity_metrics``'.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kura.api.metrics import Scraped, counter, gauge
from kura.storage.budget import TmpBudget
from kura.storage.group_commit import GroupStats
from kura.storage.hotcache import HotCache
from kura.storage.multipart import MultipartUploads
from kura.storage.recovery import StartReport
from kura.storage.stats import StorageStats


class HotCacheCollector(Collector):
    """``kura_hot_cache_*`` of one process (a worker's are summed into the node's)."""

    def __init__(self, hot: HotCache) -> None:
        self._hot = hot

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield GaugeMetricFamily(
            "kura_hot_cache_bytes",
            "Bytes of verified small artifacts held in memory.",
            self._hot.size_bytes,
        )
        hot = CounterMetricFamily(
            "kura_hot_cache_lookups", "In-memory cache lookups by result.", labels=["result"]
        )
        hot.add_metric(["hit"], self._hot.hits)
        hot.add_metric(["miss"], self._hot.misses)
        yield hot


class StoreCollector(Collector):
    """The store's occupancy and health, its start-up report, its hot cache, its outbox depth
    and replica apply outcomes, and the tmp staging budget (module docstring)."""

    def __init__(
        self,
        stats: StorageStats,
        budget: TmpBudget,
        max_disk_bytes: int,
        hot: HotCache,
        start_report: Callable[[], StartReport],
        free_bytes: Callable[[], int],
    ) -> None:
        self._hot = hot
        self._start_report = start_report
        self._free_bytes = free_bytes
        self._stats = stats
        self._budget = budget
        self._max_disk_bytes = max_disk_bytes

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        s = self._stats
        yield GaugeMetricFamily("kura_disk_used_bytes", "Bytes of stored artifacts.", s.used_bytes)
        yield GaugeMetricFamily(
            "kura_disk_limit_bytes", "Disk budget before LRU eviction.", self._max_disk_bytes
        )
        yield GaugeMetricFamily("kura_storage_artifacts", "Stored artifacts.", s.artifacts)
        yield CounterMetricFamily(
            "kura_storage_evictions",
            "Artifacts evicted to stay in the disk budget.",
            s.evictions_total,
        )
        yield CounterMetricFamily(
            "kura_storage_evicted_bytes",
            "Bytes evicted to stay in the disk budget.",
            s.evicted_bytes_total,
        )
        yield CounterMetricFamily(
            "kura_retention_evictions",
            "Artifacts evicted inside their KURA_MIN_RETENTION window (clients were told they "
            "exist) because the disk budget left no other choice; 0 while the floor holds.",
            s.retention_evictions_total,
        )
        yield CounterMetricFamily(
            "kura_retention_evicted_bytes",
            "Bytes of artifacts evicted inside their KURA_MIN_RETENTION window.",
            s.retention_evicted_bytes_total,
        )
        yield CounterMetricFamily(
            "kura_retention_displaced_evictions",
            "Artifacts written or used inside KURA_MIN_RETENTION, not promised, evicted while "
            "promises held more than half of KURA_MAX_DISK_BYTES: the disk is too small for "
            "what clients were told exists; 0 while it is not.",
            s.retention_displaced_evictions_total,
        )
        yield CounterMetricFamily(
            "kura_retention_displaced_evicted_bytes",
            "Bytes of artifacts evicted as kura_retention_displaced_evictions_total counts.",
            s.retention_displaced_bytes_total,
        )
        yield GaugeMetricFamily(
            "kura_retention_promised_bytes",
            "Bytes of stored artifacts promised to clients inside KURA_MIN_RETENTION (as of the "
            "last eviction pass or 5 s flush); keep KURA_MAX_DISK_BYTES at least twice this.",
            s.retention_promised_bytes,
        )
        # kura_storage_corrupt_artifacts_total{detected_by}: kura.api.integrity_metrics
        start = self._start_report()
        yield GaugeMetricFamily(
            "kura_disk_free_bytes",
            "Free bytes on the data dir's filesystem (writes answer 503 at or below "
            "KURA_MIN_FREE_DISK_BYTES).",
            self._free_bytes(),
        )
        yield GaugeMetricFamily(
            "kura_storage_read_only",
            "1 when the index was opened read-only because the disk was full at start-up.",
            1 if start.read_only_reason else 0,
        )
        yield GaugeMetricFamily(
            "kura_storage_index_damaged",
            "1 when start-up found the index damaged, set it aside and began an empty one.",
            1 if start.index_damaged else 0,
        )
        reconciled = CounterMetricFamily(
            "kura_storage_reconciled",
            "What start-up reconciliation removed, by kind (blob files no row names, rows "
            "whose blob file was missing).",
            labels=["kind"],
        )
        reconciled.add_metric(["file"], start.reconciled.removed_files)
        reconciled.add_metric(["row"], start.reconciled.dropped_rows)
        yield reconciled
        yield from HotCacheCollector(self._hot).collect()
        yield GaugeMetricFamily(
            "kura_outbox_depth_messages",
            "Replication messages waiting, all peers.",
            s.outbox_depth,
        )
        applied = CounterMetricFamily(
            "kura_replication_apply_results",
            "Artifact and tombstone copies applied or ignored, by source and outcome.",
            labels=["source", "outcome"],
        )
        for (source, outcome), n in sorted(s.apply_outcomes_total.items()):
            applied.add_metric([source, outcome], n)
        yield applied
        rejected = CounterMetricFamily(
            "kura_replication_rejected",
            "Artifact and tombstone copies from peers refused, never applied, by source and "
            "reason (future_version: further ahead than KURA_MAX_CLOCK_SKEW_MS).",
            labels=["source", "reason"],
        )
        for (source, reason), n in sorted(s.rejected_total.items()):
            rejected.add_metric([source, reason], n)
        yield rejected
        purges = CounterMetricFamily(
            "kura_writer_purges",
            "Purges of one writer's entries of a namespace applied (provenance), by source "
            "(local: this node's, replication: a peer's).",
            labels=["source"],
        )
        for source, n in sorted(s.writer_purges_total.items()):
            purges.add_metric([source], n)
        yield purges
        yield GaugeMetricFamily(
            "kura_tmp_reserved_bytes",
            "Bytes reserved in the tmp staging budget.",
            self._budget.reserved_bytes,
        )
        yield GaugeMetricFamily(
            "kura_tmp_capacity_bytes",
            "Capacity of the tmp staging budget.",
            self._budget.capacity_bytes,
        )
        yield GaugeMetricFamily(
            "kura_tmp_waiting_reservations",
            "Reservations waiting for room in the tmp budget.",
            self._budget.waiting,
        )
        yield GaugeMetricFamily(
            "kura_tmp_dir_bytes",
            "Bytes of all files on disk in the tmp dir, as of the last background walk.",
            self._budget.tmp_dir_bytes,
        )


def commit_collector(commits: GroupStats) -> Scraped:
    """``kura_storage_commit_*`` of the writer's group commit (``storage.group_commit``)."""
    return Scraped(
        counter(
            "kura_storage_commit_groups",
            "Writer groups made durable (one WAL fsync each).",
            lambda: commits.groups_total,
        ),
        counter(
            "kura_storage_commit_group_jobs",
            "Writer jobs made durable in those groups.",
            lambda: commits.jobs_total,
        ),
        gauge(
            "kura_storage_commit_group_max_jobs",
            "The largest writer group so far.",
            lambda: commits.largest_group,
        ),
        counter(
            "kura_storage_commit_sync_failures",
            "Writer groups whose fsync failed (their writes failed).",
            lambda: commits.sync_failures_total,
        ),
        counter(
            "kura_storage_commit_sync_shortages",
            "Writer groups not made durable for want of descriptors or memory (their "
            "writes failed; later writes are taken once the shortage passes).",
            lambda: commits.sync_shortages_total,
        ),
    )


def uploads_collector(uploads: MultipartUploads) -> Scraped:
    """``kura_multipart_reclaimed_uploads_total`` (``storage.multipart``)."""
    return Scraped(
        counter(
            "kura_multipart_reclaimed_uploads",
            "Idle multipart uploads reclaimed at the open-upload cap.",
            lambda: uploads.reclaimed_total,
        )
    )
