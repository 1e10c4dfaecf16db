"""Anti-entropy (issue 11, deliverable 3) on real node processes: it repairs what no outbox
holds any more, costs one digest request per peer per round between equal nodes, and never
evicts to repair a key this node evicted itself."""

from __future__ import annotations

import signal
import sqlite3
from pathlib import Path
from typing import Any

from tests import oneshot
from tests.conftest import NodeProcess
from tests.e2e.mesh import Mesh, forget_behind_the_cursor, manifests, status, wait_for

SCOPE = "tenant_id=t&namespace_id="
FAST = {"discovery_settle_ms": 0, "anti_entropy_interval": "0.5", "replication_backoff_max_ms": 500}


def _put_kv(node: NodeProcess, ns: str, key: str, body: bytes) -> None:
    entry = {"cas_id": key, "entries": [{"value": body.hex()}]}
    r = oneshot.put(f"{node.url}/api/cache/keyvalue?{SCOPE}{ns}", json=entry, timeout=30)
    assert r.status_code == 204, r.text


def _ae(node: NodeProcess) -> dict[str, Any]:
    summary = status(node)["anti_entropy"]
    assert isinstance(summary, dict)
    return summary


def _rounds_after(node: NodeProcess, n: int, timeout: float = 60) -> None:
    start = _ae(node)["rounds"]
    assert wait_for(lambda: _ae(node)["rounds"] >= start + n, timeout), _ae(node)


def _drop_outbox(node: NodeProcess) -> int:
    """Delete every outbox row of a stopped node, behind its back: a queue lost for good."""
    conn = sqlite3.connect(node.data_dir / "index.sqlite3")
    with conn:
        n = conn.execute("DELETE FROM outbox").rowcount
    conn.close()
    return int(n)


def test_anti_entropy_repairs_writes_and_a_clean_that_no_outbox_holds(tmp_path: Path) -> None:
    """A loses 30 artifacts and a clean behind its back (its index restored from an older copy
    under its newer change-feed cursors, rows deleted while it is stopped). No outbox holds them
    and A's cursor with B is already past them, so its change-feed pull brings nothing: only
    anti-entropy can bring them back."""
    mesh = Mesh(tmp_path, 2, **FAST)
    a, b = mesh.nodes
    try:
        mesh.wait_ready()
        for i in range(10):
            _put_kv(a, "keep", f"base{i}", f"baseline {i}".encode())
            _put_kv(a, "gone", f"base{i}", f"doomed {i}".encode())
        mesh.wait_drained()
        assert wait_for(lambda: len(manifests(b)) == 20, 30)
        written = {f"new{i}": f"written on B {i}".encode() * (i + 1) for i in range(30)}
        for key, body in written.items():
            _put_kv(b, "keep", key, body)
        assert oneshot.delete(f"{b.url}/api/cache/clean?{SCOPE}gone", timeout=30).status_code == 204
        mesh.wait_drained()
        assert wait_for(lambda: manifests(a) == manifests(b), 60)
        assert a.stop() == 0
        # Lost behind A's back: the new* artifacts of namespace keep and the tombstone of gone.
        assert forget_behind_the_cursor(
            a,
            b,
            (
                "DELETE FROM artifacts WHERE namespace_id = 'keep' AND key LIKE ?",
                ("action_cache/new%",),
            ),
            ("DELETE FROM tombstones WHERE namespace_id = ?", ("gone",)),
        ) == [30, 1]
        a = mesh.restart(0)
        mesh.wait_ready()
        assert status(b)["outbox_messages"] == 0  # nothing left to ship
        want = manifests(b)
        assert len(want) == 40
        assert wait_for(lambda: manifests(a) == want, 60), _ae(a)
        for key, body in written.items():
            r = oneshot.get(f"{a.url}/api/cache/keyvalue/{key}?{SCOPE}keep", timeout=30)
            assert r.status_code == 200, key
            assert r.json()["entries"][0]["value"] == body.hex(), key
        for i in range(10):
            r = oneshot.get(f"{a.url}/api/cache/keyvalue/base{i}?{SCOPE}gone", timeout=30)
            assert r.status_code == 404  # the clean reached A by anti-entropy too
        assert a.metric('kura_anti_entropy_repaired_total{kind="artifact"}') == 30
        assert a.metric('kura_anti_entropy_repaired_total{kind="tombstone"}') == 1
        assert a.metric("kura_anti_entropy_ranges_mismatched_total") >= 1
        assert a.metric("kura_anti_entropy_bytes_total") > sum(map(len, written.values()))
        assert b.metric_sum("kura_anti_entropy_repaired_total") == 0  # A had nothing newer
        # Once equal, both stay equal and later rounds repair nothing more.
        _rounds_after(a, 2)
        assert a.metric_sum("kura_anti_entropy_repaired_total") == 31
    finally:
        for node in mesh.nodes:
            if node.proc.poll() is None:
                node.proc.send_signal(signal.SIGCONT)
        mesh.stop_all()


def test_a_round_between_equal_nodes_costs_one_small_digest_request(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, 2, in_process=True, **FAST)
    a, b = mesh.nodes
    try:
        mesh.wait_ready()
        for i in range(200):
            _put_kv(a if i % 2 else b, f"ns{i % 3}", f"k{i}", f"body {i}".encode())
        mesh.wait_drained()
        assert wait_for(lambda: manifests(a) == manifests(b), 30)
        _rounds_after(a, 1)  # a round that may have started before the data settled ends
        before = a.metrics()
        _rounds_after(a, 4)
        after = a.metrics()
        last = _ae(a)["last_round"]
        assert last["peers"] == 1, last
        assert last["requests"] == 1, last
        assert 0 < last["bytes"] < 300, last
        assert last["ranges_mismatched"] == 0, last
        assert last["repaired"] == 0, last

        def delta(name: str) -> float:
            return after.get(name, 0.0) - before.get(name, 0.0)

        rounds = delta("kura_anti_entropy_rounds_total")
        assert rounds >= 4
        assert delta("kura_anti_entropy_ranges_mismatched_total") == 0
        # One request (and one range compared) per round, give or take the round running
        # while the metrics were read.
        assert rounds - 1 <= delta("kura_anti_entropy_requests_total") <= rounds + 1
        assert delta("kura_anti_entropy_bytes_total") < 300 * (rounds + 1)
        assert delta("kura_anti_entropy_ranges_compared_total") <= rounds + 1
        assert 0 < after["kura_anti_entropy_last_round_seconds"] < 5
    finally:
        mesh.stop_all()


def test_a_key_evicted_here_is_not_fetched_back_at_the_cost_of_an_eviction(
    tmp_path: Path,
) -> None:
    """The eviction rule: A (disk budget 10 KiB) evicts while B keeps everything; anti-entropy
    on A sees B's keys it lacks but repairs one only into free space, never evicting for it."""
    size = 1024
    mesh = Mesh(
        tmp_path, 2, in_process=True, node_settings={0: {"max_disk_bytes": 10 * size}}, **FAST
    )
    a, b = mesh.nodes
    try:
        mesh.wait_ready()
        with b.client() as c:
            for i in range(30):
                assert c.put(f"/cache/evict/{i:02d}", content=bytes([i]) * size).status_code == 201
        mesh.wait_drained()
        assert wait_for(
            lambda: a.metric("kura_anti_entropy_skipped_total" + '{reason="disk_budget"}') > 0, 30
        )
        evictions = a.metric("kura_storage_evictions_total")
        held = manifests(a)
        assert evictions > 0
        assert len(held) <= 10
        _rounds_after(a, 4)
        assert a.metric("kura_storage_evictions_total") == evictions  # no eviction for a repair
        assert manifests(a) == held  # and nothing comes and goes: no thrash
        assert int(status(a)["disk_used_bytes"]) <= 10 * size  # type: ignore[call-overload]
        assert len(manifests(b)) == 30
        skipped = a.metric('kura_anti_entropy_skipped_total{reason="disk_budget"}')
        _rounds_after(a, 2)
        assert a.metric('kura_anti_entropy_skipped_total{reason="disk_budget"}') > skipped
    finally:
        mesh.stop_all()


def test_bad_anti_entropy_requests_answer_400_with_a_message(tmp_path: Path) -> None:
    mesh = Mesh(tmp_path, 1, in_process=True, discovery_settle_ms=0)
    (node,) = mesh.nodes
    try:
        base = node.internal_url + "/_internal/anti_entropy"
        for path, params in (
            ("/digests", {"prefix": "abc"}),
            ("/digests", {"prefix": "AB"}),
            ("/digests", {"prefix": "ab", "depth": "3"}),
            ("/digests", {"prefix": "abcd", "depth": "2"}),
            ("/digests", {"depth": "x"}),
            ("/range", {"prefix": "zz"}),
            ("/range", {"prefix": "ab", "limit": "0"}),
            ("/range", {"prefix": "ab", "after": "not-hex"}),
        ):
            r = oneshot.get(base + path, params=params, timeout=10)
            assert r.status_code == 400, (path, params, r.text)
            assert r.json().get("error") or r.text, (path, params)
        ok = oneshot.get(base + "/digests", params={"prefix": "", "depth": "2"}, timeout=10)
        assert ok.status_code == 200
        assert ok.json()["ranges"] == []
    finally:
        mesh.stop_all()


def test_a_write_whose_queue_died_with_its_writer_reaches_a_peer_that_was_away(
    tmp_path: Path,
) -> None:
    """The path the convergence property test drops queues on, made deterministic: B is paused,
    A takes a write (queued for B), A is killed and its outbox deleted, A restarts, B resumes.
    No outbox holds the write: B's change-feed pull from its cursor (or anti-entropy, whichever
    comes first) brings it."""
    mesh = Mesh(tmp_path, 2, bootstrap_timeout_ms=10_000, **FAST)
    a, b = mesh.nodes
    try:
        mesh.wait_ready()
        b.proc.send_signal(signal.SIGSTOP)
        _put_kv(a, "p", "lost", b"queued, then dropped")
        a.stop(signal.SIGKILL)
        assert _drop_outbox(a) == 1
        b.proc.send_signal(signal.SIGCONT)
        a = mesh.restart(0)
        assert wait_for(lambda: len(manifests(b)) == 1, 60), _ae(b)
        assert manifests(b) == manifests(a)
    finally:
        for node in mesh.nodes:
            if node.proc.poll() is None:
                node.proc.send_signal(signal.SIGCONT)
        mesh.stop_all()
