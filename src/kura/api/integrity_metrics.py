"""Prometheus families for the integrity of stored bytes, read at scrape time.

``kura_storage_corrupt_artifacts_total{detected_by}`` counts entries quarantined because their
bytes did not match their manifest, by who found it: ``read`` (a GET, on open or while sending),
``scrub`` (the background re-hash) or ``put`` (a PUT route's "exists and intact" check). Every
label value is always present, so a rate over it never starts from a missing series.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from kura.mesh.repair import RepairStats
from kura.storage.quarantine import Quarantine
from kura.storage.scrub import ScrubStats
from kura.storage.stats import StorageStats

DETECTED_BY = ("read", "scrub", "put")
REPAIR_RESULTS = ("repaired", "not_found", "error", "dropped")


class IntegrityCollector(Collector):
    def __init__(
        self,
        stats: StorageStats,
        quarantine: Quarantine,
        scrub: ScrubStats,
        repair: RepairStats,
    ) -> None:
        self._stats = stats
        self._quarantine = quarantine
        self._scrub = scrub
        self._repair = repair

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        corrupt = CounterMetricFamily(
            "kura_storage_corrupt_artifacts",
            "Artifacts quarantined because their bytes did not match their digest or size.",
            labels=["detected_by"],
        )
        for by in DETECTED_BY:
            corrupt.add_metric([by], self._stats.corrupt_total.get(by, 0))
        yield corrupt
        yield GaugeMetricFamily(
            "kura_storage_quarantine_bytes",
            "Bytes of damaged blobs kept in the quarantine directory.",
            self._quarantine.size_bytes,
        )
        yield CounterMetricFamily(
            "kura_scrub_scrubbed_bytes",
            "Bytes re-hashed by the background scrub.",
            self._scrub.scrubbed_bytes_total,
        )
        yield CounterMetricFamily(
            "kura_scrub_scrubbed_artifacts",
            "Artifacts checked by the background scrub.",
            self._scrub.scrubbed_artifacts_total,
        )
        yield CounterMetricFamily(
            "kura_scrub_passes", "Scrub passes completed.", self._scrub.passes_total
        )
        repairs = CounterMetricFamily(
            "kura_repair_results",
            "Quarantined artifacts fetched again from peers, by result.",
            labels=["result"],
        )
        for result in REPAIR_RESULTS:
            repairs.add_metric([result], self._repair.results_total.get(result, 0))
        yield repairs
