"""The Remote Asset API (``build.bazel.remote.asset.v1``): ``Fetch`` (FetchBlob,
FetchDirectory) and ``Push`` (PushBlob, PushDirectory).

Records. A push (or a download from origin) records, for each URI, (kind, URI, qualifiers) →
CAS digest, as an ordinary inline artifact ``ArtifactRef("bazel", namespace, "asset/<hex>")``
(``kura.core.asset.record_key``) beside the CAS's ``cas/<hex>`` and the action cache's
``ac/<hex>``, so records replicate to peers, bootstrap, are evicted and are cleaned with their
namespace (``DELETE /ns/<namespace>/cache``) exactly like action-cache entries; no table of
their own. A later push for the same key replaces the record (last writer wins). Keys and the
record body are ``kura.core.asset``'s.

A fetch is a hit for the first URI whose record (of the kind asked for)

* has not passed its push's ``expire_at``;
* was stored (its manifest's ``created_at_ms``, which replicas keep) at or after the request's
  ``oldest_content_accepted``;
* matches the request's ``checksum.sri``: the SRI the push or download verified, the digest
  itself for sha256, else the blob's bytes, hashed (``checksum.sri`` is not part of the key);
* references digests (the blob or root directory, and the push's ``references_blobs`` and
  ``references_directories``) that are all in the CAS now (one ``missing`` look-up; the files of
  a directory below its listed references are not walked).

A ``FetchBlob`` whose sha256 ``checksum.sri`` names a blob in the CAS is a hit without a record
(content addressing: the bytes are the ones asked for), unless ``oldest_content_accepted`` is
set. On a miss ``FetchBlob`` downloads from origin when ``KURA_ASSET_FETCH_ALLOWED_HOSTS``
allows it (``kura.grpc.origin``) and records the URI it got; with the list empty (the
default) a miss is NOT_FOUND. A download honours ``checksum.sri`` only: a miss naming any
other qualifier but ``bazel.canonical_id`` (``kura.core.asset.unsupported``) is
INVALID_ARGUMENT, each named ``"<name>" not supported`` (remote_asset.proto), and nothing is
downloaded. One deadline covers the call's downloads, all its URIs together: the request's
``timeout`` (``DEFAULT_FETCH_SECONDS``, at most ``MAX_FETCH_SECONDS``) or the client's gRPC
deadline, whichever ends first. ``FetchDirectory`` answers records only. Every fetch is counted
in ``kura_cache_lookups_total{protocol="grpc"}``, a download as a miss.

Errors: a request without a URI, with a qualifier named twice, an unusable ``checksum.sri``,
a malformed digest, an instance name that is not a namespace, or URIs and qualifiers too long
for a record (``MAX_RECORD_BYTES``; checked before any download), or an http(s) URI with
credentials (``user:password@``) on a miss that would download, is INVALID_ARGUMENT (BuildStream
probes a server with an empty request and expects exactly that); a push of content the CAS
does not hold, whose bytes do not match its ``checksum.sri``, or a ``PushDirectory`` whose root
is not a ``Directory`` message (``Push._check_directory``), is INVALID_ARGUMENT and records
nothing. Misses and origin failures are answered in the response's ``status`` with gRPC code OK
(remote_asset.proto: "errors outside the server's control will be returned inline").
Rights (``kura.core.rights``): Fetch needs ``read``, Push ``write`` (a record names a URI, a key
that can lie about the content, as an action-cache entry can). A download from origin stores a
blob and a record: with ``checksum.sri`` it stays a read (the bytes are checked against it, and
a later fetch naming that SRI checks the record's); without, it also needs ``write``, as a push
does, since a later fetch without ``checksum.sri`` trusts the URI -> digest it records (an
origin that served other bytes once, or a URI whose content changes, would be recorded so).
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from contextlib import aclosing
from typing import Any, TypeAlias

import grpc
from google.protobuf import unknown_fields
from google.protobuf.message import DecodeError
from google.protobuf.timestamp_pb2 import Timestamp
from google.rpc import status_pb2

from kura.api.action_cache import EMPTY_SHA256
from kura.api.action_lookup import PRODUCER, cas_ref
from kura.api.auth import Access
from kura.api.file_response import DamagedBlob, verified_chunks
from kura.core.asset import (
    AssetQuery,
    AssetRecord,
    Digest,
    Sri,
    credentials_in,
    origin_of,
    parse_query,
    record_key,
    stored_uri,
    unsupported,
)
from kura.core.errors import InvalidRequest, NotFound
from kura.core.overlay import NamespaceView
from kura.grpc.cas import MAX_INLINE_PARSE_BYTES, read_blob
from kura.grpc.common import GrpcContext, check_digest, rpc, stored_blob
from kura.grpc.origin import OriginDownloads, OriginFailed
from kura.protos.build.bazel.remote.asset.v1 import (
    remote_asset_pb2 as ra,
)
from kura.protos.build.bazel.remote.asset.v1 import (
    remote_asset_pb2_grpc as ra_grpc,
)
from kura.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as reapi,
)
from kura.storage.artifact import ArtifactRef
from kura.storage.overlay import each_namespace
from kura.storage.ports import ArtifactReader

Ctx: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
BLOB, DIRECTORY = "blob", "directory"
MAX_RECORD_BYTES = 256 * 1024  # the largest record stored (a larger stored one reads as a miss)
DEFAULT_FETCH_SECONDS = 60.0  # a download without a request ``timeout``
MAX_FETCH_SECONDS = 600.0  # a longer ``timeout`` is clamped (remote_asset.proto allows it)


def _now_ms() -> int:
    return int(time.time() * 1000)


class AssetRecords:
    """Reads and writes records (module docstring) through the node's reader and writer."""

    def __init__(self, gc: GrpcContext) -> None:
        self.gc = gc

    async def find(
        self,
        kind: str,
        ns: str,
        query: AssetQuery,
        oldest_ms: int | None,
        reader: ArtifactReader | None = None,
    ) -> tuple[str, AssetRecord] | None:
        """The first URI of ``query`` with a record that answers it, and that record; read by
        ``reader`` (default the node's): through a call's namespaces in order, its records
        and their blobs alike (``kura.storage.overlay``)."""
        reader = reader or self.gc.reader
        for uri in query.uris:
            # A record that is there but does not answer (expired, its blob gone) in an
            # earlier namespace does not hide one that does in a later one.
            for ref in each_namespace(reader, _ref(kind, ns, uri, query)):
                record = await self._answer(kind, ref, query, oldest_ms, reader)
                if record is not None:
                    return uri, record
        return None

    async def _answer(
        self,
        kind: str,
        ref: ArtifactRef,
        query: AssetQuery,
        oldest_ms: int | None,
        reader: ArtifactReader,
    ) -> AssetRecord | None:
        """The record ``ref`` (read by ``reader``) when it answers ``query`` (``find``)."""
        ns = ref.namespace_id
        record, stored_ms = await self._read(ref, reader)
        if record is None or record.kind != kind:
            return None
        if record.expire_at_ms is not None and record.expire_at_ms <= _now_ms():
            return None
        if oldest_ms is not None and stored_ms < oldest_ms:
            return None
        if query.sri is not None and not await self.matches(ns, record, query.sri, reader):
            return None
        if await self.missing(ns, (record.digest, *record.references), reader):
            return None
        return record

    async def _read(
        self, ref: ArtifactRef, reader: ArtifactReader
    ) -> tuple[AssetRecord | None, int]:
        try:
            body = await reader.read(ref)
        except NotFound:
            return None, 0
        try:
            if body.manifest.size > MAX_RECORD_BYTES:
                return None, 0
            data = b"".join([c async for c in verified_chunks(self.gc.reader, body)])
            return AssetRecord.decode(data), body.manifest.created_at_ms
        except (DamagedBlob, ValueError, KeyError, TypeError):
            return None, 0
        finally:
            body.close()

    async def store(
        self, ns: str, query: AssetQuery, uri: str, record: AssetRecord, *, writer: str
    ) -> None:
        """Record ``record`` for ``uri`` (a new version of its key: last writer wins), written
        by ``writer`` (``kura.core.provenance``). ``InvalidRequest`` for a record over
        ``MAX_RECORD_BYTES`` (``encoded``)."""
        data = encoded(record)
        ref = _ref(record.kind, ns, uri, query, writer)
        await self.gc.writer.put_inline(ref, data, "application/json")

    async def missing(
        self, ns: str, digests: tuple[Digest, ...], reader: ArtifactReader | None = None
    ) -> bool:
        """Whether any of ``digests`` is not in ``ns``'s CAS (the empty blob always is), as
        ``reader`` (default the node's) sees it."""
        wanted = {h: s for h, s in digests if not (h == EMPTY_SHA256 and s == 0)}
        if not wanted:
            return False
        refs = [cas_ref(ns, h) for h in wanted]
        return bool(await (reader or self.gc.reader).missing(refs, list(wanted.values())))

    async def matches(
        self, ns: str, record: AssetRecord, sri: Sri, reader: ArtifactReader | None = None
    ) -> bool:
        """Whether the record's blob matches ``sri`` (module docstring)."""
        if record.sri is not None and record.sri == sri.text:
            return True
        return await self.blob_matches(ns, record.digest, sri, reader)

    async def blob_matches(
        self, ns: str, digest: Digest, sri: Sri, reader: ArtifactReader | None = None
    ) -> bool:
        """Whether the stored blob ``digest`` hashes to one of ``sri``'s digests; False when it
        is absent or damaged."""
        if sri.algorithm == "sha256":
            return digest[0] in sri.sha256_hex()
        h = hashlib.new(sri.algorithm)
        if digest != (EMPTY_SHA256, 0):
            try:
                blob = stored_blob(self.gc, ns, *digest, "blob", reader)
                async with aclosing(blob) as pieces:
                    async for piece in pieces:
                        h.update(piece)
            except NotFound:  # absent, stored with another size, or damaged
                return False
        return sri.matches(h.digest())


def encoded(record: AssetRecord) -> bytes:
    """``record``'s body; ``InvalidRequest`` over ``MAX_RECORD_BYTES`` (thousands of
    references, or long qualifiers)."""
    data = record.encode()
    if len(data) > MAX_RECORD_BYTES:
        raise InvalidRequest(
            f"the record would take {len(data)} bytes, more than {MAX_RECORD_BYTES}: "
            "fewer references or shorter qualifiers"
        )
    return data


def _ref(kind: str, ns: str, uri: str, query: AssetQuery, writer: str = "") -> ArtifactRef:
    return ArtifactRef(PRODUCER, ns, record_key(kind, uri, query.qualifiers), writer)


def _query(request: Any) -> AssetQuery:
    """The request's URIs and qualifiers (a digest function other than SHA-256 was refused
    with every call's message, ``kura.grpc.common.rpc``)."""
    return parse_query(list(request.uris), [(q.name, q.value) for q in request.qualifiers])


def _oldest_ms(request: Any) -> int | None:
    if not request.HasField("oldest_content_accepted"):
        return None
    return int(request.oldest_content_accepted.ToMilliseconds())


def _status(code: grpc.StatusCode, message: str = "") -> status_pb2.Status:
    return status_pb2.Status(code=code.value[0], message=message)


def _expires(record: AssetRecord) -> Timestamp | None:
    if record.expire_at_ms is None:
        return None
    stamp = Timestamp()
    stamp.FromMilliseconds(record.expire_at_ms)
    return stamp


def _digest(d: Digest) -> reapi.Digest:
    return reapi.Digest(hash=d[0], size_bytes=d[1])


class Fetch(ra_grpc.FetchServicer):
    """``FetchBlob`` and ``FetchDirectory`` (module docstring): a hit, or a miss answered in the
    response's status (NOT_FOUND, or the download's failure); INVALID_ARGUMENT and the token
    errors as gRPC errors."""

    def __init__(self, gc: GrpcContext, records: AssetRecords) -> None:
        self.gc = gc
        self.records = records
        self.origins = OriginDownloads(gc)

    @rpc("FetchBlob")
    async def FetchBlob(self, request: ra.FetchBlobRequest, context: Ctx) -> ra.FetchBlobResponse:
        view = self.gc.authorize(context, Access.READ, request.instance_name)
        ns = view.home
        query = _query(request)
        oldest_ms = _oldest_ms(request)
        found = await self.records.find(BLOB, ns, query, oldest_ms, self.gc.reader_for(view))
        if found is not None:
            uri, record = found
            self.gc.metrics.count_lookup("grpc", True)
            return ra.FetchBlobResponse(
                status=_status(grpc.StatusCode.OK),
                uri=uri,
                blob_digest=_digest(record.digest),
                expires_at=_expires(record),
            )
        if query.sri is not None and oldest_ms is None:
            for sha256 in query.sri.sha256_hex():
                manifest = await self.gc.reader.read_manifest(
                    self.gc.reader.artifact_id(cas_ref(ns, sha256))
                )
                size = 0 if manifest is None else manifest.size
                # ``missing`` checks the file is in place, and touches it like a read (LRU).
                stored = manifest is not None or sha256 == EMPTY_SHA256
                if stored and not await self.records.missing(ns, ((sha256, size),)):
                    self.gc.metrics.count_lookup("grpc", True)
                    return ra.FetchBlobResponse(
                        status=_status(grpc.StatusCode.OK),
                        uri=query.uris[0],
                        blob_digest=reapi.Digest(hash=sha256, size_bytes=size),
                    )
        self.gc.metrics.count_lookup("grpc", False)
        if not self.origins.allowed:
            return ra.FetchBlobResponse(
                status=_status(
                    grpc.StatusCode.NOT_FOUND,
                    "no record for these URIs and qualifiers, and downloads from origin are off "
                    "(KURA_ASSET_FETCH_ALLOWED_HOSTS)",
                ),
                uri=query.uris[0],
            )
        if query.sri is None:  # the record would be trusted later, unverified: a write
            view = self.gc.authorize(context, Access.WRITE, request.instance_name)
        # Stored where the call writes: never into a namespace an overlay only reads.
        return await self._download(view, query, _seconds(request), context)

    async def _download(
        self, view: NamespaceView, query: AssetQuery, seconds: float, context: Ctx
    ) -> ra.FetchBlobResponse:
        ns, writer = self.gc.writable(view, Access.WRITE_CAS), view.writer
        names = unsupported(query)
        if names:  # remote_asset.proto: INVALID_ARGUMENT, naming each unsupported qualifier
            raise InvalidRequest(
                ", ".join(f'"{name[:80]}" not supported' for name in names)
                + ": a download from origin honours checksum.sri only (and bazel.canonical_id "
                "as part of the key); nothing was downloaded"
            )
        for uri in query.uris:
            if origin_of(uri) is not None and credentials_in(uri):
                raise InvalidRequest(
                    f"URI {stored_uri(uri)[:200]!r} carries credentials (user:password@ before "
                    "its host): a download from origin never sends them (nor are they stored); "
                    "take them out of the URI. Nothing was downloaded"
                )
        sri = None if query.sri is None else query.sri.text
        # The record must fit before anything is downloaded (else the blob would be stored
        # with nothing to find it by): the longest URI, with the longest digest there is.
        largest = (EMPTY_SHA256, self.gc.settings.max_artifact_bytes)
        encoded(AssetRecord(BLOB, max(query.uris, key=len), query.qualifiers, largest, sri=sri))
        remaining = context.time_remaining()  # the client's own deadline, if it set one
        if remaining is not None:
            seconds = max(0.0, min(seconds, remaining))
        try:
            uri, digest = await self.origins.first(
                ns, query.uris, query.sri, seconds, writer=writer
            )
        except OriginFailed as failed:
            return ra.FetchBlobResponse(status=_status(failed.code, failed.message), uri=failed.uri)
        await self.records.store(
            ns, query, uri, AssetRecord(BLOB, uri, query.qualifiers, digest, sri=sri), writer=writer
        )
        return ra.FetchBlobResponse(
            status=_status(grpc.StatusCode.OK), uri=uri, blob_digest=_digest(digest)
        )

    @rpc("FetchDirectory")
    async def FetchDirectory(
        self, request: ra.FetchDirectoryRequest, context: Ctx
    ) -> ra.FetchDirectoryResponse:
        view = self.gc.authorize(context, Access.READ, request.instance_name)
        ns = view.home
        query = _query(request)
        reader = self.gc.reader_for(view)
        found = await self.records.find(DIRECTORY, ns, query, _oldest_ms(request), reader)
        self.gc.metrics.count_lookup("grpc", found is not None)
        if found is None:
            return ra.FetchDirectoryResponse(
                status=_status(
                    grpc.StatusCode.NOT_FOUND,
                    "no directory is recorded for these URIs and qualifiers",
                ),
                uri=query.uris[0],
            )
        uri, record = found
        return ra.FetchDirectoryResponse(
            status=_status(grpc.StatusCode.OK),
            uri=uri,
            root_directory_digest=_digest(record.digest),
            expires_at=_expires(record),
        )


def _seconds(request: ra.FetchBlobRequest) -> float:
    if not request.HasField("timeout"):
        return DEFAULT_FETCH_SECONDS
    seconds = request.timeout.ToTimedelta().total_seconds()
    if seconds <= 0:
        raise InvalidRequest("timeout must be positive")
    return min(seconds, MAX_FETCH_SECONDS)


class Push(ra_grpc.PushServicer):
    """``PushBlob`` and ``PushDirectory`` (module docstring): one record per URI, each a new
    version of its key; INVALID_ARGUMENT (nothing recorded) for content not in the CAS or not
    matching its ``checksum.sri``; PERMISSION_DENIED without the right ``write``."""

    def __init__(self, gc: GrpcContext, records: AssetRecords) -> None:
        self.gc = gc
        self.records = records

    @rpc("PushBlob")
    async def PushBlob(self, request: ra.PushBlobRequest, context: Ctx) -> ra.PushBlobResponse:
        await self._push(BLOB, request, context, request.blob_digest)
        return ra.PushBlobResponse()

    @rpc("PushDirectory")
    async def PushDirectory(
        self, request: ra.PushDirectoryRequest, context: Ctx
    ) -> ra.PushDirectoryResponse:
        await self._push(DIRECTORY, request, context, request.root_directory_digest)
        return ra.PushDirectoryResponse()

    async def _push(self, kind: str, request: Any, context: Ctx, target: reapi.Digest) -> None:
        view = self.gc.authorize(context, Access.WRITE, request.instance_name)
        ns = view.writable
        # The content may be in any namespace the call reads (FindMissingBlobs told the client
        # main's blobs are stored, so it did not upload them again): looked up through them.
        home, reader = view.home, self.gc.reader_for(view)
        query = _query(request)
        digest = (check_digest(target), target.size_bytes)
        references = tuple(
            (check_digest(d), d.size_bytes)
            for d in (*request.references_blobs, *request.references_directories)
        )
        if await self.records.missing(home, (digest, *references), reader):
            raise InvalidRequest(
                f"the pushed {kind} {digest[0]}/{digest[1]} or a digest it references is "
                "not in the CAS: upload the content first (remote_asset.proto: clients MUST)"
            )
        if kind == DIRECTORY:
            await self._check_directory(home, target, reader)
        sri = None
        if query.sri is not None:
            if kind != BLOB or not await self.records.blob_matches(home, digest, query.sri, reader):
                raise InvalidRequest(
                    f"checksum.sri ({query.sri.algorithm}) does not match the pushed {kind} "
                    f"{digest[0]}/{digest[1]}: nothing recorded"
                )
            sri = query.sri.text
        expire_at_ms = (
            int(request.expire_at.ToMilliseconds()) if request.HasField("expire_at") else None
        )
        records = [
            AssetRecord(kind, uri, query.qualifiers, digest, references, expire_at_ms, sri)
            for uri in query.uris
        ]
        for record in records:  # all or nothing: every record fits before one is stored
            encoded(record)
        for uri, record in zip(query.uris, records, strict=True):
            await self.records.store(ns, query, uri, record, writer=view.writer)

    async def _check_directory(
        self, ns: str, root: reapi.Digest, reader: ArtifactReader | None = None
    ) -> None:
        """``InvalidRequest`` unless the stored blob ``root`` is a REAPI ``Directory`` (it parses,
        with no unknown field) of at most one gRPC message (``max_batch_bytes``: how a client
        reads it back); a larger one is parsed off the event loop."""
        limit = self.gc.max_batch_bytes
        name = f"{root.hash}/{root.size_bytes}"
        if root.size_bytes > limit:
            raise InvalidRequest(
                f"the pushed root directory {name} is larger than {limit} bytes, the largest "
                "Directory served in one message: nothing recorded"
            )
        try:
            data = await read_blob(self.gc, ns, root, limit, reader)
        except NotFound:
            raise InvalidRequest(f"the pushed root directory {name} is not in the CAS") from None
        if len(data) > MAX_INLINE_PARSE_BYTES:
            valid = await asyncio.to_thread(_is_directory, data)
        else:
            valid = _is_directory(data)
        if not valid:
            raise InvalidRequest(
                f"the pushed root directory {name} is not a REAPI Directory message: "
                "nothing recorded"
            )


def _is_directory(data: bytes) -> bool:
    directory = reapi.Directory()
    try:
        directory.ParseFromString(data)
    except DecodeError:
        return False
    return not len(unknown_fields.UnknownFieldSet(directory))
