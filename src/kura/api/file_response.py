"""Sending a stored blob from its open file without ever completing a wrong or short response.

A 200 promises ``Content-Length`` bytes; a client that gets fewer on a clean connection end, or
gets the promised count with wrong bytes, caches garbage. Two rules follow:

* Short: ``sendfile`` (or a read) that ends before ``manifest.size`` bytes means the file shrank
  under us. The connection is aborted (``transport.abort()``: the client sees a reset, never a
  clean short body, and nothing waits for bytes that will not come) and the entry is reported
  to storage, which re-checks and quarantines it.
* Wrong: a blob whose bytes were not hashed when opened (``StoredBody.verified`` is False, the
  ``KURA_VERIFY_READS=always`` default) is hashed in a worker thread while ``sendfile`` sends all
  but its last ``TAIL_BYTES``. Those last bytes are sent only once the digest matched, and they
  are the very bytes that were hashed. On a mismatch the connection is aborted and the entry
  reported, so the client has an incomplete transfer, never a 200 with wrong bytes. This catches
  corruption below the filesystem that leaves the file's metadata unchanged. The digest checked
  is the row's XXH3-128 (``StoredBody.xxh3_128``, recorded when the body was written; many
  times faster than SHA-256, so the hash no longer caps a GET at one core's SHA-256 speed), or
  SHA-256 for a row written before the checksum existed; then the XXH3-128 is computed in the
  same pass and recorded, so the next read of that version checks the fast one. A blob of at
  most ``LOOP_HASH_MAX_BYTES`` with an XXH3-128 is hashed in the event loop before ``sendfile``
  instead (cheaper than the hop to the worker thread; the same tail rule applies). The pool's
  hash is shared with concurrent GETs of the same file and stops when every GET waiting for it
  has gone (``storage.verify.ReadVerifier.digest``): verifying costs at most what is served, so
  GETs that hang up cannot queue whole-file hashes ahead of other reads (issue 26). A hash that
  finished before its client left still has its damage reported.

Failing a transfer raises ``ConnectionResetError`` out of ``prepare``, which aiohttp treats as a
client gone away (no traceback, no second response).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable
from typing import BinaryIO, NoReturn

import aiohttp
from aiohttp import web

from kit.thread_calls import finished_in_thread
from kura.storage.artifact import StoredBody
from kura.storage.checksum import SHA256, XXH3_128, Hasher, new_hasher
from kura.storage.ports import ArtifactReader
from kura.storage.verify import DigestShare, FileDigest, digest_fd

log = logging.getLogger(__name__)

# Held back until the digest matched; also what a chunked sender keeps in hand.
TAIL_BYTES = 64 * 1024
READ_CHUNK_BYTES = 256 * 1024
# A blob up to this size with an XXH3-128 is hashed in the event loop before sendfile (~0.2 ms
# per MiB from the page cache): a hop to the verify pool and back costs more than that.
LOOP_HASH_MAX_BYTES = 2 * 1024 * 1024


async def send_file(
    writer: aiohttp.abc.AbstractStreamWriter,
    transport: asyncio.Transport,
    f: BinaryIO,
    offset: int,
    count: int,
) -> int:
    """Send ``count`` bytes of ``f`` from ``offset``; the bytes sent (fewer if the file ends).

    ``loop.sendfile`` where the loop has it; uvloop has none (it raises ``NotImplementedError``,
    https://github.com/MagicStack/uvloop/issues/228), so there the bytes are read in
    ``READ_CHUNK_BYTES`` pieces in a worker thread and written through ``writer``. Raises what
    the read or the write raises (``OSError``, ``ConnectionError``).
    """
    loop = asyncio.get_running_loop()
    try:
        return await loop.sendfile(transport, f, offset, count)
    except NotImplementedError:
        pass
    sent = 0
    while sent < count:
        chunk = await finished_in_thread(
            asyncio.to_thread(
                os.pread, f.fileno(), min(READ_CHUNK_BYTES, count - sent), offset + sent
            )
        )
        if not chunk:
            break
        await writer.write(chunk)
        sent += len(chunk)
    return sent


class DamagedBlob(ConnectionResetError):
    """The blob being sent turned out short or wrong; the transfer was aborted."""


class OpenFileResponse(web.StreamResponse):
    """200 with an already-open blob file, sent with sendfile and verified as it goes."""

    def __init__(self, body: StoredBody, headers: dict[str, str], service: ArtifactReader) -> None:
        super().__init__(status=200, headers=headers)
        self._stored = body
        self._service = service
        self.content_length = body.manifest.size

    async def prepare(self, request: web.BaseRequest) -> aiohttp.abc.AbstractStreamWriter | None:
        try:
            writer = await super().prepare(request)
            assert writer is not None
            transport = request.transport
            if request.method != "HEAD" and transport is not None:
                await self._send(writer, transport)
            await super().write_eof()
            return writer
        finally:
            self._stored.close()

    async def _send(
        self, writer: aiohttp.abc.AbstractStreamWriter, transport: asyncio.Transport
    ) -> None:
        f = self._stored.file
        assert f is not None
        size = self._stored.manifest.size
        digest: asyncio.Future[FileDigest] | None = None
        share: DigestShare | None = None
        tail = 0
        fast = self._stored.xxh3_128
        if not self._stored.verified:
            tail = min(TAIL_BYTES, size)
            algorithms = (XXH3_128,) if fast else (SHA256, XXH3_128)
            if fast and size <= LOOP_HASH_MAX_BYTES:
                digest = _digest_here(f.fileno(), size, tail)
            else:
                # Shared with concurrent GETs of the same file, stopped if all of them leave.
                share = self._service.verifier.digest(f.fileno(), size, tail, algorithms)
        try:
            await writer.drain()
            try:
                sent = await send_file(writer, transport, f, 0, size - tail)
            except ConnectionError:
                if share is not None and share.done():  # the hash finished: still report damage
                    with contextlib.suppress(OSError):
                        found = self._problem(await share.result())
                        if found is not None:
                            await report(self._service, self._stored, found)
                raise  # the client went away
            except OSError as exc:  # EIO and friends: the disk, not the client
                await self._fail(transport, f"reading the file failed: {exc}")
            if sent < size - tail:
                await self._fail(transport, f"the file ended after {sent} of {size} bytes")
            if share is not None:
                digest = asyncio.ensure_future(share.result())
            if digest is not None:
                try:
                    d = await digest
                except OSError as exc:
                    await self._fail(transport, f"hashing the file failed: {exc}")
                found = self._problem(d)
                if found is not None:
                    await self._fail(transport, found)
                if not fast:
                    self._service.record_xxh3_128([(self._stored.manifest, d.digests[XXH3_128])])
                await writer.write(d.tail)
        finally:
            if share is not None:
                share.leave()

    def _problem(self, d: FileDigest) -> str | None:
        """What ``d`` (the whole file's digest) says is wrong with the file (None: intact)."""
        size = self._stored.manifest.size
        if d.size_bytes < size:
            return f"the file ended after {d.size_bytes} of {size} bytes"
        fast = self._stored.xxh3_128
        if fast and d.digests[XXH3_128] != fast:
            return f"the file hashes to xxh3_128 {d.digests[XXH3_128]}"
        if not fast and d.sha256 != self._stored.manifest.sha256:
            return f"the file hashes to sha256 {d.sha256}"
        return None

    async def _fail(self, transport: asyncio.Transport, found: str) -> NoReturn:
        transport.abort()
        await report(self._service, self._stored, found)
        raise DamagedBlob(found)


async def report(service: ArtifactReader, body: StoredBody, found: str) -> None:
    """Log a damaged send and let storage re-check and quarantine the entry."""
    log.warning("aborted sending artifact %s: %s", body.manifest.artifact_id, found)
    await service.report_corrupt(body.manifest, "read")


async def verified_chunks(
    service: ArtifactReader, body: StoredBody, chunk_bytes: int = READ_CHUNK_BYTES
) -> AsyncIterator[bytes]:
    """The blob's bytes in chunks, for senders that write every byte themselves (the throttled
    peer download). Raises ``DamagedBlob`` (after reporting the entry) instead of yielding the
    last chunk when the file is short or does not hash to its row's XXH3-128 (when it has one)
    or else its manifest's SHA-256."""
    async for chunk, _size in verified_frames(service, body, None, chunk_bytes):
        yield chunk


async def verified_frames(
    service: ArtifactReader,
    body: StoredBody,
    frame: Callable[[bytes], bytes] | None,
    chunk_bytes: int = READ_CHUNK_BYTES,
) -> AsyncIterator[tuple[bytes, int]]:
    """``verified_chunks``, each chunk given as ``(frame(chunk), len(chunk))`` (``frame`` None:
    the chunk itself). A file's chunk is read, hashed and framed in one call on a verifier
    thread: a sender whose message is a copy of the chunk with a head (``ByteStream.Read``'s
    ``ReadResponse``) makes that copy there, with the GIL released for large ones, and the
    event loop hands over one result per chunk."""
    if body.data is not None:
        for i in range(0, len(body.data), chunk_bytes):
            chunk = body.data[i : i + chunk_bytes]
            yield (frame(chunk) if frame is not None else chunk), len(chunk)
        return
    f = body.file
    assert f is not None
    size = body.manifest.size
    loop = asyncio.get_running_loop()
    algorithm, want = (XXH3_128, body.xxh3_128) if body.xxh3_128 else (SHA256, body.manifest.sha256)
    h = new_hasher(algorithm)
    done = 0
    while done < size:
        out, n = await finished_in_thread(
            loop.run_in_executor(
                service.verifier.pool,
                _read_piece,
                f.fileno(),
                min(chunk_bytes, size - done),
                done,
                h,
                frame,
            )
        )
        if not n:
            await report(service, body, f"the file ended after {done} of {size} bytes")
            raise DamagedBlob("short file")
        done += n
        if done >= size and h.hexdigest() != want:
            await report(service, body, f"the file hashes to {algorithm} {h.hexdigest()}")
            raise DamagedBlob("digest mismatch")
        yield out, n


def _read_piece(
    fd: int, count: int, offset: int, h: Hasher, frame: Callable[[bytes], bytes] | None
) -> tuple[bytes, int]:
    """Verifier thread: ``count`` bytes at ``offset`` of ``fd``, added to ``h``, framed."""
    chunk = os.pread(fd, count, offset)
    h.update(chunk)
    return (frame(chunk) if frame is not None else chunk), len(chunk)


def _digest_here(fd: int, size: int, tail: int) -> asyncio.Future[FileDigest]:
    """``digest_fd`` (XXH3-128) run now, in the calling thread, as a done future."""
    fut: asyncio.Future[FileDigest] = asyncio.get_running_loop().create_future()
    try:
        fut.set_result(digest_fd(os.dup(fd), size, tail, (XXH3_128,)))
    except OSError as exc:
        fut.set_exception(exc)
    return fut
