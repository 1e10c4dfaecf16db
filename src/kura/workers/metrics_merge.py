"""``/metrics`` of a node with workers reports the node as one: at scrape time the primary
reads each worker's exposition over its control socket and adds the request-path families to
its own, sample by sample (equal name and labels are summed; counters, histograms and the
in-flight, hot-cache, connection and unreported-hit gauges are all sums over processes: each
process has its own connection cap and hot cache). ``_created`` samples keep the primary's value.
The public TLS families describe files every process follows on its own (``api.public_tls``):
the node's reload and failure counts are the most any process has made (one swap is counted
once, not once per process), and its certificate expiry is the earliest any process still
serves (so an expiry alert fires until every process has the renewed certificate). The token
file reload count is the primary's alone: workers take in the changes it took
(``api.auth.TokenAuth.share``).
A worker that does not answer within ``SCRAPE_TIMEOUT_SECONDS`` is left out of that scrape.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator, Sequence

import aiohttp
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

log = logging.getLogger(__name__)

SCRAPE_TIMEOUT_SECONDS = 2.0
# The families a worker's requests add to (kura.api.metrics, kura.api.auth_metrics).
MERGED = frozenset(
    {
        "kura_http_requests",
        "kura_http_request_duration_seconds",
        "kura_http_inflight_requests",
        "kura_cache_lookups",
        "kura_http_received_bytes",
        "kura_http_sent_bytes",
        "kura_http_aborted_uploads",
        "kura_auth_refusals",
        "kura_hot_cache_bytes",
        "kura_hot_cache_lookups",
        "kura_http_open_connections",
        "kura_http_max_connections",
        "kura_http_connections_closed_at_cap",
        "kura_http_connections_refused_at_cap",
        "kura_worker_unreported_hits",
    }
)
HIGHEST = frozenset({"kura_public_tls_reloads", "kura_public_tls_reload_failures"})
LOWEST = frozenset({"kura_public_tls_certificate_expiry_timestamp_seconds"})
_COMBINE = (
    dict.fromkeys(MERGED, float.__add__) | dict.fromkeys(HIGHEST, max) | dict.fromkeys(LOWEST, min)
)


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


def merge(own: str, others: Sequence[str]) -> bytes:
    """``own`` exposition with the ``MERGED`` families of ``others`` added, and the ``HIGHEST``
    and ``LOWEST`` ones combined by max and min (module docstring)."""
    families = list(text_string_to_metric_families(own))
    by_name = {f.name: f for f in families}
    for text in others:
        for family in text_string_to_metric_families(text):
            combine = _COMBINE.get(family.name)
            if combine is None:
                continue
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


async def merge_workers(own: bytes, sockets: Sequence[str]) -> bytes:
    """``own`` with the live workers' families merged in (``merge``)."""
    texts = await asyncio.gather(*(_scrape(p) for p in sockets))
    found = [t for t in texts if t is not None]
    if not found:
        return own
    return merge(own.decode(), found)
