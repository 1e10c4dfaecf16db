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

Counted families stay monotonic (``Carry``): a worker that died, was restarted or did not
answer in time takes its counters with it, and the node's sum would fall, which Prometheus
reads as a counter reset (a false spike in ``rate()``). So the primary keeps, per worker
slot, the counter, histogram and summary samples it last read from that worker, summed by the
``sum`` rule; a slot that did not answer contributes those, and when a slot answers from a new
process (another pid), what the old one had counted is kept as retired and added from then on.
Gauges are never carried: a dead worker holds no connections.

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
from dataclasses import dataclass, field

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


# Families whose samples only grow while their process lives (the Prometheus text format's
# types; prometheus_client parses a histogram's _bucket, _count and _sum into one family).
_COUNTED = frozenset({"counter", "histogram", "summary"})
_Key = tuple[str, tuple[tuple[str, str], ...]]
# Retired pids remembered per worker slot: a late text comes within a scrape's timeout, long
# before a slot could have restarted this many times.
GONE_PIDS_KEPT = 64


@dataclass
class _Slot:
    pid: int
    samples: dict[_Key, float] = field(default_factory=dict)


@dataclass
class Carry:
    """What workers counted that the node must keep counting (module docstring): per worker
    slot, the counted samples last read and the pid they came from, and the sum of what
    earlier processes of every slot counted. Event loop thread only. Texts read out of the
    order they were taken (two scrapes at once; ``Workers._merged`` also takes one at a time)
    change nothing: a process's counts only grow, and a retired process is not read again."""

    _slots: dict[int, _Slot] = field(default_factory=dict)
    _retired: dict[_Key, float] = field(default_factory=dict)
    # Per slot, the pids whose counts retired, oldest first (a late text of one is ignored).
    _gone: dict[int, dict[int, None]] = field(default_factory=dict)
    # Family name, type and help of every counted family seen, to write the carried samples.
    _families: dict[str, tuple[str, str]] = field(default_factory=dict)
    _family_of: dict[_Key, str] = field(default_factory=dict)

    def read(self, slot: int, pid: int, text: str, across: Mapping[str, Across]) -> None:
        """Record what the worker in ``slot`` (process ``pid``) exposed in ``text``."""
        if pid in self._gone.get(slot, ()):
            return  # a late text of a process whose counts already retired
        found: dict[_Key, float] = {}
        for family in text_string_to_metric_families(text):
            if family.type not in _COUNTED or across.get(family.name, "sum") != "sum":
                continue
            self._families[family.name] = (family.type, family.documentation)
            for s in family.samples:
                if s.name.endswith("_created"):
                    continue
                key = (s.name, tuple(sorted(s.labels.items())))
                found[key] = float(s.value)
                self._family_of[key] = family.name
        old = self._slots.get(slot)
        if old is not None and old.pid == pid:  # a text older than one read: counts only grow
            for key, value in old.samples.items():
                found[key] = max(found.get(key, 0.0), value)
        elif old is not None:  # a new process: the old one's counts retire
            for key, value in old.samples.items():
                self._retired[key] = self._retired.get(key, 0.0) + value
            gone = self._gone.setdefault(slot, {})
            gone[old.pid] = None
            if len(gone) > GONE_PIDS_KEPT:  # a crash-looping slot: forget the oldest
                del gone[next(iter(gone))]
        self._slots[slot] = _Slot(pid, found)

    def exposition(self, answered: set[int]) -> str | None:
        """The retired counts plus the last counts of the slots not in ``answered``, as one
        exposition to merge like a worker's; None when there is nothing to carry."""
        carried = dict(self._retired)
        for slot, held in self._slots.items():
            if slot not in answered:
                for key, value in held.samples.items():
                    carried[key] = carried.get(key, 0.0) + value
        if not carried:
            return None
        by_family: dict[str, list[Sample]] = {}
        for (name, labels), value in carried.items():
            family = self._family_of[(name, labels)]
            by_family.setdefault(family, []).append(Sample(name, dict(labels), value))
        metrics = []
        for family, found in by_family.items():
            kind, documentation = self._families[family]
            metric = Metric(family, documentation, kind)
            metric.samples = found
            metrics.append(metric)
        registry = CollectorRegistry(auto_describe=False)

        class _Fixed:
            def collect(self) -> Iterator[Metric]:
                yield from metrics

        registry.register(_Fixed())
        return generate_latest(registry).decode()


async def merge_workers(
    own: bytes,
    workers: Mapping[int, tuple[int, str]],
    across: Mapping[str, Across],
    carry: Carry | None = None,
) -> bytes:
    """``own`` with the families of the live ``workers`` (slot → (pid, control socket))
    merged in as ``across`` says (``merge``), and, with ``carry``, what workers that died,
    restarted or did not answer had counted (``Carry``)."""
    slots = list(workers)
    texts = await asyncio.gather(*(_scrape(workers[n][1]) for n in slots))
    found = [t for t in texts if t is not None]
    if carry is not None:
        answered = set()
        for n, text in zip(slots, texts, strict=True):
            if text is not None:
                carry.read(n, workers[n][0], text, across)
                answered.add(n)
        carried = carry.exposition(answered)
        if carried is not None:
            found.append(carried)
    if not found:
        return own
    return merge(own.decode(), found, across)
