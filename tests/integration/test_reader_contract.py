"""One contract for every ``ArtifactReader`` (``kura.storage.ports``): the same assertions run
against the primary's store's (``CacheService.reads``) and a worker's read-only reader
(``WorkerReads.reads``, attached to the primary's data dir as a worker process attaches), in-process:
a real SQLite index and blob files, written by the primary's writer.

The contract: a stored artifact reads back byte for byte (inline, small and large bodies, the
large one hashed while sent); a miss is a miss (``NotFound``, False, None, listed as missing),
never an exception of another kind, whoever may have it elsewhere (issue 27: the worker's reader
raised ``ForwardToPrimary``, a routing decision, from inside storage); damaged bytes read as a
miss, never as the wrong bytes; a newer version is seen as soon as its write returned.
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from kit.clock import SystemClock
from kura.api.file_response import verified_chunks
from kura.core.errors import NotFound
from kura.storage.artifact import ArtifactRef, StoredBody
from kura.storage.budget import TmpBudget
from kura.storage.hot_generation import SharedGeneration
from kura.storage.ports import ArtifactReader
from kura.storage.service import CacheService
from kura.storage.state import SMALL_BLOB_BYTES
from kura.storage.worker_reads import WorkerReads

LARGE = SMALL_BLOB_BYTES * 2 + 17  # a file body, hashed while sent
INLINE_MAX = 512  # bodies up to this many bytes live in their index row


@dataclass
class Pair:
    writer: CacheService  # the primary's store: the one writer
    reader: ArtifactReader  # under test


@pytest.fixture(params=["primary", "worker"])
async def pair(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Pair]:
    data, tmp = tmp_path / "data", tmp_path / "tmp"
    store = CacheService(
        data_dir=data,
        tmp_dir=tmp,
        tenant_id="t",
        budget=TmpBudget(4 * 1024 * 1024, tmp_dir=tmp),
        clock=SystemClock(),
        max_disk_bytes=64 * 1024 * 1024,
        min_free_disk_bytes=0,
        inline_max_bytes=INLINE_MAX,
    )
    await store.start()
    # As the supervisor does before it starts a worker: the hot cache's shared generation.
    store.hot.share(SharedGeneration.create(data), follow=False)
    worker: WorkerReads | None = None
    if request.param == "worker":
        worker = WorkerReads(data_dir=data, tmp_dir=tmp, tenant_id="t", clock=SystemClock())
        worker.attach()
    try:
        yield Pair(store, (worker or store).reads)
    finally:
        if worker is not None:
            await worker.close()
        await store.close()


def ref(key: str) -> ArtifactRef:
    return ArtifactRef("http", "ns", key)


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def put(store: CacheService, key: str, data: bytes) -> None:
    await store.put_stream(
        ref(key),
        _one(data),
        declared_length=len(data),
        limit_bytes=len(data) + 1,
        content_type="application/octet-stream",
    )


async def sent(reader: ArtifactReader, body: StoredBody) -> bytes:
    """The bytes a sender sends of ``body``: verified while sent, as the routes do."""
    if body.data is not None:
        return body.data
    try:
        return b"".join([chunk async for chunk in verified_chunks(reader, body)])
    finally:
        body.close()


BODIES = {"inline": b"i" * 100, "small": b"s" * 4000, "large": os.urandom(LARGE)}


@pytest.mark.parametrize("kind", BODIES)
async def test_a_stored_artifact_reads_back_whole(pair: Pair, kind: str) -> None:
    await put(pair.writer, kind, BODIES[kind])
    reader = pair.reader
    body = await reader.read(ref(kind))
    assert body.manifest.size == len(BODIES[kind])
    assert await sent(reader, body) == BODIES[kind]
    aid = reader.artifact_id(ref(kind))
    assert aid == pair.writer.artifact_id(ref(kind))
    assert await reader.read_manifest(aid) == body.manifest
    assert await reader.exists(ref(kind))
    by_id = await reader.read_by_id(aid, hashed=True)
    assert by_id.verified
    assert await sent(reader, by_id) == BODIES[kind]
    [many] = await reader.read_many([aid])
    assert many is not None
    assert await sent(reader, many) == BODIES[kind]


async def test_a_miss_is_a_miss(pair: Pair) -> None:
    await put(pair.writer, "here", b"here")
    reader = pair.reader
    with pytest.raises(NotFound):
        await reader.read(ref("absent"))
    with pytest.raises(NotFound):
        await reader.read_by_id(reader.artifact_id(ref("absent")))
    assert not await reader.exists(ref("absent"))
    assert await reader.read_manifest(reader.artifact_id(ref("absent"))) is None
    ids = [reader.artifact_id(ref(k)) for k in ("here", "absent")]
    got = await reader.read_many(ids)
    assert got[0] is not None
    assert got[1] is None
    refs = [ref("here"), ref("absent"), ref("also-absent")]
    assert await reader.missing(refs) == refs[1:]
    # A content digest names one size: stored with another size is missing too.
    assert await reader.missing([ref("here")], [5]) == [ref("here")]
    assert await reader.missing([ref("here")], [4]) == []


@pytest.mark.parametrize(("kind", "damage"), [("small", "flip"), ("large", "truncate")])
async def test_damaged_bytes_read_as_a_miss(pair: Pair, kind: str, damage: str) -> None:
    await put(pair.writer, kind, BODIES[kind])
    manifest = await pair.writer.reads.read_manifest(pair.writer.artifact_id(ref(kind)))
    assert manifest is not None
    assert not manifest.inline
    path = pair.writer.files.blob_path(manifest)
    if damage == "flip":
        raw = bytearray(path.read_bytes())
        raw[0] ^= 0xFF
        path.write_bytes(bytes(raw))
    else:
        os.truncate(path, manifest.size - 1)
    pair.writer.hot.invalidate([manifest.artifact_id])
    with pytest.raises(NotFound):
        await pair.reader.read(ref(kind))
    assert await pair.reader.read_many([manifest.artifact_id]) == [None]


async def test_a_newer_version_is_seen_once_written(pair: Pair) -> None:
    await put(pair.writer, "k", b"first")
    assert (await pair.reader.read(ref("k"))).data == b"first"  # now in the reader's hot cache
    await put(pair.writer, "k", b"second")
    assert (await pair.reader.read(ref("k"))).data == b"second"
    await pair.writer.delete_namespace("ns")
    with pytest.raises(NotFound):
        await pair.reader.read(ref("k"))
    assert not await pair.reader.exists(ref("k"))
