"""zstd for ByteStream ``compressed-blobs/zstd/…`` names: decompress a Write as it streams in,
compress a Read as it streams out. Blobs are stored uncompressed (one store for HTTP and gRPC).

* ``decompressed(chunks, size_bytes)``: the uncompressed bytes of a zstd stream, in pieces of at
  most ``OUT_CHUNK_BYTES``. Bounded: once the output passes ``size_bytes`` (the uncompressed
  size the resource name declares) it raises ``InvalidRequest`` at once, before the excess is
  kept, so a zstd bomb never fills the tmp budget (``size_bytes`` is what was reserved) nor RAM
  (at most ``size_bytes`` + one piece is held). A corrupt frame is ``InvalidRequest`` too.
  Fewer bytes than ``size_bytes`` or a wrong SHA-256 is caught by the write path's own checks.
* ``compressed(pieces, size_bytes)``: one zstd frame (level ``LEVEL``, content size in the
  header) of ``pieces``; the frame is closed only after the last piece, which the caller yields
  only once the whole blob verified, so a damaged blob never reaches a client as a complete frame.

Offsets (remote_execution.proto, "ByteStream API",
https://github.com/bazelbuild/remote-apis/blob/main/build/bazel/remote/execution/v2/remote_execution.proto):
a compressed Read's ``read_offset`` is in the uncompressed blob and ``read_limit`` must be 0;
a compressed Write's later ``write_offset`` values count compressed bytes.
"""

from __future__ import annotations

from collections import deque
from collections.abc import AsyncIterator
from typing import IO, cast

import zstandard

from kura.core.errors import InvalidRequest

LEVEL = 3
IN_SLICE_BYTES = 64 * 1024  # compressed bytes handed to the decompressor per step
OUT_CHUNK_BYTES = 256 * 1024  # largest uncompressed piece the decompressor emits


EMPTY_FRAME = zstandard.ZstdCompressor(level=LEVEL).compress(b"")


class ZstdBomb(InvalidRequest):
    """The stream decompresses to more than the declared uncompressed size."""


class _Bounded:
    """The decompressor's sink: keeps pieces, refuses output past ``limit_bytes``."""

    def __init__(self, limit_bytes: int) -> None:
        self.limit_bytes = limit_bytes
        self.total_bytes = 0
        self.pieces: deque[bytes] = deque()

    def write(self, data: bytes) -> int:
        self.total_bytes += len(data)
        if self.total_bytes > self.limit_bytes:
            self.pieces.clear()
            raise ZstdBomb(
                f"the zstd stream decompresses to more than the declared {self.limit_bytes} bytes"
            )
        self.pieces.append(bytes(data))
        return len(data)


async def decompressed(chunks: AsyncIterator[bytes], size_bytes: int) -> AsyncIterator[bytes]:
    """The uncompressed bytes of the zstd stream ``chunks`` (module rules)."""
    sink = _Bounded(size_bytes)
    writer = zstandard.ZstdDecompressor().stream_writer(
        cast(IO[bytes], sink),  # it calls only write()
        write_size=OUT_CHUNK_BYTES,
    )
    async for chunk in chunks:
        view = memoryview(chunk)
        for start in range(0, len(view), IN_SLICE_BYTES):
            try:
                writer.write(view[start : start + IN_SLICE_BYTES])
            except zstandard.ZstdError as exc:
                raise InvalidRequest(f"the zstd stream is corrupt: {exc}") from None
            while sink.pieces:
                yield sink.pieces.popleft()


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
