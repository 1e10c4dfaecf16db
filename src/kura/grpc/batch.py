"""The work of the CAS batch calls, per batch rather than per blob (``kura.grpc.cas`` answers
them):

* ``store_blobs`` (``BatchUpdateBlobs``): each blob's digest and length checked, then the whole
  batch stored under one durable commit (``ArtifactWriter.put_batch``, ``storage.batch_write``);
  a bad blob gets its own error and leaves nothing behind, and the others are stored.
* ``store_whole``: a ByteStream ``Write`` whose one message carries the whole of a small blob,
  as a batch of one.
* ``read_blobs`` (``BatchReadBlobs``): one index look-up for the whole batch
  (``ArtifactReader.read_many`` with ``as_reads``: the hot cache first, each hit noted as a use);
  a local miss is then asked as a lone read, which the bucket and the peers may fill.
"""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import aclosing

from kura.api.action_lookup import cas_ref
from kura.core.errors import InvalidRequest, KuraError, NotFound
from kura.grpc.common import Digest, GrpcContext, check_digest, is_empty, verified_body
from kura.storage.artifact import BatchBlob, StoredBody
from kura.storage.ports import ArtifactReader

CONTENT_TYPE = "application/octet-stream"


async def store_blobs(
    gc: GrpcContext, ns: str, blobs: Sequence[tuple[Digest, bytes]], *, writer: str
) -> list[KuraError | None]:
    """Store each ``(digest, data)`` of namespace ``ns``, written by ``writer``
    (``kura.core.provenance``); per blob, in order, None when it is
    stored (or was already, or is the empty blob) or the error that refused it
    (``InvalidRequest`` for a bad digest or a length that is not the digest's,
    ``DigestMismatch``, and what ``put_batch`` raises)."""
    answers: list[KuraError | None] = [None] * len(blobs)
    batch: list[BatchBlob] = []
    at: list[int] = []
    for i, (digest, data) in enumerate(blobs):
        try:
            sha256 = check_digest(digest)
            if len(data) != digest.size_bytes:
                raise InvalidRequest(
                    f"blob {sha256} carries {len(data)} bytes, not the {digest.size_bytes} "
                    "of its digest"
                )
        except KuraError as exc:
            answers[i] = exc
            continue
        if not is_empty(digest):
            batch.append(BatchBlob(cas_ref(ns, sha256, writer), data, sha256))
            at.append(i)
    if not batch:
        return answers
    results = await gc.writer.put_batch(
        batch, limit_bytes=gc.settings.max_artifact_bytes, content_type=CONTENT_TYPE
    )
    for i, blob, result in zip(at, batch, results, strict=True):
        if isinstance(result, KuraError):
            answers[i] = result
        elif result is not None:  # written now (None: it was stored already)
            gc.metrics.bytes_in_child("grpc").inc(len(blob.data))
    return answers


async def store_whole(gc: GrpcContext, ns: str, sha256: str, data: bytes, *, writer: str) -> None:
    """Store a blob whose whole ``data`` came in one message (a ByteStream ``Write`` of one
    message with ``finish_write``) as a batch of one: no upload task, and an inline blob's
    "already stored" check made by the writer. Raises what ``store_blobs`` answers."""
    (result,) = await gc.writer.put_batch(
        [BatchBlob(cas_ref(ns, sha256, writer), data, sha256)],
        limit_bytes=gc.settings.max_artifact_bytes,
        content_type=CONTENT_TYPE,
    )
    if isinstance(result, KuraError):
        raise result


async def read_blobs(
    gc: GrpcContext, reader: ArtifactReader, ns: str, digests: Sequence[Digest]
) -> list[bytes | KuraError]:
    """The bytes of each digest of namespace ``ns`` (checked already), in order, verified
    against the stored digest, or the error for that blob (``NotFound``: absent, stored with
    another size, or damaged; ``InvalidRequest``: larger than ``max_batch_total_size_bytes``).
    Every lookup is counted in ``kura_cache_lookups_total{protocol="grpc"}``. ``ns``'s local
    copies are read in one index look-up; a miss there is asked of ``reader`` (the bucket,
    the peers, and the call's other namespaces in order, ``kura.storage.overlay``)."""
    answers: list[bytes | KuraError] = [b""] * len(digests)
    wanted = [(i, d) for i, d in enumerate(digests) if not is_empty(d)]
    refs = [cas_ref(ns, d.hash) for _i, d in wanted]
    bodies = await gc.reader.read_many([gc.reader.artifact_id(r) for r in refs], as_reads=True)
    try:
        for (i, digest), ref, body in zip(wanted, refs, bodies, strict=True):
            try:
                if body is None:  # a local miss: the bucket or a peer may have it
                    body = await reader.read(ref)
                data = await blob_bytes(gc, digest, body, gc.max_batch_bytes)
            except NotFound as exc:
                gc.metrics.count_lookup("grpc", False)
                answers[i] = exc
                continue
            except KuraError as exc:
                answers[i] = exc
                continue
            gc.metrics.count_lookup("grpc", True)
            gc.metrics.bytes_out_child("grpc").inc(len(data))
            answers[i] = data
    finally:
        for body in bodies:
            if body is not None:
                body.close()  # those an error left open
    return answers


async def blob_bytes(gc: GrpcContext, digest: Digest, body: StoredBody, limit_bytes: int) -> bytes:
    """``body`` (closed here) in memory as the blob ``digest`` (``verified_body``: ``NotFound``
    when stored with another size or damaged, ``InvalidRequest`` past ``limit_bytes``)."""
    pieces = verified_body(gc, body, digest.hash, digest.size_bytes, "blob", limit_bytes)
    async with aclosing(pieces):
        return b"".join([piece async for piece in pieces])
