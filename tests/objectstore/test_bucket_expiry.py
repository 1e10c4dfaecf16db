"""Expiry on both tiers, end to end: real ``kura serve`` nodes sharing a bucket on a real SeaweedFS.

Short ages (``KURA_MAX_AGE=6s``, a pass every second): the bucket's cut-off is the age plus the
markers' refresh slack (7.5 s here, ``core.bucket_expiry``). An artifact nobody reads leaves the
writer's disk and the bucket; one read on another node only stays in the bucket (that node's
touch markers), although its writer never reads it and drops its own copy.
"""

from __future__ import annotations

import hashlib
import os
import sqlite3
import time

from kura.core.object_layout import is_object_key, object_key, touch_key
from kura_harness.launch.seaweedfs import SeaweedFS
from tests.conftest import NodeProcess
from tests.e2e.mesh import wait_for
from tests.objectstore.conftest import TierNode, get, put, tier_metric
from tests.objectstore.test_tier import bucket_keys, drained

AGES = {"prefix": "expiry", "max_age": "6s", "expiry_interval": "1s"}


def local_ids(node: NodeProcess) -> dict[str, str]:
    """{key: artifact_id} of what ``node`` holds on its disk."""
    conn = sqlite3.connect(f"file:{node.data_dir / 'index.sqlite3'}?mode=ro", uri=True)
    try:
        return {str(k): str(a) for k, a in conn.execute("SELECT key, artifact_id FROM artifacts")}
    finally:
        conn.close()


def test_artifacts_no_node_uses_leave_both_tiers_and_used_ones_stay(
    seaweedfs: SeaweedFS, tier_node: TierNode
) -> None:
    one = tier_node("one", **AGES)
    two = tier_node("two", **AGES)
    bodies = {"a": os.urandom(30_000), "b": os.urandom(40_000)}
    for key, body in bodies.items():
        assert put(one, key, body) in (200, 201)
    assert wait_for(lambda: drained(one), 30), one.log()[-2000:]
    ids = local_ids(one)
    a_key, b_key = (object_key("default", "", ids[k]) for k in ("a", "b"))
    assert {a_key, b_key} <= set(bucket_keys(seaweedfs, "expiry", "default/"))

    reads, uploaded_at = 0, time.monotonic()

    def b_read_on_two_and_a_gone_from_the_bucket() -> bool:
        nonlocal reads
        r = get(two, "b")  # the first fills from the bucket, the rest hit two's disk
        assert r.status_code == 200, r.text
        assert r.content == bodies["b"]
        reads += 1
        return a_key not in bucket_keys(seaweedfs, "expiry", "default/")

    assert wait_for(b_read_on_two_and_a_gone_from_the_bucket, 90, interval=0.3), (
        one.log()[-2000:] + two.log()[-2000:]
    )
    # A left once unused for the bucket's cut-off (7.5 s), B was read all that time (and kept).
    assert time.monotonic() - uploaded_at >= 6.5
    assert reads >= 3
    # Keep using B for two more passes on each node: it stays however often the passes run.
    passes = "kura_expiry_bucket_passes_total"
    later = {n.url: tier_metric(n, passes) + 2 for n in (one, two)}

    def b_read_on_two_and_two_more_passes() -> bool:
        assert get(two, "b").content == bodies["b"]
        return all(tier_metric(n, passes) >= later[n.url] for n in (one, two))

    assert wait_for(b_read_on_two_and_two_more_passes, 60, interval=0.3)
    keys = set(bucket_keys(seaweedfs, "expiry", "default/"))
    assert b_key in keys, keys
    assert touch_key("default", "", ids["b"]) in keys  # two's use, recorded in the bucket
    assert a_key not in keys
    assert touch_key("default", "", ids["a"]) not in keys
    # The local tier: one never read A or B, so both left its disk (B stays in the bucket).
    assert wait_for(lambda: local_ids(one) == {}, 30), local_ids(one)
    assert "b" in local_ids(two)

    three = tier_node("three", **AGES)  # a fresh node on the same bucket
    assert get(three, "a").status_code == 404
    r = get(three, "b")
    assert r.status_code == 200
    assert hashlib.sha256(r.content).digest() == hashlib.sha256(bodies["b"]).digest()

    deleted = sum(tier_metric(n, "kura_expiry_bucket_deleted_total") for n in (one, two, three))
    # A, by whichever pass got there first; two passes racing may both count it (idempotent).
    assert 1 <= deleted <= 2
    assert tier_metric(two, "kura_expiry_bucket_touches_total", result="ok") >= 2
    for node in (one, two):
        assert tier_metric(node, "kura_expiry_bucket_touches_total", result="error") == 0
        assert tier_metric(node, "kura_expiry_bucket_pass_failures_total") == 0
        assert tier_metric(node, "kura_expiry_bucket_passes_total") >= 1


def test_a_quota_alone_starts_the_bucket_pass_and_holds_the_namespace_to_it(
    seaweedfs: SeaweedFS, tier_node: TierNode
) -> None:
    """No age at all, a quota of 2.5 artifacts for every namespace: the node runs the bucket
    pass (on main only an age started it, and the bucket kept all three), which brings the
    namespace's objects back within the quota and counts the deletion as ``quota``."""
    node = tier_node("quota", prefix="quota", namespace_rules="*:quota=75000", expiry_interval="1s")
    for key in ("a", "b", "c"):
        assert put(node, key, os.urandom(30_000)) in (200, 201)
    assert wait_for(lambda: drained(node), 30), node.log()[-2000:]

    def objects() -> list[str]:
        keys = bucket_keys(seaweedfs, "quota", "default/")
        return [k for k in keys if is_object_key("default", k)]

    assert wait_for(lambda: len(objects()) == 2, 30, interval=0.3), node.log()[-2000:]
    evicted = "kura_expiry_bucket_evictions_total"
    assert tier_metric(node, evicted, rule="*", reason="quota") == 1
    assert tier_metric(node, "kura_expiry_bucket_evicted_bytes_total") > 30_000
