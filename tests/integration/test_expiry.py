"""KURA_MAX_AGE against real ``kura serve`` processes, with short ages (seconds).

What is checked: an artifact unused past the age is gone everywhere a client or an operator
looks (GET, the blob file, the index row, the storage gauges, the expiry metrics) while one that
is read keeps its bytes, even though its reads are still only in memory (the node flushes access
times every 5 s, longer than the 4 s age); an expiry pass keeps to its delete rate and does not
hold reads up; expiry is local (a peer keeps its copy, no tombstone is written).
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from kit.wait import wait_until
from tests import oneshot
from tests.conftest import NodeProcess
from tests.e2e.mesh import Mesh, manifests, wait_for

pytestmark = pytest.mark.in_process

AGE_SECONDS = 4


def _get(node: NodeProcess, path: str) -> httpx.Response:
    return oneshot.get(node.url + path, timeout=30)


def _put(node: NodeProcess, path: str, body: bytes) -> None:
    r = oneshot.put(node.url + path, content=body, timeout=30)
    assert r.status_code in (200, 201), r.text


def test_an_artifact_unused_past_max_age_is_gone_and_one_in_use_stays_intact(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node(max_age=f"{AGE_SECONDS}s", expiry_interval="1s")
    a, b = os.urandom(3000), os.urandom(200_000)  # A small (hot cache), B a large blob file
    _put(node, "/cache/aa/unused", a)
    _put(node, "/cache/bb/in-use", b)
    assert _get(node, "/cache/aa/unused").content == a  # once: now in the hot cache too
    assert len(node.blob_files()) == 1  # A is inline in its index row (KURA_INLINE_MAX_BYTES)

    def touch_b_until(predicate: Callable[[], bool], timeout: float) -> bool:
        def touched() -> bool:
            r = _get(node, "/cache/bb/in-use")
            assert r.status_code == 200
            assert r.content == b
            return predicate()

        return wait_until(touched, timeout, interval=0.3)

    assert touch_b_until(lambda: node.metric("kura_expiry_deleted_total") >= 1, 60), node.log()
    # B survives several more passes, each more than the age after B's write.
    passes = node.metric("kura_expiry_passes_total")
    assert touch_b_until(lambda: node.metric("kura_expiry_passes_total") >= passes + 4, 60)

    assert _get(node, "/cache/aa/unused").status_code == 404
    assert node.index_rows() == 1
    assert len(node.blob_files()) == 1
    m = node.metrics()
    assert m["kura_expiry_deleted_total"] == 1
    assert m["kura_expiry_deleted_bytes_total"] == len(a)
    assert m["kura_storage_artifacts"] == 1
    assert m["kura_disk_used_bytes"] == len(b)
    assert m["kura_storage_evictions_total"] == 0  # counted as expiry, not as eviction
    assert m["kura_expiry_last_pass_timestamp_seconds"] > time.time() - 30
    assert 0 <= m["kura_expiry_oldest_access_age_seconds"] < AGE_SECONDS
    assert _get(node, "/cache/bb/in-use").content == b
    # What expired can be written again.
    _put(node, "/cache/aa/unused", a)
    assert _get(node, "/cache/aa/unused").content == a


def test_an_expiry_pass_keeps_to_its_delete_rate_and_reads_go_on_meanwhile(
    start_node: Callable[..., NodeProcess],
) -> None:
    n, rate, batch = 40, 10, 5
    # Written before expiry is on (writes take a while on a loaded machine), so that all of them
    # are past the age at the first pass, which then takes them all.
    node = start_node("n")
    kept = os.urandom(1000)
    _put(node, "/cache/kept", kept)
    for i in range(n):
        _put(node, f"/cache/old/{i}", os.urandom(500 + i))
    assert node.index_rows() == n + 1
    node.stop()
    time.sleep(1.0)  # the 1 s age is past for every write (a restart takes longer anyway)
    node = start_node(
        "n",
        max_age="1s",
        expiry_interval="3s",
        expiry_max_deletes_per_second=rate,
        expiry_batch_size=batch,
    )
    first_seen = done_at = 0.0
    slowest_read = 0.0
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        started = time.monotonic()
        r = _get(node, "/cache/kept")
        slowest_read = max(slowest_read, time.monotonic() - started)
        assert r.status_code == 200
        assert r.content == kept
        deleted = node.metric("kura_expiry_deleted_total")
        if deleted > 0 and not first_seen:
            first_seen = time.monotonic()
        if deleted >= n:
            done_at = time.monotonic()
            break
        time.sleep(0.05)
    assert done_at, node.log()
    assert wait_for(lambda: node.metric("kura_expiry_passes_total") >= 1, 30)
    m = node.metrics()
    assert m["kura_expiry_deleted_total"] == n  # one pass took them all, nothing more
    assert m["kura_expiry_passes_total"] == 1
    # N / rate = 4 s at least for the pass. Seen from outside, the first batch to the last spans
    # (N - batch) / rate = 3.5 s less one polling round (unpaced, all go within a transaction).
    assert m["kura_expiry_last_pass_seconds"] >= n / rate
    assert done_at - first_seen >= 2.0
    assert slowest_read < 2.0, slowest_read
    print(
        f"expiry pace: {n} deleted at {rate}/s in batches of {batch}: pass "
        f"{m['kura_expiry_last_pass_seconds']:.2f} s, first to last batch seen "
        f"{done_at - first_seen:.2f} s, slowest GET meanwhile {slowest_read * 1000:.0f} ms"
    )
    assert node.index_rows() == 1
    assert node.blob_files() == []  # every body here is small: inline in its index row


def test_expiry_is_local_a_peer_keeps_its_copy_and_no_tombstone_is_written(
    tmp_path: Path,
) -> None:
    # Node 0 expires after the age; node 1 has none. Anti-entropy and read-through are off, so
    # nothing brings the copy back to node 0 and the test sees the expiry alone.
    mesh = Mesh(
        tmp_path,
        2,
        node_settings={0: {"max_age": "2s", "expiry_interval": "1s"}},
        anti_entropy_interval="0",
        read_through="never",
    )
    try:
        mesh.wait_ready()
        a, b = mesh.nodes
        body = os.urandom(5000)
        _put(a, "/cache/shared", body)
        mesh.wait_drained()
        assert wait_for(lambda: a.metric("kura_expiry_deleted_total") == 1, 60), a.log()
        assert _get(a, "/cache/shared").status_code == 404
        mesh.wait_drained()  # nothing new was queued for the peer, nothing is in flight
        assert _get(b, "/cache/shared").content == body
        assert len(manifests(b)) == 1
        assert manifests(a) == {}
        assert b.metric("kura_expiry_deleted_total") == 0
        assert _tombstones(a) == _tombstones(b) == 0
    finally:
        mesh.stop_all()


def _tombstones(node: NodeProcess) -> int:
    conn = sqlite3.connect(f"file:{node.data_dir / 'index.sqlite3'}?mode=ro", uri=True)
    try:
        return int(conn.execute("SELECT COUNT(*) FROM tombstones").fetchone()[0])
    finally:
        conn.close()
