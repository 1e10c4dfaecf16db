"""The ``/status`` document: the mesh as one node sees it (``GET /status``, ``kura status`` and
the ``/ui`` page all render this one dict, so they cannot disagree).

``node_status`` only reads: the node's membership, shipper, catch-up marks, bootstrap progress,
object-storage tier, anti-entropy summary, storage figures and recent log records. Its keys
and their units (``*_bytes``, ``*_seconds``, RFC 3339 UTC ``*_at`` times) are the document's
public shape, which ``kura status`` and the status page read (``docs/status-page.md``).
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from kura import __version__
from kura.core.namespace_rule import DEFAULT_RULE, OTHER, REASONS, top_namespaces
from kura.core.versions import MIN_WIRE_VERSION, WIRE_VERSION
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
        # The start-up work still running after the listeners came up (storage.startup_work).
        "startup": node.service.startup.as_json(),
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
        "wire_version": WIRE_VERSION,
        "min_wire_version": MIN_WIRE_VERSION,
        "event_loop": node.event_loop,
        "disk_limit_bytes": node.settings.max_disk_bytes,
        "namespaces": _namespaces(node),
        "namespace_rules": _namespace_rules(node),
        "lookups": lookups,
        "recent_errors": node.log_ring.records(),
    }


def _namespaces(node: Node) -> list[dict[str, Any]]:
    """What each namespace holds here as last measured (``StorageStats.namespace_usage``), the
    ``TOP_NAMESPACES`` largest first, the rest summed as ``(other)``; each with its rule's
    label (``(default)``: none; empty for ``(other)``)."""
    rules = node.settings.namespace_rules
    usage = top_namespaces(node.service.stats.namespace_usage)
    return [
        {
            "namespace": ns,
            "rule": "" if ns == OTHER else rules.label(ns),
            "used_bytes": size,
            "artifacts": entries,
        }
        for ns, (size, entries) in sorted(usage.items(), key=lambda kv: (-kv[1][0], kv[0]))
    ]


def _finite(seconds: float | None) -> float | None:
    """``seconds``, or None for ``inf``: JSON (RFC 8259) has no Infinity."""
    return None if seconds is None or math.isinf(seconds) else seconds


def _namespace_rules(node: Node) -> list[dict[str, Any]]:
    """Each rule of ``KURA_NAMESPACE_RULES`` in order, then ``(default)`` (namespaces no rule
    matches): what it states (None: the global setting), its evictions by reason since start,
    and the median shed age (the upper bound of its bucket, seconds; None: nothing evicted, or
    the median is past the last bound, which the page tells apart by the evictions)."""
    s = node.service.stats
    rows: list[tuple[str, float | None, int | None, float]] = [
        (r.pattern, r.max_age_seconds, r.quota_bytes, r.min_age_seconds)
        for r in node.settings.namespace_rules.rules
    ]
    rows.append((DEFAULT_RULE, None, None, 0.0))
    return [
        {
            "rule": label,
            "max_age_seconds": max_age,
            "quota_bytes": quota,
            "min_age_seconds": min_age,
            "evictions": {
                reason: s.namespace_evictions_total.get((label, reason), 0) for reason in REASONS
            },
            "shed_age_median_seconds": _finite(s.shed_ages.quantile_seconds(label, 0.5)),
        }
        for label, max_age, quota, min_age in rows
    ]


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
                # As its last answered probe reported them (None until then; kura 0.1.0
                # reports no kura version and is wire 1).
                "wire_version": peer.wire_version if peer else None,
                "kura_version": peer.kura_version if peer else None,
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
