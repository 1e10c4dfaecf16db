"""REAPI ``SplitBlob`` and ``SpliceBlob``: large CAS blobs as content-defined chunks.

The chunking is FastCDC 2020 as remote_execution.proto's ``FastCdc2020Params`` defines it,
through pyfastcdc (a port of fastcdc-rs's ``v2020``, one of the two implementations the spec
names; ``tests/unit/test_chunking.py`` checks it against the spec's test vectors). The
parameters are fixed, not settings: every node of a mesh and every client that chunks on its
own must cut the same way, or no chunk is shared.

* ``AVG_CHUNK_BYTES`` 512 KiB: the spec's recommended average (its range is 1 KiB to 1 MiB),
  and upstream Kura's. A changed region of a blob costs about one average chunk on each side
  of it; 512 KiB keeps a 2 GiB blob within 16,384 chunks (``max_chunks``).
* ``MIN_CHUNK_BYTES`` 128 KiB and ``MAX_CHUNK_BYTES`` 2 MiB: the average / 4 and * 4, which
  the spec requires ("MUST be derived from the average"), as upstream Kura has them.
* Normalization level 2 (the spec: "MUST use normalization level 2") and ``SEED`` 0 (the
  spec's recommended value: no XOR of the gear table). The gear table is fastcdc-rs's: entry
  ``i`` is the first (big-endian) 64 bits of the MD5 of 64 bytes of value ``i``.

``split``: the stored blob is read in pieces (verified against its stored digest, as every read
is), cut in a worker thread ``WINDOW_BYTES`` at a time (a cut is final once ``MAX_CHUNK_BYTES``
follow its chunk's start, so the chunks are those of the whole blob at once) and each chunk
hashed there too; every chunk not stored yet is stored through the ordinary write path
(``ArtifactWriter.put_stream``: tmp budget, size limit, digest check, replication). A chunk
that is the whole blob is the blob itself. A window's chunks are stored while the next one is
read and cut; memory: about three windows per call.

``splice``: the chunks must all be stored (NOT_FOUND naming the first missing ones) and
add up to the blob's size; their bytes, each verified as it is read, stream into
``put_stream`` under the blob's digest, which reserves the blob's size from the tmp budget
first and checks the SHA-256 before anything is published (a mismatch: INVALID_ARGUMENT,
nothing stored). A blob already stored is not written again.

Calls at once: a split holds about three windows and the chunks it is storing (at most about
``CALL_BYTES``, 16 MiB), a splice a few pieces of its chunks; ``Calls`` lets at most
``KURA_GRPC_MAX_SPLIT_SPLICE_CALLS`` of them run at once on a node (the default 4: 64 MiB)
and answers the next one RESOURCE_EXHAUSTED at once (REAPI: "the client may retry after a
delay"), rather than hold its request while memory is what is short.

Chunk lifecycle: a chunk is an ordinary CAS blob under ``cas/<sha256>`` (the key any
``Write`` of the same bytes uses): it replicates, is found by ``FindMissingBlobs``, read by
``Read``, aged and evicted like any other, independently of the blob it came from (REAPI
allows it: "A blob and any chunk derived from it MAY be evicted from the CAS at different
times"). ``split`` touches the blob (a read) and every chunk it returns (already stored ones
through ``ArtifactReader.missing``, new ones by being written); ``splice`` touches every chunk
it names and the blob. Nothing maps a blob to its chunks: a later ``split`` cuts again, and,
the cut being a function of the bytes, returns the same chunks.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import AsyncGenerator, Iterator, Sequence
from contextlib import aclosing, contextmanager
from typing import Final, TypeAlias

from pyfastcdc import FastCDC

from kura.api.action_cache import EMPTY_SHA256
from kura.api.action_lookup import cas_ref
from kura.core.errors import DigestMismatch, InvalidRequest, NotFound, ResourceExhausted
from kura.grpc.common import GrpcContext, stored_blob
from kura.storage.artifact import ArtifactRef
from kura.storage.ports import ArtifactReader, one_piece

AVG_CHUNK_BYTES = 512 * 1024
MIN_CHUNK_BYTES = AVG_CHUNK_BYTES // 4
MAX_CHUNK_BYTES = AVG_CHUNK_BYTES * 4
NORMALIZATION: Final = 2
SEED = 0
# Bytes cut per trip to the worker thread: each trip decides the chunks that start in its
# first WINDOW_BYTES - MAX_CHUNK_BYTES (at least one). A call holds about three windows.
WINDOW_BYTES = 4 * 1024 * 1024
# The most a Digest takes in a repeated field: tag and length (2), hash (66), size (<= 11).
DIGEST_WIRE_BYTES = 80
CONTENT_TYPE = "application/octet-stream"

# The most one split holds at once: three windows and the chunks being stored (module docstring).
CALL_BYTES = 4 * WINDOW_BYTES
Chunk: TypeAlias = tuple[str, int]  # (SHA-256 hex, size in bytes)
EMPTY: Chunk = (EMPTY_SHA256, 0)  # always present (REAPI): never looked up


class Calls:
    """The split and splice calls running on one node, at most ``limit`` at once (module
    docstring): memory is bounded by ``limit`` × ``CALL_BYTES``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.running = 0

    @contextmanager
    def one(self) -> Iterator[None]:
        """Hold one of the ``limit`` places for a call; ``ResourceExhausted`` when none is free
        (nothing is read or stored)."""
        if self.running >= self.limit:
            raise ResourceExhausted(
                f"{self.limit} SplitBlob/SpliceBlob calls are running on this node "
                "(KURA_GRPC_MAX_SPLIT_SPLICE_CALLS): retry after a delay"
            )
        self.running += 1
        try:
            yield
        finally:
            self.running -= 1


def new_cutter() -> FastCDC:
    """A FastCDC 2020 cutter with kura's parameters (module docstring). Not safe to share
    between threads (pyfastcdc's rule): one per call."""
    return FastCDC(
        AVG_CHUNK_BYTES,
        min_size=MIN_CHUNK_BYTES,
        max_size=MAX_CHUNK_BYTES,
        normalized_chunking=NORMALIZATION,
        seed=SEED,
    )


def max_chunks(gc: GrpcContext) -> int:
    """The most chunks one call may name: what FastCDC makes at most of the largest blob kura
    accepts (``KURA_MAX_ARTIFACT_BYTES`` / ``MIN_CHUNK_BYTES``, rounded up: 16,384 at the
    2 GiB default), and no more than one message of ``KURA_GRPC_MAX_MESSAGE_BYTES`` carries."""
    by_size = -(-gc.settings.max_artifact_bytes // MIN_CHUNK_BYTES)
    return max(1, min(by_size, gc.max_batch_bytes // DIGEST_WIRE_BYTES))


def cut(window: bytes, final: bool) -> list[tuple[int, int, str]]:
    """The chunks of ``window`` from its start whose cut is decided, as ``(offset, size,
    sha256)`` in order: those with ``MAX_CHUNK_BYTES`` of data from their start, or, when
    ``final`` (the window ends the blob), all of them. Blocking (hashes): run in a thread."""
    chunks = []
    for c in new_cutter().cut_buf(window):
        if not final and len(window) - c.offset < MAX_CHUNK_BYTES:
            break
        chunks.append((c.offset, c.length, hashlib.sha256(c.data).hexdigest()))
    return chunks


async def split(
    gc: GrpcContext,
    ns: str,
    sha256: str,
    size_bytes: int,
    reader: ArtifactReader | None = None,
    into: str | None = None,
    *,
    writer: str,
) -> list[Chunk]:
    """The chunks of the stored blob ``sha256`` (of ``size_bytes``) in namespace ``ns``, in
    order, each stored in the CAS of ``into`` (default ``ns``; module docstring) as written by
    ``writer`` (``kura.core.provenance``: the caller, whose call cut them); ``[]`` for
    the empty blob. ``reader`` (default the node's) reads the blob: through a call's
    namespaces in order (``kura.storage.overlay``), so a pull request splits main's blob into
    its own namespace.

    Raises ``NotFound`` when the blob is not stored with that size or fails verification
    (chunks stored before the damage showed are left: each is a correct blob of its own
    digest), ``InvalidRequest`` past ``max_chunks``, and what ``put_stream`` raises for a chunk
    (``ResourceExhausted`` when the tmp budget or the disk has no room now)."""
    if (sha256, size_bytes) == EMPTY:
        return []
    store = ns if into is None else into
    limit = max_chunks(gc)
    chunks: list[Chunk] = []
    pending: list[bytes] = []
    pending_bytes = 0
    # A window's chunks are stored while the next window is read and cut (one store at a
    # time); the first failure cancels the rest and is raised as itself.
    storing: asyncio.Task[None] | None = None
    try:
        async with asyncio.TaskGroup() as group:
            blob = stored_blob(gc, ns, sha256, size_bytes, "blob", reader)
            async with aclosing(blob) as pieces:
                async for piece in pieces:
                    pending.append(piece)
                    pending_bytes += len(piece)
                    if pending_bytes < WINDOW_BYTES:
                        continue
                    window = b"".join(pending)
                    decided = await asyncio.to_thread(cut, window, False)
                    chunks.extend((h, size) for _, size, h in decided)
                    if len(chunks) > limit:
                        raise InvalidRequest(
                            f"blob {sha256} splits into more than {limit} chunks, more than "
                            "one response may carry"
                        )
                    if storing is not None:
                        await storing
                    storing = group.create_task(_store_missing(gc, store, window, decided, writer))
                    rest = window[sum(size for _, size, _ in decided) :]
                    pending, pending_bytes = [rest], len(rest)
            window = b"".join(pending)
            decided = await asyncio.to_thread(cut, window, True)
            if chunks or len(decided) > 1:  # else its one chunk is the blob itself
                group.create_task(_store_missing(gc, store, window, decided, writer))
            chunks.extend((h, size) for _, size, h in decided)
    except ExceptionGroup as failed:
        raise failed.exceptions[0] from None
    return chunks


async def _store_missing(
    gc: GrpcContext, ns: str, window: bytes, decided: Sequence[tuple[int, int, str]], writer: str
) -> None:
    """Store the chunks of ``decided`` (slices of ``window``) that are not stored yet; the
    stored ones are touched (``ArtifactReader.missing``)."""
    first: dict[str, tuple[int, int]] = {}
    for offset, size, sha256 in decided:
        first.setdefault(sha256, (offset, size))
    refs = [cas_ref(ns, sha256, writer) for sha256 in first]
    missing = await gc.reader.missing(refs, [size for _, size in first.values()])
    # Stored together, so their commits share durable syncs (``storage.group_commit``); the
    # first failure cancels the others and is raised as itself.
    try:
        async with asyncio.TaskGroup() as group:
            for ref in missing:
                sha256 = ref.key.removeprefix("cas/")
                offset, size = first[sha256]
                group.create_task(
                    gc.writer.put_stream(
                        cas_ref(ns, sha256, writer),  # not ``ref``: a reader may drop its writer
                        one_piece(window[offset : offset + size]),
                        declared_length=size,
                        limit_bytes=gc.settings.max_artifact_bytes,
                        content_type=CONTENT_TYPE,
                        expected_sha256=sha256,
                    )
                )
    except ExceptionGroup as failed:
        raise failed.exceptions[0] from None


async def splice(
    gc: GrpcContext,
    ns: str,
    sha256: str,
    size_bytes: int,
    chunks: Sequence[Chunk],
    reading: tuple[str, ArtifactReader] | None = None,
    *,
    writer: str,
) -> None:
    """Store blob ``sha256`` (of ``size_bytes``) in ``ns``, written by ``writer``
    (``kura.core.provenance``), as the concatenation of the stored
    ``chunks`` (module docstring); a no-op when it is stored already. ``reading`` (namespace,
    reader), default (``ns``, the node's): where the chunks are looked up and read, through a
    call's namespaces in order (``kura.storage.overlay``), so a pull request splices main's
    chunks into its own namespace.

    Raises, storing nothing: ``InvalidRequest`` for more than ``max_chunks`` chunks, sizes that
    do not add up to ``size_bytes``, or bytes that do not hash to ``sha256``; ``NotFound`` when
    a chunk is not stored (with its size) or fails verification; ``PayloadTooLarge`` past
    ``KURA_MAX_ARTIFACT_BYTES`` (INVALID_ARGUMENT), ``InsufficientStorage`` past the disk budget
    and ``ResourceExhausted`` when the tmp budget or the disk has no room now."""
    limit = max_chunks(gc)
    if len(chunks) > limit:
        raise InvalidRequest(f"{len(chunks)} chunks is more than the {limit} one splice may name")
    total = sum(size for _, size in chunks)
    if total != size_bytes:
        raise InvalidRequest(
            f"the chunks add up to {total} bytes, not the {size_bytes} of blob {sha256}"
        )
    if size_bytes == 0:
        if sha256 != EMPTY_SHA256:
            raise InvalidRequest(f"blob {sha256} of 0 bytes is not the empty blob")
        return
    gc.writer.check_size(size_bytes, gc.settings.max_artifact_bytes)
    from_ns, reader = reading or (ns, gc.reader)
    wanted: dict[Chunk, ArtifactRef] = {}
    for chunk in chunks:
        if chunk != EMPTY:
            wanted.setdefault(chunk, cas_ref(from_ns, chunk[0]))
    missing = await reader.missing(list(wanted.values()), [size for _, size in wanted])
    if missing:
        names = ", ".join(ref.key.removeprefix("cas/") for ref in missing[:3])
        raise NotFound(f"{len(missing)} of the chunks are not stored: {names}")
    blob = cas_ref(ns, sha256, writer)
    if not await gc.reader.missing([blob], [size_bytes]):
        return  # stored already (and touched)
    try:
        async with aclosing(_concatenated(gc, from_ns, chunks, reader)) as body:
            await gc.writer.put_stream(
                blob,
                body,
                declared_length=size_bytes,
                limit_bytes=gc.settings.max_artifact_bytes,
                content_type=CONTENT_TYPE,
                expected_sha256=sha256,
            )
    except DigestMismatch as exc:
        raise InvalidRequest(
            f"the chunks do not concatenate to blob {sha256}: {exc.message}"
        ) from None


async def _concatenated(
    gc: GrpcContext, ns: str, chunks: Sequence[Chunk], reader: ArtifactReader
) -> AsyncGenerator[bytes, None]:
    """The bytes of ``chunks`` in order (``stored_blob``: a chunk gone since it was looked
    up, evicted or damaged, raises ``NotFound``)."""
    for sha256, size in chunks:
        if (sha256, size) != EMPTY:
            async with aclosing(stored_blob(gc, ns, sha256, size, "chunk", reader)) as pieces:
                async for piece in pieces:
                    yield piece
