"""``google.bytestream.ByteStream`` over the CAS: ``Read``, ``Write``, ``QueryWriteStatus``.

Names are parsed by ``kura.grpc.resource_names``; blobs are the Bazel HTTP cache's
(``kura.api.action_lookup.cas_ref``).

* ``Read``: ``read_offset`` in ``[0, size]`` (OUT_OF_RANGE otherwise) and ``read_limit`` >= 0
  (0: to the end), in chunks of at most 1 MiB (less when ``KURA_GRPC_MAX_MESSAGE_BYTES`` needs). Every byte sent is checked against the stored
  digest first, as HTTP GETs are (``kura.api.file_response.verified_chunks``): the last chunk
  is held back until the whole blob hashed right, so a damaged blob ends the stream with an
  error (NOT_FOUND, the entry quarantined), never a complete wrong one.
* ``compressed-blobs/zstd/…`` (``kura.grpc.zstd_stream``; blobs are stored uncompressed): a Read
  sends one zstd frame of the bytes from ``read_offset`` (an offset in the uncompressed blob) to
  the end, and a non-zero ``read_limit`` is INVALID_ARGUMENT (remote_execution.proto, "When
  downloading compressed blobs"). A Write's name carries the uncompressed hash and size: that
  size is reserved, the stream is decompressed as it arrives (output past the size is refused
  at once, INVALID_ARGUMENT) and the SHA-256 is checked at the end. Its ``write_offset``,
  ``committed_size`` and ``QueryWriteStatus`` count compressed bytes, so a dropped zstd write
  resumes at the compressed byte it stopped at; an already stored blob answers
  ``committed_size`` -1 (remote_execution.proto, "if this is a compressed upload"). The byte
  counters (``kura_http_received_bytes_total``, ``kura_http_sent_bytes_total``, protocol
  ``grpc``) count the bytes on the wire, compressed or not.
* ``Write`` and ``QueryWriteStatus`` need the right ``write:cas`` (the SHA-256 is checked, so
  the name cannot lie about the bytes; ``kura.core.rights``). ``Write``: a stream whose first message carries the whole blob (``finish_write``,
  uncompressed), small enough to be stored inline, is stored at once as a batch of one (``kura.grpc.batch.store_whole``): the
  same checks, no upload to keep. Otherwise resumable through ``kura.grpc.uploads`` (the whole size reserved from the tmp
  budget before the first byte is staged, size and SHA-256 checked at the end). Every message
  must carry ``write_offset`` == bytes committed so far; a jump, a resource name that changes
  mid-stream, more bytes than the size, or a hash mismatch is INVALID_ARGUMENT and discards
  the upload (nothing stored). A blob that is already stored intact, with the name's size, is answered at once with
  ``committed_size`` = its size (REAPI allows it: the client stops sending). A stream that drops,
  or sends nothing for ``KURA_BODY_IDLE_TIMEOUT_SECONDS`` (then it ends with DEADLINE_EXCEEDED),
  parks an ``uploads/{uuid}/`` write for ``KURA_GRPC_UPLOAD_RESUME_SECONDS``; one without an
  upload id is discarded at once. A write slower than the listeners' minimum upload rate
  (``kura.api.upload_rate``, counted over the upload's life, parked time included) ends with
  DEADLINE_EXCEEDED "upload too slow" and is discarded, streaming or parked.
* ``QueryWriteStatus``: the committed size of a parked or running upload, or ``complete`` with
  the full size once the blob is stored; NOT_FOUND for an unknown upload.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, TypeAlias

import grpc

from kit.read_ahead import read_ahead
from kura.api.action_cache import EMPTY_SHA256
from kura.api.action_lookup import cas_ref
from kura.api.auth import Access
from kura.api.file_response import DamagedBlob, verified_chunks, verified_frames
from kura.api.upload_rate import UploadMeter, UploadRule, Verdict
from kura.core.errors import InvalidRequest, KuraError, NotFound
from kura.grpc import zstd_stream
from kura.grpc.batch import store_whole
from kura.grpc.common import PROTOCOL, GrpcContext, OutOfRange, rpc, streaming_rpc
from kura.grpc.resource_names import IDENTITY, BlobName, parse_read, parse_write
from kura.grpc.uploads import Upload, Uploads
from kura.protos.google.bytestream import bytestream_pb2 as bs
from kura.protos.google.bytestream import bytestream_pb2_grpc as bs_grpc
from kura.storage.artifact import PutResult

Ctx: TypeAlias = "grpc.aio.ServicerContext[Any, Any]"
READ_CHUNK_BYTES = 1024 * 1024
READ_METHOD = "/google.bytestream.ByteStream/Read"
# A piece at least this large is encoded in a verifier thread: ``bytes.join`` copies it with the
# GIL released (CPython releases it from 1 MiB), so the event loop, which also runs grpcio's
# sends, spends on it only the hand-over.
ENCODE_IN_THREAD_BYTES = 256 * 1024
# The key of ``ReadResponse.data`` on the wire: its field number (10 in bytestream.proto) and
# wire type 2, length-delimited.
_DATA_KEY = bytes([bs.ReadResponse.DESCRIPTOR.fields_by_name["data"].number << 3 | 2])


def read_response(data: bytes) -> bytes:
    """The wire form of ``ReadResponse{data: data}``, built with one copy of ``data``: the key
    of field ``data`` (``_DATA_KEY``), the length as a varint, the bytes
    (https://protobuf.dev/programming-guides/encoding/); ``b""`` for empty ``data``, as proto3
    omits a default field. ``Read`` yields these, and its handler's serializer sends them as
    they are (``kura.grpc.common.TolerantDecoding``): building a ``ReadResponse`` copied each
    1 MiB chunk into the message and serializing it copied it twice more, which made a 64 MiB
    Read cost 2.7 times BuildGrid's CPU (docs/benchmarks.md)."""
    if not data:
        return b""
    head = bytearray(_DATA_KEY)
    n = len(data)
    while n > 0x7F:
        head.append((n & 0x7F) | 0x80)
        n >>= 7
    head.append(n)
    return b"".join((head, data))


class ByteStream(bs_grpc.ByteStreamServicer):
    def __init__(self, gc: GrpcContext) -> None:
        self.gc = gc
        self.uploads = Uploads(gc.settings.grpc_upload_resume_seconds, UploadRule.of(gc.settings))

    @streaming_rpc("Read")
    async def Read(self, request: bs.ReadRequest, context: Ctx) -> AsyncIterator[bytes]:
        """Yields each ``ReadResponse`` already encoded (``read_response``)."""
        name = parse_read(request.resource_name)
        view = self.gc.view(context, Access.READ, name.namespace)
        if not 0 <= request.read_offset <= name.size_bytes:
            raise OutOfRange(
                f"read_offset {request.read_offset} is outside the blob's {name.size_bytes} bytes"
            )
        if request.read_limit < 0:
            raise InvalidRequest(f"read_limit {request.read_limit} is negative")
        if request.read_limit and name.compressor != IDENTITY:
            raise InvalidRequest("read_limit must be 0 when reading compressed-blobs")
        if name.size_bytes == 0 and name.sha256 == EMPTY_SHA256:
            if name.compressor != IDENTITY:
                yield read_response(zstd_stream.EMPTY_FRAME)
            return
        try:
            body = await self.gc.reader_for(view).read(cas_ref(view.home, name.sha256))
        except NotFound:
            self.gc.metrics.count_lookup("grpc", False)
            raise
        try:
            if body.manifest.size != name.size_bytes:
                self.gc.metrics.count_lookup("grpc", False)
                raise NotFound(
                    f"blob {name.sha256} is stored with size {body.manifest.size}, "
                    f"not {name.size_bytes}"
                )
            self.gc.metrics.count_lookup("grpc", True)
            end = name.size_bytes
            if request.read_limit:
                end = min(end, request.read_offset + request.read_limit)
            if (
                name.compressor == IDENTITY
                and request.read_offset == 0
                and end == body.manifest.size
            ):
                # The whole blob, the common Read: each message made on the verifier thread.
                messages = read_ahead(self._whole_blob(body))
            else:
                pieces = _verified_range(self.gc, body, request.read_offset, end)
                if name.compressor != IDENTITY:
                    pieces = zstd_stream.compressed(pieces, end - request.read_offset)
                messages = read_ahead(self._encoded(pieces))
            try:
                async for message, size in messages:
                    self.gc.metrics.bytes_out_child("grpc").inc(size)
                    yield message
            finally:
                await messages.aclose()  # type: ignore[attr-defined]
        finally:
            body.close()

    async def _whole_blob(self, body: Any) -> AsyncGenerator[tuple[bytes, int], None]:
        """The whole blob's ``ReadResponse`` messages and sizes, each chunk read, hashed and
        encoded in one verifier-thread call (``verified_frames``), the last only once the blob
        hashed right (``DamagedBlob`` → NOT_FOUND)."""
        chunk_bytes = min(READ_CHUNK_BYTES, self.gc.max_batch_bytes)
        frames = verified_frames(self.gc.reader, body, read_response, chunk_bytes)
        try:
            async for message, size in frames:
                yield message, size
        except DamagedBlob:
            raise NotFound("the stored blob failed verification; treated as a miss") from None
        finally:
            await frames.aclose()  # type: ignore[attr-defined]

    async def _encoded(
        self, pieces: AsyncIterator[bytes]
    ) -> AsyncGenerator[tuple[bytes, int], None]:
        """Each piece's ``ReadResponse`` wire form (``read_response``) and the piece's size."""
        pool = self.gc.reader.verifier.pool
        loop = asyncio.get_running_loop()
        try:
            async for piece in pieces:
                if len(piece) < ENCODE_IN_THREAD_BYTES:
                    yield read_response(piece), len(piece)
                else:  # the copy releases the GIL: the event loop sends the last one meanwhile
                    yield await loop.run_in_executor(pool, read_response, piece), len(piece)
        finally:
            await pieces.aclose()  # type: ignore[attr-defined]

    @rpc("Write")
    async def Write(
        self, request_iterator: AsyncIterator[bs.WriteRequest], context: Ctx
    ) -> bs.WriteResponse:
        upload: Upload | None = None
        first: bs.WriteRequest | None = None
        loop = asyncio.get_running_loop()
        # Until the first message opens (or resumes) an upload, only the idle timeout runs.
        waiting = dataclasses.replace(self.uploads.rule, min_bytes_per_second=0).meter(loop.time())

        def meter() -> UploadMeter:  # asked before each wait: the upload's once opened
            return waiting if upload is None else upload.meter

        try:
            async for request in _within(request_iterator, meter):
                data = request.data  # each read of the field copies the bytes (upb)
                if first is None:
                    first = request
                    name, writer = self._writable(context, parse_write(request.resource_name))
                    if self._whole(name, request, len(data)):  # one message: no upload
                        await store_whole(self.gc, name.namespace, name.sha256, data, writer=writer)
                        self.gc.metrics.bytes_in_child("grpc").inc(len(data))
                        return bs.WriteResponse(committed_size=name.size_bytes)
                    if await self._stored(name):
                        return bs.WriteResponse(committed_size=_done_size(name))
                    upload = self._open(name, request.write_offset, writer)
                elif request.resource_name and request.resource_name != first.resource_name:
                    raise InvalidRequest("resource_name changed in the middle of a Write stream")
                assert upload is not None
                if request.write_offset != upload.committed_bytes:
                    raise InvalidRequest(
                        f"write_offset {request.write_offset} is not the {upload.committed_bytes} "
                        "bytes committed so far (QueryWriteStatus tells where to resume)"
                    )
                await upload.feed(data)
                self.gc.metrics.bytes_in_child("grpc").inc(len(data))
                upload.meter.add(len(data), loop.time())
                if request.finish_write:
                    await upload.finish()
                    return bs.WriteResponse(committed_size=upload.committed_bytes)
                if (verdict := upload.meter.verdict(loop.time())) is not None:
                    raise GivenUp(verdict)
            if upload is None:
                raise InvalidRequest("the Write stream carried no request")
            self._park(upload)
            upload = None
            raise InvalidRequest(
                "the Write stream ended without finish_write; resume it at the committed size"
            )
        except KuraError:
            if upload is not None:
                await self.uploads.discard(upload)
            raise
        except GivenUp as exc:
            message = meter().give_up(self.gc.metrics, PROTOCOL, exc.verdict, loop.time())
            if upload is not None and exc.verdict == "slow":
                await self.uploads.discard(upload)  # its reservation was not earned
            elif upload is not None:
                self._park(upload)  # stalled: resumable, as a drop is
            self.gc.requests.labels("Write", "DEADLINE_EXCEEDED").inc()
            await context.abort(grpc.StatusCode.DEADLINE_EXCEEDED, message)
        except BaseException:  # the stream dropped: cancelled or broke
            if upload is not None:
                self._park(upload)
            raise

    @rpc("QueryWriteStatus")
    async def QueryWriteStatus(
        self, request: bs.QueryWriteStatusRequest, context: Ctx
    ) -> bs.QueryWriteStatusResponse:
        name, _writer = self._writable(context, parse_write(request.resource_name))
        upload = self.uploads.get(name.session_key) if name.upload_id else None
        if upload is not None and not upload.task.done():
            return bs.QueryWriteStatusResponse(committed_size=upload.committed_bytes)
        if await self._stored(name):
            return bs.QueryWriteStatusResponse(committed_size=name.size_bytes, complete=True)
        raise NotFound(f"no upload {request.resource_name[:200]!r} is in progress")

    def _writable(self, context: Ctx, name: BlobName) -> tuple[BlobName, str]:
        """``name`` in the namespace the call writes (its own, or its token's overlay's:
        ``kura.core.overlay``), once its token may write blobs there; and who writes
        (``kura.core.provenance``)."""
        view = self.gc.view(context, Access.WRITE_CAS, name.namespace)
        ns = view.writable
        named = name if ns == name.namespace else dataclasses.replace(name, namespace=ns)
        return named, view.writer

    def _whole(self, name: BlobName, request: bs.WriteRequest, data_bytes: int) -> bool:
        """Whether the stream's first message is the whole blob, uncompressed and small enough
        to be stored inline, with no upload of that name parked to resume
        (``kura.grpc.batch.store_whole`` stores it)."""
        return (
            request.finish_write
            and name.size_bytes > 0  # the empty blob is always stored (``_stored``)
            and request.write_offset == 0
            and name.compressor == IDENTITY
            and data_bytes == name.size_bytes
            # A body staged as a file is hashed as it is written by put_stream's upload
            # (one pass), which is faster than a batch's hash first, then write: 1 MiB
            # in-process 6.8 against 8.4 ms.
            and not self.gc.writer.stages(name.size_bytes)
            and not (name.upload_id and self.uploads.get(name.session_key))
        )

    async def _stored(self, name: BlobName) -> bool:
        if name.size_bytes == 0 and name.sha256 == EMPTY_SHA256:
            return True
        return await self.gc.writer.intact(cas_ref(name.namespace, name.sha256), name.size_bytes)

    def _open(self, name: BlobName, offset: int, writer: str) -> Upload:
        """The upload this stream writes: a parked one to resume (its writer the one that
        opened it), or a new one at offset 0 written by ``writer``."""
        if not name.upload_id:  # not resumable: a key no other stream can name
            name = dataclasses.replace(name, upload_id="~" + os.urandom(8).hex())
        upload = self.uploads.get(name.session_key)
        if upload is not None and not upload.task.done():
            self.uploads.attach(upload)
            return upload
        if offset != 0:
            raise InvalidRequest(
                f"write_offset {offset}: no upload of this name is in progress, so a write "
                "starts at 0"
            )
        return self.uploads.open(name.session_key, lambda chunks: self._store(name, chunks, writer))

    def _store(
        self, name: BlobName, chunks: AsyncIterator[bytes], writer: str
    ) -> asyncio.Future[PutResult]:
        if name.compressor != IDENTITY:
            chunks = zstd_stream.decompressed(chunks, name.size_bytes)
        return asyncio.ensure_future(
            self.gc.writer.put_stream(
                cas_ref(name.namespace, name.sha256, writer),
                chunks,
                declared_length=name.size_bytes,
                limit_bytes=self.gc.settings.max_artifact_bytes,
                content_type="application/octet-stream",
                expected_sha256=name.sha256,
            )
        )

    def _park(self, upload: Upload) -> None:
        if upload.key[1].startswith("~"):
            upload.cancel()  # no upload id: nobody can resume it
        else:
            self.uploads.park(upload)


def _done_size(name: BlobName) -> int:
    """``committed_size`` for a write whose blob is already stored (module docstring)."""
    return name.size_bytes if name.compressor == IDENTITY else -1


async def _within(
    messages: AsyncIterator[bs.WriteRequest], meter: Callable[[], UploadMeter]
) -> AsyncIterator[bs.WriteRequest]:
    """``messages``, but a stream whose upload (``meter()``) is due to be given up before the
    next message comes, stalled or too slow (``kura.api.upload_rate``), raises ``GivenUp``: a
    client must not hold its reservation while its stream stays open."""
    iterator = aiter(messages)
    loop = asyncio.get_running_loop()
    while True:
        current = meter()
        try:
            message = await asyncio.wait_for(anext(iterator), current.seconds_left(loop.time()))
        except StopAsyncIteration:
            return
        except TimeoutError:
            raise GivenUp(current.due(loop.time())) from None
        yield message


class GivenUp(Exception):
    """A Write stream's upload stalled or trickled (``kura.api.upload_rate``): the stream ends
    with DEADLINE_EXCEEDED; a stalled upload is parked like a drop, a slow one discarded."""

    def __init__(self, verdict: Verdict) -> None:
        super().__init__(verdict)
        self.verdict = verdict


async def _verified_range(gc: GrpcContext, body: Any, start: int, end: int) -> AsyncIterator[bytes]:
    """Bytes ``[start, end)`` of ``body`` in pieces; each piece is yielded only once the next
    file chunk was read, and the last only after the whole blob hashed right (``DamagedBlob``
    → NOT_FOUND)."""
    held: bytes | None = None
    pos = 0
    try:
        # A message must fit KURA_GRPC_MAX_MESSAGE_BYTES with its framing.
        chunk_bytes = min(READ_CHUNK_BYTES, gc.max_batch_bytes)
        async for chunk in verified_chunks(gc.reader, body, chunk_bytes):
            lo, hi = max(start, pos), min(end, pos + len(chunk))
            pos += len(chunk)
            if held is not None:
                yield held
                held = None
            if lo < hi:
                held = chunk[lo - (pos - len(chunk)) : hi - (pos - len(chunk))]
    except DamagedBlob:
        raise NotFound("the stored blob failed verification; treated as a miss") from None
    if held is not None:
        yield held
