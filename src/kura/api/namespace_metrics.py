"""Retention per namespace (``KURA_NAMESPACE_RULES``, ``core.namespace_rule``), read at scrape
time from ``StorageStats``.

* ``kura_namespace_used_bytes{cache_namespace}`` and ``kura_namespace_artifacts{...}``: what
  each namespace holds on this node, as last measured (every expiry and eviction pass while
  rules are set, none without: ``storage.namespace_usage``). Only the ``TOP_NAMESPACES`` largest
  by bytes get a series; the rest are summed under ``cache_namespace="(other)"``, so a mesh
  with a namespace per pull request keeps a bounded number of series. The label is not
  ``namespace``: Prometheus' Kubernetes discovery gives every series of a pod that label (its
  Kubernetes namespace), and a scrape would rename ours to ``exported_namespace``.
* ``kura_namespace_evictions_total{rule,reason}`` and ``kura_namespace_evicted_bytes_total``:
  entries that left, by the rule of their namespace (its pattern, ``(default)`` for none: a
  closed set from the configuration) and the reason: ``quota``, ``max_age``, ``lru`` or
  ``forced`` (inside the rule's ``min_age``, because the disk's budget left no choice).
* ``kura_namespace_shed_age_seconds{rule}``: a histogram of how long evicted entries (every
  reason but ``max_age``) had been unused. Its low quantiles falling under a rule's ``min_age``
  say the disk is too small for the rules (the alert ``KuraShedAgeUnderMinAge``).
* ``kura_namespace_rule_min_age_seconds{rule}``: each rule's ``min_age``, for that alert.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
)
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from kura.core.namespace_rule import NamespaceRules, top_namespaces
from kura.storage.stats import StorageStats


class NamespaceCollector(Collector):
    """The ``kura_namespace_*`` families (module docstring)."""

    def __init__(self, stats: StorageStats, rules: NamespaceRules) -> None:
        self._stats = stats
        self._rules = rules

    def collect(self) -> Iterator[Metric]:
        s = self._stats
        used = GaugeMetricFamily(
            "kura_namespace_used_bytes",
            "Bytes each namespace holds on this node, as last measured (the 20 largest, the "
            "rest summed as (other)).",
            labels=["cache_namespace"],
        )
        count = GaugeMetricFamily(
            "kura_namespace_artifacts",
            "Artifacts each namespace holds on this node, as last measured (as the bytes).",
            labels=["cache_namespace"],
        )
        for namespace, (size, entries) in sorted(top_namespaces(s.namespace_usage).items()):
            used.add_metric([namespace], size)
            count.add_metric([namespace], entries)
        yield used
        yield count
        evictions = CounterMetricFamily(
            "kura_namespace_evictions",
            "Artifacts evicted or expired, by their namespace's rule and the reason.",
            labels=["rule", "reason"],
        )
        for (rule, reason), n in sorted(s.namespace_evictions_total.items()):
            evictions.add_metric([rule, reason], n)
        yield evictions
        evicted_bytes = CounterMetricFamily(
            "kura_namespace_evicted_bytes",
            "Bytes of artifacts evicted or expired, by their namespace's rule and the reason.",
            labels=["rule", "reason"],
        )
        for (rule, reason), n in sorted(s.namespace_evicted_bytes_total.items()):
            evicted_bytes.add_metric([rule, reason], n)
        yield evicted_bytes
        shed = HistogramMetricFamily(
            "kura_namespace_shed_age_seconds",
            "How long evicted artifacts had been unused, by their namespace's rule.",
            labels=["rule"],
        )
        ages = s.shed_ages
        for rule in sorted(ages.counts):
            shed.add_metric([rule], ages.cumulative(rule), ages.sums.get(rule, 0.0))
        yield shed
        min_age = GaugeMetricFamily(
            "kura_namespace_rule_min_age_seconds",
            "The min_age of each rule of KURA_NAMESPACE_RULES that sets one.",
            labels=["rule"],
        )
        for rule, seconds in self._rules.min_age_labels().items():
            min_age.add_metric([rule], seconds)
        yield min_age
