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

import pytest

from tests import oneshot
from tests.conftest import NodeProcess

pytestmark = pytest.mark.in_process

PUTS = 24
HOLD_MS = 400


def put(node: NodeProcess, i: int) -> tuple[int, float]:
    body = hashlib.sha256(str(i).encode()).digest() * 32  # 1 KiB
    started = time.monotonic()
    r = oneshot.put(f"{node.url}/cache/group-{i}", content=body, timeout=60)
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
        got = oneshot.get(f"{node.url}/cache/group-{i}", timeout=30)
        assert got.status_code == 200
        assert got.content == hashlib.sha256(str(i).encode()).digest() * 32
    assert node.index_rows() == PUTS


def test_a_failed_fsync_refuses_every_later_write_until_a_restart(
    start_node: Callable[..., NodeProcess],
) -> None:
    """``eio(N)``: the N+1st group's fsync fails (kit.failpoint). That group's PUT is answered
    503; so is every later write, reads still serve what was acknowledged, /ready is 503 and
    says why, and a restart on the same data dir (disk healthy again) serves every acknowledged
    write."""
    node = start_node("eio", failpoints="storage.before_group_sync=eio(30)")
    acked: dict[int, bytes] = {}
    failed = None
    for i in range(300):
        body = hashlib.sha256(str(i).encode()).digest() * 32
        r = oneshot.put(f"{node.url}/cache/eio-{i}", content=body, timeout=30)
        if r.status_code != 201:
            failed = r
            break
        acked[i] = body
    assert failed is not None, "the injected fsync error never fired"
    assert failed.status_code == 503, failed.text
    assert "could not be made durable" in failed.text
    later = oneshot.put(f"{node.url}/cache/after", content=b"refused", timeout=30)
    assert later.status_code == 503, later.text
    assert "refuses every write until it is restarted" in later.text
    ready = oneshot.get(f"{node.url}/ready", timeout=10)
    assert ready.status_code == 503  # writes are refused: not ready
    assert any("fsync" in w and "restarted" in w for w in ready.json()["reasons"]), ready.text
    assert any("fsync" in w and "restarted" in w for w in ready.json()["warnings"]), ready.text
    assert node.metric("kura_storage_commit_sync_failures_total") == 1
    assert acked
    for i, body in acked.items():
        assert oneshot.get(f"{node.url}/cache/eio-{i}", timeout=30).content == body
    assert node.stop() == 0
    node = start_node("eio")
    for i, body in acked.items():
        got = oneshot.get(f"{node.url}/cache/eio-{i}", timeout=30)
        assert got.status_code == 200
        assert got.content == body
    assert oneshot.put(f"{node.url}/cache/after", content=b"ok", timeout=30).status_code == 201
