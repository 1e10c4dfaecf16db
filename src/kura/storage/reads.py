"""The read path, ``ArtifactReads``: look-ups, verified reads (hot cache, inline bodies, blob
files) and the "stored and intact" check. One object, composed by the primary's store
(``CacheService``) and by a worker's reader (``storage.worker_reads``) over the pieces each
shares with it (index, files, hot cache, executors); neither inherits it.

Stored bytes are checked against the recorded size and SHA-256 before they are served: the
size on every open, small blobs (up to ``SMALL_BLOB_BYTES``) by hash on every read, large ones
by a hash computed while they are sent (``verify_reads="always"``) or, with
``verify_reads="changed"``, only when the file's stat signature changed. A mismatch seen on a
reader thread may be a race with a write of the same key, so the verdict is the writer
thread's (``damaged``: the store's ``Eviction._confirm_corrupt_sync`` is the one place an
entry is dropped for damage). A miss is a miss: whether the bucket or a peer has it is asked
by the wrappers the composition root stacks on this reader (``storage.fill.FillingReader``).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from pathlib import Path
from typing import BinaryIO, TypeVar

from kit.clock import Clock
from kura.core.errors import NotFound
from kura.core.keys import artifact_id
from kura.core.manifest import Manifest
from kura.storage.artifact import ArtifactRef, StoredBody
from kura.storage.blobs import BlobFiles, blob_name, stat_signature
from kura.storage.checksum import SHA256, XXH3_128
from kura.storage.hotcache import HotCache
from kura.storage.index import MetadataIndex
from kura.storage.state import SMALL_BLOB_BYTES, AccessTimes
from kura.storage.verify import ReadVerifier, digest_fd, problem_with_bytes, problem_with_file

log = logging.getLogger(__name__)

T = TypeVar("T")
Row = tuple[Manifest, bytes | None, str | None, str | None]  # MetadataIndex.get's


async def always_open() -> None:
    """Reads are always open (a worker's reader: its index passed its check before)."""


class ArtifactReads:
    """Reads and verification (module docstring): an ``ArtifactReader`` over the pieces it
    shares with the rest of a store. ``index`` returns the opened index (a ``RuntimeError``
    before it is); ``reader`` is the pool of SQLite reads and file opens; ``writer`` is the one
    thread that gives verdicts on damage, ``damaged(manifest, detected_by)``: True if the
    entry now reads as a miss (the primary quarantines it, ``Eviction._confirm_corrupt_sync``;
    a worker queues it for the primary), False if the caller raced a write and should look
    again. ``accesses`` takes the hits (LRU), those of ``exists`` too when ``note_exists``;
    ``record_checksums`` takes the XXH3-128 senders computed (``record_xxh3_128``);
    ``sent_again(artifact_id)`` hears of bodies sent again (``intact``); ``reads_open()`` is
    awaited on the event loop before any work goes to ``reader`` (the primary's waits for
    start-up's index check, ``StartupWork.wait_readable``; it raises ``Unavailable``)."""

    def __init__(
        self,
        *,
        index: Callable[[], MetadataIndex],
        files: BlobFiles,
        hot: HotCache,
        verifier: ReadVerifier,
        verify_reads: str,
        tenant_id: str,
        clock: Clock,
        reader: Executor,
        writer: Executor,
        damaged: Callable[[Manifest, str], bool],
        accesses: AccessTimes,
        record_checksums: Callable[[list[tuple[Manifest, str]]], None],
        sent_again: Callable[[str], None] = lambda artifact_id: None,
        note_exists: bool = False,
        reads_open: Callable[[], Awaitable[None]] = always_open,
    ) -> None:
        self._index = index
        self._reads_open = reads_open
        self.files = files
        self.hot = hot
        self.verifier = verifier
        self.verify_reads = verify_reads
        self.tenant_id = tenant_id
        self.clock = clock
        self._reader = reader
        self._writer = writer
        self._damaged = damaged
        self.accesses = accesses
        self._record_checksums = record_checksums
        self._sent_again = sent_again
        self._note_exists = note_exists

    def artifact_id(self, ref: ArtifactRef) -> str:
        return artifact_id(ref.producer, self.tenant_id, ref.namespace_id, ref.key)

    async def _in(self, pool: Executor, fn: Callable[..., T], *args: object) -> T:
        if pool is self._reader:  # start-up's index check: wait here, not in a reader thread
            await self._reads_open()
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    async def exists(self, ref: ArtifactRef) -> bool:
        aid = self.artifact_id(ref)
        found = await self._in(self._reader, self._index().exists, aid)
        if found and self._note_exists:
            self.accesses.note(aid, self.clock.now_ms())
        return found

    def record_xxh3_128(self, found: Sequence[tuple[Manifest, str]]) -> None:
        """Checksums senders computed while verifying rows that had none: ``record_checksums``
        (best effort)."""
        self._record_checksums(list(found))

    async def missing(
        self, refs: Sequence[ArtifactRef], sizes: Sequence[int] | None = None
    ) -> list[ArtifactRef]:
        """The refs of ``refs`` with no stored version, in order: one index look-up and a
        ``stat`` of each blob file (no body read; a row whose file is gone or cut short is
        quarantined and missing, ``_present_sync``).
        ``sizes`` (bytes, one per ref) asks for the ref stored with that size: one stored with
        another size is missing too (a content digest names one size:
        REAPI's ``Digest`` is hash and size, so a blob of size N is not the digest's blob of
        size M).
        The stored ones are touched like a read (LRU), so the blobs a hit references age with
        it, and promised (``AccessTimes.promise``): the caller tells its client they exist, so
        they stay for ``KURA_MIN_RETENTION`` while the disk budget allows
        (``storage.retention``)."""
        ids = [self.artifact_id(r) for r in refs]
        stored = await self._in(self._reader, self._present_sync, ids)
        wrong_size = {
            i
            for i, (aid, size) in enumerate(zip(ids, sizes or (), strict=sizes is not None))
            if aid in stored and stored[aid] != size
        }
        told = (aid for i, aid in enumerate(ids) if aid in stored and i not in wrong_size)
        self.accesses.promise(told, self.clock.now_ms())
        return [r for i, r in enumerate(refs) if i in wrong_size or ids[i] not in stored]

    def _present_sync(self, ids: Sequence[str]) -> dict[str, int]:
        """Reader thread: ``artifact_id -> size`` of the ids stored with their body in place.
        A row whose blob file is gone or has another size (removed or cut behind the node's
        back) is not present: it is quarantined like any damaged entry, so an entry naming it
        reads as a miss (field report B29) until it is stored again. One ``stat`` per file;
        no body is read."""
        index = self._index()
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
                        self._writer.submit(self._damaged, row[0], "read").result()
                    continue
            present[aid] = size
        return present

    def note_access(self, accesses: dict[str, int]) -> None:
        """Record reads made elsewhere (a worker process's hits, ``kura.workers``): artifact id
        -> unix ms, kept if later than what is noted; flushed with this node's own reads."""
        self.accesses.merge(accesses)

    async def intact(self, ref: ArtifactRef, size_bytes: int | None = None) -> bool:
        """Stored and intact: what a PUT route that skips existing keys must ask instead of
        ``exists``, so a PUT over a damaged copy (quarantined here) stores the new body.
        ``size_bytes``: and stored with that size (a content digest's size, as in ``missing``);
        one stored with another size reads False and is left alone. When intact, ``sent_again``
        hears of it (the object-storage tier checks the bucket's copy, ``storage.bucket_heal``)."""
        aid = self.artifact_id(ref)
        found = await self.verify_stored(aid, detected_by="put", size_bytes=size_bytes)
        if found:
            self._sent_again(aid)
        return found

    async def intact_many(self, refs: Sequence[ArtifactRef], sizes: Sequence[int]) -> list[bool]:
        """``intact`` for many refs (each with its size in bytes), in order, in one reader-thread
        call and one index statement per 500 refs: a batch write's "already stored" check."""
        ids = [self.artifact_id(r) for r in refs]
        found = await self._in(self._reader, self._intact_many_sync, ids, list(sizes))
        for aid, ok in zip(ids, found, strict=True):
            if ok:
                self._sent_again(aid)
        return found

    def _intact_many_sync(self, ids: Sequence[str], sizes: Sequence[int]) -> list[bool]:
        rows = self._index().get_many(ids)
        intact: list[bool] = []
        for aid, size in zip(ids, sizes, strict=True):
            row = rows.get(aid)
            if row is None or row[0].size != size:
                intact.append(False)
                continue
            manifest = row[0]
            if manifest.inline:
                problem = problem_with_bytes(row[1], manifest)
            else:
                problem = problem_with_file(self._blob_path(manifest), manifest, None)
            # A problem may be a race with a write: the one-by-one check asks the writer.
            intact.append(problem is None or self._verify_stored_sync(aid, "put", None, size))
        return intact

    async def read(self, ref: ArtifactRef) -> StoredBody:
        """The artifact, or ``NotFound`` (absent, evicted, or failed verification). Small ones
        are verified; a large one may carry ``verified=False``, to be hashed while sent."""
        aid = self.artifact_id(ref)
        # The hot cache first, without a coroutine or a thread hop (most small reads, per
        # request); on a miss, a verified read that fills it.
        body = self._hot_body(aid) or await self._read_cold(aid)
        if body is None:
            raise NotFound("Artifact not found")
        self.accesses.note(aid, self.clock.now_ms())
        return body

    def _hot_body(self, aid: str) -> StoredBody | None:
        hit = self.hot.get(aid)
        return None if hit is None else StoredBody(hit[0], data=hit[1])

    async def _read_cold(self, aid: str) -> StoredBody | None:
        """A verified read in the read pool, filling the hot cache (a hot-cache miss of
        ``read`` and ``read_by_id``)."""
        generation = self.hot.generation
        body = await self._in(self._reader, self._read_sync, aid)
        if body is not None and body.data is not None:
            self.hot.put(body.manifest, body.data, generation)
        return body

    async def read_by_id(self, aid: str, *, hashed: bool = False) -> StoredBody:
        """Like ``read`` but by artifact id (peers address artifacts by id). ``hashed=True``
        hashes an unverified large blob before returning it, for senders that cannot verify
        while sending (the shipper); damage found then is quarantined and raises NotFound."""
        body = self._hot_body(aid) or await self._read_cold(aid)
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
        self._writer.submit(self._damaged, body.manifest, "read").result()
        return None

    async def read_manifest(self, aid: str) -> Manifest | None:
        row = await self._in(self._reader, self._index().get, aid)
        return None if row is None else row[0]

    def _read_sync(
        self, aid: str, row: Row | None = None, *, looked_up: bool = False
    ) -> StoredBody | None:
        """Reader thread: the artifact verified against its manifest, or None. ``looked_up``:
        ``row`` is its index row (None: absent) just read by the caller, so the first attempt
        does not read it again.

        A mismatch seen here may be a race with a write of the same key (the writer renames
        the new file, then updates the row), so the verdict is left to the writer thread, where
        file and row are consistent: it re-checks, and drops the entry only if it is really
        corrupt. A race just means "look again".
        """
        index = self._index()
        for attempt in range(5):
            if attempt or not looked_up:
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
            if self._writer.submit(self._damaged, manifest, "read").result():
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
                self._index().set_stat_sig, manifest.artifact_id, stat_signature(st)
            ).result()
            return StoredBody(manifest, file=f)
        f.close()
        return None

    def _blob_path(self, manifest: Manifest) -> Path:
        """The one place the integrity checks map a manifest to its blob file."""
        return self.files.blob_path(manifest)

    async def report_corrupt(self, manifest: Manifest, detected_by: str) -> bool:
        """A sender found ``manifest``'s bytes damaged: re-check them on the writer thread and
        quarantine the entry if they really are. True if it was quarantined."""
        return await self._in(self._writer, self._damaged, manifest, detected_by)

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
        index = self._index()
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
            if self._writer.submit(self._damaged, manifest, detected_by).result():
                return False
        return False

    async def read_many(
        self, aids: Sequence[str], *, as_reads: bool = False
    ) -> list[StoredBody | None]:
        """``read_by_id`` for many ids, in order, in one reader-thread call and one index
        statement per 500 ids (``MetadataIndex.get_many``): each body verified as
        ``_read_sync`` does, None when absent or damaged. The caller closes every ``file``
        body. Without ``as_reads``, the hot cache is not used and nothing is noted (peers,
        the shipper, the scrub); with it, each is served as ``read`` serves it (the hot cache
        first, and every body found noted as a use: REAPI ``BatchReadBlobs``)."""
        bodies: list[StoredBody | None] = [None] * len(aids)
        todo: list[int] = []
        for i, aid in enumerate(aids):
            hit = self.hot.get(aid) if as_reads else None
            if hit is None:
                todo.append(i)
            else:
                bodies[i] = StoredBody(hit[0], data=hit[1])
        generation = self.hot.generation
        if todo:
            read = await self._in(self._reader, self._read_many_sync, [aids[i] for i in todo])
            for i, body in zip(todo, read, strict=True):
                bodies[i] = body
                if as_reads and body is not None and body.data is not None:
                    self.hot.put(body.manifest, body.data, generation)
        if as_reads:
            now = self.clock.now_ms()
            for aid, body in zip(aids, bodies, strict=True):
                if body is not None:
                    self.accesses.note(aid, now)
        return bodies

    def _read_many_sync(self, aids: Sequence[str]) -> list[StoredBody | None]:
        rows = self._index().get_many(aids)
        return [self._read_sync(a, rows.get(a), looked_up=True) for a in aids]


def _sha256_fileobj(f: BinaryIO) -> str:
    h = hashlib.sha256()
    while chunk := f.read(1024 * 1024):
        h.update(chunk)
    return h.hexdigest()
