"""Bootstrap and eviction agree (issue 11, deliverable 4), over real HTTP between real nodes.

A joining node whose peers hold twice its disk budget fetches newest first, stops at the budget
(``KURA_BOOTSTRAP_DISK_PERCENT`` of ``KURA_MAX_DISK_BYTES``), evicts nothing, becomes ready and
says in ``/ready``, ``/status``, ``/metrics`` and ``kura status`` what share it holds; an older key
it skipped is still a hit through read-through. A bootstrap with room still fetches everything,
and the manifests route pages newest first with a compound cursor beside the old ``after=``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from kura.core.keys import artifact_id
from kura.core.manifest import Manifest
from kura.mesh.wire import encode_manifest
from tests import oneshot
from tests.conftest import NodeProcess
from tests.e2e.fakepeer import FakePeer, honest
from tests.e2e.mesh import Mesh, manifests, status, wait_for
from tests.e2e.test_bootstrap import fill, is_ready, start_joiner

KiB = 1024
SIZE = 10 * KiB
COUNT = 200
# 90 % (the default KURA_BOOTSTRAP_DISK_PERCENT) of this is exactly 100 artifacts: half the peers'.
MAX_DISK_BYTES = -(-(COUNT // 2) * SIZE * 100 // 90)
LIMIT_BYTES = MAX_DISK_BYTES * 90 // 100


def newest_first(node: NodeProcess) -> list[str]:
    """The node's artifact ids by version, newest first (read through the old key-order paging)."""
    held = manifests(node)
    return sorted(held, key=lambda a: (-int(str(held[a]["version_ms"])), a))


def test_a_joiner_with_half_the_peers_data_in_budget_holds_the_newest_half_and_says_so(
    tmp_path: Path,
) -> None:
    mesh = Mesh(tmp_path / "mesh", 2, in_process=True, discovery_settle_ms=0)
    joiner: NodeProcess | None = None
    try:
        mesh.wait_ready()
        a, _b = mesh.nodes
        bodies = fill(a, "budget", COUNT, SIZE)  # one writer: strictly increasing versions
        mesh.wait_drained()
        order = newest_first(a)
        assert len(order) == COUNT
        assert [len(manifests(n)) for n in mesh.nodes] == [COUNT] * 2
        joiner = start_joiner(tmp_path / "c", mesh.internal_urls, max_disk_bytes=MAX_DISK_BYTES)
        assert wait_for(lambda: is_ready(joiner), 120), status(joiner)

        held = set(manifests(joiner))
        newest = set(order[: COUNT // 2])
        print(f"budget {LIMIT_BYTES} bytes: joiner holds {len(held)} of {COUNT} artifacts")
        # Exactly the newest that fit, within one artifact at the boundary (downloads overlap).
        assert COUNT // 2 - 1 <= len(held) <= COUNT // 2
        assert len(held - newest) <= 1, sorted(order.index(h) for h in held - newest)
        assert held <= set(order[: COUNT // 2 + 1])
        assert joiner.metric_sum("kura_storage_evictions_total") == 0
        assert joiner.metric("kura_disk_used_bytes") <= LIMIT_BYTES

        ready = oneshot.get(joiner.url + "/ready", timeout=10).json()
        stopped = [w for w in ready["warnings"] if "stopped at the disk budget" in w]
        assert len(stopped) == 1, ready
        print(f"/ready: {stopped[0]}")
        assert f"{len(held)} of {COUNT} artifacts" in stopped[0]
        assert f"{len(held) * SIZE} of {COUNT * SIZE} bytes" in stopped[0]
        assert "served by read-through" in stopped[0]
        assert f"holding {100 * len(held) // COUNT}% of the peers' data" in stopped[0]

        boot = status(joiner)["bootstrap"]
        assert isinstance(boot, dict)
        assert boot["budget_stopped"] is True
        assert boot["budget_limit_bytes"] == LIMIT_BYTES
        assert (boot["peer_data_artifacts"], boot["held_artifacts"]) == (COUNT, len(held))
        assert boot["skipped_artifacts"] == COUNT - len(held)
        assert boot["skipped_bytes"] == (COUNT - len(held)) * SIZE
        assert all(p["phase"] == "done" for p in boot["peers"])  # completed, not retried
        assert joiner.metric_sum("kura_bootstrap_budget_stopped") >= 1
        assert joiner.metric("kura_bootstrap_budget_limit_bytes") == LIMIT_BYTES
        assert abs(joiner.metric("kura_bootstrap_held_ratio") - len(held) / COUNT) < 0.01
        skipped = [
            v
            for k, v in joiner.metrics().items()
            if k.startswith("kura_bootstrap_artifacts{") and 'kind="skipped"' in k
        ]
        assert max(skipped) == COUNT - len(held)
        assert joiner.metric_sum("kura_bootstrap_passes_total") == 2  # one pass per peer
        out = subprocess.run(
            [sys.executable, "-m", "kura.cli", "status", "--url", joiner.url],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert "stopped at the disk budget" in out.stdout
        assert f"({len(held)} of {COUNT} artifacts" in out.stdout

        # The oldest key was skipped: a GET on the joiner is still a hit, through read-through.
        oldest = manifests(a)[order[-1]]
        assert order[-1] not in held
        with joiner.client() as c:
            got = c.get(f"/cache/{oldest['key']}")
        assert got.status_code == 200
        assert got.content == bodies[str(oldest["key"])]
        assert joiner.metric('kura_read_through_total{result="hit"}') == 1

        # Bootstrap is over: live writes past the budget evict the oldest fetched versions first
        # (bootstrap copies count as last used when it began), never the newest.
        kept = sorted(held, key=order.index)  # newest first
        fill(joiner, "live", 16, SIZE)
        assert wait_for(lambda: joiner.metric_sum("kura_storage_evictions_total") > 0, 30)
        after = set(manifests(joiner))
        gone = [aid for aid in kept if aid not in after]
        assert gone, "the live writes evicted nothing"
        assert gone == kept[-len(gone) :], [kept.index(g) for g in gone]
        assert joiner.metric("kura_disk_used_bytes") <= MAX_DISK_BYTES
    finally:
        if joiner is not None:
            joiner.stop()
        mesh.stop_all()


def test_a_joiner_with_room_for_everything_fetches_everything_and_reports_no_stop(
    tmp_path: Path,
) -> None:
    mesh = Mesh(tmp_path / "mesh", 2, in_process=True, discovery_settle_ms=0)
    joiner: NodeProcess | None = None
    try:
        mesh.wait_ready()
        bodies = fill(mesh.nodes[0], "roomy", 40, SIZE)
        bodies.update(fill(mesh.nodes[1], "other", 20, SIZE))
        mesh.wait_drained()
        joiner = start_joiner(tmp_path / "c", mesh.internal_urls, max_disk_bytes=2 * 60 * SIZE)
        assert wait_for(lambda: is_ready(joiner), 120), status(joiner)
        held = {m["key"]: m["sha256"] for m in manifests(joiner).values()}
        assert held == {k: hashlib.sha256(b).hexdigest() for k, b in bodies.items()}
        boot = status(joiner)["bootstrap"]
        assert isinstance(boot, dict)
        assert boot["budget_stopped"] is False
        assert (boot["held_artifacts"], boot["skipped_artifacts"]) == (60, 0)
        assert boot["held_percent"] == 100
        ready = oneshot.get(joiner.url + "/ready", timeout=10).json()
        assert not [w for w in ready["warnings"] if "disk budget" in w], ready
        assert joiner.metric_sum("kura_bootstrap_budget_stopped") == 0
        assert joiner.metric_sum("kura_storage_evictions_total") == 0
    finally:
        if joiner is not None:
            joiner.stop()
        mesh.stop_all()


def push(node: NodeProcess, key: str, data: bytes, version_ms: int) -> str:
    """Replicate ``key`` into ``node`` at exactly ``version_ms`` (as a peer would)."""
    m = Manifest(
        artifact_id=artifact_id("http", "default", "", key),
        producer="http",
        namespace_id="",
        key=key,
        content_type="application/octet-stream",
        size=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        version_ms=version_ms,
        created_at_ms=version_ms,
    )
    r = oneshot.put(
        node.internal_url + "/_internal/replicate/artifact",
        content=data,
        headers={"Kura-Manifest": encode_manifest(m)},
        timeout=30,
    )
    assert r.status_code == 204, r.text
    return m.artifact_id


def pages(node: NodeProcess, **params: object) -> list[list[dict[str, object]]]:
    out: list[list[dict[str, object]]] = []
    after: str | None = None
    while True:
        query = {**params, "limit": 3, **({} if after is None else {"after": after})}
        r = oneshot.get(node.internal_url + "/_internal/bootstrap/manifests", params=query)
        r.raise_for_status()
        body = r.json()
        out.append(body["manifests"])
        if body["next_after"] is None:
            return out
        after = body["next_after"]


def test_manifests_page_newest_first_with_a_compound_cursor_and_the_old_paging_still_works(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node("paging")
    now = time.time_ns() // 1_000_000
    # Ties on version_ms across pages are what the compound cursor is for.
    versions = {f"tie/{i}": now - 10 for i in range(5)} | {f"old/{i}": now - 20 for i in range(4)}
    versions |= {"new/0": now - 5}
    ids = {push(node, k, k.encode(), v): v for k, v in versions.items()}
    expected = sorted(ids, key=lambda a: (-ids[a], a))

    newest = pages(node, order="newest")
    assert [m["artifact_id"] for page in newest for m in page] == expected
    assert [len(p) for p in newest] == [3, 3, 3, 1]
    old = pages(node)
    assert [m["artifact_id"] for page in old for m in page] == sorted(ids)
    r = oneshot.get(node.internal_url + "/_internal/bootstrap/manifests", params={"limit": 3})
    assert "order" not in r.json()  # the old answer is unchanged
    for bad in ({"order": "sideways"}, {"order": "newest", "after": expected[0]}):
        r = oneshot.get(node.internal_url + "/_internal/bootstrap/manifests", params=bad)
        assert r.status_code == 400, (bad, r.text)


def test_a_peer_that_predates_newest_first_paging_is_still_bootstrapped_completely(
    tmp_path: Path,
) -> None:
    artifacts = [honest(f"legacy/{i:02d}", os.urandom(4 * KiB)) for i in range(12)]
    with FakePeer(artifacts) as peer:  # pages by artifact_id and ignores ``order``
        joiner = start_joiner(tmp_path / "j", [peer.url])
        try:
            assert wait_for(lambda: is_ready(joiner), 60), status(joiner)
            assert {m["key"] for m in manifests(joiner).values()} == {
                a.manifest.key for a in artifacts
            }
            assert "predates newest-first paging" in joiner.log()
        finally:
            joiner.stop()


def test_diverged_peers_are_merged_by_version_so_the_joiner_holds_the_newest_of_the_union(
    start_node: Callable[..., NodeProcess], tmp_path: Path
) -> None:
    # Two nodes that never met: the first holds the older half, the second the newer half.
    older, newer = start_node("older"), start_node("newer")
    fill(older, "older", COUNT // 2, SIZE)
    fill(newer, "newer", COUNT // 2, SIZE)
    newest = set(manifests(newer))
    joiner = start_joiner(
        tmp_path / "c", [older.internal_url, newer.internal_url], max_disk_bytes=MAX_DISK_BYTES
    )
    try:
        assert wait_for(lambda: is_ready(joiner), 120), status(joiner)
        held = set(manifests(joiner))
        print(f"diverged peers: {len(held & newest)} of the newer, {len(held - newest)} older")
        assert COUNT // 2 - 1 <= len(held) <= COUNT // 2
        assert len(held - newest) <= 1
        assert joiner.metric_sum("kura_storage_evictions_total") == 0
        boot = status(joiner)["bootstrap"]
        assert isinstance(boot, dict)
        # The union is estimated from what was fetched plus the largest skip: both halves.
        assert (boot["held_artifacts"], boot["peer_data_artifacts"]) == (len(held), COUNT)
    finally:
        joiner.stop()
