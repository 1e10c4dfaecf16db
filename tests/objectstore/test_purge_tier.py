"""Provenance in the object-storage tier (issue 29 item 4), in-process against a real SeaweedFS:
the writer a write records travels in the bucket object's header, a bucket fill carries it
into another node, a purge deletes exactly that writer's objects of the namespace, and a fill
of an old copy of that writer (an upload that raced the purge) is ignored afterwards."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

from kit.clock import SystemClock
from kit.wait import wait_until_async
from kura.core.object_layout import namespace_prefix, object_key
from kura.storage.artifact import ArtifactRef
from kura.storage.object_store import ListedObject, ObjectStore, ObjectStoreConfig
from kura.storage.object_tier import ObjectTier
from kura.storage.service import CacheService
from kura_harness.launch.seaweedfs import SeaweedFS
from tests.integration.test_fill import make_store
from tests.objectstore.test_bucket_expiry_pass import store_for
from tests.objectstore.test_tier import overwrite_raw

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


class WrittenAfterListing(ObjectStore):
    """The real store; once ``after_listing`` is set, the next listing ends by running it (an
    upload by another writer), as if that upload landed between a purge's listing and its
    deletions."""

    after_listing: Callable[[], Awaitable[None]] | None = None

    async def list_prefix(self, prefix: str) -> AsyncIterator[list[ListedObject]]:
        async for page in super().list_prefix(prefix):
            yield page
        hook, self.after_listing = self.after_listing, None
        if hook is not None:
            await hook()


@contextlib.asynccontextmanager
async def two_nodes(
    tmp_path: Path, bucket: ObjectStore, **tier_settings: int
) -> AsyncIterator[tuple[list[CacheService], list[ObjectTier], Callable[[int], Awaitable[None]]]]:
    """Nodes a and b sharing ``bucket``, their tiers (``tier_settings``) not running;
    ``drain(i)`` runs node i's uploader until its queue is empty (it keeps running)."""
    tiers: list[ObjectTier] = []
    nodes = [
        make_store(tmp_path / name, bucket=True, outbox_written=lambda i=i: tiers[i].wake())
        for i, name in enumerate("ab")
    ]
    tiers += [ObjectTier(n, bucket, SystemClock(), **tier_settings) for n in nodes]
    running: dict[int, asyncio.Task[None]] = {}

    async def drain(i: int) -> None:
        if i not in running:
            running[i] = asyncio.create_task(tiers[i].run())

        async def empty() -> bool:
            return await nodes[i].replica_log.outbox_depths() == {}

        assert await wait_until_async(empty, 30)

    for n in nodes:
        await n.start()
    try:
        yield nodes, tiers, drain
    finally:
        for task in running.values():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for n in nodes:
            await n.close()


async def _writers(bucket: ObjectStore, namespace: str) -> dict[str, str | None]:
    """Key -> writer of every object of ``namespace`` in the bucket."""
    keys = [
        o.key async for page in bucket.list_prefix(namespace_prefix("t", namespace)) for o in page
    ]
    return {k: (await bucket.stored_header(k) or (0, "?"))[1] for k in keys}


async def test_a_peers_purge_purges_the_bucket_again_after_this_nodes_late_upload(
    seaweedfs: SeaweedFS, tmp_path: Path
) -> None:
    """The writer wrote on b, whose upload is still queued when the operator purges on a; a's
    bucket purge runs, then b's upload lands. b applying a's purge (as from a peer) purges the
    bucket again, behind that upload: no object of the writer is left for a fill."""
    bucket = store_for(seaweedfs, "late-upload")
    async with two_nodes(tmp_path, bucket) as ([a, b], _tiers, drain):
        bad = await _put(b, EVIL, "evil-on-b", b"bad bytes")  # its upload queued on b
        purge = await a.purge_writer("main", EVIL)
        await drain(0)  # a's bucket purge: nothing of evil there yet
        await drain(1)  # b's upload lands after it
        assert await _writers(bucket, "main") == {object_key("t", "main", bad): EVIL}
        applied = await b.purge_writer("main", EVIL, purge.version_ms, source="replication")
        assert applied.entries == 1
        await drain(1)
        assert await _writers(bucket, "main") == {}
        fresh = make_store(tmp_path / "fresh", bucket=True)
        await fresh.start()
        try:  # a node that knows no purge (a new one) finds nothing to fill
            assert await ObjectTier(fresh, bucket, SystemClock()).fill(bad, "main") is None
        finally:
            await fresh.close()


async def test_a_bucket_purge_keeps_an_object_another_writer_replaced_after_the_listing(
    seaweedfs: SeaweedFS, tmp_path: Path
) -> None:
    env = seaweedfs.env("kura", "replaced")
    bucket = WrittenAfterListing(ObjectStoreConfig.from_env(env["KURA_OBJECT_STORE_URL"], env, 10))
    async with two_nodes(tmp_path, bucket) as ([a, b], _tiers, drain):
        bad = [await _put(a, EVIL, f"evil-{i}", b"bad %d" % i) for i in range(2)]
        await drain(0)
        newer = await _put(b, CI, "evil-0", b"good bytes")  # the key evil wrote, rebuilt by CI
        assert newer == bad[0]
        replaced = object_key("t", "main", newer)
        good = await b.reads.read_by_id(newer)

        async def ci_uploads() -> None:  # b's upload, between a's purge listing and deletion
            await bucket.put_file(replaced, good.manifest, good.data or b"")

        bucket.after_listing = ci_uploads
        await a.purge_writer("main", EVIL)
        await drain(0)
        assert bucket.after_listing is None  # it ran
        assert await _writers(bucket, "main") == {replaced: CI}


async def test_a_purge_of_the_empty_writer_keeps_objects_that_are_not_kuras(
    seaweedfs: SeaweedFS, tmp_path: Path
) -> None:
    bucket = store_for(seaweedfs, "foreign")
    async with two_nodes(tmp_path, bucket) as ([a, _b], _tiers, drain):
        await _put(a, "", "old-row", b"written before writers were recorded")
        await drain(0)
        foreign = object_key("t", "main", "0" * 64)
        overwrite_raw(seaweedfs, "foreign", foreign, b"somebody else's bytes")
        assert (await a.purge_writer("main", "")).entries == 1
        await drain(0)
        assert await _writers(bucket, "main") == {foreign: None}  # the anonymous one went


async def test_a_bucket_purge_deletes_at_the_expiry_pace(
    seaweedfs: SeaweedFS, tmp_path: Path
) -> None:
    """KURA_EXPIRY_MAX_DELETES_PER_SECOND=2, batches of one: three victims take 1.5 s at least
    (unpaced, one request deleted them all at once)."""
    bucket = store_for(seaweedfs, "paced")
    paced = {"max_deletes_per_second": 2, "delete_batch_size": 1}
    async with two_nodes(tmp_path, bucket, **paced) as ([a, _b], _tiers, drain):
        for i in range(3):
            await _put(a, EVIL, f"evil-{i}", b"bad %d" % i)
        await drain(0)
        await a.purge_writer("main", EVIL)
        started = time.monotonic()
        await drain(0)
        assert time.monotonic() - started >= 1.5
        assert await _writers(bucket, "main") == {}
