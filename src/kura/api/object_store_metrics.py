"""Prometheus families for the object-storage tier, read at scrape time from ObjectStoreStats.

* ``kura_object_store_requests_total{op,result}``: every request to the store; ``op`` in
  put/get/head/delete/list, ``result`` in ok/not_found/auth/bucket_missing/throttled/
  server_error/timeout/unreachable/error (closed sets; every pair always present).
* ``kura_object_store_request_duration_seconds{op}``: request latency.
* ``kura_object_store_upload_queue_messages``: uploads and cleans waiting in the outbox.
* ``kura_object_store_upload_queue_oldest_age_seconds``: how long the oldest has waited.
* ``kura_object_store_upload_queue_stalled``: 1 while uploads fail with the disk full (writes
  are refused until the store takes them), else 0.
* ``kura_object_store_circuit_open``: 1 while the circuit breaker skips the store
  (``storage.breaker``), else 0; ``kura_object_store_circuit_opened_total``: times it opened;
  ``kura_object_store_skipped_requests_total``: requests not sent because it was open.
* ``kura_object_store_uploaded_bytes_total``, ``kura_object_store_filled_bytes_total``: artifact
  bytes uploaded, and read from the store into the local tier on misses.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.registry import Collector

from kura.storage.breaker import BreakerState
from kura.storage.object_store_stats import LATENCY_BUCKETS, OPS, RESULTS, ObjectStoreStats


class ObjectStoreCollector(Collector):
    def __init__(self, stats: ObjectStoreStats, breaker: BreakerState | None = None) -> None:
        self._stats = stats
        self._breaker = breaker or BreakerState()

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily | HistogramMetricFamily]:
        s = self._stats
        requests = CounterMetricFamily(
            "kura_object_store_requests",
            "Requests to the object-storage tier, by operation and result.",
            labels=["op", "result"],
        )
        for op in OPS:
            for result in RESULTS:
                requests.add_metric([op, result], s.requests_total.get((op, result), 0))
        yield requests
        latency = HistogramMetricFamily(
            "kura_object_store_request_duration_seconds",
            "Latency of requests to the object-storage tier.",
            labels=["op"],
        )
        for op in OPS:
            counts, total = s.latency.get(op, ([0] * (len(LATENCY_BUCKETS) + 1), 0.0))
            buckets, running = [], 0
            for bound, n in zip((*LATENCY_BUCKETS, float("inf")), counts, strict=True):
                running += n
                buckets.append(("+Inf" if bound == float("inf") else repr(bound), running))
            latency.add_metric([op], buckets, total)
        yield latency
        yield GaugeMetricFamily(
            "kura_object_store_upload_queue_messages",
            "Uploads and cleans queued for the object-storage tier.",
            s.upload_queue_depth,
        )
        yield GaugeMetricFamily(
            "kura_object_store_upload_queue_oldest_age_seconds",
            "Age of the oldest message queued for the object-storage tier (0 when empty).",
            s.upload_oldest_age_seconds,
        )
        yield GaugeMetricFamily(
            "kura_object_store_upload_queue_stalled",
            "1 while uploads fail and the disk is full (writes refused until they drain).",
            1 if s.upload_stalled else 0,
        )
        b = self._breaker
        yield GaugeMetricFamily(
            "kura_object_store_circuit_open",
            "1 while requests skip the object store after failures in a row, else 0.",
            1 if b.open else 0,
        )
        yield CounterMetricFamily(
            "kura_object_store_circuit_opened",
            "Times the object store's circuit breaker opened.",
            b.opened_total,
        )
        yield CounterMetricFamily(
            "kura_object_store_skipped_requests",
            "Requests not sent to the object store because its circuit breaker was open.",
            b.skipped_total,
        )
        yield CounterMetricFamily(
            "kura_object_store_uploaded_bytes",
            "Artifact bytes uploaded to the object-storage tier.",
            s.uploaded_bytes_total,
        )
        yield CounterMetricFamily(
            "kura_object_store_filled_bytes",
            "Artifact bytes read from the object-storage tier into the local tier on misses.",
            s.filled_bytes_total,
        )
