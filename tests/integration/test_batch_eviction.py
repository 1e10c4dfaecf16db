"""A batch write (``storage.batch_write``) makes room only for the bytes it adds: a blob of the
batch already stored intact (written again by a client that did not ask ``FindMissingBlobs``
first) adds nothing, and one that replaces a stored copy adds only the difference. Before, the
batch evicted room for every blob it was handed, so re-sending the blobs of a full store pushed
out others, promised ones included (counted as retention shortfall, ``storage.retention``),
for bytes it never wrote. And every blob it writes gets its outbox message per peer."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest

from kit.clock import ManualClock
from kura.storage.artifact import ArtifactRef, BatchBlob, PutResult
from kura.storage.budget import TmpBudget
from kura.storage.service import CacheService

pytestmark = pytest.mark.in_process

SIZE = 10 * 1024
BUDGET = 10 * SIZE
HOUR_MS = 3600 * 1000


def store(tmp_path: Path, clock: ManualClock, **kw: object) -> CacheService:
    return CacheService(
        data_dir=tmp_path / "data",
        tmp_dir=tmp_path / "tmp",
        tenant_id="t",
        budget=TmpBudget(1024 * 1024, tmp_dir=tmp_path / "tmp"),
        clock=clock,
        max_disk_bytes=BUDGET,
        min_free_disk_bytes=0,
        min_retention_ms=HOUR_MS,
        inline_max_bytes=2 * SIZE,
        **kw,  # type: ignore[arg-type]
    )


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
