"""Multipart module uploads: start → parts → complete (Kura's ``/api/cache/module`` flow).

Rules from upstream Kura (kura-behaviour.md §1.3): a part is at most 10 MiB (413), the upload's
total at most 2 GiB (422; replacing a part number counts only the new size), and ``complete``
needs the exact ascending list of uploaded part numbers (400). Unknown uploads are 404.

At ``MAX_OPEN_UPLOADS``, or at ``per_namespace`` open uploads of the starting namespace, a
``start`` reclaims the least recently active *reclaimable* upload (of that namespace, at its own
cap), freeing its parts and their tmp budget; only when none is reclaimable does it answer 503 +
Retry-After. An upload with no part in flight is reclaimable when it has been idle (no part
received) for longer than ``idle_seconds``, or when, older than ``grace_seconds``, it has
received fewer bytes than ``min_bytes_per_second`` times its age: the HTTP bodies' minimum
rate (``KURA_MIN_UPLOAD_BYTES_PER_SECOND`` after ``KURA_UPLOAD_GRACE_SECONDS``), here over the
whole upload, so a trickle of 1-byte parts cannot keep an upload from reclaim (issue 26: 1,024
uploads kept alive by a 1-byte part every 45 s refused every other ``start``). The per-namespace
cap keeps one namespace (one team's credential) from holding every slot. The TTL counts from
``start`` and nothing extends it.

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
    # Bytes of every part staged so far, replaced ones included (the progress made).
    received_bytes: int = 0

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
        *,
        per_namespace: int = MAX_OPEN_UPLOADS,
        min_bytes_per_second: int = 0,
        grace_seconds: float = 10.0,
    ) -> None:
        self._service = service
        self._clock = clock
        self._ttl_seconds = ttl_seconds
        self._idle_seconds = idle_seconds
        self._per_namespace = per_namespace
        self._min_bytes_per_second = min_bytes_per_second
        self._grace_seconds = grace_seconds
        self._uploads: dict[str, _Upload] = {}
        self.reclaimed_total = 0

    async def start(self, ref: ArtifactRef) -> str | None:
        """A new upload id, or None if the artifact already exists (nothing to upload).
        ``ResourceExhausted`` (503 + Retry-After) when the node's or the namespace's cap is
        reached and no upload is reclaimable (module docstring)."""
        if await self._service.reads.exists(ref):
            return None
        self.reap_expired()
        namespace = ref.namespace_id
        mine = [u for u, up in self._uploads.items() if up.ref.namespace_id == namespace]
        if len(mine) >= self._per_namespace and not self._reclaim(mine):
            raise ResourceExhausted(
                f"namespace {namespace!r} has {len(mine)} multipart uploads in progress, its "
                f"cap (KURA_MULTIPART_UPLOADS_PER_NAMESPACE), and each is making progress; "
                "retry later",
                5,
            )
        if len(self._uploads) >= MAX_OPEN_UPLOADS and not self._reclaim(list(self._uploads)):
            raise ResourceExhausted(
                f"{MAX_OPEN_UPLOADS} multipart uploads are in progress and each was active "
                f"within the last {self._idle_seconds:g} s at the minimum upload rate; "
                "retry later",
                5,
            )
        upload_id = str(uuid.uuid4())
        now = self._clock.monotonic()
        self._uploads[upload_id] = _Upload(ref, now, active_at=now)
        return upload_id

    def _reclaimable(self, upload: _Upload, now: float) -> bool:
        """Idle past ``idle_seconds``, or past the grace period below the minimum rate."""
        if upload.parts_in_flight:
            return False  # a part being received is held to the rate by the body reader
        if now - upload.active_at > self._idle_seconds:
            return True
        age = now - upload.started_at
        return (
            age > self._grace_seconds and upload.received_bytes < self._min_bytes_per_second * age
        )

    def _reclaim(self, candidates: list[str]) -> bool:
        """Abort the least recently active reclaimable upload of ``candidates``; whether one
        was."""
        now = self._clock.monotonic()
        idle = [
            (self._uploads[upload_id].active_at, upload_id)
            for upload_id in candidates
            if self._reclaimable(self._uploads[upload_id], now)
        ]
        if not idle:
            return False
        _active_at, upload_id = min(idle)
        self.abort(upload_id)
        self.reclaimed_total += 1
        if self.reclaimed_total == 1 or self.reclaimed_total % 1000 == 0:
            log.warning(
                "open multipart uploads at a cap (%d per node, %d per namespace): reclaimed the "
                "least recently active idle or too slow upload (%d reclaimed so far)",
                MAX_OPEN_UPLOADS,
                self._per_namespace,
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
        upload.received_bytes += staged.size
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

    def namespace_of(self, upload_id: str) -> str:
        """The namespace the upload ``upload_id`` was started in; ``NotFound`` if unknown."""
        return self._get(upload_id).ref.namespace_id

    def _get(self, upload_id: str) -> _Upload:
        upload = self._uploads.get(upload_id)
        if upload is None:
            raise NotFound("Upload not found")
        return upload


def _discard(part: _Part) -> None:
    part.path.unlink(missing_ok=True)
    part.reservation.release()
