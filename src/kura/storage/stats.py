"""``StorageStats``: the storage counters the metrics layer reads at scrape time."""

from __future__ import annotations

from dataclasses import dataclass, field

from kura.core.namespace_rule import ShedAges


@dataclass
class StorageStats:
    """Plain counters the metrics layer reads at scrape time."""

    used_bytes: int = 0
    artifacts: int = 0
    evictions_total: int = 0
    evicted_bytes_total: int = 0
    # Of those, promised ones evicted inside KURA_MIN_RETENTION (storage.retention), and when the
    # last one went (unix ms, 0 = never).
    retention_evictions_total: int = 0
    retention_evicted_bytes_total: int = 0
    # Artifacts used inside KURA_MIN_RETENTION but not promised, evicted while promises held more
    # than retention.DISPLACING_SHARE of the budget; when the last of either went (unix ms).
    retention_displaced_evictions_total: int = 0
    retention_displaced_bytes_total: int = 0
    retention_last_eviction_ms: int = 0
    # Bytes of the artifacts promised inside the window, as of the last eviction pass or flush.
    retention_promised_bytes: int = 0
    # Retention per namespace (KURA_NAMESPACE_RULES, storage.eviction): namespace -> (bytes,
    # entries) as last measured (namespace_usage), 0 = never measured; (rule label, reason) ->
    # entries evicted or expired; the ages of evicted entries; the last forced eviction (unix ms)
    # of an entry inside its rule's min_age.
    namespace_usage: dict[str, tuple[int, int]] = field(default_factory=dict)
    namespace_usage_measured_ms: int = 0
    namespace_evictions_total: dict[tuple[str, str], int] = field(default_factory=dict)
    namespace_evicted_bytes_total: dict[tuple[str, str], int] = field(default_factory=dict)
    shed_ages: ShedAges = field(default_factory=ShedAges)
    namespace_forced_last_ms: int = 0
    # detected_by ("read", "scrub", "put") -> entries quarantined.
    corrupt_total: dict[str, int] = field(default_factory=dict)
    outbox_depth: int = 0  # changed on the writer thread only
    # (source, outcome) -> count; source is "local", "replication", "bootstrap", "read_through".
    apply_outcomes_total: dict[tuple[str, str], int] = field(default_factory=dict)
    # (source, reason) -> copies from peers refused before applying; reason "future_version".
    rejected_total: dict[tuple[str, str], int] = field(default_factory=dict)
    # source ("local", "replication") -> purges of a writer's entries applied (provenance).
    writer_purges_total: dict[str, int] = field(default_factory=dict)
