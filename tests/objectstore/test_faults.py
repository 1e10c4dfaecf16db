"""Faults of the object-storage tier (issue 12 item 4), injected into real processes.

* SeaweedFS SIGKILLed while a node uploads, restarted on the same ports and data dir: every
  write the node acknowledged (2xx) is in the bucket afterwards, byte-identical (0 lost), and
  the node serves all of them from its local tier meanwhile.
* Throttling (503 SlowDown), 500s and hangs, from the fault proxy (a test double in front of
  the real SeaweedFS): writes still answer 2xx (durable locally, upload queued), each failure
  is logged and counted under its own result, nothing is evicted while its upload is pending,
  and the queue drains once the store answers again.
"""

from __future__ import annotations

import hashlib
import os
import threading

import httpx
import pytest

from kura_harness.launch.seaweedfs import SeaweedFS
from tests import oneshot
from tests.conftest import NodeProcess
from tests.e2e.mesh import wait_for
from tests.objectstore.conftest import TierNode, get, put, tier_metric
from tests.objectstore.faultproxy import FaultProxy

pytestmark = pytest.mark.own_seaweedfs  # SeaweedFS is killed or stopped here

QUEUE = "kura_object_store_upload_queue_messages"
REQUESTS = "kura_object_store_requests_total"


def put_failures(node: NodeProcess) -> float:
    """Failed requests of the uploader (its version check GETs and its PUTs)."""
    return sum(
        tier_metric(node, REQUESTS, result=r)
        for r in ("unreachable", "timeout", "server_error", "throttled", "error")
    )


@pytest.mark.slow  # about 30 s, up to 60 s on a loaded machine (SeaweedFS restarts in it)
def test_store_killed_during_uploads_loses_no_acknowledged_write(
    seaweedfs: SeaweedFS, tier_node: TierNode
) -> None:
    a = tier_node("a", prefix="kill", object_store_timeout="3s", replication_backoff_max_ms=4000)
    acked: dict[str, bytes] = {}
    refused: list[tuple[str, int]] = []
    stop = threading.Event()

    def writer() -> None:
        i = 0
        while not stop.is_set() and i < 400:
            key, body = f"w{i}", os.urandom(20_000 + (i * 7919) % 200_000)
            status = put(a, key, body)
            if status in (200, 201):
                acked[key] = body
            else:
                refused.append((key, status))
            i += 1

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        assert wait_for(lambda: len(acked) >= 15, 60)
        seaweedfs.kill()  # SIGKILL while the writer keeps writing and the node uploads
        written_at_kill = len(acked)
        assert wait_for(lambda: len(acked) >= written_at_kill + 25, 60)
        assert wait_for(lambda: put_failures(a) > 0, 60), a.log()[-3000:]
        # The store is down: every acknowledged write reads back from the local tier.
        for key, body in list(acked.items()):
            r = get(a, key)
            assert r.status_code == 200, key
            assert r.content == body
    finally:
        stop.set()
        thread.join(60)
    assert refused == []  # the outage refused no write
    assert tier_metric(a, QUEUE) > 0  # uploads are waiting
    assert "object store upload queue: upload of" in a.log()
    seaweedfs.restart()  # same ports, same data dir
    assert wait_for(lambda: tier_metric(a, QUEUE) == 0, 120), a.log()[-3000:]

    b = tier_node("b", prefix="kill")  # an empty node: everything must come from the bucket
    lost = [k for k, body in acked.items() if get(b, k).content != body]
    assert lost == [], f"{len(lost)} of {len(acked)} acknowledged writes lost"
    assert b.index_rows() == len(acked)
    print(f"acked={len(acked)} at_kill={written_at_kill} put_failures={put_failures(a)} lost=0")


def test_throttling_errors_and_hangs_are_retried_and_never_evict_a_pending_upload(
    seaweedfs: SeaweedFS, fault_proxy: FaultProxy, tier_node: TierNode
) -> None:
    budget = 400_000
    a = tier_node(
        "a",
        prefix="faults",
        endpoint=fault_proxy.endpoint,
        object_store_timeout="2s",
        max_disk_bytes=budget,
        replication_backoff_max_ms=4000,
    )
    bodies = {f"f{i}": os.urandom(100_000) for i in range(8)}  # 2x the disk budget
    for mode, result in (
        ("slowdown", "throttled"),
        ("error500", "server_error"),
        ("hang", "timeout"),
    ):
        fault_proxy.set_mode(mode)
        before = tier_metric(a, REQUESTS, result=result)
        for key in list(bodies)[:4] if mode == "slowdown" else ():
            assert put(a, key, bodies[key]) in (200, 201)
        assert wait_for(lambda r=result, b=before: tier_metric(a, REQUESTS, result=r) > b, 60), mode
        assert f"failed ({result})" in a.log()
    for key in list(bodies)[4:]:
        assert put(a, key, bodies[key]) in (200, 201)  # still 2xx: durable here, upload queued
    assert wait_for(lambda: tier_metric(a, QUEUE) >= len(bodies), 60)
    # Nothing was evicted although the node is over its budget: every upload is pending.
    assert tier_metric(a, "kura_storage_evictions_total") == 0
    for key, body in bodies.items():
        assert get(a, key).content == body
    fault_proxy.set_mode("pass")
    assert wait_for(lambda: tier_metric(a, QUEUE) == 0, 120), a.log()[-3000:]
    # Uploaded now: the next write evicts down to the budget again.
    assert put(a, "after", b"x" * 10) in (200, 201)
    assert wait_for(lambda: tier_metric(a, "kura_disk_used_bytes") <= budget, 30)
    assert tier_metric(a, "kura_storage_evictions_total") > 0
    b = tier_node("b", prefix="faults")
    for key, body in bodies.items():
        r = get(b, key)
        assert r.status_code == 200, key
        assert hashlib.sha256(r.content).digest() == hashlib.sha256(body).digest()
    assert oneshot.get(a.url + "/ready", timeout=10).status_code == 200


def test_a_full_upload_queue_refuses_writes_and_leaves_nothing_behind(
    seaweedfs: SeaweedFS, fault_proxy: FaultProxy, tier_node: TierNode
) -> None:
    a = tier_node(
        "a",
        prefix="full",
        endpoint=fault_proxy.endpoint,
        outbox_max_depth=3,
        replication_backoff_max_ms=2000,
    )
    fault_proxy.set_mode("slowdown")
    for i in range(3):
        assert put(a, f"q{i}", f"queued {i}".encode()) in (200, 201)
    assert wait_for(lambda: tier_metric(a, QUEUE) == 3, 30)
    r = oneshot.put(f"{a.url}/cache/q3", content=b"one too many", timeout=30)
    assert r.status_code == 503, r.text
    assert "object-store upload queue holds 3 messages" in r.text
    assert "Retry-After" in r.headers
    assert a.index_rows() == 3
    assert a.staging_files() == []
    assert tier_metric(a, "kura_tmp_reserved_bytes") == 0
    # The refusal is loud in /ready, which stays 200: reads go on.
    ready = oneshot.get(a.url + "/ready", timeout=10)
    assert ready.status_code == 200
    assert any("upload queue is full (3 messages" in w for w in ready.json()["warnings"]), ready
    fault_proxy.set_mode("pass")
    assert wait_for(lambda: tier_metric(a, QUEUE) == 0, 60)
    assert put(a, "q3", b"one too many") in (200, 201)  # room again
    ready = oneshot.get(a.url + "/ready", timeout=10).json()
    assert not any("upload queue is full" in w for w in ready["warnings"]), ready


def test_a_multipart_completion_refused_by_a_full_upload_queue_can_be_retried(
    seaweedfs: SeaweedFS, fault_proxy: FaultProxy, tier_node: TierNode
) -> None:
    """A 503 + Retry-After on ``complete`` keeps the upload and its parts: the client's retry
    of the same call, once the queue drained, stores the artifact (before, it was 404)."""
    a = tier_node(
        "a",
        prefix="mpretry",
        endpoint=fault_proxy.endpoint,
        outbox_max_depth=2,
        replication_backoff_max_ms=2000,
    )
    fault_proxy.set_mode("slowdown")
    for i in range(2):
        assert put(a, f"q{i}", f"queued {i}".encode()) in (200, 201)
    assert wait_for(lambda: tier_metric(a, QUEUE) == 2, 30)
    q = "tenant_id=acme&hash=mp1&name=n1&cache_category=builds"
    parts = [os.urandom(30_000), os.urandom(20_000)]
    with httpx.Client(base_url=a.url, timeout=30) as c:
        upload_id = c.post(f"/api/cache/module/start?{q}").json()["upload_id"]
        for n, data in enumerate(parts, 1):
            r = c.post(f"/api/cache/module/part?{q}&upload_id={upload_id}&part_number={n}",
                       content=data)  # fmt: skip
            assert r.status_code == 204, r.text
        complete = f"/api/cache/module/complete?{q}&upload_id={upload_id}"
        r = c.post(complete, json={"parts": [1, 2]})
        assert r.status_code == 503, r.text
        assert "Retry-After" in r.headers
        assert a.index_rows() == 2
        fault_proxy.set_mode("pass")
        assert wait_for(lambda: tier_metric(a, QUEUE) == 0, 60)
        r = c.post(complete, json={"parts": [1, 2]})
        assert r.status_code == 204, r.text
        assert c.get(f"/api/cache/module/mp1?{q}").content == b"".join(parts)
    assert wait_for(lambda: tier_metric(a, "kura_tmp_reserved_bytes") == 0, 30)
    assert a.staging_files() == []


def test_a_fill_larger_than_the_tmp_budget_is_a_miss_that_leaves_nothing_behind(
    tier_node: TierNode,
) -> None:
    a = tier_node("a", prefix="tmpbudget")
    body = os.urandom(300_000)
    assert put(a, "big", body) in (200, 201)
    assert wait_for(
        lambda: (
            tier_metric(a, QUEUE) == 0
            and tier_metric(a, "kura_object_store_uploaded_bytes_total") > 0
        ),
        30,
    )
    b = tier_node("b", prefix="tmpbudget", tmp_dir_max_bytes=100_000)
    r = get(b, "big")
    assert r.status_code == 404  # a miss, never a partial or wrong 200
    assert "object store fill of" in b.log()
    assert b.index_rows() == 0
    assert b.staging_files() == []
    assert tier_metric(b, "kura_tmp_reserved_bytes") == 0
    c = tier_node("c", prefix="tmpbudget")  # with room, the same object fills
    assert get(c, "big").content == body


def test_a_late_upload_never_replaces_a_newer_version_in_the_bucket(
    seaweedfs: SeaweedFS, fault_proxy: FaultProxy, tier_node: TierNode
) -> None:
    late = tier_node(
        "late", prefix="lww", endpoint=fault_proxy.endpoint, replication_backoff_max_ms=2000
    )
    fault_proxy.set_mode("slowdown")
    assert put(late, "k", b"older version, uploaded late") in (200, 201)
    assert wait_for(lambda: tier_metric(late, REQUESTS, result="throttled") > 0, 30)
    newer = tier_node("newer", prefix="lww")
    assert put(newer, "k", b"newer version") in (200, 201)
    assert wait_for(lambda: tier_metric(newer, QUEUE) == 0, 30)
    fault_proxy.set_mode("pass")
    assert wait_for(lambda: tier_metric(late, QUEUE) == 0, 60)
    fresh = tier_node("fresh", prefix="lww")
    assert get(fresh, "k").content == b"newer version"
    assert tier_metric(late, "kura_object_store_uploaded_bytes_total") == 0  # skipped, not put
