"""Expiry metrics (``storage.expiry``), exposed at scrape time from its stats.

``kura_expiry_deleted_total`` and ``kura_expiry_deleted_bytes_total`` (artifacts and bytes
dropped for age), ``kura_expiry_passes_total``, ``kura_expiry_listener_failures_total``, and the
gauges ``kura_expiry_last_pass_timestamp_seconds`` (Unix time the last pass ended; 0 = none yet),
``kura_expiry_last_pass_seconds`` (how long it took) and
``kura_expiry_oldest_access_age_seconds`` (how long the least recently used artifact had been
unused when the last pass ended; 0 for an empty store). All stay 0 while expiry is off.
"""

from __future__ import annotations

from kura.api.metrics import KuraMetrics
from kura.storage.expiry import ExpiryStats


def watch_expiry(metrics: KuraMetrics, stats: ExpiryStats) -> None:
    for kind, name, doc, value in (
        (
            "counter",
            "kura_expiry_deleted",
            "Artifacts deleted because they were unused for longer than KURA_MAX_AGE.",
            lambda: stats.deleted_total,
        ),
        (
            "counter",
            "kura_expiry_deleted_bytes",
            "Bytes of artifacts deleted for age.",
            lambda: stats.deleted_bytes_total,
        ),
        ("counter", "kura_expiry_passes", "Expiry passes completed.", lambda: stats.passes_total),
        (
            "counter",
            "kura_expiry_listener_failures",
            "Expiry listeners (another tier's expiry) that raised.",
            lambda: stats.listener_failures_total,
        ),
        (
            "gauge",
            "kura_expiry_last_pass_timestamp_seconds",
            "Unix time the last expiry pass ended (0: none yet).",
            lambda: stats.last_pass_timestamp_seconds,
        ),
        (
            "gauge",
            "kura_expiry_last_pass_seconds",
            "Wall time the last expiry pass took (paced by KURA_EXPIRY_MAX_DELETES_PER_SECOND).",
            lambda: stats.last_pass_seconds,
        ),
        (
            "gauge",
            "kura_expiry_oldest_access_age_seconds",
            "Time since the least recently used artifact was last used, at the last pass.",
            lambda: stats.oldest_access_age_seconds,
        ),
    ):
        metrics.watch_value(kind, name, doc, value)
