"""The read path of ``CacheService``: look-ups, verified reads (hot cache, inline bodies, blob
files), the "stored and intact" check, and the one place a damaged entry is quarantined.

Stored bytes are checked against the recorded size and SHA-256 before they are served: the
size on every open, small blobs (up to ``SMALL_BLOB_BYTES``) by hash on every read, large ones
by a hash computed while they are sent (``verify_reads="always"``) or, with
``verify_reads="changed"``, only when the file's stat signature changed. A mismatch seen on a
reader thread may be a race with a write of the same key, so the verdict is the writer
thread's (``_confirm_corrupt_sync``). A local miss is offered to the mesh once
(``StorageHooks.fetch_missing``, read-through).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO

from kura.core.errors import NotFound
from kura.core.manifest import Manifest
from kura.storage.artifact import ArtifactRef, StoredBody
from kura.storage.blobs import blob_name, stat_signature
from kura.storage.checksum import SHA256, XXH3_128
from kura.storage.state import SMALL_BLOB_BYTES, StorageState
from kura.storage.verify import digest_fd, problem_with_bytes, problem_with_file

log = logging.getLogger(__name__)


class ReadPath(StorageState):
    """Reads, verification and quarantine (module docstring)."""

    async def exists(self, ref: ArtifactRef) -> bool:
        return await self._in(self._reader, self._require_index().exists, self.artifact_id(ref))

    async def missing(
        self, refs: Sequence[ArtifactRef], sizes: Sequence[int] | None = None
    ) -> list[ArtifactRef]:
        """The refs of ``refs`` with no stored version, in order: one index look-up and a
        ``stat`` of each blob file (no body read; a row whose file is gone or cut short is
        quarantined and missing, ``_present_sync``), then, like ``read``, a fetch from peers (``StorageHooks.fetch_missing``,
        read-through) of each absent one, stopping at the first that cannot be had (so a miss
        may list only one).
        ``sizes`` (bytes, one per ref) asks for the ref stored with that size: one stored with
        another size is missing too, and not asked of peers (a content digest names one size:
        REAPI's ``Digest`` is hash and size, so a blob of size N is not the digest's blob of
        size M).
        The stored ones are touched like a read (LRU), so the blobs a hit references age with
        it."""
        ids = [self.artifact_id(r) for r in refs]
        stored = await self._in(self._reader, self._present_sync, ids)
        wrong_size = {
            i
            for i, (aid, size) in enumerate(zip(ids, sizes or (), strict=sizes is not None))
            if aid in stored and stored[aid] != size
        }
        now = self.clock.now_ms()
        for i, aid in enumerate(ids):
            if aid in stored and i not in wrong_size:
                self._touches[aid] = now
        absent = [i for i, aid in enumerate(ids) if aid not in stored]
        for n, i in enumerate(absent):
            if await self.hooks.fetch_missing(ids[i], refs[i].namespace_id) is False:
                wrong_size.update(absent[n:])
                break
        return [refs[i] for i in sorted(wrong_size)]

    def _present_sync(self, ids: Sequence[str]) -> dict[str, int]:
        """Reader thread: ``artifact_id -> size`` of the ids stored with their body in place.
        A row whose blob file is gone or has another size (removed or cut behind the node's
        back) is not present: it is quarantined like any damaged entry, so an entry naming it
        reads as a miss (field report B29) until it is stored again. One ``stat`` per file;
        no body is read."""
        index = self._require_index()
        present: dict[str, int] = {}
        for aid, (size, version_ms, sha256, inline) in index.stored_bodies(ids).items():
            if not inline:
                path = self.files.bucket(aid) / blob_name(aid, version_ms, sha256)
                try:
                    on_disk = os.stat(path).st_size
                except FileNotFoundError:
                    on_disk = -1
                if on_disk != size:
                    row = index.get(aid)
                    if row is not None and row[0].version_ms == version_ms:
                        self._writer.submit(self._confirm_corrupt_sync, row[0], "read").result()
                    continue
            present[aid] = size
        return present

    def note_access(self, accesses: dict[str, int]) -> None:
        """Record reads made elsewhere (a worker process's hits, ``kura.workers``): artifact id
        -> unix ms, kept if later than what is noted; flushed with this node's own reads."""
        for aid, at_ms in accesses.items():
            if at_ms > self._touches.get(aid, 0):
                self._touches[aid] = at_ms

    async def intact(self, ref: ArtifactRef, size_bytes: int | None = None) -> bool:
        """Stored and intact: what a PUT route that skips existing keys must ask instead of
        ``exists``, so a PUT over a damaged copy (quarantined here) stores the new body.
        ``size_bytes``: and stored with that size (a content digest's size, as in ``missing``);
        one stored with another size reads False and is left alone. When intact, the hooks hear
        that it was sent again (``StorageHooks.sent_again``: the bucket's copy is checked)."""
        aid = self.artifact_id(ref)
        found = await self.verify_stored(aid, detected_by="put", size_bytes=size_bytes)
        if found:
            self.hooks.sent_again(aid)
        return found

    async def read(self, ref: ArtifactRef) -> StoredBody:
        """The artifact, or ``NotFound`` (absent, evicted, or failed verification). Small ones
        are verified; a large one may carry ``verified=False``, to be hashed while sent."""
        aid = self.artifact_id(ref)
        body = await self._read_cached(aid)
        if body is None:
            fetched = await self.hooks.fetch_missing(aid, ref.namespace_id)
            if isinstance(fetched, StoredBody):
                body = fetched  # verified, in memory, being stored (mesh.read_through)
            elif fetched:
                body = await self._read_cached(aid)
        if body is None:
            raise NotFound("Artifact not found")
        self._touches[aid] = self.clock.now_ms()
        return body

    async def _read_cached(self, aid: str) -> StoredBody | None:
        """The hot cache first (no thread hop); on a miss, a verified read that fills it."""
        hit = self.hot.get(aid)
        if hit is not None:
            return StoredBody(hit[0], data=hit[1])
        generation = self.hot.generation
        body = await self._in(self._reader, self._read_sync, aid)
        if body is not None and body.data is not None:
            self.hot.put(body.manifest, body.data, generation)
        return body

    async def read_by_id(self, aid: str, *, hashed: bool = False) -> StoredBody:
        """Like ``read`` but by artifact id (peers address artifacts by id). ``hashed=True``
        hashes an unverified large blob before returning it, for senders that cannot verify
        while sending (the shipper); damage found then is quarantined and raises NotFound."""
        body = await self._read_cached(aid)
        if body is not None and hashed and not body.verified:
            body = await self._in(self._reader, self._hash_body_sync, body)
        if body is None:
            raise NotFound("Artifact not found")
        return body

    def _hash_body_sync(self, body: StoredBody) -> StoredBody | None:
        assert body.file is not None
        want = (XXH3_128, body.xxh3_128) if body.xxh3_128 else (SHA256, body.manifest.sha256)
        d = digest_fd(os.dup(body.file.fileno()), body.manifest.size, 0, want[:1])
        if d.size_bytes == body.manifest.size and d.digests[want[0]] == want[1]:
            body.verified = True
            return body
        body.close()
        self._writer.submit(self._confirm_corrupt_sync, body.manifest, "read").result()
        return None

    async def read_manifest(self, aid: str) -> Manifest | None:
        row = await self._in(self._reader, self._require_index().get, aid)
        return None if row is None else row[0]

    def _read_sync(self, aid: str) -> StoredBody | None:
        """Reader thread: the artifact verified against its manifest, or None.

        A mismatch seen here may be a race with a write of the same key (the writer renames
        the new file, then updates the row), so the verdict is left to the writer thread, where
        file and row are consistent: it re-checks, and drops the entry only if it is really
        corrupt. A race just means "look again".
        """
        index = self._require_index()
        for _attempt in range(5):
            row = index.get(aid)
            if row is None:
                return None
            manifest, inline_body, sig, xxh3 = row
            if manifest.inline:
                if problem_with_bytes(inline_body, manifest) is None:
                    return StoredBody(manifest, data=inline_body)
            else:
                body = self._open_verified(manifest, sig, xxh3)
                if body is not None:
                    return body
            if self._writer.submit(self._confirm_corrupt_sync, manifest, "read").result():
                return None
        return None

    def _open_verified(
        self, manifest: Manifest, sig: str | None, xxh3: str | None = None
    ) -> StoredBody | None:
        """The blob file if its size matches ``manifest`` and, for small blobs, its hash (else
        None). A large one whose stat signature is the recorded one is returned unhashed
        (``verified=False``: hashed while sent) unless ``verify_reads == "changed"``, which
        trusts the signature; with another signature it is hashed here first."""
        try:
            f = self.files.open_blob(manifest)
        except FileNotFoundError:
            return None
        st = os.fstat(f.fileno())
        if st.st_size != manifest.size:
            f.close()
            return None
        if manifest.size <= SMALL_BLOB_BYTES:
            data = f.read()
            f.close()
            if problem_with_bytes(data, manifest) is None:
                return StoredBody(manifest, data=data)
            return None
        if stat_signature(st) == sig:
            # The very file the row was committed with; "always" still hashes it while sending.
            return StoredBody(
                manifest, file=f, verified=self.verify_reads == "changed", xxh3_128=xxh3
            )
        # Changed since last verified, or a reader that raced a write opened the next version's
        # file: hash it now, so a race is told apart from damage (by the writer) before sending.
        if _sha256_fileobj(f) == manifest.sha256:
            f.seek(0)
            self._writer.submit(
                self._require_index().set_stat_sig, manifest.artifact_id, stat_signature(st)
            ).result()
            return StoredBody(manifest, file=f)
        f.close()
        return None

    def _blob_path(self, manifest: Manifest) -> Path:
        """The one place the integrity checks map a manifest to its blob file."""
        return self.files.blob_path(manifest)

    def record_xxh3_128(self, found: Sequence[tuple[Manifest, str]]) -> None:
        """Senders verified rows without a checksum with SHA-256 and computed each one's
        XXH3-128 in the same pass: record ``(manifest, xxh3_128)`` pairs (one writer-thread
        task, not waited for; best effort) so the next read of that version checks the fast
        one (``MetadataIndex.set_xxh3_128``)."""
        index = self._require_index()
        with contextlib.suppress(RuntimeError):  # the writer pool is shutting down
            self._writer.submit(index.set_xxh3_128, list(found))

    async def report_corrupt(self, manifest: Manifest, detected_by: str) -> bool:
        """A sender found ``manifest``'s bytes damaged: re-check them on the writer thread and
        quarantine the entry if they really are. True if it was quarantined."""
        return await self._in(self._writer, self._confirm_corrupt_sync, manifest, detected_by)

    async def verify_stored(
        self,
        artifact_id: str,
        *,
        detected_by: str,
        pace: Callable[[int], None] | None = None,
        executor: ThreadPoolExecutor | None = None,
        size_bytes: int | None = None,
    ) -> bool:
        """True if the artifact is stored and intact (size and SHA-256 match its manifest).

        A damaged entry is quarantined (counted under ``detected_by``: "put", "scrub") and
        reads False, like an absent one. ``pace(n)`` is called per chunk hashed (rate limits);
        it runs on ``executor`` (default: the reader pool). ``size_bytes``: False, without a
        read, when the stored artifact has another size. Safe to call concurrently.
        """
        return await self._in(
            executor or self._reader,
            self._verify_stored_sync,
            artifact_id,
            detected_by,
            pace,
            size_bytes,
        )

    def _verify_stored_sync(
        self,
        aid: str,
        detected_by: str,
        pace: Callable[[int], None] | None,
        size_bytes: int | None = None,
    ) -> bool:
        index = self._require_index()
        for _attempt in range(5):
            row = index.get(aid)
            if row is None:
                return False
            manifest, inline_body = row[0], row[1]
            if size_bytes is not None and manifest.size != size_bytes:
                return False
            if manifest.inline:
                problem = problem_with_bytes(inline_body, manifest)
                if pace is not None:
                    pace(manifest.size)
            else:
                problem = problem_with_file(self._blob_path(manifest), manifest, pace)
            if problem is None:
                return True
            if self._writer.submit(self._confirm_corrupt_sync, manifest, detected_by).result():
                return False
        return False

    def _confirm_corrupt_sync(self, manifest: Manifest, detected_by: str) -> bool:
        """Writer thread (no commit runs concurrently): if ``manifest`` is still the stored
        version and its bytes still do not match it, quarantine the entry and return True.
        False means the caller raced a write and should look again.

        This is the one place an entry is dropped for damage: the file (or inline body) moves to
        the quarantine, the row goes, the hot cache and disk accounting follow, a WARNING names
        what was expected and what was found, and ``on_quarantine`` is told.
        """
        index = self._require_index()
        current = index.get(manifest.artifact_id)
        if current is None or current[0] != manifest:
            return False
        path = None if manifest.inline else self._blob_path(manifest)
        if path is None:
            problem = problem_with_bytes(current[1], manifest)
        else:
            problem = problem_with_file(path, manifest)
        if problem is None:
            return False
        if index.read_only:  # cannot drop it now: a miss, until a restart reconciles
            return True
        log.warning(
            "quarantined artifact %s (producer %s, namespace %r, key %r): expected %d bytes "
            "with sha256 %s, but %s (detected by %s)",
            manifest.artifact_id,
            manifest.producer,
            manifest.namespace_id,
            manifest.key,
            manifest.size,
            manifest.sha256,
            problem,
            detected_by,
        )
        index.delete([manifest.artifact_id])
        self.hot.invalidate([manifest.artifact_id])
        try:
            self.quarantine.admit(
                manifest,
                blob=path,
                inline_body=current[1] if path is None else None,
                found=problem,
                detected_by=detected_by,
                now_ms=self.clock.now_ms(),
            )
        except OSError:
            log.exception("could not quarantine %s; removing it", manifest.artifact_id)
            if path is not None:
                path.unlink(missing_ok=True)
        by = self.stats.corrupt_total
        by[detected_by] = by.get(detected_by, 0) + 1
        self.stats.used_bytes -= manifest.size
        self.stats.artifacts -= 1
        try:
            self._on_quarantine(manifest.artifact_id)
        except Exception:
            log.exception("on_quarantine hook failed for %s", manifest.artifact_id)
        return True

    async def read_many(self, aids: Sequence[str]) -> list[StoredBody | None]:
        """``read_by_id`` for many ids in one reader-thread call, without the hot cache: each
        body verified as ``_read_sync`` does, None when absent or damaged. The caller closes
        every ``file`` body."""
        return await self._in(self._reader, lambda: [self._read_sync(a) for a in aids])


def _sha256_fileobj(f: BinaryIO) -> str:
    h = hashlib.sha256()
    while chunk := f.read(1024 * 1024):
        h.update(chunk)
    return h.hexdigest()
