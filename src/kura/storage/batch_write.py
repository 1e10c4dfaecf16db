"""Many local writes under one durable commit: ``put_batch`` (REAPI ``BatchUpdateBlobs``).

Stored one by one, a batch of N small blobs paid N index look-ups, N writer-thread hops and N
WAL fsyncs, one after another: 100 blobs of 1 KiB took 115 ms where BuildGrid, which does not
fsync, took 16 (``docs/benchmarks.md``). ``put_batch`` stores the blobs that pass their checks
together, with the guarantees of a single write (``storage.write_path``):

1. every body is hashed, and one that does not hash to its digest is refused on its own
   (``DigestMismatch``) before anything of it is written;
2. blobs already stored intact are not written again: an inline one is found by the writer in
   the row it reads anyway (step 4), a file is hashed first in one reader-thread call with one
   index look-up (``ArtifactReads.intact_many``);
3. a body larger than ``inline_max_bytes`` is staged under one tmp-budget reservation for the
   batch, each staging file written and fsynced in the sync pool, in parallel;
4. one writer-thread job then publishes the staged files, issues one version above every
   stored copy and tombstone of the batch, and commits every row with its outbox messages in
   ONE SQLite transaction (``MetadataIndex.upsert_many``); the group commit makes it durable
   (one WAL fsync, one fsync per blob directory, ``storage.group_commit``) before any blob of
   the batch is acknowledged, and the shipper is woken once.

A refused blob leaves nothing behind (no staging file, no reservation, no row); a failure of
the commit (a failed fsync, a full disk) fails every blob that was to be written in it, and
acknowledges none.
"""

from __future__ import annotations

import asyncio
import dataclasses
import errno
import hashlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from kit.failpoint import failpoint
from kura.core.errors import DigestMismatch, KuraError, ResourceExhausted, Unavailable
from kura.core.manifest import Manifest
from kura.core.version import ApplyOutcome, decide_apply
from kura.storage.artifact import BatchBlob, PutResult
from kura.storage.budget import Reservation
from kura.storage.checksum import xxh3_128_hex
from kura.storage.reads import ArtifactReads
from kura.storage.verify import problem_with_bytes
from kura.storage.write_path import WritePath

# Bodies adding up to more than this are hashed in the sync pool, not on the event loop.
HASH_INLINE_BYTES = 256 * 1024


@dataclass
class _Pending:
    """A blob to write: where its answer goes, its manifest (version issued by the writer),
    and its staging file (None: stored inline)."""

    at: list[int]
    manifest: Manifest
    data: bytes
    staged: Path | None = None
    xxh3_128: str | None = None


class BatchWrite(WritePath):
    """``put_batch`` (module docstring)."""

    reads: ArtifactReads  # the store's read path (``CacheService``)
    _sent_again: Callable[[str], None]  # an intact artifact sent again (``CacheService``)

    async def put_batch(
        self, blobs: Sequence[BatchBlob], *, limit_bytes: int, content_type: str
    ) -> list[PutResult | KuraError | None]:
        """Store ``blobs`` as new local versions under one durable commit (module docstring).

        For each blob, in order: its ``PutResult``; None when it was already stored intact
        with its size (nothing written); or the error that refused it, leaving nothing behind
        (``DigestMismatch``, ``PayloadTooLarge`` over ``limit_bytes``, ``InsufficientStorage``
        over the disk budget, and for every blob to be written, ``ResourceExhausted`` without
        the free disk space or tmp budget, ``Unavailable`` when the commit could not be made
        durable). A blob named twice is stored once and both get its answer."""
        answers: list[PutResult | KuraError | None] = [None] * len(blobs)
        if not blobs:
            return answers
        hashed = await self._hashed(blobs)
        good: dict[str, list[int]] = {}
        for i, (blob, sha256) in enumerate(zip(blobs, hashed, strict=True)):
            try:
                if sha256 != blob.sha256:
                    raise DigestMismatch(
                        f"body has SHA-256 {sha256}, not the expected {blob.sha256}"
                    )
                self._check_limits(len(blob.data), limit_bytes)
            except KuraError as exc:
                answers[i] = exc
                continue
            good.setdefault(self.artifact_id(blob.ref), []).append(i)
        pending = [
            _Pending(at, self._batch_manifest(blobs[at[0]], aid, content_type), blobs[at[0]].data)
            for aid, at in good.items()
        ]
        # An inline blob stored intact already is found by the writer, in the row it reads
        # anyway; a file is hashed here first, off the writer thread.
        files = [p for p in pending if not p.manifest.inline]
        if files:
            refs = [blobs[p.at[0]].ref for p in files]
            stored = await self.reads.intact_many(refs, [p.manifest.size for p in files])
            intact = {id(p) for p, ok in zip(files, stored, strict=True) if ok}
            pending = [p for p in pending if id(p) not in intact]
        if not pending:
            return answers
        try:
            self._check_free_disk(sum(len(p.data) for p in pending))
            results = await self._stage_and_commit(pending)
        except KuraError as exc:
            results = [exc] * len(pending)
        for p, result in zip(pending, results, strict=True):
            if result is None:
                self._sent_again(p.manifest.artifact_id)
            for i in p.at:
                answers[i] = result
        return answers

    async def _hashed(self, blobs: Sequence[BatchBlob]) -> list[str]:
        """The SHA-256 (hex) of each body: on the event loop for a small batch, else in the
        sync pool (a 4 MiB batch costs milliseconds of hashing)."""
        if sum(len(b.data) for b in blobs) <= HASH_INLINE_BYTES:
            return [hashlib.sha256(b.data).hexdigest() for b in blobs]
        return await self._in(
            self._syncer, lambda: [hashlib.sha256(b.data).hexdigest() for b in blobs]
        )

    def _batch_manifest(self, blob: BatchBlob, aid: str, content_type: str) -> Manifest:
        inline = len(blob.data) <= self.inline_max_bytes
        return self._new_manifest(
            blob.ref, aid, len(blob.data), blob.sha256, content_type, {}, inline=inline
        )

    async def _stage_and_commit(
        self, pending: list[_Pending]
    ) -> list[PutResult | KuraError | None]:
        """Stage the large bodies (one reservation), then the one commit; staging files are
        gone and the reservation released when this returns or raises."""
        large = [p for p in pending if not p.manifest.inline]
        staged_bytes = sum(len(p.data) for p in large)
        reservation = self.budget.try_reserve(staged_bytes) if large else None
        try:
            if reservation is not None:
                # Every staging job ends before any error is raised: none creates its file
                # after the cleanup below.
                staged = await asyncio.gather(
                    *(self._stage(p, reservation) for p in large), return_exceptions=True
                )
                for outcome in staged:
                    if isinstance(outcome, BaseException):
                        raise outcome
                reservation.mark_written()
            await self._writes_open()  # start-up's reconciliation must not race the publish
            peers = self._artifact_targets()
            self.queues.check_room(peers)
            results: list[PutResult | KuraError | None] = await self._in(
                self._writer, self._commit_batch_sync, pending, self._take_touches(), peers
            )
        finally:
            for p in large:
                if p.staged is not None:
                    p.staged.unlink(missing_ok=True)
            if reservation is not None:
                reservation.release()
        if peers and any(isinstance(r, PutResult) for r in results):
            self._outbox_written()
        return results

    async def _stage(self, p: _Pending, reservation: Reservation) -> None:
        path = self.files.new_staging_path("uploads")
        reservation.track(path)
        p.staged = path
        job = asyncio.get_running_loop().run_in_executor(self._syncer, _write_durably, path, p.data)
        try:
            p.xxh3_128 = await asyncio.shield(job)
        except asyncio.CancelledError:  # the write goes on in its thread: remove it after
            job.add_done_callback(lambda _done: path.unlink(missing_ok=True))
            raise

    def _commit_batch_sync(
        self, pending: list[_Pending], touches: dict[str, int], peers: Sequence[str]
    ) -> list[PutResult | KuraError | None]:
        """Writer thread: eviction for the batch, one version above every stored copy and
        tombstone of it, the staged files published, every row and its outbox messages in one
        transaction; replaced files unlinked once the group is durable. An inline blob whose
        row holds the same bytes intact already is not written (None)."""
        index = self._require_index()
        if touches:
            index.touch(touches)
        ids = [p.manifest.artifact_id for p in pending]
        existing = index.get_many(ids)
        # Room for the bytes the batch adds, not for every blob it was handed: one stored
        # intact already adds nothing, one that replaces a copy only the difference.
        evictions = self.stats.evictions_total
        self._evict_sync(_added_bytes(pending, existing), "")
        if self.stats.evictions_total != evictions:  # a row of the batch may have gone
            existing = index.get_many(ids)
        # The tombstone, or the purge of the writer when newer, per (namespace, writer).
        scopes = {(p.manifest.namespace_id, p.manifest.writer) for p in pending}
        covers = {scope: index.covered(*scope) for scope in scopes}
        version = self.versions.issue(
            self.clock.now_ms(),
            max((row[0].version_ms for row in existing.values()), default=None),
            max((t for t in covers.values() if t is not None), default=None),
        )
        results: list[PutResult | KuraError | None] = []
        rows: list[tuple[Manifest, bytes | None, str | None, str | None]] = []
        published: list[Path] = []
        olds: list[Manifest | None] = []
        try:
            for p in pending:
                manifest = dataclasses.replace(p.manifest, version_ms=version)
                row = existing.get(manifest.artifact_id)
                old = None if row is None else row[0]
                if row is not None and _same_inline(manifest, row[0], row[1]):
                    results.append(None)
                    continue
                outcome = decide_apply(
                    version,
                    None if old is None else old.version_ms,
                    covers[manifest.namespace_id, manifest.writer],
                    manifest.sha256,
                    "" if old is None else old.sha256,
                )
                self._count("local", outcome.value)
                if outcome is not ApplyOutcome.APPLIED:  # unreachable by the version rule
                    results.append(Unavailable(f"the write was not applied ({outcome.value})"))
                    continue
                sig = None
                if p.staged is not None:
                    sig = self.files.put(p.staged, manifest)
                    published.append(self.files.blob_path(manifest))
                rows.append((manifest, p.data if manifest.inline else None, sig, p.xxh3_128))
                olds.append(old)
                results.append(PutResult(manifest, old is None, outcome))
            if published:
                failpoint("storage.after_publish")  # files published, no row yet (crash tests)
            admitted = self.queues.admit_many(
                index.connection(), peers, self.clock.now_ms(), len(rows)
            )
            index.upsert_many(rows, self.clock.now_ms(), admitted)
        except BaseException:
            for path in published:
                path.unlink(missing_ok=True)  # never acknowledged
            raise
        for (manifest, _d, _s, _x), old in zip(rows, olds, strict=True):
            if old is not None and not old.inline and self.files.blob_path(old) not in published:
                self._writer.unlink_later(self.files.blob_path(old))
            self.stats.used_bytes += manifest.size - (0 if old is None else old.size)
            if old is None:
                self.stats.artifacts += 1
        self.hot.invalidate([m.artifact_id for m, *_ in rows], replaced=any(olds))
        self.queues.enqueued(admitted)
        return results


def _added_bytes(
    pending: Sequence[_Pending],
    existing: dict[str, tuple[Manifest, bytes | None, str | None, str | None]],
) -> int:
    """The bytes ``pending`` adds to the store over the ``existing`` rows (may be negative)."""
    added = 0
    for p in pending:
        row = existing.get(p.manifest.artifact_id)
        if row is None:
            added += p.manifest.size
        elif not _same_inline(p.manifest, row[0], row[1]):
            added += p.manifest.size - row[0].size
    return added


def _same_inline(new: Manifest, stored: Manifest, body: bytes | None) -> bool:
    """Whether ``stored`` (with its inline ``body``) already holds ``new``'s bytes, intact."""
    return (
        new.inline
        and stored.inline
        and (stored.size, stored.sha256) == (new.size, new.sha256)
        and problem_with_bytes(body, stored) is None
    )


def _write_durably(path: Path, data: bytes) -> str:
    """Sync pool: ``data`` written to the new file ``path`` and fsynced; its XXH3-128 (hex).
    The file is removed on any failure; a full tmp disk raises ``ResourceExhausted``."""
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException as exc:
        path.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise ResourceExhausted("insufficient free disk space in the tmp dir") from exc
        raise
    return xxh3_128_hex(data)
