"""zstd for ByteStream ``compressed-blobs/zstd/…`` names: decompress a Write as it streams in,
compress a Read as it streams out. Blobs are stored uncompressed (one store for HTTP and gRPC).

* ``decompressed(chunks, size_bytes)``: the uncompressed bytes of a zstd stream, in pieces of at
  most ``OUT_CHUNK_BYTES``. Bounded in memory by a constant per upload, whatever the expansion
  ratio: the decompressor is asked for one piece at a time (``ZSTD_decompressStream`` with an
  output buffer of ``OUT_CHUNK_BYTES``, through ``zstandard``'s stream reader), each piece is
  handed on (and the event loop gets a turn) before the next is made, and a frame's window may
  not exceed ``MAX_WINDOW_BYTES``. A 32 KB frame of a 1 GiB blob once expanded whole between two
  yields (+1,033 MiB RSS, a 3 s stall, issue 26). Once the output passes ``size_bytes`` (the
  uncompressed size the resource name declares) it raises ``InvalidRequest`` at once, before the
  excess is kept, so a zstd bomb never fills the tmp budget (``size_bytes`` is what was
  reserved). A corrupt frame, or bytes after the last frame that are no frame, is
  ``InvalidRequest`` too. Fewer bytes than ``size_bytes`` or a wrong SHA-256 is caught by the
  write path's own checks.
* ``whole_decompressed`` and ``whole_compressed`` (``whole_compressed_off_loop``: in a worker
  thread past 256 KiB): the same for a blob held in memory (the batch calls' ``compressor``
  field: BatchUpdateBlobs' requests, BatchReadBlobs' answers).
* ``compressed(pieces, size_bytes)``: one zstd frame (level ``LEVEL``, content size in the
  header) of ``pieces``; the frame is closed only after the last piece, which the caller yields
  only once the whole blob verified, so a damaged blob never reaches a client as a complete frame.

Offsets (remote_execution.proto, "ByteStream API",
https://github.com/bazelbuild/remote-apis/blob/main/build/bazel/remote/execution/v2/remote_execution.proto):
a compressed Read's ``read_offset`` is in the uncompressed blob and ``read_limit`` must be 0;
a compressed Write's later ``write_offset`` values count compressed bytes.

Measured here (2 cores, one thread): level 3 compresses 0.7-1.2 GB/s of incompressible bytes and
0.2-0.25 GB/s of source-like text (ratio 27-39); end to end on one node, a 64 MiB zstd Read
delivers 0.7x the uncompressed bytes per second of an identity Read, and a zstd Write of
source-like text 1.5x those of an identity Write. A 256 MiB blob sent as a 6 KB frame grows the
node's peak RSS by 3 MiB (259 MiB before issue 26).
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import IO, cast

import zstandard

from kura.core.errors import InvalidRequest
from kura.storage.ports import one_piece

LEVEL = 3
IN_SLICE_BYTES = 64 * 1024  # compressed bytes handed to the decompressor per step
OUT_CHUNK_BYTES = 256 * 1024  # largest uncompressed piece the decompressor emits
OFF_LOOP_BYTES = 256 * 1024  # a larger blob is compressed whole in a worker thread
# The largest frame window accepted: RFC 8878 section 3.1.1.1.2 recommends decoders support
# windows up to 8 MB and encoders not need more (zstd levels 1-19 stay within it); the window is
# memory the decoder holds per upload, so a larger one (levels 20-22, --long) is refused.
MAX_WINDOW_BYTES = 8 * 1024 * 1024


EMPTY_FRAME = zstandard.ZstdCompressor(level=LEVEL).compress(b"")


class ZstdBomb(InvalidRequest):
    """The stream decompresses to more than the declared uncompressed size."""


class _NeedInput(Exception):
    """Raised by ``_Feed.read`` while it holds no compressed bytes: the stream reader's ``read1``
    lets it through and loses no output (it asks for input only while its output buffer is still
    empty), and is called again once the next chunk arrived."""


class _Feed:
    """The stream reader's source: the compressed chunks received and not yet taken."""

    def __init__(self) -> None:
        self.chunks: deque[memoryview] = deque()
        self.ended = False

    def read(self, size: int) -> memoryview | bytes:
        if self.chunks:
            chunk = self.chunks.popleft()
            if len(chunk) > size:  # views, not copies, of a large message's rest
                self.chunks.appendleft(chunk[size:])
                chunk = chunk[:size]
            return chunk
        if self.ended:
            return b""
        raise _NeedInput


async def decompressed(chunks: AsyncIterator[bytes], size_bytes: int) -> AsyncIterator[bytes]:
    """The uncompressed bytes of the zstd stream ``chunks`` (module rules), in pieces of at most
    ``OUT_CHUNK_BYTES``. Raises ``ZstdBomb`` past ``size_bytes`` and ``InvalidRequest`` for a
    corrupt stream or a window larger than ``MAX_WINDOW_BYTES``."""
    feed = _Feed()
    reader = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW_BYTES).stream_reader(
        cast(IO[bytes], feed),  # it calls only read()
        read_size=IN_SLICE_BYTES,
        read_across_frames=True,
        closefd=False,
    )
    incoming = aiter(chunks)
    total_bytes = 0
    while True:
        try:
            piece = reader.read1(OUT_CHUNK_BYTES)
        except _NeedInput:
            try:
                chunk = await anext(incoming)
            except StopAsyncIteration:
                feed.ended = True
            else:
                if chunk:  # the reader takes an empty read for the end of the stream
                    feed.chunks.append(memoryview(chunk))
            continue
        except zstandard.ZstdError as exc:
            raise InvalidRequest(f"the zstd stream is corrupt or unsupported: {exc}") from None
        if not piece:
            return
        total_bytes += len(piece)
        if total_bytes > size_bytes:
            raise ZstdBomb(
                f"the zstd stream decompresses to more than the declared {size_bytes} bytes"
            )
        yield piece
        await asyncio.sleep(0)  # a stream of pieces that were never awaited must not hog the loop


async def compressed(pieces: AsyncIterator[bytes], size_bytes: int) -> AsyncIterator[bytes]:
    """One zstd frame of ``pieces`` (module rules), in the pieces the compressor emits."""
    compressor = zstandard.ZstdCompressor(level=LEVEL).compressobj(size=size_bytes)
    async for piece in pieces:
        out = compressor.compress(piece)
        if out:
            yield out
    tail = compressor.flush()
    if tail:
        yield tail


async def whole_decompressed(data: bytes, size_bytes: int) -> bytes:
    """``decompressed`` of one in-memory zstd stream, joined (the same bounds and errors)."""
    return b"".join([piece async for piece in decompressed(one_piece(data), size_bytes)])


def whole_compressed(data: bytes) -> bytes:
    """One zstd frame of ``data`` (level ``LEVEL``, content size in the header)."""
    return zstandard.ZstdCompressor(level=LEVEL).compress(data)


async def whole_compressed_off_loop(data: bytes) -> bytes:
    """``whole_compressed(data)``, in a worker thread when ``data`` is over ``OFF_LOOP_BYTES``:
    level 3 takes about 20 ms for a 4 MiB batch of source-like text (0.2 GB/s, module
    docstring), too long to hold the event loop and every other call on it."""
    if len(data) <= OFF_LOOP_BYTES:
        return whole_compressed(data)
    return await asyncio.to_thread(whole_compressed, data)
