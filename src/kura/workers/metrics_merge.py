"""``/metrics`` of a node with workers reports the node as one: at scrape time the primary
reads each worker's exposition over its control socket and combines every family a worker
exposes with its own, sample by sample (equal name and labels combine; ``_created`` samples
keep the primary's value). How a family combines is declared by the collector that defines it
(``across_processes``, ``kura.api.metrics.Scraped``), gathered by ``KuraMetrics.register``:
the default is the sum over processes (requests, latency, lookups, bytes, in-flight, hot cache,
connections, unreported hits: each process has its own), and a collector may ask for the most
or the least any process has, or the primary's value alone (``api.auth_metrics`` says which
and why for its families; ``kura_node_info`` and the gRPC share of the connection cap are the
primary's). A worker that does not answer within ``SCRAPE_TIMEOUT_SECONDS`` is left out of
that scrape.

Why not prometheus_client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``,
``MultiProcessCollector``): it could add up only the request counters and histogram. Custom
collectors and ``Gauge.set_function`` do not work in it (prometheus_client's "Multiprocess
Mode" documentation), yet the in-flight, hot-cache, connection and unreported-hit gauges and
the TLS families are read from each process's state at scrape time, so this scrape would stay
for them and a second mechanism would be added beside it. Its counters are always summed, where
the TLS reload counts need the most any process made. And it is chosen for the whole Python
process, at import, from the environment: every node in one process (the in-process test
nodes) would write one set of files, keyed by one pid.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence

import aiohttp
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from kura.api.metrics import Across

log = logging.getLogger(__name__)

SCRAPE_TIMEOUT_SECONDS = 2.0
_COMBINE: dict[Across, Callable[[float, float], float]] = {
    "sum": float.__add__,
    "max": max,
    "min": min,
}


async def _scrape(path: str) -> str | None:
    try:
        connector = aiohttp.UnixConnector(path=path)
        async with (
            aiohttp.ClientSession(connector=connector) as session,
            session.get(
                "http://worker/metrics",
                timeout=aiohttp.ClientTimeout(total=SCRAPE_TIMEOUT_SECONDS),
            ) as r,
        ):
            return await r.text()
    except (aiohttp.ClientError, OSError, TimeoutError) as exc:
        log.warning("could not read a worker's metrics (%s): %s", path, exc)
        return None


def merge(own: str, others: Sequence[str], across: Mapping[str, Across]) -> bytes:
    """``own`` exposition (Prometheus text format) with every family of ``others`` combined into
    it as ``across`` says (family name → rule; absent: ``sum``; module docstring). Families
    only ``own`` has are kept as they are."""
    families = list(text_string_to_metric_families(own))
    by_name = {f.name: f for f in families}
    for text in others:
        for family in text_string_to_metric_families(text):
            rule = across.get(family.name, "sum")
            if rule == "primary":
                continue
            combine = _COMBINE[rule]
            target = by_name.get(family.name)
            if target is None:
                target = by_name[family.name] = family
                families.append(family)
                continue
            index = {
                (s.name, tuple(sorted(s.labels.items()))): i for i, s in enumerate(target.samples)
            }
            for s in family.samples:
                if s.name.endswith("_created"):
                    continue
                key = (s.name, tuple(sorted(s.labels.items())))
                i = index.get(key)
                if i is None:
                    index[key] = len(target.samples)
                    target.samples.append(s)
                else:
                    old = target.samples[i]
                    value = combine(float(old.value), float(s.value))
                    target.samples[i] = Sample(old.name, old.labels, value)
    registry = CollectorRegistry(auto_describe=False)

    class _Fixed:
        def collect(self) -> Iterator[Metric]:
            yield from families

    registry.register(_Fixed())
    return generate_latest(registry)


async def merge_workers(own: bytes, sockets: Sequence[str], across: Mapping[str, Across]) -> bytes:
    """``own`` with the families of the workers listening on ``sockets`` merged in as
    ``across`` says (``merge``)."""
    texts = await asyncio.gather(*(_scrape(p) for p in sockets))
    found = [t for t in texts if t is not None]
    if not found:
        return own
    return merge(own.decode(), found, across)
