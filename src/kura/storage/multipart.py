"""Multipart module uploads: start → parts → complete (Kura's ``/api/cache/module`` flow).

Rules from upstream Kura (kura-behaviour.md §1.3): a part is at most 10 MiB (413), the upload's
total at most 2 GiB (422; replacing a part number counts only the new size), and ``complete``
needs the exact ascending list of uploaded part numbers (400). Unknown uploads are 404.

Parts are staged in ``TMP_DIR/parts`` and each keeps its tmp-budget reservation until the upload
completes, is abandoned (TTL) or the part is replaced, so parts count against the same budget as
every other occupant. Upload state is in memory: the tmp dir is wiped at start-up anyway, so an
upload cannot survive a restart (upstream behaves the same).
"""

from __future__ import annotations

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

    @property
    def total_bytes(self) -> int:
        return sum(p.size for p in self.parts.values())


class MultipartUploads:
    """Open uploads of one node. Event-loop confined; not thread-safe."""

    def __init__(self, service: CacheService, clock: Clock, ttl_seconds: float) -> None:
        self._service = service
        self._clock = clock
        self._ttl_seconds = ttl_seconds
        self._uploads: dict[str, _Upload] = {}

    @property
    def open_uploads(self) -> int:
        return len(self._uploads)

    async def start(self, ref: ArtifactRef) -> str | None:
        """A new upload id, or None if the artifact already exists (nothing to upload)."""
        if await self._service.exists(ref):
            return None
        self.reap_expired()
        if len(self._uploads) >= MAX_OPEN_UPLOADS:
            raise ResourceExhausted("too many multipart uploads in progress", 5)
        upload_id = str(uuid.uuid4())
        self._uploads[upload_id] = _Upload(ref, self._clock.monotonic())
        return upload_id

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
        # A chunked part reserves its largest possible size, capped at the budget's capacity
        # (stage_body answers 413 if it really grows past it).
        first = (
            declared_length
            if declared_length is not None
            else min(MAX_PART_BYTES, budget.capacity_bytes)
        )
        reservation = budget.try_reserve(max(1, first))
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
        if self._uploads.get(upload_id) is not upload or others + staged.size > MAX_TOTAL_BYTES:
            staged.path.unlink(missing_ok=True)
            reservation.release()
            if self._uploads.get(upload_id) is not upload:
                raise NotFound("Upload not found")
            raise UnprocessableEntity("Total upload size exceeds 2GB limit")
        previous = upload.parts.get(part_number)
        if previous is not None:
            _discard(previous)
        upload.parts[part_number] = _Part(staged.path, staged.size, reservation)

    async def complete(self, upload_id: str, part_numbers: list[int]) -> PutResult:
        """Concatenate the parts in order into the artifact; the upload is then gone."""
        upload = self._get(upload_id)
        if not part_numbers or part_numbers != sorted(upload.parts):
            raise InvalidRequest("Parts mismatch or missing parts")
        if upload.total_bytes > MAX_TOTAL_BYTES:
            raise UnprocessableEntity("Total upload size exceeds 2GB limit")
        del self._uploads[upload_id]
        try:
            return await self._service.put_concatenated(
                upload.ref, [upload.parts[n].path for n in part_numbers], "application/octet-stream"
            )
        finally:
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
