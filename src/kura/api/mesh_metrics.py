"""The mesh's families (``kura.mesh``), read at scrape time from its components' counters.

``MeshCollector``: ``kura_mesh_*`` (peers, membership changes, initial discovery), the per-peer
outbox and delivery families of the shipper (``kura_outbox_messages``,
``..._oldest_message_age_seconds``, ``kura_replication_requests_total``,
``..._dropped_total``), ``kura_read_through_total`` and ``kura_bootstrap_*``.
``catch_up_collector``: what catch-up dropped and caught up per peer (``kura_outbox_*``);
``peer_metadata_collector``: the pulling side's metadata cost (``kura_peer_metadata_*``).
Peers are labelled by ``mesh.wire.peer_label``, never by raw URL.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kura.api.metrics import Scraped, counts, gauge
from kura.mesh.bootstrap import Bootstrapper
from kura.mesh.catch_up import CatchUpStats
from kura.mesh.client import PeerClient
from kura.mesh.membership import Membership
from kura.mesh.read_through import ReadThrough
from kura.mesh.shipper import Shipper
from kura.mesh.wire import peer_label
from kura.storage.ports import PeerQueueView


class MeshCollector(Collector):
    """Membership, the outbox shipper's per-peer delivery, read-through and bootstrap."""

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


def catch_up_collector(stats: CatchUpStats, queues: PeerQueueView) -> Scraped:
    """Per peer: queues and messages dropped, messages skipped at the cap, catch-ups (the
    peer pulled our feed); and the peers marked to be caught up (``mesh.catch_up``)."""
    return Scraped(
        counts(
            "kura_outbox_dropped_queues",
            "Peer queues dropped: the peer was absent past KURA_PEER_FORGET_AFTER or its queue "
            "reached KURA_OUTBOX_MAX_DEPTH.",
            "peer",
            _by_peer_label(lambda: stats.dropped_queues_total),
        ),
        counts(
            "kura_outbox_dropped_messages",
            "Outbox messages dropped with a peer's queue.",
            "peer",
            _by_peer_label(lambda: stats.dropped_messages_total),
        ),
        counts(
            "kura_outbox_skipped_messages",
            "Messages not enqueued because the peer's queue was at KURA_OUTBOX_MAX_DEPTH.",
            "peer",
            _by_peer_label(lambda: queues.skipped_total),
        ),
        counts(
            "kura_outbox_catch_ups",
            "Catch-up passes completed (the peer's mark cleared).",
            "peer",
            _by_peer_label(lambda: stats.catch_ups_total),
        ),
        gauge(
            "kura_outbox_peers_needing_catch_up",
            "Peers marked to be caught up (queue dropped or at its cap).",
            lambda: len(queues.marks),
        ),
    )


def peer_metadata_collector(client: PeerClient) -> Scraped:
    """The pulling side's metadata cost (``mesh.client``): requests and response body bytes by
    kind, in ``mesh.client.METADATA_KINDS`` (bootstrap, changes)."""
    return Scraped(
        counts(
            "kura_peer_metadata_requests",
            "Metadata requests made to peers, by kind: bootstrap (full manifest and tombstone "
            "walk) or changes (change feed).",
            "kind",
            lambda: client.metadata_requests_total,
        ),
        counts(
            "kura_peer_metadata_bytes",
            "Response body bytes of metadata requests made to peers, by kind.",
            "kind",
            lambda: client.metadata_bytes_total,
        ),
    )


def _by_peer_label(values: Callable[[], Mapping[str, int]]) -> Callable[[], dict[str, int]]:
    return lambda: {peer_label(url): n for url, n in values().items()}
