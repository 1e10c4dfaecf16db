"""CacheService: the one façade protocols use to store and read artifacts.

Guarantees:

* A write is visible only once complete: its body is staged in the tmp dir under a reservation
  from the tmp budget, fsynced, renamed into place beside any older version and then recorded
  in the index (committed with ``synchronous=FULL``); only then is the older version's file
  unlinked. A crash at any point leaves the acknowledged version intact, and start-up removes
  the rest (``storage.reconcile``; ``docs/durability.md``). A failed or rejected write leaves
  no blob, no index row and no reserved bytes.
* Every artifact has a ``version_ms``; an index row is replaced only by a strictly newer version
  (last writer wins, ``core.version``). A local write's version is issued in the writer thread
  above the stored copy's, the namespace tombstone's and every version this node has issued or
  learned (``VersionClock``, started from the index's largest version), so an acknowledged
  local write always wins; a local write that is not applied raises ``Unavailable``. Versions
  from peers more than ``max_clock_skew_ms`` ahead of the clock raise ``FutureVersion``
  (``_admit``, the one gate every non-local copy and tombstone passes).
* Stored bytes are checked against the recorded size and SHA-256 before they are served: the
  size on every open, small blobs by hash on every read, large ones by a hash computed while they
  are sent (``verify_reads="always"``; the sender holds the tail back until the digest matched)
  or, with ``verify_reads="changed"``, only when the file's stat signature changed. A mismatch
  quarantines the entry (``storage.quarantine``) and reads as a miss, never as a 200 with wrong
  bytes. ``verify_stored`` is the same check for the scrub and for PUT routes that skip keys
  which are already stored ("exists and intact"); ``on_quarantine(artifact_id)`` is called (on
  the writer thread) for every entry quarantined, so the mesh can fetch a good copy.
* Stored bytes stay within ``max_disk_bytes`` by least-recently-used eviction. Evictions are
  local: they are never replicated. While ``eviction_floor_ms`` is set (a bootstrap runs),
  eviction only picks artifacts last used before it; a write that finds nothing it may evict is
  still stored, over the budget, as when nothing at all is evictable. A bootstrap copy is
  stamped as last used at the floor, and equal stamps are evicted oldest version first.
* Every local write (and namespace clean) enqueues one outbox message per replication target in
  the same SQLite transaction as the data. Copies received from peers (``apply_replica``) are
  applied by last-writer-wins and are not re-enqueued: every node ships its own writes to all.
  A peer whose queue holds ``outbox_max_depth`` messages gets no more and is marked to be
  caught up (``storage.peer_queue``); a write is never refused because of a peer.

Blocking work runs off the event loop: SQLite reads and file opens in a small reader pool,
fsync and hashing in a sync pool, and every index write plus the rename that publishes a blob in
one single-threaded writer, which serialises commits of the same key.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import os
import shutil
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO, TypeVar

from kit.clock import Clock
from kit.failpoint import failpoint
from kura.core.errors import (
    DigestMismatch,
    InsufficientStorage,
    InvalidRequest,
    KuraError,
    NotFound,
    PayloadTooLarge,
    ResourceExhausted,
    Unavailable,
)
from kura.core.eviction import bytes_to_free
from kura.core.keys import artifact_id
from kura.core.manifest import Manifest
from kura.core.version import (
    ApplyOutcome,
    FutureVersion,
    VersionClock,
    ahead_of_skew_ms,
    decide_apply,
)
from kura.storage import change_feed
from kura.storage.blobs import (
    GROW_STEP_BYTES,
    BlobFiles,
    Staged,
    concatenate,
    fsync_path,
    stage_body,
    stat_signature,
)
from kura.storage.budget import Reservation, TmpBudget
from kura.storage.change_feed import ChangesPage
from kura.storage.checksum import SHA256, XXH3_128
from kura.storage.hotcache import HotCache
from kura.storage.index import MetadataIndex, OutboxMessage
from kura.storage.peer_queue import PeerQueues
from kura.storage.quarantine import Quarantine
from kura.storage.recovery import StartReport, open_storage, warnings
from kura.storage.verify import ReadVerifier, digest_fd, problem_with_bytes, problem_with_file

log = logging.getLogger(__name__)

T = TypeVar("T")

# Blobs up to this size are read into memory and hashed on every read.
SMALL_BLOB_BYTES = 64 * 1024
TOUCH_FLUSH_SECONDS = 5.0


@dataclass(frozen=True)
class ArtifactRef:
    """What a protocol names: producer (protocol family), namespace and key."""

    producer: str
    namespace_id: str
    key: str


@dataclass
class StoredBody:
    """An artifact ready to send: ``data`` for small ones, else an open ``file``.

    ``data`` is always verified. A ``file`` whose size matched but whose bytes were not hashed
    yet has ``verified=False``: the sender must hash it while sending and abort on a mismatch
    (``kura.api.file_response``), against ``xxh3_128`` (hex, recorded at write time) when the
    row has one, else against ``manifest.sha256``. The caller must close ``file`` (``close()``
    does it and is idempotent).
    """

    manifest: Manifest
    data: bytes | None = None
    file: BinaryIO | None = None
    verified: bool = True
    xxh3_128: str | None = None

    def close(self) -> None:
        if self.file is not None:
            self.file.close()
            self.file = None


@dataclass
class StorageStats:
    """Plain counters the metrics layer reads at scrape time."""

    used_bytes: int = 0
    artifacts: int = 0
    evictions_total: int = 0
    evicted_bytes_total: int = 0
    # detected_by ("read", "scrub", "put") -> entries quarantined.
    corrupt_total: dict[str, int] = field(default_factory=dict)
    outbox_depth: int = 0  # changed on the writer thread only
    # (source, outcome) -> count; source is "local", "replication", "bootstrap", "read_through".
    apply_outcomes_total: dict[tuple[str, str], int] = field(default_factory=dict)
    # (source, reason) -> copies from peers refused before applying; reason "future_version".
    rejected_total: dict[tuple[str, str], int] = field(default_factory=dict)


@dataclass(frozen=True)
class PutResult:
    """Outcome of a write. ``created`` is False when an earlier version existed."""

    manifest: Manifest
    created: bool
    outcome: ApplyOutcome


class CacheService:
    """See module docstring. Create, ``await start()``, use, ``await close()``."""

    def __init__(
        self,
        *,
        data_dir: Path,
        tmp_dir: Path,
        tenant_id: str,
        budget: TmpBudget,
        clock: Clock,
        max_disk_bytes: int,
        min_free_disk_bytes: int,
        outbox_max_depth: int = 100_000,
        hot_cache_bytes: int = 64 * 1024 * 1024,
        verify_reads: str = "always",
        quarantine_max_bytes: int = 1024 * 1024 * 1024,
        on_quarantine: Callable[[str], None] = lambda artifact_id: None,
        max_clock_skew_ms: int = 300_000,
        max_inline_bytes: int = 1024 * 1024,
    ) -> None:
        self.files = BlobFiles(data_dir, tmp_dir)
        self.verify_reads = verify_reads
        self.quarantine = Quarantine(data_dir / "quarantine", quarantine_max_bytes)
        self.verifier = ReadVerifier()
        self._on_quarantine = on_quarantine
        self.hot = HotCache(hot_cache_bytes, SMALL_BLOB_BYTES)
        self.outbox_max_depth = outbox_max_depth
        # Set by the mesh: who local writes are shipped to, and how to wake the shipper.
        self.replication_targets: Callable[[], Sequence[str]] = tuple
        self.on_outbox_write: Callable[[], None] = lambda: None
        # Set by the mesh: on a local miss, try to fetch the artifact id from peers.
        self.on_miss: Callable[[str], Awaitable[bool]] | None = None
        # Set by the mesh while a bootstrap runs: eviction then only picks artifacts last used
        # before this wall-clock ms, so it never evicts what the bootstrap fetched.
        self.eviction_floor_ms: int | None = None
        self.tenant_id = tenant_id
        self.budget = budget
        self.clock = clock
        self.max_disk_bytes = max_disk_bytes
        self.min_free_disk_bytes = min_free_disk_bytes
        self.stats = StorageStats()
        self.queues = PeerQueues(lambda: self.stats, outbox_max_depth)
        self._index: MetadataIndex | None = None
        self._reader = ThreadPoolExecutor(4, thread_name_prefix="kura-read")
        self._syncer = ThreadPoolExecutor(4, thread_name_prefix="kura-sync")
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="kura-write")
        self.max_clock_skew_ms = max_clock_skew_ms
        # Inline bodies are read into memory and stored in SQLite, outside the tmp budget: a
        # peer's copy that claims to be inline may be no larger than a local inline write
        # (KURA_MAX_KEYVALUE_BYTES, as upstream Kura limits inline replicas).
        self.max_inline_bytes = max_inline_bytes
        self.versions = VersionClock()
        self._touches: dict[str, int] = {}
        self.start_report = StartReport()

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self) -> None:
        """Open the data dir (taking its lock), sweep staging leftovers and orphans."""
        await self._in(self._writer, self._open_sync)

    def _open_sync(self) -> None:
        self._index, self.start_report = open_storage(self.files)
        self.quarantine.open()
        latest = self._index.max_version_ms()
        self.versions.observe(latest)  # a restart never goes backwards
        if ahead_of_skew_ms(latest, self.clock.now_ms(), self.max_clock_skew_ms):
            log.warning(
                "the index holds version_ms %d, %d ms ahead of this node's clock: local writes "
                "are stamped after it, and peers refuse them until their clocks catch up "
                "(KURA_MAX_CLOCK_SKEW_MS=%d); check this machine's clock",
                latest,
                latest - self.clock.now_ms(),
                self.max_clock_skew_ms,
            )
        count, used = self._index.totals()
        self.stats.artifacts, self.stats.used_bytes = count, used
        self.queues.load(self._index.connection(), self._index.read_only)
        for warning in self.warnings()[len(self.start_report.warnings) :]:
            log.warning("at start-up: %s", warning)  # a full disk (the rest is logged already)
        swept, rec = self.start_report.swept_files, self.start_report.reconciled
        if swept or rec.removed_files or rec.dropped_rows:
            orphans = rec.removed_files + rec.dropped_rows
            log.info("start-up sweep removed %d staging files and %d orphans", swept, orphans)

    def warnings(self) -> list[str]:
        """Storage problems for an operator (``/ready`` warnings); see ``recovery.warnings``."""
        return warnings(self.start_report, self.files.data_dir, self.min_free_disk_bytes)

    async def close(self) -> None:
        """Flush access times and release the data dir. Safe to call once after start."""
        if self._index is not None:
            await self.flush_touches()
            await self._in(self._writer, self._close_sync)
        self.verifier.close()
        for pool in (self._reader, self._syncer, self._writer):
            pool.shutdown(wait=True)

    def _close_sync(self) -> None:
        if self._index is not None:
            self._index.close_thread_connection()
        self.files.close()

    async def run_maintenance(self) -> None:
        """Forever: flush batched access times. Run it in the app's TaskGroup."""
        while True:
            await asyncio.sleep(TOUCH_FLUSH_SECONDS)
            try:
                await self.flush_touches()
            except Exception:
                log.exception("flushing access times failed; will retry")

    async def flush_touches(self) -> None:
        touches, self._touches = self._touches, {}
        # Access times are best effort: not recorded while the disk is full or read-only.
        index = self._require_index()
        full = self.free_disk_bytes() <= self.min_free_disk_bytes
        if touches and not index.read_only and not full:
            await self._in(self._writer, index.touch, touches)

    # -- identity and versions ---------------------------------------------------------------

    def artifact_id(self, ref: ArtifactRef) -> str:
        return artifact_id(ref.producer, self.tenant_id, ref.namespace_id, ref.key)

    def artifact_id_of(self, manifest: Manifest) -> str:
        """The identity a manifest's (producer, namespace, key) has on this node's tenant."""
        return artifact_id(manifest.producer, self.tenant_id, manifest.namespace_id, manifest.key)

    def next_version_ms(self) -> int:
        """A new version above every version issued or learned (writes take theirs in the
        writer thread instead, where the stored copy is known)."""
        return self.versions.issue(self.clock.now_ms())

    def _admit(self, version_ms: int, source: str, subject: str) -> None:
        """The one skew gate for versions from peers (replication, bootstrap, read-through):
        more than ``max_clock_skew_ms`` ahead of this node's clock raises ``FutureVersion``
        (logged at WARNING, counted in ``rejected_total``); an admitted version advances the
        version clock. Safe on any thread."""
        now = self.clock.now_ms()
        if ahead_of_skew_ms(version_ms, now, self.max_clock_skew_ms):
            key = (source, "future_version")
            self.stats.rejected_total[key] = self.stats.rejected_total.get(key, 0) + 1
            log.warning(
                "refused %s from %s: version_ms %d is %d ms ahead of this node's clock "
                "(KURA_MAX_CLOCK_SKEW_MS=%d)",
                subject,
                source,
                version_ms,
                version_ms - now,
                self.max_clock_skew_ms,
            )
            raise FutureVersion(
                f"{subject}: version_ms {version_ms} is {version_ms - now} ms ahead of this "
                f"node's clock, more than KURA_MAX_CLOCK_SKEW_MS={self.max_clock_skew_ms}; "
                "refused, never applied"
            )
        self.versions.observe(version_ms)

    # -- reads -------------------------------------------------------------------------------

    async def exists(self, ref: ArtifactRef) -> bool:
        return await self._in(self._reader, self._require_index().exists, self.artifact_id(ref))

    async def missing(self, refs: Sequence[ArtifactRef]) -> list[ArtifactRef]:
        """The refs of ``refs`` with no stored version, in order: one index look-up (no body
        read), then, like ``read``, a fetch from peers (``on_miss``, read-through) of each
        absent one, stopping at the first that cannot be had (so a miss may list only one).
        The stored ones are touched like a read (LRU), so the blobs a hit references age with
        it."""
        ids = [self.artifact_id(r) for r in refs]
        present = await self._in(self._reader, self._require_index().existing, ids)
        now = self.clock.now_ms()
        for aid in present:
            self._touches[aid] = now
        absent = [(r, aid) for r, aid in zip(refs, ids, strict=True) if aid not in present]
        for i, (_ref, aid) in enumerate(absent):
            if self.on_miss is None or not await self.on_miss(aid):
                return [r for r, _ in absent[i:]]
        return []

    async def intact(self, ref: ArtifactRef) -> bool:
        """Stored and intact: what a PUT route that skips existing keys must ask instead of
        ``exists``, so a PUT over a damaged copy (quarantined here) stores the new body."""
        return await self.verify_stored(self.artifact_id(ref), detected_by="put")

    async def read(self, ref: ArtifactRef) -> StoredBody:
        """The artifact, or ``NotFound`` (absent, evicted, or failed verification). Small ones
        are verified; a large one may carry ``verified=False``, to be hashed while sent."""
        aid = self.artifact_id(ref)
        body = await self._read_cached(aid)
        if body is None and self.on_miss is not None and await self.on_miss(aid):
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
            f = self._blob_path(manifest).open("rb")
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

    def record_xxh3_128(self, manifest: Manifest, xxh3_128: str) -> None:
        """A sender verified a row without a checksum with SHA-256 and computed its XXH3-128 in
        the same pass: record it (writer thread, not waited for; best effort) so the next read
        of that version checks the fast one (``MetadataIndex.set_xxh3_128``)."""
        index = self._require_index()
        with contextlib.suppress(RuntimeError):  # the writer pool is shutting down
            self._writer.submit(index.set_xxh3_128, manifest, xxh3_128)

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
    ) -> bool:
        """True if the artifact is stored and intact (size and SHA-256 match its manifest).

        A damaged entry is quarantined (counted under ``detected_by``: "put", "scrub") and
        reads False, like an absent one. ``pace(n)`` is called per chunk hashed (rate limits);
        it runs on ``executor`` (default: the reader pool). Safe to call concurrently.
        """
        return await self._in(
            executor or self._reader, self._verify_stored_sync, artifact_id, detected_by, pace
        )

    def _verify_stored_sync(
        self, aid: str, detected_by: str, pace: Callable[[int], None] | None
    ) -> bool:
        index = self._require_index()
        for _attempt in range(5):
            row = index.get(aid)
            if row is None:
                return False
            manifest, inline_body = row[0], row[1]
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

    # -- writes ------------------------------------------------------------------------------

    def check_size(self, declared_length: int | None, limit_bytes: int) -> None:
        """Reject a declared body before reading it: over the route limit, over the disk budget,
        or more than the free disk space allows. Raises PayloadTooLarge / ResourceExhausted."""
        if declared_length is None:
            return
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
        self._check_free_disk(declared_length)

    def free_disk_bytes(self) -> int:
        """Free bytes on the data dir's filesystem (0 before ``start`` created the dir)."""
        try:
            return shutil.disk_usage(self.files.data_dir).free
        except FileNotFoundError:
            return 0

    def _check_writable(self) -> None:
        """ResourceExhausted (503) while the index is read-only (a full disk at start-up)."""
        if reason := self.start_report.read_only_reason:
            raise ResourceExhausted(reason, retry_after_seconds=30)

    def _check_free_disk(self, incoming_bytes: int) -> None:
        self._check_writable()
        free = shutil.disk_usage(self.files.data_dir).free
        if free - incoming_bytes < self.min_free_disk_bytes:
            raise ResourceExhausted(
                f"insufficient free disk space: {free} bytes free, {incoming_bytes} bytes "
                f"incoming, {self.min_free_disk_bytes} bytes must stay free",
                retry_after_seconds=5,
            )

    async def put_stream(
        self,
        ref: ArtifactRef,
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
        IncompleteBody, DigestMismatch, InvalidRequest.
        """
        self.check_size(declared_length, limit_bytes)
        first = (
            declared_length
            if declared_length is not None
            else min(GROW_STEP_BYTES, limit_bytes, self.budget.capacity_bytes)
        )
        with self.budget.try_reserve(max(first, 1)) as reservation:
            staged = await stage_body(
                body,
                self.files.new_staging_path("uploads"),
                reservation,
                limit_bytes=limit_bytes,
                declared_length=declared_length,
                expected_sha256=expected_sha256,
            )
            return await self._commit_staged(ref, staged, content_type, headers or {})

    async def put_concatenated(
        self, ref: ArtifactRef, parts: Sequence[Path], content_type: str
    ) -> PutResult:
        """Store the concatenation of ``parts`` (multipart completion). Parts are left in place."""
        total = sum(p.stat().st_size for p in parts)
        self.check_size(total, self.max_disk_bytes)
        incoming = self.files.blobs_dir / f"multipart.incoming-{os.urandom(8).hex()}"
        try:
            staged = await self._in(self._syncer, concatenate, parts, incoming)
            return await self._commit_staged(ref, staged, content_type, {}, fsynced=True)
        finally:
            incoming.unlink(missing_ok=True)

    async def put_inline(self, ref: ArtifactRef, data: bytes, content_type: str) -> PutResult:
        """Store a small body inside the index (key-value entries)."""
        self._check_free_disk(len(data))
        aid = self.artifact_id(ref)
        manifest = self._new_manifest(
            ref, aid, len(data), hashlib.sha256(data).hexdigest(), content_type, {}, inline=True
        )
        return await self._commit(manifest, None, data, source="local")

    async def _commit_staged(
        self,
        ref: ArtifactRef,
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
    ) -> PutResult:
        peers: Sequence[str] = self.replication_targets() if source == "local" else ()
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
        )
        if peers and result.outcome is ApplyOutcome.APPLIED:
            self.on_outbox_write()
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
        )

    def _take_touches(self) -> dict[str, int]:
        touches, self._touches = self._touches, {}
        return touches

    def _count(self, source: str, outcome: str) -> None:
        key = (source, outcome)
        self.stats.apply_outcomes_total[key] = self.stats.apply_outcomes_total.get(key, 0) + 1

    def _commit_sync(
        self,
        manifest: Manifest,
        staged_path: Path | None,
        inline_body: bytes | None,
        touches: dict[str, int],
        outbox_peers: Sequence[str],
        source: str,
        xxh3_128: str | None = None,
    ) -> PutResult:
        """Writer thread: LWW check, eviction, publish the file, record the row (with the
        file's XXH3-128) and the outbox messages in one transaction."""
        index = self._require_index()
        if touches:
            index.touch(touches)
        existing = index.get(manifest.artifact_id)
        if source == "local":
            version = self.versions.issue(
                self.clock.now_ms(),
                None if existing is None else existing[0].version_ms,
                index.tombstone(manifest.namespace_id),
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
            sig = stat_signature(self.files.persist(staged_path, manifest))
            failpoint("storage.after_publish")
        outbox_peers = self.queues.admit(index.connection(), outbox_peers, self.clock.now_ms())
        # A bootstrap copy counts as last used when the bootstrap began: never used here, and
        # equal stamps leave LRU to evict the oldest versions first once the bootstrap is over.
        floor = self.eviction_floor_ms
        stamp_ms = floor if source == "bootstrap" and floor is not None else self.clock.now_ms()
        try:
            index.upsert(manifest, inline_body, sig, stamp_ms, outbox_peers, xxh3_128=xxh3_128)
        except BaseException:
            if new is not None and new != old:
                new.unlink(missing_ok=True)  # never acknowledged
            raise
        failpoint("storage.after_commit")
        if old is not None and old != new:
            old.unlink(missing_ok=True)  # a reader that has it open keeps its bytes
        # After the row and the file changed: a read that began earlier cannot re-insert old bytes.
        self.hot.invalidate([manifest.artifact_id])
        self.queues.enqueued(outbox_peers)
        self.stats.used_bytes += manifest.size - old_size
        if existing is None:
            self.stats.artifacts += 1
        return PutResult(manifest, existing is None, outcome)

    async def evict_to_budget(self) -> None:
        """Evict least-recently-used artifacts until the store is within ``max_disk_bytes``
        (after an eviction floor held them back: ``eviction_floor_ms``)."""
        await self._in(self._writer, self._evict_sync, 0, "")

    def _evict_sync(self, incoming_bytes: int, exclude: str) -> None:
        index = self._require_index()
        need = bytes_to_free(self.stats.used_bytes, incoming_bytes, self.max_disk_bytes)
        while need > 0:
            batch = index.least_recently_used(256, exclude, self.eviction_floor_ms)
            if not batch:
                return
            victims: list[tuple[str, int, bool]] = []
            for victim in batch:
                victims.append(victim)
                need -= victim[1]
                if need <= 0:
                    break
            self._drop_sync(victims)
            self.stats.evictions_total += len(victims)
            self.stats.evicted_bytes_total += sum(v[1] for v in victims)

    def _drop_sync(self, victims: Sequence[tuple[str, int, bool]]) -> None:
        """Writer thread: delete ``(artifact_id, size, inline)`` rows (and their digests, one
        transaction), hot-cache entries and blob files, and follow in the disk accounting. The
        one path eviction and expiry share; nothing is replicated (both are local)."""
        index = self._require_index()
        index.delete(v[0] for v in victims)
        self.hot.invalidate([v[0] for v in victims])
        for aid, size, inline in victims:
            if not inline:
                self.files.remove_artifact(aid)
            self.stats.used_bytes -= size
            self.stats.artifacts -= 1

    async def drop_unused(self, cutoff_ms: int, limit: int) -> list[tuple[str, int, bool]]:
        """Expiry (``storage.expiry``): delete up to ``limit`` artifacts last used before
        ``cutoff_ms`` (wall-clock ms), oldest first, through eviction's path; return them as
        ``(artifact_id, size, inline)``, empty when none is that old. Access times still in memory
        are recorded first, and one touched meanwhile is kept, so a read since the last flush
        always counts. Under a bootstrap's ``eviction_floor_ms`` nothing used at or after the floor
        goes. Raises ``ResourceExhausted`` while the index is read-only."""
        self._check_writable()
        return await self._in(
            self._writer, self._drop_unused_sync, cutoff_ms, limit, self._take_touches()
        )

    def _drop_unused_sync(
        self, cutoff_ms: int, limit: int, touches: dict[str, int]
    ) -> list[tuple[str, int, bool]]:
        index = self._require_index()
        if touches:
            index.touch(touches)
        floor = self.eviction_floor_ms
        before = cutoff_ms if floor is None else min(cutoff_ms, floor)
        pending = self._touches  # read only: the event loop may add to it meanwhile
        victims = [
            v for v in index.least_recently_used(limit, "", before) if pending.get(v[0], 0) < before
        ]
        if victims:
            self._drop_sync(victims)
        return victims

    # -- copies from peers -------------------------------------------------------------------

    async def apply_outcome_for(
        self, manifest: Manifest, source: str | None = None
    ) -> ApplyOutcome:
        """What applying ``manifest`` would do now (a pre-check before fetching its body).
        With ``source``, a version too far ahead raises ``FutureVersion`` first (``_admit``)."""
        if source is not None:
            self._admit(manifest.version_ms, source, _subject(manifest))
        return await self._in(self._reader, self._precheck_sync, manifest)

    def _precheck_sync(self, manifest: Manifest) -> ApplyOutcome:
        index = self._require_index()
        existing = index.get(manifest.artifact_id)
        return _decide(index, manifest, None if existing is None else existing[0])

    async def apply_replica(
        self,
        manifest: Manifest,
        body: AsyncIterator[bytes],
        *,
        declared_length: int | None,
        source: str,
        reservation: Reservation | None = None,
    ) -> ApplyOutcome:
        """Apply a peer's copy of an artifact at the peer's version (last writer wins).

        The body must be exactly ``manifest.size`` bytes hashing to ``manifest.sha256``
        (``DigestMismatch``/``IncompleteBody``/``InvalidRequest`` otherwise); a copy that is not
        newer than what is stored, or is covered by a tombstone, is ignored without staging it.
        Staging uses ``reservation`` when given (bootstrap reserves and waits itself), else a
        fail-fast ``try_reserve`` (``ResourceExhausted`` when the tmp budget is full).
        A version more than ``max_clock_skew_ms`` ahead raises ``FutureVersion`` (400) before
        anything is read. Never enqueues outbox messages. Safe to call concurrently.
        """
        if manifest.inline and manifest.size > self.max_inline_bytes:
            raise PayloadTooLarge(
                f"an inline artifact of {manifest.size} bytes exceeds the inline limit of "
                f"{self.max_inline_bytes} bytes (KURA_MAX_KEYVALUE_BYTES)",
                self.max_inline_bytes,
            )
        outcome = await self.apply_outcome_for(manifest, source)
        if outcome is not ApplyOutcome.APPLIED:
            self._count(source, outcome.value)
            return outcome
        if manifest.size > self.max_disk_bytes:
            raise InsufficientStorage(
                f"artifact of {manifest.size} bytes exceeds the node's disk budget "
                f"({self.max_disk_bytes} bytes)"
            )
        if declared_length is not None and declared_length != manifest.size:
            raise InvalidRequest(
                f"Content-Length {declared_length} does not match the manifest size {manifest.size}"
            )
        self._check_free_disk(manifest.size)
        if manifest.inline:
            data = b"".join([chunk async for chunk in _capped(body, manifest.size)])
            if len(data) != manifest.size or hashlib.sha256(data).hexdigest() != manifest.sha256:
                raise DigestMismatch("inline body does not match its manifest")
            return (await self._commit(manifest, None, data, source=source)).outcome
        own = reservation is None
        held = self.budget.try_reserve(max(1, manifest.size)) if own else reservation
        assert held is not None
        try:
            try:
                staged = await stage_body(
                    body,
                    self.files.new_staging_path(
                        "bootstrap" if source == "bootstrap" else "uploads"
                    ),
                    held,
                    limit_bytes=min(held.size_bytes, manifest.size),
                    declared_length=manifest.size,
                    expected_sha256=manifest.sha256,
                )
            except PayloadTooLarge:
                raise InvalidRequest(
                    f"body exceeded its manifest size and reserved "
                    f"{min(held.size_bytes, manifest.size)} bytes; rejected"
                ) from None
            try:
                await self._in(self._syncer, fsync_path, staged.path)
                result = await self._commit(
                    manifest, staged.path, None, source=source, xxh3_128=staged.xxh3_128
                )
                return result.outcome
            finally:
                staged.path.unlink(missing_ok=True)
        finally:
            if own:
                held.release()

    # -- many small copies at once (bootstrap batches) --------------------------------------

    async def apply_outcomes_for(self, manifests: Sequence[Manifest]) -> list[ApplyOutcome]:
        """``apply_outcome_for`` (without the skew gate) for many manifests in one reader-thread
        call: what applying each would do now."""
        return await self._in(self._reader, self._precheck_many_sync, list(manifests))

    def _precheck_many_sync(self, manifests: list[Manifest]) -> list[ApplyOutcome]:
        index = self._require_index()
        stored = index.versions([m.artifact_id for m in manifests])
        tombstones: dict[str, int | None] = {}
        outcomes = []
        for m in manifests:
            if m.namespace_id not in tombstones:
                tombstones[m.namespace_id] = index.tombstone(m.namespace_id)
            version, sha = stored.get(m.artifact_id, (None, ""))
            outcomes.append(
                decide_apply(m.version_ms, version, tombstones[m.namespace_id], m.sha256, sha)
            )
        return outcomes

    async def read_many(self, aids: Sequence[str]) -> list[StoredBody | None]:
        """``read_by_id`` for many ids in one reader-thread call, without the hot cache: each
        body verified as ``_read_sync`` does, None when absent or damaged. The caller closes
        every ``file`` body."""
        return await self._in(self._reader, lambda: [self._read_sync(a) for a in aids])

    async def apply_small_replicas(
        self, items: Sequence[tuple[Manifest, bytes]], *, source: str
    ) -> list[ApplyOutcome | KuraError]:
        """Apply many peers' copies of small artifacts, each at the peer's version (last writer
        wins), stored inline in the index in ONE transaction: one durable commit for the batch
        instead of a file, a directory and a WAL fsync per artifact. For each item, in order:
        its outcome, or the error that refused it (``DigestMismatch`` for bytes that do not
        match the manifest, ``PayloadTooLarge`` above ``max_inline_bytes``, ``FutureVersion``
        past the skew limit). Raises ``ResourceExhausted``/``Unavailable`` (nothing applied)
        when the disk cannot take the batch. Never enqueues outbox messages."""
        results: list[ApplyOutcome | KuraError] = []
        accepted: list[tuple[int, Manifest, bytes]] = []
        for i, (manifest, data) in enumerate(items):
            try:
                if manifest.size > self.max_inline_bytes:
                    raise PayloadTooLarge(
                        f"{manifest.size} bytes is above the inline limit", self.max_inline_bytes
                    )
                self._admit(manifest.version_ms, source, _subject(manifest))
                if problem_with_bytes(data, manifest) is not None:
                    raise DigestMismatch("body does not match its manifest")
            except KuraError as exc:
                results.append(exc)
                continue
            results.append(ApplyOutcome.APPLIED)  # replaced below by the writer's verdict
            accepted.append((i, dataclasses.replace(manifest, inline=True), data))
        if not accepted:
            return results
        self._check_free_disk(sum(m.size for _i, m, _d in accepted))
        outcomes = await self._in(
            self._writer, self._commit_many_sync, accepted, self._take_touches(), source
        )
        for (i, _m, _d), outcome in zip(accepted, outcomes, strict=True):
            results[i] = outcome
        return results

    def _commit_many_sync(
        self,
        items: list[tuple[int, Manifest, bytes]],
        touches: dict[str, int],
        source: str,
    ) -> list[ApplyOutcome]:
        """Writer thread: the version rule for each item, eviction for the whole batch, then
        every applied row in one transaction; replaced files are unlinked after the commit."""
        index = self._require_index()
        if touches:
            index.touch(touches)
        self._evict_sync(sum(m.size for _i, m, _d in items), "")
        outcomes: list[ApplyOutcome] = []
        rows: list[tuple[Manifest, bytes | None, str | None, str | None]] = []
        replaced: list[Manifest | None] = []
        for _i, manifest, data in items:
            existing = index.get(manifest.artifact_id)
            stored = None if existing is None else existing[0]
            outcome = _decide(index, manifest, stored)
            self._count(source, outcome.value)
            outcomes.append(outcome)
            if outcome is ApplyOutcome.APPLIED:
                rows.append((manifest, data, None, None))
                replaced.append(stored)
        if not rows:
            return outcomes
        floor = self.eviction_floor_ms  # a bootstrap copy counts as used when it began
        stamp_ms = floor if source == "bootstrap" and floor is not None else self.clock.now_ms()
        index.upsert_many(rows, stamp_ms)
        self.hot.invalidate([m.artifact_id for m, _d, _s, _x in rows])
        for (manifest, _d, _s, _x), old in zip(rows, replaced, strict=True):
            if old is not None and not old.inline:
                self.files.blob_path(old).unlink(missing_ok=True)
            self.stats.used_bytes += manifest.size - (0 if old is None else old.size)
            if old is None:
                self.stats.artifacts += 1
        return outcomes

    # -- namespaces --------------------------------------------------------------------------

    async def delete_namespace(
        self, namespace_id: str, version_ms: int | None = None, *, source: str = "local"
    ) -> int:
        """Tombstone ``namespace_id`` at ``version_ms`` (default: a new local version) and delete
        every artifact of it at or below that version. A local clean is enqueued for every
        replication target; a tombstone from a peer is not. Returns the tombstone version.

        A local clean's version is issued in the writer thread above every version of the
        namespace held here; a peer's tombstone too far ahead raises ``FutureVersion``."""
        self._check_writable()
        if source != "local" and version_ms is not None:
            self._admit(version_ms, source, f"tombstone of namespace {namespace_id!r}")
        peers: Sequence[str] = self.replication_targets() if source == "local" else ()
        applied, version = await self._in(
            self._writer, self._delete_namespace_sync, namespace_id, version_ms, peers
        )
        self._count(source + "_tombstone", "applied" if applied else "ignored_older")
        if applied and peers:
            self.on_outbox_write()
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
        self.hot.invalidate([v[0] for v in victims])
        self.queues.enqueued(peers)
        for aid, size, inline in victims:
            if not inline:
                self.files.remove_artifact(aid)
            self.stats.used_bytes -= size
            self.stats.artifacts -= 1
        return True, version_ms

    # -- paging for peers ----------------------------------------------------------------------

    async def manifests_page(self, after: str | None, limit: int) -> list[Manifest]:
        """Manifests in artifact_id order strictly after ``after`` (None: from the first)."""
        return await self._in(self._reader, self._require_index().manifests_after, after, limit)

    async def manifests_newest_page(
        self, after: tuple[int, str] | None, limit: int
    ) -> list[Manifest]:
        """Manifests by (version_ms descending, artifact_id) strictly after the cursor ``after``
        (None: from the newest); ``MetadataIndex.manifests_newest``."""
        return await self._in(self._reader, self._require_index().manifests_newest, after, limit)

    async def tombstones_page(self, after: str | None, limit: int) -> list[tuple[str, int]]:
        """Tombstones in namespace_id order strictly after ``after`` (None: from the first)."""
        return await self._in(self._reader, self._require_index().tombstones_after, after, limit)

    async def changes_page(self, since: int, limit: int) -> ChangesPage:
        """This node's change feed after ``since`` (``storage.change_feed.read_page``).
        Unavailable (503) on an index without the change sequence (read-only, pre-version 3)."""
        index = self._require_index()
        try:
            return await self._in(
                self._reader, lambda: change_feed.read_page(index.connection(), since, limit)
            )
        except change_feed.FeedUnavailable as exc:
            raise Unavailable(str(exc)) from exc

    # -- outbox ------------------------------------------------------------------------------

    async def outbox_batch(self, peer: str, limit: int) -> list[OutboxMessage]:
        """The oldest pending messages for ``peer``; none while deliveries cannot be recorded
        (index read-only, or the disk full): shipping resumes once space is back."""
        if self._require_index().read_only or self.free_disk_bytes() <= self.min_free_disk_bytes:
            return []
        return await self._in(self._reader, self._require_index().outbox_batch, peer, limit)

    async def outbox_ack(self, ids: Sequence[int]) -> None:
        """Delete delivered messages (only after the peer acknowledged them)."""
        if not ids:
            return
        await self._in(self._writer, self._outbox_ack_sync, ids)

    def _outbox_ack_sync(self, ids: Sequence[int]) -> None:
        # Writer thread, like every other change of ``stats.outbox_depth`` (_commit_sync,
        # _delete_namespace_sync): ``+=``/``-=`` from two threads could lose an update.
        self.queues.acked(self._require_index().connection(), ids)

    async def outbox_depths(self) -> dict[str, tuple[int, int]]:
        return await self._in(self._reader, self._require_index().outbox_depths)

    async def in_reader(self, fn: Callable[..., T], *args: object) -> T:
        """Run ``fn(connection, *args)`` on a reader thread with its index connection (the
        read-only queries of ``storage.digests``, for anti-entropy)."""
        return await self._in(self._reader, lambda: fn(self._require_index().connection(), *args))

    async def in_writer(self, fn: Callable[..., T], *args: object) -> T:
        """Run ``fn(connection, *args)`` on the writer thread with its index connection (the
        ``PeerQueues`` operations: forget a peer, re-offer pages, clear a mark)."""
        return await self._in(self._writer, lambda: fn(self._require_index().connection(), *args))

    # -- plumbing ----------------------------------------------------------------------------

    def _require_index(self) -> MetadataIndex:
        if self._index is None:
            raise RuntimeError("CacheService.start() has not completed")
        return self._index

    async def _in(self, pool: ThreadPoolExecutor, fn: Callable[..., T], *args: object) -> T:
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)


def _decide(index: MetadataIndex, incoming: Manifest, stored: Manifest | None) -> ApplyOutcome:
    """Last-writer-wins against what is stored and the namespace tombstone (core.version)."""
    return decide_apply(
        incoming.version_ms,
        None if stored is None else stored.version_ms,
        index.tombstone(incoming.namespace_id),
        incoming.sha256,
        "" if stored is None else stored.sha256,
    )


def _subject(manifest: Manifest) -> str:
    return f"{manifest.producer} artifact in namespace {manifest.namespace_id!r}"


async def _capped(body: AsyncIterator[bytes], limit_bytes: int) -> AsyncIterator[bytes]:
    size = 0
    async for chunk in body:
        size += len(chunk)
        if size > limit_bytes:
            raise InvalidRequest(f"body is longer than the manifest size {limit_bytes}")
        yield chunk


def _sha256_fileobj(f: BinaryIO) -> str:
    h = hashlib.sha256()
    while chunk := f.read(1024 * 1024):
        h.update(chunk)
    return h.hexdigest()
