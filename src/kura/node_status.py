"""The ``/status`` document: the mesh as one node sees it (``GET /status``, ``kura status`` and
the ``/ui`` page all render this one dict, so they cannot disagree).

``node_status`` only reads: the node's membership, shipper, catch-up marks, bootstrap progress,
object-storage tier, anti-entropy summary, storage figures and recent log records. Its keys
and their units (``*_bytes``, ``*_seconds``, RFC 3339 UTC ``*_at`` times) are the document's
public shape, which ``kura status`` and the status page read (``docs/status-page.md``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kura import __version__
from kura.storage.fsync import process_shortage

if TYPE_CHECKING:
    from kura.app import Node


def node_status(node: Node, lookups: dict[str, dict[str, int]]) -> dict[str, Any]:
    """The status document of ``node`` (a JSON object; peers sorted by URL, bootstrap peers by
    peer), with ``lookups`` (``KuraMetrics.lookups_by_protocol``) as its hits and misses. Event
    loop thread only: it reads state the loop mutates."""
    peers = _peers(node)
    process_shortage.refresh()  # this moment's descriptor reading (storage.fsync)
    reasons = node.readiness_reasons()
    bootstrap = _bootstrap(node)
    return {
        "node_url": node.node_url,
        "public_url": node.public_url,
        "tenant_id": node.settings.tenant_id,
        "region": node.settings.region,
        "ready": not reasons,
        "reasons": reasons,
        "warnings": node.warnings(),
        # With the object-storage tier a node never bootstraps: its data is the bucket's.
        "bootstrap": bootstrap if node.object_tier is None else None,
        "object_store": _object_store(node),
        "anti_entropy": node.anti_entropy.summary(),
        "generation": node.membership.generation,
        "peers": peers,
        "artifacts": node.service.stats.artifacts,
        "disk_used_bytes": node.service.stats.used_bytes,
        "outbox_messages": node.service.stats.outbox_depth,
        "tmp_reserved_bytes": node.budget.reserved_bytes,
        "tmp_capacity_bytes": node.budget.capacity_bytes,
        "version": __version__,
        "event_loop": node.event_loop,
        "disk_limit_bytes": node.settings.max_disk_bytes,
        "lookups": lookups,
        "recent_errors": node.log_ring.records(),
    }


def _peers(node: Node) -> list[dict[str, Any]]:
    """Every peer any part of the node knows of (membership, shipper, catch-up marks), by URL."""
    now_ms = node.clock.now_ms()
    peers = []
    known = {p.node_url: p for p in node.membership.peers.values()}
    marks = node.service.queues.marks
    for url in sorted(
        set(node.membership.targets()) | set(known) | set(node.shipper.peers) | set(marks)
    ):
        peer = known.get(url)
        ship = node.shipper.peers.get(url)
        oldest = ship.oldest_enqueued_ms if ship else None
        mark = marks.get(url)
        peers.append(
            {
                "node_url": url,
                "known": peer is not None,
                "healthy": bool(peer and peer.healthy),
                "region": peer.region if peer else "",
                "outbox_messages": node.service.queues.depth(url),
                "outbox_oldest_age_seconds": (now_ms - oldest) / 1000 if oldest else 0.0,
                "replication_failures_in_a_row": ship.failures if ship else 0,
                "last_error": ship.last_error if ship else "",
                "needs_catch_up": mark is not None,
                "catch_up_reason": mark.reason if mark else "",
                "catching_up": node.catch_up.catching_up(url),
                "forgotten_at": _iso(mark.forgotten_at_ms if mark else None),
                "outbox_dropped_messages": mark.dropped_messages if mark else 0,
            }
        )
    return peers


def _bootstrap(node: Node) -> dict[str, Any]:
    """The bootstrap's summary, its byte budget and its progress per peer."""
    bootstrap: dict[str, Any] = dict(node.bootstrapper.summary())
    bootstrap.update(node.bootstrapper.budget().as_json())
    bootstrap["peers"] = [
        {
            "peer": p.peer,
            "phase": p.phase.value,
            "bytes_done": p.bytes_done,
            "bytes_total": p.bytes_total,
            "artifacts_done": p.artifacts_done,
            "artifacts_total": p.artifacts_total,
            "passes": p.passes,
            "failed_passes_in_a_row": p.failed_passes_in_a_row,
            "abandoned": p.abandoned,
            "last_error": p.last_error,
            "listed_artifacts": p.listed_artifacts,
            "listed_bytes": p.listed_bytes,
            "skipped_artifacts": p.skipped_artifacts,
            "skipped_bytes": p.skipped_bytes,
            "budget_stopped": p.budget_stopped,
            "mode": p.mode,
            "cursor": p.cursor_seq,
        }
        for p in sorted(node.bootstrapper.progress.values(), key=lambda p: p.peer)
    ]
    return bootstrap


def _object_store(node: Node) -> dict[str, Any] | None:
    """The tier's part: where, how far the uploads are behind, whether requests skip the store
    (its circuit breaker open: ``unreachable``) and whether the uploads are stalled with the
    disk full (None without the tier)."""
    if node.object_tier is None:
        return None
    stats = node.object_tier.store.stats
    return {
        "store": node.object_tier.store.describe(),
        "upload_queue_messages": stats.upload_queue_depth,
        "oldest_upload_age_seconds": round(stats.upload_oldest_age_seconds, 1),
        "unreachable": node.object_tier.store.breaker.state.open,
        "uploads_stalled": stats.upload_stalled,
    }


def _iso(ms: int | None) -> str | None:
    """Unix milliseconds as an RFC 3339 UTC time, or None."""
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat(timespec="milliseconds")
