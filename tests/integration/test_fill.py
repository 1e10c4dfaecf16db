"""The bucket and the peers as wrappers of the reader (``storage.fill.FillingReader``), and what
replication is given at construction (``CacheService``'s ``targets``, ``bucket``,
``outbox_written``, ``touched``, ``sent_again``), on real stores in-process: a miss is asked of
the bucket before the peers, a miss everywhere stays a miss, ``missing`` stops at the first ref
nobody has and never asks for a ref stored with another size; with the bucket, artifact writes
are queued for it alone and cleans for the peers and it.

Each source is another real store standing in for the bucket or a peer (``StoreSource``: what
it holds is applied here as ``apply_replica``, as the tier and read-through do); the real tier
and read-through are covered on real processes (``tests/objectstore``, ``tests/e2e``). The
composed reader also passes the reader contract every ``ArtifactReader`` passes (the tests of
``test_reader_contract``, run here over it).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from kit.clock import SystemClock
from kura.core.errors import NotFound
from kura.core.object_layout import OUTBOX_TARGET
from kura.storage.artifact import ArtifactRef, StoredBody
from kura.storage.budget import TmpBudget
from kura.storage.fill import Filled, FillingReader
from kura.storage.object_store import ObjectStore, ObjectStoreConfig
from kura.storage.object_tier import ObjectTier
from kura.storage.service import CacheService
from tests.integration.test_reader_contract import (  # noqa: F401 (run here over the wrappers)
    INLINE_MAX,
    Pair,
    test_a_miss_is_a_miss,
    test_a_newer_version_is_seen_once_written,
    test_a_stored_artifact_reads_back_whole,
    test_damaged_bytes_read_as_a_miss,
)

PEER = "http://127.0.0.1:1"


def make_store(root: Path, **replication: Any) -> CacheService:
    return CacheService(
        data_dir=root / "data",
        tmp_dir=root / "tmp",
        tenant_id="t",
        budget=TmpBudget(4 * 1024 * 1024, tmp_dir=root / "tmp"),
        clock=SystemClock(),
        max_disk_bytes=64 * 1024 * 1024,
        min_free_disk_bytes=0,
        **replication,
    )


class StoreSource:
    """A ``FillSource`` over another real store: a fill copies its artifact into ``into``."""

    def __init__(self, holder: CacheService, into: CacheService) -> None:
        self.holder, self.into = holder, into
        self.asked: list[str] = []

    async def fill(self, artifact_id: str, namespace_id: str) -> Filled | None:
        self.asked.append(artifact_id)
        try:
            body = await self.holder.reads.read_by_id(artifact_id, hashed=True)
        except NotFound:
            return None
        assert body.data is not None

        async def chunks() -> AsyncIterator[bytes]:
            yield body.data or b""

        await self.into.apply_replica(
            body.manifest, chunks(), declared_length=body.manifest.size, source="object_store"
        )
        return Filled()


class FakeEmptySource:
    """A bucket or peers that have nothing."""

    async def fill(self, artifact_id: str, namespace_id: str) -> Filled | None:
        return None


@pytest.fixture
async def pair(tmp_path: Path) -> AsyncIterator[Pair]:
    """The reader contract's pair, its reader composed as ``kura.app`` does."""
    store = make_store(tmp_path, inline_max_bytes=INLINE_MAX)
    await store.start()
    try:
        empty = FakeEmptySource()
        yield Pair(store, FillingReader(FillingReader(store.reads, empty), empty))
    finally:
        await store.close()


@dataclass
class Stack:
    """This node's store, a bucket's and a peer's, and the reader composed as ``kura.app``
    does: the local store, then the bucket, then the peers."""

    local: CacheService
    bucket_store: CacheService
    peer_store: CacheService
    bucket: StoreSource
    peers: StoreSource
    reader: FillingReader


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    local, bucket_store, peer_store = made = [
        make_store(tmp_path / name) for name in ("local", "bucket", "peer")
    ]
    for store in made:
        await store.start()
    bucket, peers = StoreSource(bucket_store, local), StoreSource(peer_store, local)
    try:
        yield Stack(
            local,
            bucket_store,
            peer_store,
            bucket,
            peers,
            FillingReader(FillingReader(local.reads, bucket), peers),
        )
    finally:
        for store in made:
            await store.close()


def ref(key: str) -> ArtifactRef:
    return ArtifactRef("http", "ns", key)


async def put(store: CacheService, key: str, data: bytes) -> None:
    await store.put_inline(ref(key), data, "application/octet-stream")


async def test_a_miss_asks_the_bucket_before_the_peers_and_stays_a_miss_when_nobody_has_it(
    stack: Stack,
) -> None:
    local, bucket, peers, reader = stack.local, stack.bucket, stack.peers, stack.reader
    bucket_store, peer_store = stack.bucket_store, stack.peer_store
    await put(bucket_store, "in-bucket", b"b" * 100)
    await put(peer_store, "on-a-peer", b"p" * 100)

    assert (await reader.read(ref("in-bucket"))).data == b"b" * 100
    assert (await reader.read(ref("on-a-peer"))).data == b"p" * 100
    with pytest.raises(NotFound):
        await reader.read(ref("nowhere"))
    ids = [local.reads.artifact_id(ref(k)) for k in ("in-bucket", "on-a-peer", "nowhere")]
    assert bucket.asked == ids
    assert peers.asked == ids[1:]
    # Stored here now: read again without asking anyone.
    assert (await local.reads.read(ref("on-a-peer"))).data == b"p" * 100
    assert (await reader.read(ref("in-bucket"))).data == b"b" * 100
    assert len(bucket.asked) == 3


async def test_missing_fills_in_order_stops_at_the_first_nobody_has_and_skips_another_size(
    stack: Stack,
) -> None:
    local, bucket, peers, reader = stack.local, stack.bucket, stack.peers, stack.reader
    bucket_store, peer_store = stack.bucket_store, stack.peer_store
    await put(local, "other-size", b"o" * 10)
    await put(local, "here", b"h" * 10)
    await put(peer_store, "on-a-peer", b"p" * 10)
    await put(bucket_store, "in-bucket", b"b" * 10)
    await put(bucket_store, "after-the-miss", b"a" * 10)
    keys = ["other-size", "here", "on-a-peer", "in-bucket", "nowhere", "after-the-miss"]
    refs = [ref(k) for k in keys]

    got = await reader.missing(refs, [99, 10, 10, 10, 10, 10])

    assert got == [ref("other-size"), ref("nowhere"), ref("after-the-miss")]
    aid = {k: local.reads.artifact_id(ref(k)) for k in keys}
    # The bucket is asked for each absent ref in turn (after a peer's fill too), the peers
    # only for what the bucket lacks; nothing past the first ref nobody has; never a ref
    # stored here with another size.
    assert bucket.asked == [aid["on-a-peer"], aid["in-bucket"], aid["nowhere"]]
    assert peers.asked == [aid["on-a-peer"], aid["nowhere"]]
    assert await local.reads.exists(ref("in-bucket"))


async def test_with_the_bucket_artifact_writes_queue_for_it_alone_and_cleans_for_all(
    tmp_path: Path,
) -> None:
    woken: list[None] = []
    store = make_store(
        tmp_path, targets=lambda: (PEER,), bucket=True, outbox_written=lambda: woken.append(None)
    )
    await store.start()
    try:
        await put(store, "a", b"a")
        depths = await store.replica_log.outbox_depths()
        assert {peer: n for peer, (n, _at) in depths.items()} == {OUTBOX_TARGET: 1}
        await store.delete_namespace("ns")
        depths = await store.replica_log.outbox_depths()
        assert {peer: n for peer, (n, _at) in depths.items()} == {OUTBOX_TARGET: 2, PEER: 1}
        assert len(woken) == 2
    finally:
        await store.close()


async def test_the_bucket_queue_gauge_counts_a_write_before_its_answer_not_at_the_next_pass(
    tmp_path: Path,
) -> None:
    """The uploader sets the gauge on its passes; were it alone, a client (or a script waiting
    for ``kura_object_store_upload_queue_messages == 0``) would see 0 between its write's
    answer and the uploader's next pass. The uploader does not run here: the write's wake
    alone must count it."""
    tiers: list[ObjectTier] = []
    store = make_store(tmp_path, bucket=True, outbox_written=lambda: tiers[0].wake())
    config = ObjectStoreConfig.from_env("s3://never-asked", {}, 1)
    tiers.append(ObjectTier(store, ObjectStore(config, clock=SystemClock()), SystemClock()))
    await store.start()
    try:
        assert tiers[0].store.stats.upload_queue_depth == 0
        await put(store, "a", b"a")
        assert tiers[0].store.stats.upload_queue_depth == 1
    finally:
        await store.close()


async def test_a_store_on_its_own_queues_nothing_and_hears_of_touches_and_repeats(
    tmp_path: Path,
) -> None:
    touches: list[Mapping[str, int]] = []
    again: list[str] = []
    store = make_store(tmp_path, touched=touches.append, sent_again=again.append)
    await store.start()
    try:
        await put(store, "a", b"a")
        await store.delete_namespace("other")
        assert await store.replica_log.outbox_depths() == {}
        await store.reads.read(ref("a"))
        await store.flush_touches()
        assert [set(t) for t in touches] == [{store.reads.artifact_id(ref("a"))}]
        assert await store.intact(ref("a"))
        assert again == [store.reads.artifact_id(ref("a"))]
    finally:
        await store.close()


class MemorySource:
    """Peers whose copy is served from memory while it is stored (``mesh.read_through``)."""

    def __init__(self, holder: CacheService) -> None:
        self.holder = holder

    async def fill(self, artifact_id: str, namespace_id: str) -> Filled | None:
        body = await self.holder.reads.read_by_id(artifact_id, hashed=True)
        return Filled(StoredBody(body.manifest, data=body.data))


async def test_a_read_served_by_a_fill_is_noted_as_a_use_like_a_local_hit(tmp_path: Path) -> None:
    """A read that the bucket or a peer answered counts as a use (the LRU, ``KURA_MAX_AGE``,
    the bucket's touch markers, which bucket expiry reads): the review found a filled read
    noted nowhere, so an object read only through fills could expire from the bucket."""
    touches: list[Mapping[str, int]] = []
    local = make_store(tmp_path / "local", touched=touches.append)
    bucket_store, peer_store = make_store(tmp_path / "bucket"), make_store(tmp_path / "peer")
    for store in (local, bucket_store, peer_store):
        await store.start()
    try:
        await put(bucket_store, "in-bucket", b"b" * 100)
        await put(peer_store, "on-a-peer", b"p" * 100)
        reader = FillingReader(
            FillingReader(local.reads, StoreSource(bucket_store, local)),
            MemorySource(peer_store),
            note_read=lambda aid: local.note_access({aid: local.clock.now_ms()}),
        )
        assert (await reader.read(ref("in-bucket"))).data == b"b" * 100  # stored, read back
        assert (await reader.read(ref("on-a-peer"))).data == b"p" * 100  # from memory
        await local.flush_touches()
        noted = set().union(*(set(t) for t in touches))
        assert noted == {local.reads.artifact_id(ref(k)) for k in ("in-bucket", "on-a-peer")}
    finally:
        for store in (local, bucket_store, peer_store):
            await store.close()
