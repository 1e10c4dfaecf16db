"""A dataset 10x each node's disk budget, written across 3 nodes that share one bucket (real
SeaweedFS): every artifact reads back byte-identical from every node, and no node's disk ends
over its budget (fills evict the least recently used; nothing pending upload is evicted)."""

from __future__ import annotations

import hashlib
import os
import threading

from tests.e2e.mesh import wait_for
from tests.objectstore.conftest import TierNode, get, put, tier_metric

BUDGET = 512 * 1024  # each node's KURA_MAX_DISK_BYTES
ARTIFACTS = 40
SIZE = 128 * 1024  # 40 x 128 KiB = 5 MiB = 10x the budget


def test_ten_times_the_disk_budget_across_three_nodes_sharing_a_bucket(tier_node: TierNode) -> None:
    nodes = [tier_node(f"n{i}", prefix="scale", max_disk_bytes=BUDGET) for i in range(3)]
    digests: dict[str, str] = {}
    peak = [0.0] * len(nodes)
    done = threading.Event()

    def watch() -> None:  # the largest disk use each node reports while the test runs
        while not done.wait(0.2):
            for i, n in enumerate(nodes):
                peak[i] = max(peak[i], tier_metric(n, "kura_disk_used_bytes"))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        for i in range(ARTIFACTS):
            body = os.urandom(SIZE)
            key = f"s{i}"
            assert put(nodes[i % 3], key, body) in (200, 201)
            digests[key] = hashlib.sha256(body).hexdigest()
        for n in nodes:
            assert wait_for(
                lambda n=n: tier_metric(n, "kura_object_store_upload_queue_messages") == 0, 120
            )
        mismatches = 0
        for n in nodes:
            for key, digest in digests.items():
                r = get(n, key)
                if r.status_code != 200 or hashlib.sha256(r.content).hexdigest() != digest:
                    mismatches += 1
        assert mismatches == 0
    finally:
        done.set()
        watcher.join(10)
    for n in nodes:
        used = tier_metric(n, "kura_disk_used_bytes")
        on_disk = sum(p.stat().st_size for p in n.blob_files())
        assert used <= BUDGET, (n.url, used)
        assert on_disk <= BUDGET, (n.url, on_disk)
        assert tier_metric(n, "kura_storage_evictions_total") > 0
    print(f"peak disk use per node while writing: {[int(p) for p in peak]} (budget {BUDGET})")
