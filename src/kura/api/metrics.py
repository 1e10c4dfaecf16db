"""Prometheus metrics for one node, in their own registry.

Request metrics are recorded by the endpoint wrapper (``kura.api.http``); storage and budget
gauges are read from ``StorageStats`` and ``TmpBudget`` at scrape time, so the store itself
knows nothing of Prometheus (metrics wrap the store, STYLE.md). Labels come from closed sets
only: protocol names, HTTP methods, status codes, outcomes; never a key or a URL.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Iterator
from typing import TYPE_CHECKING, Any

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

from kura.mesh.wire import peer_label
from kura.storage.budget import TmpBudget
from kura.storage.hotcache import HotCache
from kura.storage.recovery import StartReport
from kura.storage.service import StorageStats

if TYPE_CHECKING:  # a worker process has none of these: it need not load them
    from kura.mesh.bootstrap import Bootstrapper
    from kura.mesh.membership import Membership
    from kura.mesh.read_through import ReadThrough
    from kura.mesh.shipper import Shipper

# The *_created series only add noise for a long-running server.
disable_created_metrics()  # type: ignore[no-untyped-call]

LATENCY_BUCKETS = tuple(0.001 * 2**i for i in range(16))


class _HotCacheCollector(Collector):
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


class _StoreCollector(Collector):
    def __init__(
        self,
        stats: StorageStats,
        budget: TmpBudget,
        max_disk_bytes: int,
        tmp_dir_bytes: Callable[[], int],
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
        self._tmp_dir_bytes = tmp_dir_bytes

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
        yield from _HotCacheCollector(self._hot).collect()
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
            self._tmp_dir_bytes(),
        )


class _MeshCollector(Collector):
    def __init__(
        self,
        membership: Membership,
        shipper: Shipper,
        read_through: ReadThrough,
        bootstrapper: Bootstrapper,
    ) -> None:
        self._membership = membership
        self._shipper = shipper
        self._read_through = read_through
        self._bootstrapper = bootstrapper

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        peers = GaugeMetricFamily("kura_mesh_peers", "Peers by state.", labels=["state"])
        known = self._membership.peers.values()
        peers.add_metric(["known"], len(known))
        peers.add_metric(["healthy"], sum(1 for p in known if p.healthy))
        yield peers
        changes = CounterMetricFamily(
            "kura_mesh_membership_changes", "Membership changes by kind.", labels=["change"]
        )
        for change, n in sorted(self._membership.stats.changes_total.items()):
            changes.add_metric([change], n)
        yield changes
        yield GaugeMetricFamily(
            "kura_mesh_initial_discovery_completed",
            "1 once initial discovery completed.",
            1 if self._membership.initial_discovery_completed else 0,
        )
        depth = GaugeMetricFamily(
            "kura_outbox_messages", "Replication messages waiting, per peer.", labels=["peer"]
        )
        age = GaugeMetricFamily(
            "kura_outbox_oldest_message_age_seconds",
            "Age of the oldest waiting replication message, per peer.",
            labels=["peer"],
        )
        results = CounterMetricFamily(
            "kura_replication_requests",
            "Replication deliveries by peer, operation and result.",
            labels=["peer", "operation", "result"],
        )
        dropped = CounterMetricFamily(
            "kura_replication_dropped",
            "Copies dropped from a peer's queue because the peer refused them for good.",
            labels=["peer", "reason"],
        )
        now_ms = time.time_ns() // 1_000_000
        for url, state in sorted(self._shipper.peers.items()):
            peer = peer_label(url)
            depth.add_metric([peer], state.depth)
            oldest = state.oldest_enqueued_ms
            age.add_metric([peer], max(0.0, (now_ms - oldest) / 1000) if oldest else 0.0)
            for (operation, result), n in sorted(state.results_total.items()):
                results.add_metric([peer, operation, result], n)
            for reason, n in sorted(state.dropped_total.items()):
                dropped.add_metric([peer, reason], n)
        yield depth
        yield age
        yield results
        yield dropped
        rt = CounterMetricFamily(
            "kura_read_through",
            "Reads served by fetching from a peer, by result.",
            labels=["result"],
        )
        for result, n in sorted(self._read_through.stats.results_total.items()):
            rt.add_metric([result], n)
        yield rt
        yield from self._bootstrap()

    def _bootstrap(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        progress = sorted(self._bootstrapper.progress.items())
        nbytes = GaugeMetricFamily(
            "kura_bootstrap_bytes",
            "Bootstrap bytes needed (total), applied (done) and left out at the disk budget "
            "(skipped), per peer.",
            labels=["peer", "kind"],
        )
        arts = GaugeMetricFamily(
            "kura_bootstrap_artifacts",
            "Bootstrap artifacts needed (total), applied (done) and left out at the disk budget "
            "(skipped), per peer.",
            labels=["peer", "kind"],
        )
        phase = GaugeMetricFamily(
            "kura_bootstrap_peer_phase",
            "1 for the bootstrap phase each peer is in.",
            labels=["peer", "phase"],
        )
        abandoned = GaugeMetricFamily(
            "kura_bootstrap_peer_abandoned",
            "1 when a peer failed so many passes in a row that it no longer gates readiness.",
            labels=["peer"],
        )
        stopped = GaugeMetricFamily(
            "kura_bootstrap_budget_stopped",
            "1 when the peer's last bootstrap pass stopped fetching at the disk budget.",
            labels=["peer"],
        )
        report = self._bootstrapper.budget()
        limit = GaugeMetricFamily(
            "kura_bootstrap_budget_limit_bytes",
            "Stored bytes bootstrap fills up to (KURA_BOOTSTRAP_DISK_PERCENT of "
            "KURA_MAX_DISK_BYTES).",
            report.limit_bytes,
        )
        held = GaugeMetricFamily(
            "kura_bootstrap_held_ratio",
            "Share of the largest peer's data (bytes) this node holds after bootstrap, 0..1.",
            report.held_percent / 100,
        )
        passes = CounterMetricFamily(
            "kura_bootstrap_passes", "Bootstrap passes started per peer.", labels=["peer"]
        )
        results = CounterMetricFamily(
            "kura_bootstrap_artifact_results",
            "Bootstrap artifact results per peer (applied, ignored_*, gone, too_large, skipped_budget, "
            "rejected_future, error).",
            labels=["peer", "result"],
        )
        for url, p in progress:
            peer = peer_label(url)
            nbytes.add_metric([peer, "total"], p.bytes_total)
            nbytes.add_metric([peer, "done"], min(p.bytes_done, p.bytes_total))
            arts.add_metric([peer, "total"], p.artifacts_total)
            arts.add_metric([peer, "done"], min(p.artifacts_done, p.artifacts_total))
            nbytes.add_metric([peer, "skipped"], p.skipped_bytes)
            arts.add_metric([peer, "skipped"], p.skipped_artifacts)
            stopped.add_metric([peer], 1 if p.budget_stopped else 0)
            phase.add_metric([peer, p.phase.value], 1)
            abandoned.add_metric([peer], 1 if p.abandoned else 0)
            passes.add_metric([peer], p.passes)
            for result, n in sorted(p.results_total.items()):
                results.add_metric([peer, result], n)
        yield from (nbytes, arts, phase, abandoned, stopped, limit, held, passes, results)


class _ValueCollector(Collector):
    def __init__(
        self, kind: str, name: str, documentation: str, source: Callable[[], float]
    ) -> None:
        self._family = GaugeMetricFamily if kind == "gauge" else CounterMetricFamily
        self._name, self._documentation, self._source = name, documentation, source

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        yield self._family(self._name, self._documentation, self._source())


class _CountsCollector(Collector):
    def __init__(
        self, name: str, documentation: str, label: str, counts: Callable[[], dict[str, int]]
    ) -> None:
        self._name, self._doc, self._label, self._counts = name, documentation, label, counts

    def collect(self) -> Iterator[CounterMetricFamily]:
        family = CounterMetricFamily(self._name, self._doc, labels=[self._label])
        for value, n in sorted(self._counts().items()):
            family.add_metric([value], n)
        yield family


class KuraMetrics:
    """All of one node's metrics. Create once per process (or per test app)."""

    def __init__(self, region: str, tenant_id: str) -> None:
        self._request_children: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self._lookup_children: dict[tuple[str, bool], Any] = {}
        self._bytes_children: dict[tuple[str, str], Any] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        # With worker processes: adds their request families at scrape time (kura.workers).
        self.merge: Callable[[bytes], Awaitable[bytes]] | None = None
        r = self.registry
        self.requests = Counter(
            "kura_http_requests_total",
            "HTTP requests by protocol, method and status.",
            ["protocol", "method", "status"],
            registry=r,
        )
        self.latency = Histogram(
            "kura_http_request_duration_seconds",
            "HTTP request latency.",
            ["protocol", "method"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self._inflight_sources: list[Callable[[], int]] = []
        inflight = Gauge("kura_http_inflight_requests", "HTTP requests being served.", registry=r)
        # Read at scrape time: no locked increment and decrement on every request.
        inflight.set_function(lambda: sum(f() for f in self._inflight_sources))
        self.lookups = Counter(
            "kura_cache_lookups_total",
            "Artifact reads by protocol and result (hit or miss).",
            ["protocol", "result"],
            registry=r,
        )
        self.bytes_in = Counter(
            "kura_http_received_bytes_total",
            "Artifact bytes received in request bodies.",
            ["protocol"],
            registry=r,
        )
        self.bytes_out = Counter(
            "kura_http_sent_bytes_total",
            "Artifact bytes sent in response bodies.",
            ["protocol"],
            registry=r,
        )
        self.aborted_uploads = Counter(
            "kura_http_aborted_uploads_total",
            "Uploads aborted for holding a reservation without sending: stalled (no byte for "
            "the idle timeout) or slow (below the minimum rate after the grace period).",
            ["reason"],
            registry=r,
        )
        info = Gauge(
            "kura_node_info",
            "Constant 1, labelled with the node's identity.",
            ["region", "tenant_id"],
            registry=r,
        )
        info.labels(region=region, tenant_id=tenant_id).set(1)

    def observe_request(self, protocol: str, method: str, status: int, seconds: float) -> None:
        """Count one request and its latency (label children cached: this runs per request)."""
        key = (protocol, method, status)
        child = self._request_children.get(key)
        if child is None:
            child = self._request_children[key] = (
                self.requests.labels(protocol, method, str(status)),
                self.latency.labels(protocol, method),
            )
        child[0].inc()
        child[1].observe(seconds)

    def count_inflight(self, source: Callable[[], int]) -> None:
        """Add a source of in-flight request counts (one per listener)."""
        self._inflight_sources.append(source)

    def bytes_in_child(self, protocol: str) -> Any:
        child = self._bytes_children.get(("in", protocol))
        if child is None:
            child = self._bytes_children[("in", protocol)] = self.bytes_in.labels(protocol)
        return child

    def bytes_out_child(self, protocol: str) -> Any:
        child = self._bytes_children.get(("out", protocol))
        if child is None:
            child = self._bytes_children[("out", protocol)] = self.bytes_out.labels(protocol)
        return child

    def count_lookup(self, protocol: str, hit: bool) -> None:
        key = (protocol, hit)
        child = self._lookup_children.get(key)
        if child is None:
            child = self._lookup_children[key] = self.lookups.labels(
                protocol, "hit" if hit else "miss"
            )
        child.inc()

    async def node_exposition(self) -> bytes:
        """The node's exposition: this process's, with its workers' merged in when it has some
        (``merge``, set by ``kura.workers``). ``/metrics`` serves it and ``/status`` counts its
        lookups from it, so the two cannot disagree."""
        body = self.exposition()
        if self.merge is not None:
            body = await self.merge(body)
        return body

    async def lookups_by_protocol(self) -> dict[str, dict[str, int]]:
        """``kura_cache_lookups_total`` of the whole node (the workers' hits too, from
        ``node_exposition``; issue 26 item 11: the status page counted the primary's alone) as
        ``{protocol: {"hit": n, "miss": n}}``, protocols in name order; a protocol appears once
        it counted a lookup (empty before any read)."""
        out: dict[str, dict[str, int]] = {}
        text = (await self.node_exposition()).decode()
        for family in text_string_to_metric_families(text):
            if family.name != "kura_cache_lookups":
                continue
            for sample in family.samples:
                if sample.name.endswith("_total"):
                    counts = out.setdefault(sample.labels["protocol"], {"hit": 0, "miss": 0})
                    counts[sample.labels["result"]] = int(sample.value)
        return dict(sorted(out.items()))

    def count_aborted_upload(self, reason: str) -> None:
        """One upload aborted; ``reason`` is ``stalled`` or ``slow``."""
        self.aborted_uploads.labels(reason).inc()

    def watch_value(
        self, kind: str, name: str, documentation: str, source: Callable[[], float]
    ) -> None:
        """Expose ``source()`` at scrape time as a ``gauge`` or ``counter`` (``name`` without
        ``_total``; the exposition adds it)."""
        self.registry.register(_ValueCollector(kind, name, documentation, source))

    def watch_store(
        self,
        stats: StorageStats,
        budget: TmpBudget,
        max_disk_bytes: int,
        tmp_dir_bytes: Callable[[], int],
        hot: HotCache,
        start_report: Callable[[], StartReport] = StartReport,
        free_bytes: Callable[[], int] = lambda: 0,
    ) -> None:
        self.registry.register(
            _StoreCollector(
                stats, budget, max_disk_bytes, tmp_dir_bytes, hot, start_report, free_bytes
            )
        )

    def watch_hot_cache(self, hot: HotCache) -> None:
        """A worker's hot cache alone (the primary's comes with ``watch_store``)."""
        self.registry.register(_HotCacheCollector(hot))

    def watch_mesh(
        self,
        membership: Membership,
        shipper: Shipper,
        read_through: ReadThrough,
        bootstrapper: Bootstrapper,
    ) -> None:
        self.registry.register(_MeshCollector(membership, shipper, read_through, bootstrapper))

    def watch_counts(
        self, name: str, documentation: str, label: str, counts: Callable[[], dict[str, int]]
    ) -> None:
        """Export ``counts()`` (label value → count, a closed set) as counter ``name``_total."""
        self.registry.register(_CountsCollector(name, documentation, label, counts))

    def watch_peer_metadata(
        self, requests: Callable[[], dict[str, int]], body_bytes: Callable[[], dict[str, int]]
    ) -> None:
        """The pulling side's metadata cost (``mesh.client``): ``kura_peer_metadata_requests_
        total{kind}`` and ``kura_peer_metadata_bytes_total{kind}`` (response body bytes), kind
        in ``mesh.client.METADATA_KINDS`` (bootstrap, changes)."""
        self.watch_counts(
            "kura_peer_metadata_requests",
            "Metadata requests made to peers, by kind: bootstrap (full manifest and tombstone "
            "walk) or changes (change feed).",
            "kind",
            requests,
        )
        self.watch_counts(
            "kura_peer_metadata_bytes",
            "Response body bytes of metadata requests made to peers, by kind.",
            "kind",
            body_bytes,
        )

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
