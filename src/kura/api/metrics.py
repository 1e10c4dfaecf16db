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

from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Literal

from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

# The *_created series only add noise for a long-running server.
disable_created_metrics()  # type: ignore[no-untyped-call]

LATENCY_BUCKETS = tuple(0.001 * 2**i for i in range(16))
_BOUNDS = (*LATENCY_BUCKETS, float("inf"))
_LE = tuple(floatToGoString(b) for b in _BOUNDS)  # type: ignore[no-untyped-call]


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


class Count:
    """One series of a request counter: a plain number, without prometheus_client's lock,
    since only the event loop adds to it (every HTTP handler and gRPC servicer runs there);
    ``RequestFamilies`` reads it at scrape time."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0.0

    def inc(self, amount: float = 1.0) -> None:
        self.value += amount


class Timing:
    """One series of the request latency histogram, as ``Count`` (no lock): the count per
    bucket of ``LATENCY_BUCKETS`` (+Inf last), not yet cumulative, and the sum of seconds."""

    __slots__ = ("buckets", "sum")

    def __init__(self) -> None:
        self.buckets = [0] * len(_BOUNDS)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        # The first bucket whose bound is at least ``seconds`` (prometheus_client's rule).
        self.buckets[bisect_left(_BOUNDS, seconds)] += 1
        self.sum += seconds


class RequestSeries:
    """The per-request families' series, as plain numbers, and the families built from them at
    scrape time (``Scraped``): the same names, help, labels and buckets as the
    prometheus_client ``Counter`` and ``Histogram`` they replace, whose every increment took a
    lock and whose every observation looped over the buckets in Python (issue 30 item 3);
    series in the order they were first used, as theirs."""

    def __init__(self) -> None:
        self.requests: dict[tuple[str, str, str], Count] = {}  # protocol, method, status
        self.latency: dict[tuple[str, str], Timing] = {}  # protocol, method
        self.lookups: dict[tuple[str, str], Count] = {}  # protocol, hit or miss
        self.bytes_in: dict[str, Count] = {}  # protocol
        self.bytes_out: dict[str, Count] = {}  # protocol

    def requests_family(self) -> Metric:
        family = CounterMetricFamily(
            "kura_http_requests",
            "HTTP requests by protocol, method and status.",
            labels=["protocol", "method", "status"],
        )
        for labels, count in list(self.requests.items()):
            family.add_metric(labels, count.value)
        return family

    def latency_family(self) -> Metric:
        family = HistogramMetricFamily(
            "kura_http_request_duration_seconds",
            "HTTP request latency.",
            labels=["protocol", "method"],
        )
        for labels, timing in list(self.latency.items()):
            total, cumulative = 0, []
            for le, n in zip(_LE, timing.buckets, strict=True):
                total += n
                cumulative.append((le, float(total)))
            family.add_metric(labels, cumulative, timing.sum)
        return family

    def lookups_family(self) -> Metric:
        family = CounterMetricFamily(
            "kura_cache_lookups",
            "Artifact reads by protocol and result (hit or miss).",
            labels=["protocol", "result"],
        )
        for labels, count in list(self.lookups.items()):
            family.add_metric(labels, count.value)
        return family

    def bytes_in_family(self) -> Metric:
        return _per_protocol(
            "kura_http_received_bytes", "Artifact bytes received in request bodies.", self.bytes_in
        )

    def bytes_out_family(self) -> Metric:
        return _per_protocol(
            "kura_http_sent_bytes", "Artifact bytes sent in response bodies.", self.bytes_out
        )


def _per_protocol(name: str, documentation: str, series: dict[str, Count]) -> Metric:
    family = CounterMetricFamily(name, documentation, labels=["protocol"])
    for protocol, count in list(series.items()):
        family.add_metric([protocol], count.value)
    return family


class KuraMetrics:
    """All of one node's metrics. Create once per process (or per test app)."""

    def __init__(self, region: str, tenant_id: str) -> None:
        # Per request: a dict look-up and plain additions (``RequestSeries``).
        self._request_children: dict[tuple[str, str, int], tuple[Count, Timing]] = {}
        self._lookup_children: dict[tuple[str, bool], Count] = {}
        self.series = series = RequestSeries()
        self.registry = CollectorRegistry(auto_describe=True)
        # Family name → how workers' samples combine with this process's (``register``).
        self.across_processes: dict[str, Across] = {"kura_node_info": "primary"}
        # With worker processes: adds their request families at scrape time (kura.workers).
        self.merge: Callable[[bytes], Awaitable[bytes]] | None = None
        r = self.registry
        self.register(Scraped(series.requests_family, series.latency_family))
        self._inflight_sources: list[Callable[[], int]] = []
        inflight = Gauge("kura_http_inflight_requests", "HTTP requests being served.", registry=r)
        # Read at scrape time: no locked increment and decrement on every request.
        inflight.set_function(lambda: sum(f() for f in self._inflight_sources))
        self.register(
            Scraped(series.lookups_family, series.bytes_in_family, series.bytes_out_family)
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
            s = self.series
            child = self._request_children[key] = (
                s.requests.setdefault((protocol, method, str(status)), Count()),
                s.latency.setdefault((protocol, method), Timing()),
            )
        child[0].value += 1
        child[1].observe(seconds)

    def count_inflight(self, source: Callable[[], int]) -> None:
        """Add a source of in-flight request counts (one per listener)."""
        self._inflight_sources.append(source)

    def bytes_in_child(self, protocol: str) -> Count:
        """The series of ``kura_http_received_bytes_total`` of ``protocol`` (``inc(n)``)."""
        child = self.series.bytes_in.get(protocol)
        if child is None:
            child = self.series.bytes_in[protocol] = Count()
        return child

    def bytes_out_child(self, protocol: str) -> Count:
        """The series of ``kura_http_sent_bytes_total`` of ``protocol`` (``inc(n)``)."""
        child = self.series.bytes_out.get(protocol)
        if child is None:
            child = self.series.bytes_out[protocol] = Count()
        return child

    def count_lookup(self, protocol: str, hit: bool) -> None:
        key = (protocol, hit)
        child = self._lookup_children.get(key)
        if child is None:
            result = "hit" if hit else "miss"
            child = self._lookup_children[key] = self.series.lookups.setdefault(
                (protocol, result), Count()
            )
        child.value += 1

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
