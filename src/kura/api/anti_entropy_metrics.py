"""Anti-entropy metrics (``mesh.anti_entropy``), exposed at scrape time from its stats.

Names are fixed (a benchmark reads them): ``kura_anti_entropy_rounds_total``,
``..._ranges_compared_total``, ``..._ranges_mismatched_total``, ``..._requests_total``,
``..._bytes_total`` (bytes of peer responses received: digest and listing bodies plus the
bodies of repaired artifacts), ``..._repaired_total{kind}`` (kind: artifact, tombstone),
``..._skipped_total{reason}`` (disk_budget, future_version, error) and the gauge
``kura_anti_entropy_last_round_seconds`` (wall time of the last round).
"""

from __future__ import annotations

from kura.api.metrics import Scraped, counter, counts, gauge
from kura.mesh.anti_entropy import AntiEntropyStats


def anti_entropy_collector(stats: AntiEntropyStats) -> Scraped:
    """The families above, read from ``stats`` at scrape time."""
    return Scraped(
        counter("kura_anti_entropy_rounds", "Anti-entropy rounds run.", lambda: stats.rounds_total),
        counter(
            "kura_anti_entropy_ranges_compared",
            "Key ranges whose digests were compared with a peer's.",
            lambda: stats.ranges_compared_total,
        ),
        counter(
            "kura_anti_entropy_ranges_mismatched",
            "Compared key ranges whose digests differed.",
            lambda: stats.ranges_mismatched_total,
        ),
        counter(
            "kura_anti_entropy_requests",
            "Anti-entropy requests sent to peers.",
            lambda: stats.requests_total,
        ),
        counter(
            "kura_anti_entropy_bytes",
            "Bytes of anti-entropy responses received.",
            lambda: stats.bytes_total,
        ),
        counts(
            "kura_anti_entropy_repaired",
            "Items repaired by anti-entropy, by kind (artifact, tombstone).",
            "kind",
            lambda: stats.repaired_total,
        ),
        counts(
            "kura_anti_entropy_skipped",
            "Repairs not made, by reason (disk_budget: a missing artifact that would need an "
            "eviction; future_version; error).",
            "reason",
            lambda: stats.skipped_total,
        ),
        gauge(
            "kura_anti_entropy_last_round_seconds",
            "Wall time of the last anti-entropy round.",
            lambda: stats.last_round_seconds,
        ),
    )
