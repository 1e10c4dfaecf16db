"""Group commit on a real node (``kura.storage.group_commit``): concurrent PUTs share one WAL
fsync, none is answered before the fsync of its group, and every answered one is stored.

The failpoint ``storage.before_group_sync=sleep(MS)`` holds each group's fsync open, so the
PUTs that arrive meanwhile must queue into the next group: the test can then require a large
group instead of hoping for one. (SIGKILLs at that failpoint, with writers running, are in
``tests/integration/test_crash.py``.)"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import httpx

from tests.conftest import NodeProcess

PUTS = 24
HOLD_MS = 400


def put(node: NodeProcess, i: int) -> tuple[int, float]:
    body = hashlib.sha256(str(i).encode()).digest() * 32  # 1 KiB
    started = time.monotonic()
    r = httpx.put(f"{node.url}/cache/group-{i}", content=body, timeout=60)
    return r.status_code, time.monotonic() - started


def test_concurrent_puts_share_a_group_and_are_answered_only_after_its_fsync(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node(failpoints=f"storage.before_group_sync=sleep({HOLD_MS})")
    before = node.metrics()
    with ThreadPoolExecutor(PUTS) as pool:
        answers = list(pool.map(lambda i: put(node, i), range(PUTS)))
    assert [status for status, _s in answers] == [201] * PUTS
    # Every PUT waited for a held fsync: none was answered before its group was durable.
    assert min(seconds for _status, seconds in answers) >= HOLD_MS / 1000
    after = node.metrics()
    jobs = (
        after["kura_storage_commit_group_jobs_total"]
        - before["kura_storage_commit_group_jobs_total"]
    )
    groups = after["kura_storage_commit_groups_total"] - before["kura_storage_commit_groups_total"]
    assert jobs >= PUTS
    assert groups < PUTS / 2, (groups, jobs)  # most PUTs shared another's fsync
    assert after["kura_storage_commit_group_max_jobs"] >= 4
    assert after["kura_storage_commit_sync_failures_total"] == 0
    for i in range(PUTS):
        got = httpx.get(f"{node.url}/cache/group-{i}", timeout=30)
        assert got.status_code == 200
        assert got.content == hashlib.sha256(str(i).encode()).digest() * 32
    assert node.index_rows() == PUTS
