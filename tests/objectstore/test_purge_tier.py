"""Provenance in the object-storage tier (issue 29 item 4), in-process against a real SeaweedFS:
the writer a write records travels in the bucket object's header, a bucket fill carries it
into another node, a purge deletes exactly that writer's objects of the namespace, and a fill
of an old copy of that writer (an upload that raced the purge) is ignored afterwards."""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

from kit.clock import SystemClock
from kit.wait import wait_until_async
from kura.core.object_layout import namespace_prefix, object_key
from kura.storage.artifact import ArtifactRef
from kura.storage.object_tier import ObjectTier
from kura.storage.service import CacheService
from kura_harness.launch.seaweedfs import SeaweedFS
from tests.integration.test_fill import make_store
from tests.objectstore.test_bucket_expiry_pass import store_for

CI, EVIL = "token:ci-main", "token:evil"


async def _put(service: CacheService, writer: str, key: str, body: bytes) -> str:
    ref = ArtifactRef("nx", "main", key, writer=writer)
    await service.put_inline(ref, body, "application/octet-stream")
    return service.artifact_id(ref)


async def test_a_purge_deletes_exactly_the_writers_objects_and_an_old_copy_never_fills_again(
    seaweedfs: SeaweedFS, tmp_path: Path
) -> None:
    tiers: list[ObjectTier] = []
    a = make_store(tmp_path / "a", bucket=True, outbox_written=lambda: tiers[0].wake())
    b = make_store(tmp_path / "b", bucket=True)
    bucket = store_for(seaweedfs, "purge")
    tiers += [ObjectTier(a, bucket, SystemClock()), ObjectTier(b, bucket, SystemClock())]
    await a.start()
    await b.start()
    uploader = asyncio.create_task(tiers[0].run())

    async def drained() -> bool:
        return await a.replica_log.outbox_depths() == {}

    async def objects() -> dict[str, str]:
        """Key -> writer of every object of ``main`` in the bucket."""
        keys = [o.key async for page in bucket.list_prefix(prefix) for o in page]
        return {k: (await bucket.stored_header(k) or (0, "?"))[1] for k in keys}

    prefix = namespace_prefix("t", "main")
    try:
        good = [await _put(a, CI, f"ci-{i}", b"good %d" % i) for i in range(2)]
        bad = [await _put(a, EVIL, f"evil-{i}", b"bad %d" % i) for i in range(2)]
        assert await wait_until_async(drained, 30)
        written = {object_key("t", "main", aid): CI for aid in good}
        written |= {object_key("t", "main", aid): EVIL for aid in bad}
        assert await objects() == written  # the header carries the writer

        assert await tiers[1].fill(bad[0], "main") is not None  # b fills evil's from the bucket
        [filled] = await b.written_by("main", EVIL, 10)
        assert (filled.artifact_id, filled.writer) == (bad[0], EVIL)
        assert [(u.writer, u.vias) for u in await b.writers("main")] == [(EVIL, ("object_store",))]
        old = await a.reads.read_by_id(bad[1])

        purge = await a.purge_writer("main", EVIL)
        assert purge.entries == 2
        assert await wait_until_async(drained, 30)
        assert await objects() == {object_key("t", "main", aid): CI for aid in good}

        # An upload of evil's old version that raced the purge: a fill of it is ignored.
        await bucket.put_file(object_key("t", "main", bad[1]), old.manifest, old.data or b"")
        assert await tiers[0].fill(bad[1], "main") is None
        assert await a.reads.read_manifest(bad[1]) is None
        assert [u.writer for u in await a.writers("main")] == [CI]
    finally:
        uploader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await uploader
        await a.close()
        await b.close()
