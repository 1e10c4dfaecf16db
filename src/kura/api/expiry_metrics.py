"""Expiry metrics (``storage.expiry``), exposed at scrape time from its stats.

``kura_expiry_deleted_total`` and ``kura_expiry_deleted_bytes_total`` (artifacts and bytes
dropped for age), ``kura_expiry_passes_total``, ``kura_expiry_listener_failures_total``, and the
gauges ``kura_expiry_last_pass_timestamp_seconds`` (Unix time the last pass ended; 0 = none yet),
``kura_expiry_last_pass_seconds`` (how long it took) and
``kura_expiry_oldest_access_age_seconds`` (how long the least recently used artifact had been
unused when the last pass ended; 0 for an empty store). All stay 0 while expiry is off.

With the object-storage tier (``bucket_expiry_collector``, ``storage.bucket_expiry``):
``kura_expiry_bucket_deleted_total`` (artifacts deleted from the bucket by this node's passes),
``kura_expiry_bucket_markers_deleted_total`` (touch markers left without their object),
``kura_expiry_bucket_kept_total`` (victims a re-check kept: used meanwhile),
``kura_expiry_bucket_evictions_total{rule,reason}`` and
``kura_expiry_bucket_evicted_bytes_total{rule,reason}`` (those deletions by their namespace's
rule, ``(default)`` for none, and reason: ``max_age``, ``quota``, or ``forced`` when over the
quota inside the rule's ``min_age``: the labels of the local ``kura_namespace_evictions_total``),
``kura_expiry_bucket_passes_total``, ``kura_expiry_bucket_pass_failures_total``,
``kura_expiry_bucket_touches_total{result}`` (touch markers, result in ``ok``, ``error``,
``dropped``) and the gauge ``kura_expiry_bucket_touch_queue_artifacts``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from prometheus_client.core import CounterMetricFamily
from prometheus_client.metrics_core import Metric

from kura.api.metrics import Family, Scraped, counter, counts, gauge
from kura.storage.bucket_expiry import BucketExpiry
from kura.storage.bucket_touch import BucketToucher
from kura.storage.expiry import ExpiryStats


def expiry_collector(stats: ExpiryStats) -> Scraped:
    """The ``kura_expiry_*`` families of the local tier's expiry (``storage.expiry``)."""
    return Scraped(
        counter(
            "kura_expiry_deleted",
            "Artifacts deleted because they were unused for longer than KURA_MAX_AGE.",
            lambda: stats.deleted_total,
        ),
        counter(
            "kura_expiry_deleted_bytes",
            "Bytes of artifacts deleted for age.",
            lambda: stats.deleted_bytes_total,
        ),
        counter("kura_expiry_passes", "Expiry passes completed.", lambda: stats.passes_total),
        counter(
            "kura_expiry_listener_failures",
            "Expiry listeners (another tier's expiry) that raised.",
            lambda: stats.listener_failures_total,
        ),
        gauge(
            "kura_expiry_last_pass_timestamp_seconds",
            "Unix time the last expiry pass ended (0: none yet).",
            lambda: stats.last_pass_timestamp_seconds,
        ),
        gauge(
            "kura_expiry_last_pass_seconds",
            "Wall time the last expiry pass took (paced by KURA_EXPIRY_MAX_DELETES_PER_SECOND).",
            lambda: stats.last_pass_seconds,
        ),
        gauge(
            "kura_expiry_oldest_access_age_seconds",
            "Time since the least recently used artifact was last used, at the last pass.",
            lambda: stats.oldest_access_age_seconds,
        ),
    )


def by_rule_and_reason(
    name: str, documentation: str, values: Callable[[], Mapping[tuple[str, str], int]]
) -> Family:
    """A counter ``name``_total with one series per (rule, reason) of ``values()``."""

    def family() -> Metric:
        found = CounterMetricFamily(name, documentation, labels=["rule", "reason"])
        for (rule, reason), n in sorted(values().items()):
            found.add_metric([rule, reason], n)
        return found

    return family


def bucket_expiry_collector(expiry: BucketExpiry, toucher: BucketToucher) -> Scraped:
    """The ``kura_expiry_bucket_*`` families (``storage.bucket_expiry``, ``.bucket_touch``)."""
    stats = expiry.stats
    return Scraped(
        counter(
            "kura_expiry_bucket_deleted",
            "Artifacts this node deleted from the bucket: unused on every node past their max age, "
            "or over their namespace's quota.",
            lambda: stats.deleted_total,
        ),
        counter(
            "kura_expiry_bucket_markers_deleted",
            "Touch markers deleted from the bucket after their object was gone.",
            lambda: stats.markers_deleted_total,
        ),
        counter(
            "kura_expiry_bucket_kept",
            "Bucket expiry victims kept by the re-check before deletion (used meanwhile).",
            lambda: stats.kept_total,
        ),
        by_rule_and_reason(
            "kura_expiry_bucket_evictions",
            "Artifacts this node deleted from the bucket, by their namespace's rule and the "
            "reason (max_age, quota, forced: over the quota inside min_age).",
            lambda: dict(stats.evictions_total),
        ),
        by_rule_and_reason(
            "kura_expiry_bucket_evicted_bytes",
            "Bytes of artifacts this node deleted from the bucket, by rule and reason.",
            lambda: dict(stats.evicted_bytes_total),
        ),
        counter(
            "kura_expiry_bucket_passes",
            "Bucket expiry passes completed.",
            lambda: stats.passes_total,
        ),
        counter(
            "kura_expiry_bucket_pass_failures",
            "Bucket expiry passes that failed (the store refused or was unreachable).",
            lambda: stats.failures_total,
        ),
        gauge(
            "kura_expiry_bucket_touch_queue_artifacts",
            "Artifacts waiting for their touch marker to be written to the bucket.",
            toucher.pending,
        ),
        counts(
            "kura_expiry_bucket_touches",
            "Touch markers written to the bucket, by result (ok, error, dropped: queue full).",
            "result",
            lambda: dict(toucher.stats),
        ),
    )
