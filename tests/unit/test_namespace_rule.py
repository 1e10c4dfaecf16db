"""``kura.core.namespace_rule``: the usage gauges' cap and the shed-age histogram's buckets."""

from __future__ import annotations

from kura.core.namespace_rule import OTHER, SHED_AGE_BUCKETS, ShedAges, top_namespaces


def test_usage_keeps_the_largest_namespaces_and_sums_the_rest_as_other() -> None:
    usage = {f"pr-{i}": (i, 1) for i in range(1000)}  # a namespace per pull request
    shown = top_namespaces(usage, top=20)
    assert len(shown) == 21
    assert min(b for ns, (b, _e) in shown.items() if ns != OTHER) == 980
    assert shown[OTHER] == (sum(range(980)), 980)
    assert top_namespaces({"main": (5, 1)}) == {"main": (5, 1)}  # nothing left over: no other


def test_shed_ages_fall_in_prometheus_le_buckets_and_give_a_bucket_s_bound_as_quantile() -> None:
    ages = ShedAges()
    ages.observe("main", [3600.0, 3600.5, 100 * 86400.0])  # on a bound, just past it, past all
    cumulative = dict(ages.cumulative("main"))
    assert cumulative["3600.0"] == 1  # le: a value equal to the bound is in its bucket
    assert cumulative["10800.0"] == 2
    assert cumulative["+Inf"] == 3
    assert len(cumulative) == len(SHED_AGE_BUCKETS) + 1
    assert ages.sums["main"] == 3600.0 + 3600.5 + 100 * 86400.0
    assert ages.quantile_seconds("main", 0.3) == 3600.0
    assert ages.quantile_seconds("main", 1.0) == float("inf")
    assert ages.quantile_seconds("pr-*", 0.5) is None
