"""Resumable ByteStream writes: one ``Upload`` per ``uploads/{uuid}/blobs/{hash}/{size}`` name.

An upload is an ``ArtifactWriter.put_stream`` running in its own task, fed the chunks of one or
more ``Write`` streams through a small queue. So it follows the write path's rules unchanged:
the whole declared size is reserved from the tmp budget before the first byte is staged
("reserve before writing"; ResourceExhausted if it does not fit now), the size and the SHA-256
are checked at the end, and on any failure or discard nothing is left (no blob, no index row,
no reserved bytes).

* ``committed_bytes`` counts the bytes accepted so far; a stream that drops (the client
  cancels, the connection breaks, or it ends without ``finish_write``) parks the upload, and a
  new stream may go on at exactly that offset (``QueryWriteStatus`` reports it) within
  ``resume_seconds`` (``KURA_GRPC_UPLOAD_RESUME_SECONDS``). Then, or on ``discard``, the task
  is cancelled, which deletes the staged file and releases the reservation.
* One stream at a time per upload: a second one while the first is attached is refused
  (``Conflict``).
* Each upload has an ``UploadMeter`` (``kura.api.upload_rate``), the listeners' one rule for
  slow uploads, run over the upload's whole life: the time it is parked counts toward its
  average rate, so a parked upload is discarded when its resume window ends or, sooner, when
  its average falls below ``KURA_MIN_UPLOAD_BYTES_PER_SECOND`` (past the grace period). A
  client cannot keep a reservation by resuming with a byte now and then.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any, TypeAlias

from kura.api.upload_rate import UploadMeter, UploadRule
from kura.core.errors import Conflict
from kura.storage.artifact import PutResult

Key: TypeAlias = tuple[str, str, str, int, str]
QUEUE_CHUNKS = 4


class Upload:
    """One resumable write (module docstring). Create through ``Uploads.open``."""

    def __init__(
        self,
        key: Key,
        store: Callable[[AsyncIterator[bytes]], asyncio.Future[PutResult]],
        meter: UploadMeter,
    ) -> None:
        self.key = key
        self.meter = meter
        self.committed_bytes = 0
        self.attached = False
        self._queue: asyncio.Queue[bytes | None] = asyncio.Queue(QUEUE_CHUNKS)
        self.task: asyncio.Future[PutResult] = store(self._chunks())
        self._expiry: asyncio.TimerHandle | None = None

    async def _chunks(self) -> AsyncIterator[bytes]:
        while (chunk := await self._queue.get()) is not None:
            yield chunk

    async def feed(self, chunk: bytes | None) -> None:
        """Hand ``chunk`` (None: the end) to the write; raises what the write failed with."""
        put = asyncio.ensure_future(self._queue.put(chunk))
        either: set[asyncio.Future[Any]] = {put, self.task}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if not put.done():
            put.cancel()
            self.task.result()  # raises: the write ended before taking the chunk
            raise RuntimeError("the write ended before the end of its body")
        if chunk is not None:
            self.committed_bytes += len(chunk)

    async def finish(self) -> PutResult:
        await self.feed(None)
        return await self.task

    def cancel(self) -> None:
        if self._expiry is not None:
            self._expiry.cancel()
        self.task.cancel()


class Uploads:
    """The uploads in progress on this node, by (namespace, uuid, hash, size, compressor)."""

    def __init__(self, resume_seconds: float, rule: UploadRule) -> None:
        self.resume_seconds = resume_seconds
        self.rule = rule
        self._uploads: dict[Key, Upload] = {}

    def __len__(self) -> int:
        return len(self._uploads)

    def get(self, key: Key) -> Upload | None:
        return self._uploads.get(key)

    def open(
        self, key: Key, store: Callable[[AsyncIterator[bytes]], asyncio.Future[PutResult]]
    ) -> Upload:
        """A new upload for ``key`` (none may be in progress), attached to the calling stream."""
        old = self._uploads.get(key)
        assert old is None or old.task.done()
        upload = Upload(key, store, self.rule.meter(asyncio.get_running_loop().time()))
        upload.attached = True
        self._uploads[key] = upload
        upload.task.add_done_callback(lambda _t: self._forget(upload))
        return upload

    def attach(self, upload: Upload) -> None:
        """Resume ``upload`` on the calling stream; ``Conflict`` if another stream has it."""
        if upload.attached:
            raise Conflict("another stream is writing this upload now")
        if upload._expiry is not None:
            upload._expiry.cancel()
            upload._expiry = None
        upload.attached = True
        # A new stream has the idle timeout anew; the average rate keeps its clock.
        upload.meter.last = asyncio.get_running_loop().time()

    def park(self, upload: Upload) -> None:
        """The stream dropped: keep ``upload`` for ``resume_seconds``, or until its average
        rate falls below the minimum if that is sooner (module docstring), then discard it."""
        upload.attached = False
        if upload.task.done():
            return
        loop = asyncio.get_running_loop()
        keep = min(self.resume_seconds, upload.meter.slow_at() - loop.time())
        upload._expiry = loop.call_later(max(keep, 0.0), upload.cancel)

    async def discard(self, upload: Upload) -> None:
        """Cancel ``upload`` and wait until its staged file and reservation are gone."""
        upload.cancel()
        with contextlib.suppress(BaseException):
            await upload.task

    async def discard_all(self) -> None:
        for upload in list(self._uploads.values()):
            await self.discard(upload)

    def _forget(self, upload: Upload) -> None:
        if self._uploads.get(upload.key) is upload:
            del self._uploads[upload.key]
        if upload.task.cancelled():
            return
        upload.task.exception()  # retrieved: a parked upload's failure is not "never retrieved"
