"""Retention per namespace (issue 29 item 3, ``KURA_NAMESPACE_RULES``, ``core.namespace_rule``).

On main there was one global LRU and one global ``KURA_MAX_AGE``: nobody could keep ``main``
for 30 days and pull requests for 2, give a namespace a quota, or tell how young the entries
being evicted were. Three levels:

* a real ``kura serve`` whose clock libfaketime moves 3 days on (the ages);
* a real node in this process, over HTTP (a quota: whose entries go when the disk fills);
* a real ``CacheService`` on a ``ManualClock`` (``min_age`` and the shed-age histogram, in
  virtual hours), exported by the real collector.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest

from kit.clock import ManualClock
from kit.settings import SettingsError
from kit.wait import wait_until
from kura.api.namespace_metrics import NamespaceCollector
from kura.cli import build_parser
from kura.core.namespace_rule import NO_RULES, NamespaceRules
from kura.settings import load_settings
from kura.settings_rules import parse_namespace_rules
from kura.storage.budget import TmpBudget
from kura.storage.service import ArtifactRef, CacheService
from tests.conftest import NodeProcess, faketime_prefix, parse_samples

pytestmark = pytest.mark.in_process

SIZE = 10 * 1024
HOUR = 3600.0
RULES = "main:min_age=1h"
SHED_UNDER_AN_HOUR = 'kura_namespace_shed_age_seconds_bucket{le="3600.0",rule="main"}'


def put(node: NodeProcess, namespace: str, key: str, body: bytes) -> None:
    with node.client() as c:
        r = c.put(f"/ns/{namespace}/cache/ab/{key}", content=body)
    assert r.status_code in (200, 201), r.text


def get(node: NodeProcess, namespace: str, key: str) -> httpx.Response:
    with node.client() as c:
        return c.get(f"/ns/{namespace}/cache/ab/{key}")


# -- max_age per namespace, on a process whose clock moves -----------------------------------


def test_pr_entries_past_their_max_age_go_and_main_s_of_the_same_age_stay(
    start_node: Callable[..., NodeProcess],
) -> None:
    rules = "main:max_age=30d;pr-*:max_age=2d"
    node = start_node(namespace_rules=rules)
    bodies = {ns: os.urandom(SIZE) for ns in ("main", "pr-17", "pr-18", "docs")}
    for ns, body in bodies.items():
        put(node, ns, "app.tar", body)
    assert node.stop() == 0
    # Three days later (libfaketime): every entry is 3 days unused.
    later = start_node(prefix=faketime_prefix("+3d"), namespace_rules=rules, expiry_interval="1s")
    assert wait_until(lambda: later.metric("kura_expiry_passes_total") >= 1, 30), later.log()

    assert get(later, "pr-17", "app.tar").status_code == 404
    assert get(later, "pr-18", "app.tar").status_code == 404
    assert get(later, "main", "app.tar").content == bodies["main"]  # main: 30 days
    assert get(later, "docs", "app.tar").content == bodies["docs"]  # no rule, no KURA_MAX_AGE
    m = later.metrics()
    assert m['kura_namespace_evictions_total{reason="max_age",rule="pr-*"}'] == 2
    assert m['kura_namespace_used_bytes{cache_namespace="main"}'] == SIZE
    assert 'kura_namespace_used_bytes{cache_namespace="pr-17"}' not in m
    assert m["kura_expiry_deleted_total"] == 2


# -- a quota, on a real node -----------------------------------------------------------------


def test_a_namespace_over_its_quota_loses_its_own_oldest_entries_not_another_s(
    start_node: Callable[..., NodeProcess],
) -> None:
    """The disk holds 10 entries. ``team-b`` writes 4 first (the least recently used), then
    ``team-a`` 6, twice its quota of 3. The next write overflows the disk: plain LRU took
    ``team-b``'s 2 oldest; the quota takes ``team-a``'s 3 oldest instead."""
    node = start_node(
        max_disk_bytes=10 * SIZE,
        inline_max_bytes=0,
        namespace_rules=f"team-a:quota={3 * SIZE}",
    )
    b = {f"b{i}": os.urandom(SIZE) for i in range(4)}
    a = {f"a{i}": os.urandom(SIZE) for i in range(6)}
    for key, body in b.items():
        put(node, "team-b", key, body)
    for key, body in a.items():
        put(node, "team-a", key, body)
    put(node, "team-c", "c0", os.urandom(SIZE))  # over the disk's budget

    assert [get(node, "team-b", k).content == v for k, v in b.items()] == [True] * 4
    assert [get(node, "team-a", k).status_code for k in a] == [404] * 3 + [200] * 3
    assert get(node, "team-c", "c0").status_code == 200
    m = node.metrics()
    assert m['kura_namespace_evictions_total{reason="quota",rule="team-a"}'] == 3
    assert 'kura_namespace_evictions_total{reason="lru",rule="(default)"}' not in m
    assert m['kura_namespace_used_bytes{cache_namespace="team-a"}'] == 3 * SIZE
    assert m["kura_disk_used_bytes"] <= 10 * SIZE
    # The status document and page show the same.
    with node.client() as c:
        status = c.get("/status").json()
        page = c.get("/ui").text
    (rule, default) = status["namespace_rules"]
    assert (rule["rule"], rule["quota_bytes"], rule["evictions"]["quota"]) == (
        "team-a",
        3 * SIZE,
        3,
    )
    assert default["rule"] == "(default)"
    usage = {n["namespace"]: (n["rule"], n["used_bytes"]) for n in status["namespaces"]}
    assert usage["team-a"] == ("team-a", 3 * SIZE)
    assert usage["team-b"] == ("(default)", 4 * SIZE)
    assert '<section id="namespaces">' in page
    assert "<code>team-a</code>" in page


def strict_json(text: str) -> Any:
    """``text`` parsed as RFC 8259 JSON: ``Infinity``, ``-Infinity`` and ``NaN`` refused."""

    def refuse(constant: str) -> None:
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=refuse)


def test_a_median_shed_age_past_the_last_bucket_is_null_in_status_and_over_90d_on_the_page(
    start_node: Callable[..., NodeProcess],
) -> None:
    """Entries evicted 100 days after their last use: the median falls past the histogram's
    last bound (90 d). ``/status`` sent it as ``Infinity``, which no strict parser reads."""
    node = start_node(max_disk_bytes=10 * SIZE, inline_max_bytes=0)
    for i in range(10):
        put(node, "main", f"k{i}", os.urandom(SIZE))
    assert node.stop() == 0
    later = start_node(
        prefix=faketime_prefix("+100d"), max_disk_bytes=10 * SIZE, inline_max_bytes=0
    )
    put(later, "main", "new", os.urandom(SIZE))  # over the disk's budget: the oldest go
    with later.client() as c:
        status = strict_json(c.get("/status").text)
        page = c.get("/ui").text
    (default,) = status["namespace_rules"]
    assert default["evictions"]["lru"] >= 1
    assert default["shed_age_median_seconds"] is None
    assert "&gt; 90d" in page


# -- min_age on a real node: respected while the disk allows, forced and warned when not -----

FORCED = "namespace min_age not held"


def test_a_real_node_keeps_young_main_entries_while_it_can_and_warns_when_the_disk_forces_it(
    start_node: Callable[..., NodeProcess],
) -> None:
    """Every entry here is seconds old, under ``main``'s 1 h ``min_age``: main's are kept while
    entries of another namespace are left to evict (plain LRU took main's, the oldest), and
    evicted only when nothing else is left, which the shed-age histogram, the ``forced``
    count and ``/ready`` show."""
    node = start_node(max_disk_bytes=10 * SIZE, inline_max_bytes=0, namespace_rules=RULES)
    main = {f"m{i}": os.urandom(SIZE) for i in range(5)}
    for key, body in main.items():
        put(node, "main", key, body)
    for i in range(6):
        put(node, "scratch", f"s{i}", os.urandom(SIZE))  # the 11th entry: an eviction pass
    assert [get(node, "main", k).content == v for k, v in main.items()] == [True] * 5
    m = node.metrics()
    assert m['kura_namespace_shed_age_seconds_count{rule="(default)"}'] == 2
    assert 'kura_namespace_shed_age_seconds_count{rule="main"}' not in m
    with node.client() as c:
        assert not any(FORCED in w for w in c.get("/ready").json()["warnings"])

    for i in range(10, 20):  # only young main entries are left to take
        put(node, "main", f"m{i}", os.urandom(SIZE))
    m = node.metrics()
    assert m[SHED_UNDER_AN_HOUR] >= 1
    assert m['kura_namespace_evictions_total{reason="forced",rule="main"}'] >= 1
    assert m["kura_disk_used_bytes"] <= 10 * SIZE
    with node.client() as c:
        ready = c.get("/ready")
    assert ready.status_code == 200  # a warning, not a reason: the node still serves
    assert any(FORCED in w for w in ready.json()["warnings"]), ready.text


# -- min_age and the shed-age histogram, on virtual time -------------------------------------


def ref(namespace: str, key: str) -> ArtifactRef:
    return ArtifactRef("http", namespace, key)


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[tuple[CacheService, ManualClock]]:
    clock = ManualClock()
    rules: NamespaceRules = parse_namespace_rules(RULES)
    s = CacheService(
        data_dir=tmp_path / "data",
        tmp_dir=tmp_path / "tmp",
        tenant_id="t",
        budget=TmpBudget(1 << 20, tmp_dir=tmp_path / "tmp"),
        clock=clock,
        max_disk_bytes=10 * SIZE,
        min_free_disk_bytes=0,
        min_retention_ms=0,
        namespace_rules=rules,
    )
    await s.start()
    yield s, clock
    await s.close()


async def write(service: CacheService, namespace: str, keys: range) -> None:
    for i in keys:
        await service.put_stream(
            ref(namespace, f"k{i}"),
            _one(os.urandom(SIZE)),
            declared_length=SIZE,
            limit_bytes=1 << 20,
            content_type="application/octet-stream",
        )


async def held(service: CacheService, namespace: str, keys: range) -> int:
    return sum([await service.reads.exists(ref(namespace, f"k{i}")) for i in keys])


def scrape(service: CacheService) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(NamespaceCollector(service.stats, service.namespace_rules))
    return parse_samples(generate_latest(registry).decode())


SHED_MAIN = 'kura_namespace_shed_age_seconds_count{rule="main"}'


async def test_shed_age_shows_min_age_respected_then_violated_when_the_disk_forces_it(
    service: tuple[CacheService, ManualClock],
) -> None:
    s, clock = service
    # main's 5 entries, then 5 of a namespace with no rule, 10 minutes later: the disk is full.
    await write(s, "main", range(5))
    clock.advance(600)
    await write(s, "scratch", range(5))
    clock.advance(600)
    # Two more scratch entries: an eviction pass frees down to the low watermark (2 entries).
    # Plain LRU took main's (the least recently used); main's min_age (1 h) keeps them, and
    # scratch's own oldest go.
    await write(s, "scratch", range(100, 102))
    assert await held(s, "main", range(5)) == 5
    assert await held(s, "scratch", range(2)) == 0
    assert await held(s, "scratch", range(2, 5)) == 3
    m = scrape(s)
    assert m.get(SHED_MAIN, 0) == 0
    assert m['kura_namespace_shed_age_seconds_count{rule="(default)"}'] == 2
    assert m['kura_namespace_evictions_total{reason="lru",rule="(default)"}'] == 2
    assert not any("min_age not held" in w for w in s.warnings())

    # Only young main entries left to take: the disk's budget wins, counted as forced.
    await write(s, "main", range(10, 20))
    m = scrape(s)
    assert m[SHED_UNDER_AN_HOUR] >= 1  # main's min_age violated
    assert m['kura_namespace_evictions_total{reason="forced",rule="main"}'] >= 1
    assert m['kura_namespace_rule_min_age_seconds{rule="main"}'] == HOUR
    assert any("min_age not held" in w for w in s.warnings())
    assert s.stats.used_bytes <= 10 * SIZE

    # Two hours on, main's entries are past their min_age: evicting them respects it again.
    clock.advance(2 * HOUR)
    under = m[SHED_UNDER_AN_HOUR]
    await write(s, "main", range(30, 35))
    m = scrape(s)
    assert m[SHED_UNDER_AN_HOUR] == under
    assert m[SHED_MAIN] > under
    assert m['kura_namespace_shed_age_seconds_bucket{le="10800.0",rule="main"}'] == m[SHED_MAIN]


def index_names(data_dir: Path) -> set[str]:
    with contextlib.closing(sqlite3.connect(data_dir / "index.sqlite3")) as conn:
        return {
            str(r[0]) for r in conn.execute("SELECT name FROM sqlite_master WHERE type='index'")
        }


async def open_close(tmp_path: Path, rules: NamespaceRules) -> set[str]:
    """The index names of ``tmp_path``'s node after it started with ``rules``, took one entry,
    measured usage (only with rules) and stopped."""
    s = CacheService(
        data_dir=tmp_path / "data",
        tmp_dir=tmp_path / "tmp",
        tenant_id="t",
        budget=TmpBudget(1 << 20, tmp_dir=tmp_path / "tmp"),
        clock=ManualClock(),
        max_disk_bytes=10 * SIZE,
        min_free_disk_bytes=0,
        namespace_rules=rules,
    )
    await s.start()
    await write(s, "main", range(1))
    usage = await s.enforce_quotas()  # what every expiry pass measures first
    assert usage == ({"main": (SIZE, 1)} if rules else {})  # no scan without rules
    await s.close()
    return index_names(tmp_path / "data")


async def test_the_per_namespace_index_exists_only_while_rules_are_set(tmp_path: Path) -> None:
    """``artifacts_by_namespace_access`` makes every touch flush dearer: a node without rules
    (the default) has only ``artifacts_by_namespace`` and measures no usage, as before rules
    existed; one started with rules builds it, and drops it when started again without (it was
    built on every node)."""
    assert "artifacts_by_namespace_access" not in await open_close(tmp_path, NO_RULES)
    with_rules = await open_close(tmp_path, parse_namespace_rules(RULES))
    assert {"artifacts_by_namespace", "artifacts_by_namespace_access"} <= with_rules
    without = await open_close(tmp_path, NO_RULES)
    assert "artifacts_by_namespace" in without
    assert "artifacts_by_namespace_access" not in without


# -- the setting -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("main:max_age=30x", "must be an age"),
        ("main:ttl=1d", "is not max_age=, quota= or min_age="),
        ("main", "names no max_age, quota or min_age"),
        ("main:max_age=1d;main:quota=1G", "'main' is given twice"),
        ("pr-*:quota=0", "quota must be above 0"),
        ("pr-*:max_age=1h,min_age=2h", "min_age must be below max_age"),
        ("pr-*:quota=ten", "expected a byte count"),
        ("(default):quota=1G", "'(default)' is a reserved metric label"),
        ("(other):max_age=1d", "'(other)' is a reserved metric label"),
    ],
)
def test_a_bad_rule_is_refused_at_start_naming_it(text: str, problem: str) -> None:
    args = build_parser().parse_args(["serve"])
    with pytest.raises(SettingsError) as refused:
        load_settings(args, {"KURA_NAMESPACE_RULES": text})
    assert "KURA_NAMESPACE_RULES" in str(refused.value)
    assert problem in str(refused.value)


def test_rules_match_first_by_name_or_pattern() -> None:
    rules = parse_namespace_rules(
        "main:max_age=30d,min_age=1d;pr-*:max_age=2d,quota=10GiB;*:max_age=7d"
    )
    assert rules.max_age_seconds("main", 0) == 30 * 86400
    assert rules.max_age_seconds("pr-123", 0) == 2 * 86400
    assert rules.label("pr-123") == "pr-*"
    assert rules.max_age_seconds("", 0) == 7 * 86400  # "*" matches the tenant-wide namespace
    assert (
        parse_namespace_rules("main:quota=1G").max_age_seconds("main", 3600) == 3600
    )  # KURA_MAX_AGE
