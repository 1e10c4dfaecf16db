"""A batch write (``storage.batch_write``) makes room only for the bytes it adds: a blob of the
batch already stored intact (written again by a client that did not ask ``FindMissingBlobs``
first) adds nothing, and one that replaces a stored copy adds only the difference. Before, the
batch evicted room for every blob it was handed, so re-sending the blobs of a full store pushed
out others, promised ones included (counted as retention shortfall, ``storage.retention``),
for bytes it never wrote. And every blob it writes gets its outbox message per peer."""

from __future__ import annotations

import hashlib
import os
import signal
from collections.abc import Callable
from pathlib import Path

import grpc
import pytest

from kit.clock import ManualClock
from kura.storage.artifact import ArtifactRef, BatchBlob, PutResult
from kura.storage.service import CacheService
from kura_harness.launch.process import free_port
from tests.conftest import NodeProcess
from tests.grpc_api.client import Reapi
from tests.integration.test_retention import BUDGET, HOUR_MS, SIZE
from tests.integration.test_retention import store as retention_store

pytestmark = pytest.mark.in_process


def store(tmp_path: Path, clock: ManualClock, **kw: object) -> CacheService:
    return retention_store(tmp_path, clock, HOUR_MS, inline_max_bytes=2 * SIZE, **kw)


def batch(bodies: list[bytes]) -> list[BatchBlob]:
    return [
        BatchBlob(
            ArtifactRef("bazel", "", f"cas/{hashlib.sha256(b).hexdigest()}"),
            b,
            hashlib.sha256(b).hexdigest(),
        )
        for b in bodies
    ]


async def test_a_batch_of_blobs_stored_already_evicts_nothing(tmp_path: Path) -> None:
    clock = ManualClock()
    service = store(tmp_path, clock)
    await service.start()
    try:
        bodies = [os.urandom(SIZE) for _ in range(BUDGET // SIZE)]  # the whole budget
        first = await service.put_batch(
            batch(bodies), limit_bytes=BUDGET, content_type="application/octet-stream"
        )
        assert all(isinstance(r, PutResult) for r in first)
        refs = [b.ref for b in batch(bodies)]
        assert await service.reads.missing(refs) == []  # all promised
        clock.advance(1)

        again = await service.put_batch(
            batch(bodies), limit_bytes=BUDGET, content_type="application/octet-stream"
        )

        assert again == [None] * len(bodies)  # stored intact already: nothing written
        assert service.stats.evictions_total == 0  # main: the whole budget evicted
        assert service.stats.retention_evictions_total == 0
        assert await service.reads.missing(refs) == []
    finally:
        await service.close()


async def test_every_blob_a_batch_writes_is_queued_for_every_peer(tmp_path: Path) -> None:
    clock = ManualClock()
    service = store(tmp_path, clock, targets=lambda: ("peer-a", "peer-b"))
    await service.start()
    try:
        bodies = [os.urandom(100), os.urandom(3 * SIZE), os.urandom(200)]  # inline, file, inline
        results = await service.put_batch(
            batch(bodies), limit_bytes=BUDGET, content_type="application/octet-stream"
        )
        assert all(isinstance(r, PutResult) for r in results)
        rows = (
            service._require_index()
            .connection()
            .execute("SELECT peer, artifact_id FROM outbox ORDER BY peer, artifact_id")
            .fetchall()
        )
        ids = sorted(service.artifact_id(b.ref) for b in batch(bodies))
        assert rows == [(p, a) for p in ("peer-a", "peer-b") for a in ids]
    finally:
        await service.close()


async def test_a_batch_never_fills_a_peer_queue_past_its_cap(tmp_path: Path) -> None:
    """KURA_OUTBOX_MAX_DEPTH is a cap, not a threshold: a batch arriving with room for 3 more
    messages queues its first 3 blobs for the peer and skips the rest (counted, the peer
    marked to catch up). The cap was checked once per batch, so a queue one message short of
    it took the whole batch: 21 of a cap of 20 in a full test run."""
    clock = ManualClock()
    service = store(tmp_path, clock, targets=lambda: ("peer-a",), outbox_max_depth=5)
    await service.start()
    try:
        first = [os.urandom(100) for _ in range(2)]
        then = [os.urandom(100) for _ in range(4)]
        for bodies in (first, then):
            results = await service.put_batch(
                batch(bodies), limit_bytes=BUDGET, content_type="application/octet-stream"
            )
            assert all(isinstance(r, PutResult) for r in results)
        queued = [
            aid
            for (aid,) in service._require_index()
            .connection()
            .execute("SELECT artifact_id FROM outbox WHERE peer = 'peer-a' ORDER BY id")
        ]
        ids = [service.artifact_id(b.ref) for b in batch(first + then)]
        assert queued == ids[:5]  # the first batch, and the first 3 of the second
        assert service.queues.depth("peer-a") == 5
        assert service.queues.skipped_total == {"peer-a": 1}
        assert "peer-a" in service.queues.marks  # to catch up on what it missed
    finally:
        await service.close()


# -- a kill between a batch's publish and its commit -------------------------------------------


def test_a_kill_between_a_batch_s_publish_and_its_commit_leaves_no_orphan_and_no_row(
    start_node: Callable[..., NodeProcess],
) -> None:
    """SIGKILL inside the batch's window (its files renamed into place, no row committed): the
    batch was never acknowledged, and the restart removes its files; nothing names a file that
    is gone, and the blobs can be written again."""
    port = free_port()
    settings = {"grpc_port": port, "inline_max_bytes": 1024}
    node = start_node("kill", failpoints="storage.after_publish=kill@1", **settings)
    c = Reapi(f"127.0.0.1:{port}")
    bodies = [os.urandom(100), os.urandom(50 * 1024), os.urandom(60 * 1024)]
    try:
        with pytest.raises(grpc.RpcError):
            c.batch_update(bodies)
    finally:
        c.close()
    assert node.proc.wait(timeout=15) == -signal.SIGKILL
    assert "failpoint storage.after_publish: kill" in node.log()
    node.stop(signal.SIGKILL)

    node = start_node("kill", **settings)  # the same data dir, no failpoint
    c = Reapi(f"127.0.0.1:{port}")
    try:
        assert node.blob_files() == []  # the published, never committed files: removed
        assert node.index_rows() == 0
        assert node.staging_files() == []
        assert len(c.find_missing(bodies)) == 3
        assert [r.status.code for r in c.batch_update(bodies).responses] == [0, 0, 0]
        assert c.find_missing(bodies) == []
        assert len(node.blob_files()) == 2
    finally:
        c.close()
