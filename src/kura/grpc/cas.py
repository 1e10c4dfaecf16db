"""REAPI ``Capabilities`` and ``ContentAddressableStorage`` (remote_execution.proto, v2.0).

* ``GetCapabilities``: SHA-256 only, action-cache updates allowed, ``max_batch_total_size_bytes``
  = ``KURA_GRPC_MAX_MESSAGE_BYTES`` - 64 KiB, API 2.0 (the version of the published stubs,
  which predate the ``Compressor`` field: the batch calls carry identity only, and zstd cannot
  be advertised; ByteStream serves ``compressed-blobs/zstd/…`` all the same,
  ``kura.grpc.bytestream``).
* ``FindMissingBlobs``: one index look-up (peers asked for local misses, read-through). A blob
  is present only with the digest's size: a stored blob of another size does not answer for it.
* ``BatchUpdateBlobs``: each blob is checked (size, hash), and the good ones are stored under
  one durable commit (``kura.grpc.batch``); a bad one gets its own INVALID_ARGUMENT status and
  nothing is stored for it. Blobs already stored intact are not rewritten. The request's blob
  bytes must fit ``max_batch_total_size_bytes``.
* ``BatchReadBlobs``: one index look-up for the batch (``kura.grpc.batch``); per-blob
  NOT_FOUND; INVALID_ARGUMENT for the whole call when the blobs
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

Keys: ``ArtifactRef("bazel", namespace, "cas/<hex>")``, the Bazel HTTP cache's
(``kura.api.action_lookup.cas_ref``).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, TypeAlias

import grpc
from buildgrid.common.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as reapi,
)
from buildgrid.common.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2_grpc_aio as reapi_grpc,
)
from buildgrid.common.protos.build.bazel.semver import semver_pb2
from buildgrid.common.protos.google.rpc import code_pb2, status_pb2
from google.protobuf.message import DecodeError

from kura.api.action_lookup import cas_ref
from kura.api.auth import Access
from kura.core.errors import InvalidRequest, KuraError, NotFound
from kura.grpc.batch import blob_bytes, read_blobs, store_blobs
from kura.grpc.common import (
    GrpcContext,
    check_digest,
    code_for,
    is_empty,
    rpc,
    streaming_rpc,
)

Ctx: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
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
        self.gc.authorize(context, Access.READ, request.instance_name)
        sha256 = reapi.DigestFunction.SHA256
        return reapi.ServerCapabilities(
            cache_capabilities=reapi.CacheCapabilities(
                digest_function=[sha256],
                action_cache_update_capabilities=reapi.ActionCacheUpdateCapabilities(
                    update_enabled=True
                ),
                max_batch_total_size_bytes=self.gc.max_batch_bytes,
                symlink_absolute_path_strategy=reapi.SymlinkAbsolutePathStrategy.ALLOWED,
            ),
            low_api_version=semver_pb2.SemVer(major=2, minor=0),
            high_api_version=semver_pb2.SemVer(major=2, minor=0),
        )


class ContentAddressableStorage(reapi_grpc.ContentAddressableStorageServicer):
    def __init__(self, gc: GrpcContext) -> None:
        self.gc = gc

    @rpc("FindMissingBlobs")
    async def FindMissingBlobs(
        self, request: reapi.FindMissingBlobsRequest, context: Ctx
    ) -> reapi.FindMissingBlobsResponse:
        ns = self.gc.authorize(context, Access.READ, request.instance_name)
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
        missing = await self.gc.reader.missing(
            [cas_ref(ns, h) for h in wanted], [d.size_bytes for d in wanted.values()]
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
        ns = self.gc.authorize(context, Access.WRITE, request.instance_name)
        total = sum(len(r.data) for r in request.requests)
        if total > self.gc.max_batch_bytes:
            raise InvalidRequest(
                f"the batch carries {total} bytes of blobs, more than "
                f"max_batch_total_size_bytes {self.gc.max_batch_bytes}: use ByteStream.Write"
            )
        errors = await store_blobs(self.gc, ns, [(r.digest, r.data) for r in request.requests])
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
        ns = self.gc.authorize(context, Access.READ, request.instance_name)
        for d in request.digests:
            check_digest(d)
        total = sum(d.size_bytes for d in request.digests)
        if total > self.gc.max_batch_bytes:
            raise InvalidRequest(
                f"the blobs asked for add up to {total} bytes, more than "
                f"max_batch_total_size_bytes {self.gc.max_batch_bytes}: use ByteStream.Read"
            )
        responses = []
        found = await read_blobs(self.gc, ns, request.digests)
        for d, got in zip(request.digests, found, strict=True):
            data, status = (got, _status()) if isinstance(got, bytes) else (b"", _status(got))
            responses.append(
                reapi.BatchReadBlobsResponse.Response(digest=d, data=data, status=status)
            )
        return reapi.BatchReadBlobsResponse(responses=responses)

    @streaming_rpc("GetTree")
    async def GetTree(  # type: ignore[override]
        self, request: reapi.GetTreeRequest, context: Ctx
    ) -> AsyncIterator[reapi.GetTreeResponse]:
        ns = self.gc.authorize(context, Access.READ, request.instance_name)
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
        async for directory, size_bytes in self._walk(ns, request.root_digest):
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
        self, ns: str, root: reapi.Digest
    ) -> AsyncIterator[tuple[reapi.Directory, int]]:
        """Every stored directory from ``root`` down, breadth first, each once, with its size in
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
                data = await read_blob(self.gc, ns, digest, self.gc.max_batch_bytes)
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


async def read_blob(gc: GrpcContext, ns: str, digest: reapi.Digest, limit_bytes: int) -> bytes:
    """The blob ``digest`` in memory, its bytes verified against the stored digest.
    ``NotFound`` when it is not stored with that size (or turns out damaged: storage then
    quarantines it), ``InvalidRequest`` when it is larger than ``limit_bytes``."""
    if is_empty(digest):
        return b""
    return await blob_bytes(gc, digest, await gc.reader.read(cas_ref(ns, digest.hash)), limit_bytes)
