"""``kura.api.metrics``: the per-request families are plain numbers read at scrape time
(``RequestSeries``, issue 30 item 3), and their exposition is the one prometheus_client's own
``Counter`` and ``Histogram`` gave for the same requests, line for line."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from kura.api.metrics import LATENCY_BUCKETS, KuraMetrics

# Latencies on, between, below and above the bucket bounds (2^i ms), and a zero.
LATENCIES = (0.0, 0.0005, 0.001, 0.0015, 0.002, 0.004, 0.0041, 0.5, 16.384, 32.768, 40.0, 1e9)


def request_lines(exposition: bytes) -> list[str]:
    """The lines of the request families, without the others (node info, in-flight gauge)."""
    names = (
        "kura_http_requests",
        "kura_http_request_duration_seconds",
        "kura_cache_lookups",
        "kura_http_received_bytes",
        "kura_http_sent_bytes",
    )
    keep = []
    for line in exposition.decode().splitlines():
        words = line.split(" ")
        name = words[2] if line.startswith("#") else words[0].split("{")[0]
        if any(name == n or name.startswith(n + "_") for n in names):
            keep.append(line)
    return keep


def reference(requests: list[tuple[str, str, int, float]]) -> list[str]:
    """What prometheus_client's own families expose for ``requests`` (the families kura had)."""
    r = CollectorRegistry(auto_describe=True)
    total = Counter(
        "kura_http_requests_total",
        "HTTP requests by protocol, method and status.",
        ["protocol", "method", "status"],
        registry=r,
    )
    latency = Histogram(
        "kura_http_request_duration_seconds",
        "HTTP request latency.",
        ["protocol", "method"],
        buckets=LATENCY_BUCKETS,
        registry=r,
    )
    lookups = Counter(
        "kura_cache_lookups_total",
        "Artifact reads by protocol and result (hit or miss).",
        ["protocol", "result"],
        registry=r,
    )
    received = Counter(
        "kura_http_received_bytes_total",
        "Artifact bytes received in request bodies.",
        ["protocol"],
        registry=r,
    )
    sent = Counter(
        "kura_http_sent_bytes_total",
        "Artifact bytes sent in response bodies.",
        ["protocol"],
        registry=r,
    )
    for protocol, method, status, seconds in requests:
        total.labels(protocol, method, str(status)).inc()
        latency.labels(protocol, method).observe(seconds)
        lookups.labels(protocol, "hit" if status == 200 else "miss").inc()
        (received if method == "PUT" else sent).labels(protocol).inc(1024)
    return request_lines(generate_latest(r))


def test_request_families_expose_what_prometheus_client_did() -> None:
    requests = [
        (protocol, method, status, seconds)
        for protocol in ("http_cache", "nx")
        for method, status in (("GET", 200), ("GET", 404), ("PUT", 201))
        for seconds in LATENCIES
    ]
    metrics = KuraMetrics("region", "tenant")
    assert request_lines(metrics.exposition()) == reference([])  # families before any series
    for protocol, method, status, seconds in requests:
        metrics.observe_request(protocol, method, status, seconds)
        metrics.count_lookup(protocol, status == 200)
        if method == "PUT":
            metrics.bytes_in_child(protocol).inc(1024)
        else:
            metrics.bytes_out_child(protocol).inc(1024)
    got = request_lines(metrics.exposition())
    assert got == reference(requests)
    assert (
        'kura_http_request_duration_seconds_bucket{le="+Inf",method="GET",protocol="nx"} 24.0'
        in got
    )
