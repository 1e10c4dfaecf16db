"""Writes and hashing of a staged body done in a thread pool instead of on the event loop
(``storage.blobs.stage_body`` with ``offload``): for work nobody waits on (a bootstrap's bodies,
a read-through copy already served), whose pool runs at a lower CPU priority
(``kit.background``). The staging file is created there too (``open_for_writing``)."""

from __future__ import annotations

import asyncio
from concurrent.futures import Executor
from pathlib import Path
from typing import BinaryIO

from kura.storage.checksum import BodyDigests
from kura.storage.fsync import start_writeback

# Bytes handed to an offload pool at a time: large enough that the thread hop (tens of
# microseconds) is noise, small enough that a block is written in about a millisecond.
OFFLOAD_BLOCK_BYTES = 1024 * 1024


async def open_for_writing(path: Path, pool: Executor) -> BinaryIO:
    """``path`` created and opened for writing (``"wb"``) in ``pool``, not on the loop: while
    other writes' fsyncs keep the filesystem's journal busy, creating a file can wait tens of
    milliseconds (44 to 96 ms measured here on a joining node during a bootstrap). Cancelled
    meanwhile, it raises at once, and the file the open goes on to create is closed and
    removed when the open completes."""
    job = asyncio.get_running_loop().run_in_executor(pool, _open_wb, path)
    try:
        return await asyncio.shield(job)
    except asyncio.CancelledError:
        job.add_done_callback(lambda done: _discard(done, path))
        raise


def _open_wb(path: Path) -> BinaryIO:
    return path.open("wb")


def _discard(done: asyncio.Future[BinaryIO], path: Path) -> None:
    if done.cancelled() or done.exception() is not None:
        return
    done.result().close()
    path.unlink(missing_ok=True)


class OffloadedWrites:
    """``stage_body``'s writes and hashing (``storage.blobs``) done in ``pool``, in blocks of
    ``OFFLOAD_BLOCK_BYTES``, in order, one block in flight: the loop receives the next block
    while a thread writes and hashes the last. The chunks are passed as they came (no copy).
    Each written block's writeback starts at once (``storage.fsync.start_writeback``), so the
    staged file's fsync finds most of it on the disk already."""

    def __init__(self, f: BinaryIO, digests: BodyDigests, pool: Executor) -> None:
        self._f = f
        self._digests = digests
        self._pool = pool
        self._block: list[bytes] = []
        self._block_bytes = 0
        self._job: asyncio.Future[None] | None = None
        self._written = 0

    async def add(self, chunk: bytes) -> None:
        self._block.append(chunk)
        self._block_bytes += len(chunk)
        if self._block_bytes >= OFFLOAD_BLOCK_BYTES:
            await self._submit()

    async def finish(self) -> None:
        """Write what is left; returns once every byte is written and hashed."""
        if self._block:
            await self._submit()
        if self._job is not None:
            job, self._job = self._job, None
            await job

    def abandon(self) -> None:
        """On a failure: the block in flight (if any) finishes or fails on its own, its outcome
        retrieved, so nothing is logged as an unretrieved exception."""
        if self._job is not None:
            self._job.add_done_callback(_retrieve)

    async def _submit(self) -> None:
        if self._job is not None:
            await self._job
        block, self._block, self._block_bytes = self._block, [], 0
        loop = asyncio.get_running_loop()
        self._job = loop.run_in_executor(self._pool, self._write, block)

    def _write(self, block: list[bytes]) -> None:
        """Write ``block``, start its writeback, then hash it: the disk takes the bytes while
        they are hashed."""
        start = self._written
        for chunk in block:
            self._f.write(chunk)
            self._written += len(chunk)
        self._f.flush()
        start_writeback(self._f.fileno(), start, self._written - start)
        for chunk in block:
            self._digests.update(chunk)


def _retrieve(job: asyncio.Future[None]) -> None:
    if not job.cancelled():
        job.exception()
