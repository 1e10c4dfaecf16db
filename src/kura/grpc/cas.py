"""REAPI ``Capabilities`` and ``ContentAddressableStorage`` (remote_execution.proto, v2.0-2.3).

* ``GetCapabilities``: SHA-256 only; ``supported_compressors`` and
  ``supported_batch_update_compressors`` are zstd (ByteStream's ``compressed-blobs/zstd/…``
  and the batch calls); ``update_enabled`` is the caller's own right ``write`` (the action
  cache) in the instance's namespace (false for a read-only or a ``write:cas`` credential, so
  Bazel 6+ does not try to upload action results and fail; a ``write:cas`` one still uploads
  its blobs), except for a Bazel older than 6.0, which would refuse to build
  (``fails_on_update_disabled``); ``splice_blob_support`` is the right ``write:cas``;
  ``max_batch_total_size_bytes`` = ``KURA_GRPC_MAX_MESSAGE_BYTES`` - 64 KiB; API 2.0 to 2.3.
* ``FindMissingBlobs``: one index look-up (peers asked for local misses, read-through). A blob
  is present only with the digest's size: a stored blob of another size does not answer for it.
* ``BatchUpdateBlobs`` (right ``write:cas``, as ByteStream ``Write``): a blob sent with ``compressor`` ZSTD is decompressed first, refused
  (INVALID_ARGUMENT, ``zstd_stream.ZstdBomb``) once it passes its digest's size, and counts at
  that declared size against ``max_batch_total_size_bytes``. Each blob is checked (size, hash),
  and the good ones are stored under one durable commit (``kura.grpc.batch``); a bad one gets
  its own INVALID_ARGUMENT status and nothing is stored for it. Blobs already stored intact are
  not rewritten. The request's blob bytes must fit ``max_batch_total_size_bytes``.
* ``BatchReadBlobs``: one index look-up for the batch (``kura.grpc.batch``); each blob is
  answered zstd-compressed when ``acceptable_compressors`` lists ZSTD (identity otherwise);
  per-blob NOT_FOUND; INVALID_ARGUMENT for the whole call when the blobs
  asked for add up to more than ``max_batch_total_size_bytes`` (REAPI: "the server MUST return
  INVALID_ARGUMENT" then).
* ``GetTree``: the root ``Directory`` and every directory below it, breadth first, each once,
  streamed in pages of at most ``page_size`` directories (default and maximum 1,000) and at most
  ``MAX_TREE_PAGE_BYTES`` (2 MiB) or ``max_batch_total_size_bytes`` of them, whichever is less
  (a Directory larger alone is a page of its own), so a page always fits
  ``KURA_GRPC_MAX_MESSAGE_BYTES`` (by count alone, 1,000 directories of 3 KiB once passed the
  4 MiB message limit, issue 26) and serializing one never holds the event loop for long;
  every page but the last carries a ``next_page_token`` from which a new call resumes.
  Directories that are not stored are skipped (REAPI: "they will be omitted"). A Directory
  larger than ``MAX_INLINE_PARSE_BYTES`` is parsed in a worker thread, off the event loop.
* ``SplitBlob`` (right ``read``) and ``SpliceBlob`` (``write:cas``: the spliced bytes are
  checked against the digest): ``kura.grpc.chunking``
  (FastCDC 2020, its parameters advertised in ``fast_cdc_2020_params``). A digest function
  other than SHA-256 (or unset) is INVALID_ARGUMENT.

Keys: ``ArtifactRef("bazel", namespace, "cas/<hex>")``, the Bazel HTTP cache's
(``kura.api.action_lookup.cas_ref``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, TypeAlias

import grpc
from google.protobuf.message import DecodeError
from google.rpc import code_pb2, status_pb2

from kura.api.action_lookup import cas_ref
from kura.api.auth import Access
from kura.core.errors import InvalidRequest, KuraError, NotFound
from kura.grpc import chunking
from kura.grpc.batch import blob_bytes, read_blobs, store_blobs
from kura.grpc.common import (
    GrpcContext,
    check_digest,
    code_for,
    fails_on_update_disabled,
    is_empty,
    rpc,
    streaming_rpc,
)
from kura.grpc.zstd_stream import whole_compressed_off_loop, whole_decompressed
from kura.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as reapi,
)
from kura.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2_grpc as reapi_grpc,
)
from kura.protos.build.bazel.semver import semver_pb2
from kura.storage.ports import ArtifactReader

Ctx: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
# REAPI 2.3: the compressors (2.1), digest_function in requests (2.2), output_paths (2.3).
HIGH_API_MINOR = 3
IDENTITY = reapi.Compressor.IDENTITY
ZSTD = reapi.Compressor.ZSTD
MAX_TREE_PAGE = 1000
MAX_TREE_PAGE_BYTES = 2 * 1024 * 1024  # directories in one GetTree page (a lone larger one too)
MAX_INLINE_PARSE_BYTES = 64 * 1024  # a larger Directory is parsed in a worker thread


def _status(exc: KuraError | None = None) -> status_pb2.Status:
    if exc is None:
        return status_pb2.Status(code=code_pb2.OK)
    return status_pb2.Status(code=code_for(exc).value[0], message=exc.message)


class Capabilities(reapi_grpc.CapabilitiesServicer):
    def __init__(self, gc: GrpcContext) -> None:
        self.gc = gc

    @rpc("GetCapabilities")
    async def GetCapabilities(
        self, request: reapi.GetCapabilitiesRequest, context: Ctx
    ) -> reapi.ServerCapabilities:
        view = self.gc.authorize(context, Access.READ, request.instance_name)
        ns = view.home
        sha256 = reapi.DigestFunction.SHA256
        # write: the action cache (kura.core.rights); a write:cas caller is told false and
        # uploads its blobs all the same. An instance its overlay only reads: no writes.
        writes = view.write is not None and self.gc.allows(context, Access.WRITE, ns)
        return reapi.ServerCapabilities(
            cache_capabilities=reapi.CacheCapabilities(
                digest_functions=[sha256],
                action_cache_update_capabilities=reapi.ActionCacheUpdateCapabilities(
                    update_enabled=writes or fails_on_update_disabled(context)
                ),
                supported_compressors=[ZSTD],
                supported_batch_update_compressors=[ZSTD],
                max_batch_total_size_bytes=self.gc.max_batch_bytes,
                symlink_absolute_path_strategy=reapi.SymlinkAbsolutePathStrategy.ALLOWED,
                split_blob_support=True,
                splice_blob_support=view.write is not None
                and self.gc.allows(context, Access.WRITE_CAS, ns),
                fast_cdc_2020_params=reapi.FastCdc2020Params(
                    avg_chunk_size_bytes=chunking.AVG_CHUNK_BYTES, seed=chunking.SEED
                ),
            ),
            low_api_version=semver_pb2.SemVer(major=2, minor=0),
            high_api_version=semver_pb2.SemVer(major=2, minor=HIGH_API_MINOR),
        )


class ContentAddressableStorage(reapi_grpc.ContentAddressableStorageServicer):
    def __init__(self, gc: GrpcContext) -> None:
        self.gc = gc
        self.chunking = chunking.Calls(gc.settings.grpc_max_split_splice_calls)

    @rpc("FindMissingBlobs")
    async def FindMissingBlobs(
        self, request: reapi.FindMissingBlobsRequest, context: Ctx
    ) -> reapi.FindMissingBlobsResponse:
        view = self.gc.authorize(context, Access.READ, request.instance_name)
        wanted: dict[str, reapi.Digest] = {}
        # A hash asked again with another size: reported missing (a false "missing" costs an
        # upload the Write's own check then skips; a false "present" fails the build).
        again: dict[tuple[str, int], reapi.Digest] = {}
        for d in request.blob_digests:
            check_digest(d)
            if is_empty(d):
                continue
            first = wanted.setdefault(d.hash, d)
            if first.size_bytes != d.size_bytes:
                again.setdefault((d.hash, d.size_bytes), d)
        # Present in any namespace the call reads: not missing (kura.storage.overlay).
        missing = await self.gc.reader_for(view).missing(
            [cas_ref(view.home, h) for h in wanted], [d.size_bytes for d in wanted.values()]
        )
        return reapi.FindMissingBlobsResponse(
            missing_blob_digests=[
                *(wanted[m.key.removeprefix("cas/")] for m in missing),
                *again.values(),
            ]
        )

    @rpc("BatchUpdateBlobs")
    async def BatchUpdateBlobs(
        self, request: reapi.BatchUpdateBlobsRequest, context: Ctx
    ) -> reapi.BatchUpdateBlobsResponse:
        view = self.gc.authorize(context, Access.WRITE_CAS, request.instance_name)
        ns = view.writable
        # A compressed blob counts at its declared size: that is what it grows to in memory.
        total = sum(
            len(r.data) if r.compressor == IDENTITY else max(len(r.data), r.digest.size_bytes)
            for r in request.requests
        )
        if total > self.gc.max_batch_bytes:
            raise InvalidRequest(
                f"the batch carries {total} bytes of blobs (compressed ones at their declared "
                f"size), more than max_batch_total_size_bytes {self.gc.max_batch_bytes}: "
                "use ByteStream.Write"
            )
        # zstd blobs inflated first; one that fails keeps its own error, the rest go together.
        failed: dict[int, KuraError] = {}
        blobs: list[tuple[reapi.Digest, bytes]] = []
        for i, r in enumerate(request.requests):
            try:
                blobs.append((r.digest, await inflated(r.compressor, r.data, r.digest)))
            except KuraError as exc:
                failed[i] = exc
        stored = iter(await store_blobs(self.gc, ns, blobs, writer=view.writer))
        errors = [failed.get(i) or next(stored) for i in range(len(request.requests))]
        return reapi.BatchUpdateBlobsResponse(
            responses=[
                reapi.BatchUpdateBlobsResponse.Response(digest=r.digest, status=_status(error))
                for r, error in zip(request.requests, errors, strict=True)
            ]
        )

    @rpc("BatchReadBlobs")
    async def BatchReadBlobs(
        self, request: reapi.BatchReadBlobsRequest, context: Ctx
    ) -> reapi.BatchReadBlobsResponse:
        view = self.gc.authorize(context, Access.READ, request.instance_name)
        for d in request.digests:
            check_digest(d)
        total = sum(d.size_bytes for d in request.digests)
        if total > self.gc.max_batch_bytes:
            raise InvalidRequest(
                f"the blobs asked for add up to {total} bytes, more than "
                f"max_batch_total_size_bytes {self.gc.max_batch_bytes}: use ByteStream.Read"
            )
        zstd = ZSTD in request.acceptable_compressors
        responses = []
        found = await read_blobs(self.gc, self.gc.reader_for(view), view.home, request.digests)
        for d, got in zip(request.digests, found, strict=True):
            compressor = IDENTITY
            if isinstance(got, bytes):
                data, status = got, _status()
                if zstd:
                    data, compressor = await whole_compressed_off_loop(data), ZSTD
            else:
                data, status = b"", _status(got)
            responses.append(
                reapi.BatchReadBlobsResponse.Response(
                    digest=d, data=data, status=status, compressor=compressor
                )
            )
        return reapi.BatchReadBlobsResponse(responses=responses)

    @rpc("SplitBlob")
    async def SplitBlob(
        self, request: reapi.SplitBlobRequest, context: Ctx
    ) -> reapi.SplitBlobResponse:
        """``kura.grpc.chunking.split``; read access is enough (the chunks stored are cut from
        a blob already stored, by the server: a caller adds no bytes of its own). The blob is
        read through the call's namespaces; its chunks are stored in the namespace the call
        writes, never in one it only reads: a credential that reads ``main`` and writes
        ``pr-123`` splits main's blob into pr-123, and one that writes nothing here is refused
        (PERMISSION_DENIED) rather than adding chunks to a namespace it may only read."""
        view = self.gc.authorize(context, Access.READ, request.instance_name)
        into = self.gc.writable(
            view,
            Access.WRITE_CAS,
            "SplitBlob stores the chunks it cuts, and this call writes no namespace: name "
            "the credential's write namespace, or none, as the instance name",
        )
        d = request.blob_digest
        reader = self.gc.reader_for(view)
        with self.chunking.one():
            chunks = await chunking.split(
                self.gc,
                view.home,
                check_digest(d),
                d.size_bytes,
                reader,
                into=into,
                writer=view.writer,
            )
        return reapi.SplitBlobResponse(
            chunk_digests=[reapi.Digest(hash=h, size_bytes=n) for h, n in chunks],
            chunking_function=reapi.ChunkingFunction.FAST_CDC_2020,
        )

    @rpc("SpliceBlob")
    async def SpliceBlob(
        self, request: reapi.SpliceBlobRequest, context: Ctx
    ) -> reapi.SpliceBlobResponse:
        """``kura.grpc.chunking.splice``; any ``chunking_function`` (the bytes are checked, not
        how they were cut)."""
        view = self.gc.authorize(context, Access.WRITE_CAS, request.instance_name)
        ns = view.writable
        d = request.blob_digest
        sha256 = check_digest(d)
        chunks = [(check_digest(c), c.size_bytes) for c in request.chunk_digests]
        reading = (view.home, self.gc.reader_for(view))  # chunks main has count as stored
        with self.chunking.one():
            await chunking.splice(
                self.gc, ns, sha256, d.size_bytes, chunks, reading, writer=view.writer
            )
        return reapi.SpliceBlobResponse(blob_digest=d)

    @streaming_rpc("GetTree")
    async def GetTree(
        self, request: reapi.GetTreeRequest, context: Ctx
    ) -> AsyncIterator[reapi.GetTreeResponse]:
        view = self.gc.authorize(context, Access.READ, request.instance_name)
        reader = self.gc.reader_for(view)
        check_digest(request.root_digest)
        if request.page_size < 0:
            raise InvalidRequest("page_size must not be negative")
        page_size = min(request.page_size or MAX_TREE_PAGE, MAX_TREE_PAGE)
        try:
            skip = int(request.page_token or "0")
        except ValueError:
            raise InvalidRequest(
                f"page_token {request.page_token[:40]!r} was not issued here"
            ) from None
        if skip < 0:
            raise InvalidRequest("page_token must not be negative")
        # A page is serialized on the event loop: a few MiB at most, even under a large limit.
        page_max_bytes = min(self.gc.max_batch_bytes, MAX_TREE_PAGE_BYTES)
        page: list[reapi.Directory] = []
        page_bytes = 0
        seen = 0
        async for directory, size_bytes in self._walk(reader, view.home, request.root_digest):
            seen += 1
            if seen <= skip:
                continue
            # Each entry of the repeated field costs its bytes, a tag and a length (<= 6 bytes).
            entry_bytes = size_bytes + 6
            if page and (len(page) == page_size or page_bytes + entry_bytes > page_max_bytes):
                # A full page, and more follow: it names where.
                yield reapi.GetTreeResponse(directories=page, next_page_token=str(seen - 1))
                page, page_bytes = [], 0
            page.append(directory)
            page_bytes += entry_bytes
        yield reapi.GetTreeResponse(directories=page)

    async def _walk(
        self, reader: ArtifactReader, ns: str, root: reapi.Digest
    ) -> AsyncIterator[tuple[reapi.Directory, int]]:
        """Every stored directory from ``root`` down (of ``ns``, read by ``reader``: through
        the call's namespaces in order), breadth first, each once, with its size in
        a response in bytes (about its blob's: ``read_blob`` refuses blobs larger than
        ``max_batch_total_size_bytes``)."""
        queue = deque([root])
        visited: set[str] = set()
        while queue:
            digest = queue.popleft()
            if digest.hash in visited:
                continue
            visited.add(digest.hash)
            try:
                data = await read_blob(self.gc, ns, digest, self.gc.max_batch_bytes, reader)
            except NotFound:
                continue
            if len(data) > MAX_INLINE_PARSE_BYTES:
                directory, size_bytes = await asyncio.to_thread(_directory, digest.hash, data)
            else:
                directory, size_bytes = _directory(digest.hash, data)
            yield directory, size_bytes
            for child in directory.directories:
                check_digest(child.digest)
                queue.append(child.digest)


def _directory(sha256: str, data: bytes) -> tuple[reapi.Directory, int]:
    """``data`` parsed as a ``Directory``, with its size as it will be sent (its own encoding
    may be longer or shorter); ``InvalidRequest`` when it is not one."""
    directory = reapi.Directory()
    try:
        directory.ParseFromString(data)
    except DecodeError:
        raise InvalidRequest(f"blob {sha256} is not a Directory") from None
    return directory, directory.ByteSize()


async def read_blob(
    gc: GrpcContext,
    ns: str,
    digest: reapi.Digest,
    limit_bytes: int,
    reader: ArtifactReader | None = None,
) -> bytes:
    """The blob ``digest`` of ``ns`` in memory (read by ``reader``, default the node's), its
    bytes verified against the stored digest.
    ``NotFound`` when it is not stored with that size (or turns out damaged: storage then
    quarantines it), ``InvalidRequest`` when it is larger than ``limit_bytes``."""
    if is_empty(digest):
        return b""
    body = await (reader or gc.reader).read(cas_ref(ns, digest.hash))
    return await blob_bytes(gc, digest, body, limit_bytes)


async def inflated(compressor: int, data: bytes, digest: reapi.Digest) -> bytes:
    """A batch blob's bytes, uncompressed: ``data`` itself for IDENTITY, ``whole_decompressed``
    for ZSTD (``ZstdBomb`` once past the digest's size: the batch limit bounds that size);
    ``InvalidRequest`` for any other compressor."""
    if compressor == IDENTITY:
        return data
    if compressor != ZSTD:
        raise InvalidRequest(
            f"blob {digest.hash[:64]} is sent with compressor {compressor}: only identity and "
            "zstd are supported (GetCapabilities' supported_batch_update_compressors)"
        )
    return await whole_decompressed(data, digest.size_bytes)
