"""The write path of ``CacheService``: size and free-space checks, staging a body under a
reservation from the tmp budget, and the commit that publishes it.

A write is visible only once whole: its body is staged in the tmp dir, fsynced, renamed into
place beside any older version (``BlobStore.put``) and then recorded in the index with its
outbox messages in one transaction; only then is the older version's file unlinked. A small
body (at most ``inline_max_bytes``, ``storage.small_body``) is read into memory instead and
recorded in the index row itself, in the same one transaction: no file, no tmp-budget
reservation, and its group's WAL fsync (``storage.group_commit``) is its only fsync. A body
declared at ``OFFLOAD_MIN_BYTES`` or more is written and hashed in the sync pool, a block at a
time, while the event loop receives the next block (``storage.offload``). A local
write's version is issued on the writer thread above the stored copy's and the namespace
tombstone's, so an acknowledged local write always wins. A failed or rejected write leaves no
blob, no index row and no reserved bytes. Eviction makes room first (``storage.eviction``).
A namespace clean (``delete_namespace``) is a write too: a tombstone and the deletion of every
artifact under it, in one transaction with its outbox messages. So is a purge of one writer's
entries of a namespace (``purge_writer``, provenance): the same clean, of that writer's rows
only, recorded as a purge whose version then rules that writer's copies there as a tombstone
does (``MetadataIndex.covered``).
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path

from kit.failpoint import failpoint
from kura.core.errors import InsufficientStorage, PayloadTooLarge, Unavailable
from kura.core.manifest import Manifest
from kura.core.version import ApplyOutcome
from kura.storage import provenance
from kura.storage.artifact import ArtifactRef, Purge, PutResult
from kura.storage.blobs import GROW_STEP_BYTES, Staged, concatenate, stage_body
from kura.storage.eviction import Eviction
from kura.storage.fsync import fsync_path
from kura.storage.offload import OFFLOAD_BLOCK_BYTES
from kura.storage.small_body import buffer_small, check_digest, fits_inline
from kura.storage.state import decide as _decide

log = logging.getLogger(__name__)

# A declared body of at least this many bytes is staged off the event loop (``put_stream``).
OFFLOAD_MIN_BYTES = 2 * OFFLOAD_BLOCK_BYTES


class WritePath(Eviction):
    """Local writes (module docstring)."""

    # -- writes ------------------------------------------------------------------------------

    def check_size(self, declared_length: int | None, limit_bytes: int) -> None:
        """Reject a declared body before reading it: over the route limit, over the disk budget,
        or more than the free disk space allows. Raises PayloadTooLarge / ResourceExhausted."""
        if declared_length is None:
            return
        self._check_limits(declared_length, limit_bytes)
        self._check_free_disk(declared_length)

    def _check_limits(self, declared_length: int, limit_bytes: int) -> None:
        """``check_size`` without the free-space check (a batch checks that once for all)."""
        if declared_length > limit_bytes:
            raise PayloadTooLarge(
                f"body of {declared_length} bytes exceeds this route's limit of {limit_bytes} bytes",
                limit_bytes,
            )
        if declared_length > self.max_disk_bytes:
            raise InsufficientStorage(
                f"body of {declared_length} bytes exceeds the node's disk budget "
                f"({self.max_disk_bytes} bytes)"
            )

    async def put_stream(
        self,
        ref: ArtifactRef | Callable[[str], ArtifactRef],
        body: AsyncIterator[bytes],
        *,
        declared_length: int | None,
        limit_bytes: int,
        content_type: str,
        headers: dict[str, str] | None = None,
        expected_sha256: str | None = None,
    ) -> PutResult:
        """Store a streamed body as a new local version of ``ref``.

        Raises (leaving nothing behind): PayloadTooLarge, ResourceExhausted (tmp budget, disk),
        IncompleteBody, DigestMismatch, InvalidRequest, and whatever ``body`` raises.
        ``ref`` may be a function of the body's SHA-256 (hex), called once it is known: a
        content-addressed write whose digest the writer learns only from the bytes.
        A small body (``storage.small_body``) is stored inline in its index row, unstaged.
        """
        self.check_size(declared_length, limit_bytes)
        if fits_inline(self.inline_max_bytes, declared_length):
            got = await buffer_small(
                body,
                self.inline_max_bytes,
                limit_bytes=limit_bytes,
                declared_length=declared_length,
            )
            if isinstance(got, bytes):
                return await self._put_small(
                    ref, got, limit_bytes, content_type, headers, expected_sha256
                )
            body = got  # grew past the threshold: staged like any large body
        if declared_length is not None:
            reservation = self.budget.try_reserve(max(declared_length, 1))
        else:  # one step if it fits now, else only what arrives (stage_body grows it)
            step = min(GROW_STEP_BYTES, limit_bytes, self.budget.capacity_bytes)
            reservation = self.budget.try_reserve_up_to(max(step, 1))
        # A large body is written and hashed in the sync pool, a block at a time, while the
        # loop receives the next block (``storage.offload``); a small one costs no thread hop.
        large = declared_length is not None and declared_length >= OFFLOAD_MIN_BYTES
        with reservation:
            staged = await stage_body(
                body,
                self.files.new_staging_path("uploads"),
                reservation,
                limit_bytes=limit_bytes,
                declared_length=declared_length,
                expected_sha256=expected_sha256,
                offload=self._syncer if large else None,
            )
            return await self._commit_staged(ref, staged, content_type, headers or {})

    def stages(self, declared_length: int | None) -> bool:
        """Whether ``put_stream`` stages a body of ``declared_length`` in the tmp dir (so needs
        room in the tmp budget) rather than storing it inline."""
        return not (
            declared_length is not None and fits_inline(self.inline_max_bytes, declared_length)
        )

    async def _put_small(
        self,
        ref: ArtifactRef | Callable[[str], ArtifactRef],
        data: bytes,
        limit_bytes: int,
        content_type: str,
        headers: dict[str, str] | None,
        expected_sha256: str | None,
    ) -> PutResult:
        """Store a fully read small body inline: digest checked first (nothing stored on a
        mismatch), then the size checks on its real length (a chunked body had none)."""
        sha256 = check_digest(data, expected_sha256)
        self.check_size(len(data), limit_bytes)
        ref = _named(ref, sha256)
        aid = self.artifact_id(ref)
        manifest = self._new_manifest(
            ref, aid, len(data), sha256, content_type, headers or {}, inline=True
        )
        return await self._commit(manifest, None, data, source="local")

    async def put_concatenated(
        self, ref: ArtifactRef, parts: Sequence[Path], content_type: str
    ) -> PutResult:
        """Store the concatenation of ``parts`` (multipart completion). Parts are left in place.
        Waits for start-up's reconciliation first (``_writes_open``): it would remove the
        concatenation, written under ``blobs/``, as a publish leftover."""
        await self._writes_open()
        total = sum(p.stat().st_size for p in parts)
        self.check_size(total, self.max_disk_bytes)
        incoming = self.files.blobs_dir / f"multipart.incoming-{os.urandom(8).hex()}"
        try:
            staged = await self._in(self._syncer, concatenate, parts, incoming)
            return await self._commit_staged(ref, staged, content_type, {}, fsynced=True)
        finally:
            incoming.unlink(missing_ok=True)

    async def put_inline(self, ref: ArtifactRef, data: bytes, content_type: str) -> PutResult:
        """Store a small body inside the index (key-value entries): ``_put_small``, the one
        inline write, under the largest inline row (``max_inline_bytes``). Raises (storing
        nothing) PayloadTooLarge above it, InsufficientStorage above the disk budget,
        ResourceExhausted without the free disk space."""
        return await self._put_small(ref, data, self.max_inline_bytes, content_type, {}, None)

    # -- namespace cleans --------------------------------------------------------------------------

    async def delete_namespace(
        self, namespace_id: str, version_ms: int | None = None, *, source: str = "local"
    ) -> int:
        """Tombstone ``namespace_id`` at ``version_ms`` (default: a new local version) and delete
        every artifact of it at or below that version. A local clean is enqueued for every
        replication target; a tombstone from a peer is not. Returns the tombstone version.

        A local clean's version is issued in the writer thread above every version of the
        namespace held here; a peer's tombstone too far ahead raises ``FutureVersion``."""
        await self._writes_open()
        self._check_writable()
        if source != "local" and version_ms is not None:
            self._admit(version_ms, source, f"tombstone of namespace {namespace_id!r}")
        peers: Sequence[str] = self._replication_targets() if source == "local" else ()
        applied, version = await self._in(
            self._writer, self._delete_namespace_sync, namespace_id, version_ms, peers
        )
        self._count(source + "_tombstone", "applied" if applied else "ignored_older")
        if applied and peers:
            self._outbox_written()
        if source == "local" and not applied:
            raise Unavailable("the clean was not applied (an equal tombstone exists); retry it")
        return version

    def _delete_namespace_sync(
        self, namespace_id: str, version_ms: int | None, peers: Sequence[str]
    ) -> tuple[bool, int]:
        index = self._require_index()
        if version_ms is None:
            version_ms = self.versions.issue(
                self.clock.now_ms(),
                index.max_version_ms(namespace_id),
                index.tombstone(namespace_id),
            )
        peers = self.queues.admit(index.connection(), peers, self.clock.now_ms())
        victims = index.apply_tombstone(namespace_id, version_ms, self.clock.now_ms(), peers)
        if victims is None:
            return False, version_ms
        self._drop_victims(victims)
        self.queues.enqueued(peers)
        return True, version_ms

    async def purge_writer(
        self,
        namespace_id: str,
        writer: str,
        version_ms: int | None = None,
        *,
        source: str = "local",
    ) -> Purge:
        """Delete every entry ``writer`` wrote in ``namespace_id`` at or below ``version_ms``
        (default: a new local version) and record the purge, in one transaction; a local purge
        is enqueued for every replication target (the peers, which apply the same purge, and
        the bucket, which deletes that writer's objects), a peer's for the bucket only: an
        upload of that writer's queued here before the purge arrived may have reached the
        bucket after the first node's bucket purge, and this node's queue drains in order, so
        its purge runs after that upload (a repeated bucket purge deletes nothing more). From
        then on a copy of that writer's in that namespace at or below the version is ignored,
        wherever it comes from (a replica in flight, a bootstrap page, anti-entropy, the
        bucket), as a namespace tombstone ignores older copies; a later write by the writer
        gets a newer version and is stored. LWW keeps one version per key: a key whose newest version was
        the writer's is a miss afterwards, even if another writer's older version existed.

        Returns the purge (its version, the entries and bytes deleted here); logged at INFO
        and counted (``StorageStats.writer_purges_total``). A local purge's version is issued
        above every version of the namespace held here; a peer's too far ahead raises
        ``FutureVersion``; a local purge not applied (an equal one exists) ``Unavailable``;
        a local purge of a new (namespace, writer) pair past the recorded purges' bounds
        (``provenance.check_room``) ``InsufficientStorage``; ``ResourceExhausted``
        while the index is read-only."""
        await self._writes_open()
        self._check_writable()
        if source != "local" and version_ms is not None:
            self._admit(version_ms, source, f"purge of {writer!r} in namespace {namespace_id!r}")
        local = source == "local"
        peers: Sequence[str] = self._replication_targets() if local else self._bucket_targets
        purge = await self._in(
            self._writer, self._purge_writer_sync, namespace_id, writer, version_ms, peers, local
        )
        if purge is None:
            self._count(source + "_purge", "ignored_older")
            if source == "local":
                raise Unavailable("the purge was not applied (an equal purge exists); retry it")
            return Purge(version_ms or 0, 0, 0)
        self._count(source + "_purge", "applied")
        self.stats.writer_purges_total[source] = self.stats.writer_purges_total.get(source, 0) + 1
        log.info(
            "purged writer %r in namespace %r at version %d: %d entries, %d bytes (source %s)",
            writer,
            namespace_id,
            purge.version_ms,
            purge.entries,
            purge.bytes,
            source,
        )
        if peers:
            self._outbox_written()
        return purge

    def _purge_writer_sync(
        self,
        namespace_id: str,
        writer: str,
        version_ms: int | None,
        peers: Sequence[str],
        local: bool,
    ) -> Purge | None:
        index = self._require_index()
        if local:
            provenance.check_room(index.purges, namespace_id, writer)
        if version_ms is None:
            version_ms = self.versions.issue(
                self.clock.now_ms(),
                index.max_version_ms(namespace_id),
                index.covered(namespace_id, writer),
            )
        peers = self.queues.admit(index.connection(), peers, self.clock.now_ms())
        victims = index.apply_purge(namespace_id, writer, version_ms, self.clock.now_ms(), peers)
        if victims is None:
            return None
        self._drop_victims(victims)
        self.queues.enqueued(peers)
        return Purge(version_ms, len(victims), sum(size for _aid, size, _inline in victims))

    def _drop_victims(self, victims: Sequence[tuple[str, int, bool]]) -> None:
        """Writer thread: what a clean deleted from the index, gone from the hot cache, the
        blob files (once durable) and the counters."""
        self.hot.invalidate([v[0] for v in victims])
        for aid, size, inline in victims:
            if not inline:
                self._unlink_artifact_later(aid)
            self.stats.used_bytes -= size
            self.stats.artifacts -= 1

    async def _commit_staged(
        self,
        ref: ArtifactRef | Callable[[str], ArtifactRef],
        staged: Staged,
        content_type: str,
        headers: dict[str, str],
        *,
        fsynced: bool = False,
    ) -> PutResult:
        try:
            if not fsynced:
                await self._in(self._syncer, fsync_path, staged.path)
            self._check_free_disk(0)
            ref = _named(ref, staged.sha256)
            aid = self.artifact_id(ref)
            manifest = self._new_manifest(
                ref, aid, staged.size, staged.sha256, content_type, headers
            )
            return await self._commit(
                manifest, staged.path, None, source="local", xxh3_128=staged.xxh3_128
            )
        finally:
            staged.path.unlink(missing_ok=True)

    async def _commit(
        self,
        manifest: Manifest,
        staged_path: Path | None,
        inline_body: bytes | None,
        *,
        source: str,
        xxh3_128: str | None = None,
        via: str = "",
    ) -> PutResult:
        await self._writes_open()  # start-up's reconciliation must not race the publish
        peers: Sequence[str] = self._artifact_targets() if source == "local" else ()
        self.queues.check_room(peers)  # a full object-tier upload queue refuses the write
        result = await self._in(
            self._writer,
            self._commit_sync,
            manifest,
            staged_path,
            inline_body,
            self._take_touches(),
            peers,
            source,
            xxh3_128,
            "" if source == "local" else via or source,
        )
        if peers and result.outcome is ApplyOutcome.APPLIED:
            self._outbox_written()
        if source == "local" and result.outcome is not ApplyOutcome.APPLIED:
            # The version rule makes this unreachable; a 2xx must never report a lost write.
            raise Unavailable(f"the write was not applied ({result.outcome.value}); retry it")
        return result

    def _new_manifest(
        self,
        ref: ArtifactRef,
        aid: str,
        size: int,
        sha256: str,
        content_type: str,
        headers: dict[str, str],
        *,
        inline: bool = False,
    ) -> Manifest:
        return Manifest(
            artifact_id=aid,
            producer=ref.producer,
            namespace_id=ref.namespace_id,
            key=ref.key,
            content_type=content_type,
            size=size,
            sha256=sha256,
            version_ms=0,  # issued by _commit_sync in the writer thread
            created_at_ms=self.clock.now_ms(),
            inline=inline,
            headers=headers,
            writer=ref.writer,
        )

    def _commit_sync(
        self,
        manifest: Manifest,
        staged_path: Path | None,
        inline_body: bytes | None,
        touches: dict[str, int],
        outbox_peers: Sequence[str],
        source: str,
        xxh3_128: str | None = None,
        via: str = "",
    ) -> PutResult:
        """Writer thread: LWW check, eviction, publish the file, record the row (with the
        file's XXH3-128 and how the copy came, ``via``: ``""`` for a local write) and the outbox
        messages in one transaction."""
        index = self._require_index()
        if touches:
            index.touch(touches)
        existing = index.get(manifest.artifact_id)
        if source == "local":
            version = self.versions.issue(
                self.clock.now_ms(),
                None if existing is None else existing[0].version_ms,
                index.covered(manifest.namespace_id, manifest.writer),
            )
            manifest = dataclasses.replace(manifest, version_ms=version)
        outcome = _decide(index, manifest, None if existing is None else existing[0])
        self._count(source, outcome.value)
        if outcome is not ApplyOutcome.APPLIED:
            return PutResult(existing[0] if existing else manifest, False, outcome)
        old_size = 0 if existing is None else existing[0].size
        self._evict_sync(manifest.size - old_size, manifest.artifact_id)
        sig = None
        # New version's file beside the old one, commit, and only then unlink the old file: a
        # crash anywhere leaves the acknowledged version whole (start-up reconciles the rest).
        old = None if existing is None or existing[0].inline else self.files.blob_path(existing[0])
        new = None if staged_path is None else self.files.blob_path(manifest)
        if staged_path is not None:
            sig = self.files.put(staged_path, manifest)
            failpoint("storage.after_publish")
        outbox_peers = self.queues.admit(index.connection(), outbox_peers, self.clock.now_ms())
        # A bootstrap copy counts as last used when the bootstrap began: never used here, and
        # equal stamps leave LRU to evict the oldest versions first once the bootstrap is over.
        floor = self._eviction_floor_ms()
        stamp_ms = floor if source == "bootstrap" and floor is not None else self.clock.now_ms()
        try:
            index.upsert(
                manifest,
                inline_body,
                sig,
                stamp_ms,
                outbox_peers,
                xxh3_128=xxh3_128,
                via=via,
            )
        except BaseException:
            if new is not None and new != old:
                new.unlink(missing_ok=True)  # never acknowledged
            raise
        failpoint("storage.after_commit")
        if old is not None and old != new:
            self._writer.unlink_later(old)  # once durable; a reader with it open keeps its bytes
        # After the row and the file changed: a read that began earlier cannot re-insert old bytes.
        self.hot.invalidate([manifest.artifact_id], replaced=existing is not None)
        self.queues.enqueued(outbox_peers)
        self.stats.used_bytes += manifest.size - old_size
        if existing is None:
            self.stats.artifacts += 1
        return PutResult(manifest, existing is None, outcome)


def _named(ref: ArtifactRef | Callable[[str], ArtifactRef], sha256: str) -> ArtifactRef:
    return ref if isinstance(ref, ArtifactRef) else ref(sha256)
