"""Prometheus metrics for one node, in their own registry, and the collector its components use.

``KuraMetrics`` owns the registry and the request families, recorded by the endpoint wrapper
(``kura.api.http``). Every other family belongs to the component it describes: each exposes a
collector (``Scraped``, or its own ``Collector``) that reads the component's plain counters at
scrape time, and ``kura.app`` registers them (``KuraMetrics.register``); the components
themselves know nothing of Prometheus (metrics wrap the store, STYLE.md). Labels come from
closed sets only: protocol names, HTTP methods, status codes, outcomes; never a key or a URL.

With worker processes, a family a worker also exposes is summed over the processes unless its
collector says otherwise in ``across_processes`` (``kura.workers.metrics_merge``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any, Literal

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

# The *_created series only add noise for a long-running server.
disable_created_metrics()  # type: ignore[no-untyped-call]

LATENCY_BUCKETS = tuple(0.001 * 2**i for i in range(16))


# How the node's value of a family combines the processes' (``kura.workers.metrics_merge``):
# their sum (the default), the most or the least any process has, or the primary's alone.
Across = Literal["sum", "max", "min", "primary"]
Family = Callable[[], Metric]  # builds one family from a component's counters, at scrape time


def gauge(name: str, documentation: str, value: Callable[[], float]) -> Family:
    """A gauge ``name`` of ``value()``."""
    return lambda: GaugeMetricFamily(name, documentation, value())


def counter(name: str, documentation: str, value: Callable[[], float]) -> Family:
    """A counter ``name``_total of ``value()`` (``name`` without ``_total``)."""
    return lambda: CounterMetricFamily(name, documentation, value())


def counts(
    name: str, documentation: str, label: str, values: Callable[[], Mapping[str, float]]
) -> Family:
    """A counter ``name``_total with one series per item of ``values()`` (label value → count,
    a closed set), in label order."""

    def family() -> Metric:
        found = CounterMetricFamily(name, documentation, labels=[label])
        for value, n in sorted(values().items()):
            found.add_metric([value], n)
        return found

    return family


class Scraped(Collector):
    """A component's families, each built from its counters at scrape time.

    ``across_processes`` maps a family name (counters without ``_total``) to how it combines
    over worker processes when not summed (``Across``)."""

    def __init__(
        self, *families: Family, across_processes: Mapping[str, Across] | None = None
    ) -> None:
        self._families = families
        self.across_processes = dict(across_processes or {})

    def collect(self) -> Iterator[Metric]:
        for family in self._families:
            yield family()


class KuraMetrics:
    """All of one node's metrics. Create once per process (or per test app)."""

    def __init__(self, region: str, tenant_id: str) -> None:
        self._request_children: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self._lookup_children: dict[tuple[str, bool], Any] = {}
        self._bytes_children: dict[tuple[str, str], Any] = {}
        self.registry = CollectorRegistry(auto_describe=True)
        # Family name → how workers' samples combine with this process's (``register``).
        self.across_processes: dict[str, Across] = {"kura_node_info": "primary"}
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

    def register(self, *collectors: Collector) -> None:
        """Register each collector on the node's registry and take in its ``across_processes``
        (``Scraped``). Raises ``ValueError`` for a family name already registered."""
        for collector in collectors:
            self.registry.register(collector)
            self.across_processes.update(getattr(collector, "across_processes", {}))

    def exposition(self) -> bytes:
        return generate_latest(self.registry)
