"""Multipart module uploads: start → parts → complete (Kura's ``/api/cache/module`` flow).

Rules from upstream Kura (kura-behaviour.md §1.3): a part is at most 10 MiB (413), the upload's
total at most 2 GiB (422; replacing a part number counts only the new size), and ``complete``
needs the exact ascending list of uploaded part numbers (400). Unknown uploads are 404.

At ``MAX_OPEN_UPLOADS`` a ``start`` reclaims the least recently active upload that has been
idle (no part received or in flight) for longer than ``idle_seconds``, freeing its parts and
their tmp budget; only when every open upload is active does it answer 503 + Retry-After (1,024
``start`` calls otherwise locked every module upload out for the whole TTL).

Parts are staged in ``TMP_DIR/parts`` and each keeps its tmp-budget reservation until the upload
completes, is abandoned (TTL) or the part is replaced, so parts count against the same budget as
every other occupant. Upload state is in memory: the tmp dir is wiped at start-up anyway, so an
upload cannot survive a restart (upstream behaves the same).
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

from kit.clock import Clock
from kura.core.errors import (
    InvalidRequest,
    NotFound,
    PayloadTooLarge,
    ResourceExhausted,
    UnprocessableEntity,
)
from kura.storage.blobs import stage_body
from kura.storage.budget import Reservation
from kura.storage.service import ArtifactRef, CacheService, PutResult

log = logging.getLogger(__name__)

MAX_PART_BYTES = 10 * 1024 * 1024
MAX_TOTAL_BYTES = 2 * 1024 * 1024 * 1024
MAX_OPEN_UPLOADS = 1024
MAX_PART_NUMBER = 10_000


@dataclass
class _Part:
    path: Path
    size: int
    reservation: Reservation


@dataclass
class _Upload:
    ref: ArtifactRef
    started_at: float
    parts: dict[int, _Part] = field(default_factory=dict)
    # Monotonic seconds of the last start, part begun or part staged; parts being received now.
    active_at: float = 0.0
    parts_in_flight: int = 0

    @property
    def total_bytes(self) -> int:
        return sum(p.size for p in self.parts.values())


class MultipartUploads:
    """Open uploads of one node. Event-loop confined; not thread-safe."""

    def __init__(
        self,
        service: CacheService,
        clock: Clock,
        ttl_seconds: float,
        idle_seconds: float = 60.0,
    ) -> None:
        self._service = service
        self._clock = clock
        self._ttl_seconds = ttl_seconds
        self._idle_seconds = idle_seconds
        self._uploads: dict[str, _Upload] = {}
        self.reclaimed_total = 0

    @property
    def open_uploads(self) -> int:
        return len(self._uploads)

    async def start(self, ref: ArtifactRef) -> str | None:
        """A new upload id, or None if the artifact already exists (nothing to upload)."""
        if await self._service.exists(ref):
            return None
        self.reap_expired()
        if len(self._uploads) >= MAX_OPEN_UPLOADS and not self._reclaim_idle():
            raise ResourceExhausted(
                f"{MAX_OPEN_UPLOADS} multipart uploads are in progress and each was active "
                f"within the last {self._idle_seconds:g} s; retry later",
                5,
            )
        upload_id = str(uuid.uuid4())
        now = self._clock.monotonic()
        self._uploads[upload_id] = _Upload(ref, now, active_at=now)
        return upload_id

    def _reclaim_idle(self) -> bool:
        """Abort the least recently active upload idle past ``idle_seconds``; whether one was."""
        now = self._clock.monotonic()
        idle = [
            (up.active_at, upload_id)
            for upload_id, up in self._uploads.items()
            if up.parts_in_flight == 0 and now - up.active_at > self._idle_seconds
        ]
        if not idle:
            return False
        _active_at, upload_id = min(idle)
        self.abort(upload_id)
        self.reclaimed_total += 1
        if self.reclaimed_total == 1 or self.reclaimed_total % 1000 == 0:
            log.warning(
                "open multipart uploads at the cap of %d: reclaimed the least recently active "
                "idle upload (%d reclaimed so far)",
                MAX_OPEN_UPLOADS,
                self.reclaimed_total,
            )
        return True

    async def put_part(
        self,
        upload_id: str,
        part_number: int,
        body: AsyncIterator[bytes],
        declared_length: int | None,
    ) -> None:
        """Stage one part, replacing an earlier part with the same number."""
        upload = self._get(upload_id)
        if not 1 <= part_number <= MAX_PART_NUMBER:
            raise InvalidRequest("Invalid part_number")
        if declared_length is not None and declared_length > MAX_PART_BYTES:
            raise PayloadTooLarge("Part exceeds 10MB limit", MAX_PART_BYTES)
        previous = upload.parts.get(part_number)
        others = upload.total_bytes - (previous.size if previous else 0)
        if declared_length is not None and others + declared_length > MAX_TOTAL_BYTES:
            raise UnprocessableEntity("Total upload size exceeds 2GB limit")
        budget = self._service.budget
        # A chunked part reserves its largest possible size, capped at the budget's capacity,
        # when that fits now, else only what arrives (stage_body grows it, and answers 413 if it
        # really grows past the capacity).
        if declared_length is not None:
            reservation = budget.try_reserve(max(1, declared_length))
        else:
            reservation = budget.try_reserve_up_to(
                max(1, min(MAX_PART_BYTES, budget.capacity_bytes))
            )
        upload.parts_in_flight += 1
        upload.active_at = self._clock.monotonic()
        try:
            staged = await stage_body(
                body,
                self._service.files.new_staging_path("parts"),
                reservation,
                limit_bytes=MAX_PART_BYTES,
                declared_length=declared_length,
            )
        except PayloadTooLarge:
            reservation.release()
            raise PayloadTooLarge("Part exceeds 10MB limit", MAX_PART_BYTES) from None
        except BaseException:
            reservation.release()
            raise
        finally:
            upload.parts_in_flight -= 1
            upload.active_at = self._clock.monotonic()
        if self._uploads.get(upload_id) is not upload or others + staged.size > MAX_TOTAL_BYTES:
            staged.path.unlink(missing_ok=True)
            reservation.release()
            if self._uploads.get(upload_id) is not upload:
                raise NotFound("Upload not found")
            raise UnprocessableEntity("Total upload size exceeds 2GB limit")
        reservation.shrink_to(staged.size)  # a chunked part reserved up to MAX_PART_BYTES
        previous = upload.parts.get(part_number)
        if previous is not None:
            _discard(previous)
        upload.parts[part_number] = _Part(staged.path, staged.size, reservation)

    async def complete(self, upload_id: str, part_numbers: list[int]) -> PutResult:
        """Concatenate the parts in order into the artifact; the upload is then gone, unless
        the store answered ``ResourceExhausted`` (503 + Retry-After: the disk's free-space
        floor, a full object-store upload queue): then it is kept, parts and all, for the
        client's retry of the same call. While it completes it takes no parts (404)."""
        upload = self._get(upload_id)
        if not part_numbers or part_numbers != sorted(upload.parts):
            raise InvalidRequest("Parts mismatch or missing parts")
        if upload.total_bytes > MAX_TOTAL_BYTES:
            raise UnprocessableEntity("Total upload size exceeds 2GB limit")
        del self._uploads[upload_id]
        retry = False
        try:
            return await self._service.put_concatenated(
                upload.ref, [upload.parts[n].path for n in part_numbers], "application/octet-stream"
            )
        except ResourceExhausted:
            retry = True
            upload.active_at = self._clock.monotonic()
            self._uploads[upload_id] = upload
            raise
        finally:
            if not retry:
                for part in upload.parts.values():
                    _discard(part)

    def reap_expired(self) -> int:
        """Drop uploads older than the TTL, freeing their parts. Returns how many."""
        now = self._clock.monotonic()
        expired = [u for u, up in self._uploads.items() if now - up.started_at > self._ttl_seconds]
        for upload_id in expired:
            self.abort(upload_id)
        return len(expired)

    def abort(self, upload_id: str) -> None:
        upload = self._uploads.pop(upload_id, None)
        if upload is not None:
            for part in upload.parts.values():
                _discard(part)

    def abort_all(self) -> None:
        for upload_id in list(self._uploads):
            self.abort(upload_id)

    def _get(self, upload_id: str) -> _Upload:
        upload = self._uploads.get(upload_id)
        if upload is None:
            raise NotFound("Upload not found")
        return upload


def _discard(part: _Part) -> None:
    part.path.unlink(missing_ok=True)
    part.reservation.release()
