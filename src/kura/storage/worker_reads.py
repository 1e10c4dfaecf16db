"""The ``ArtifactReader`` of a worker process (``kura.workers``): the primary's read path
(``storage.reads``) over a read-only connection to the same SQLite file, never writing
anything. It has no write path at all: ``WorkerReads`` composes the read path
(``storage.reads.ArtifactReads``) and is no store.

A worker serves GET and HEAD hits itself and hands everything else to the primary, the one
process that owns the data dir. This reader answers a miss as any reader does (``read`` raises
``NotFound``, ``exists`` is False, ``read_manifest`` None, ``missing`` lists it): an absent
entry, and an entry whose bytes fail their check (the primary re-checks and quarantines it; the
id is queued in ``suspects`` for it). Handing a miss to the primary, which may read it through
from a peer, is the worker app's routing decision (``kura.workers.worker``). The XXH3-128 a
worker computes while it verifies a row from before the checksum with SHA-256 is queued in
``checksums`` for the primary to record (``CacheService.record_xxh3_128``), so such a row gets
its fast checksum whichever process reads it first. The checks a worker makes before it sends
a byte are the primary's own (``storage.reads``: size on open, hash of small bodies, large ones
hashed while sent).

Coherence: a row is read from SQLite on every request the worker's hot cache cannot answer. That
cache follows the node's shared change counter (``storage.hot_generation``): the primary bumps
it after every commit that replaces or drops an artifact, and the cache empties when it moved, so
a hit is never older than the last change the primary finished. The connection runs in autocommit, so each query sees every transaction committed before it, which
in WAL mode includes the primary's commits from another process
(https://www.sqlite.org/wal.html#concurrency): a read that starts after a write's
acknowledgement sees that write. A row whose file was unlinked between the query and the open
(an overwrite, an eviction, a clean) reads as a miss, never a 500.

``tests/integration/test_workers.py`` reads one key from 6 threads while it is overwritten 150
times and counts reads older than the last acknowledged version: 0.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kit.clock import Clock
from kura.core.manifest import Manifest
from kura.storage.hot_generation import SharedGeneration
from kura.storage.index import MetadataIndex
from kura.storage.read_side import open_reads
from kura.storage.recovery import INDEX_NAME
from kura.storage.schema import READABLE_SCHEMA_VERSIONS, compat_view


class SharedReadIndex(MetadataIndex):
    """``MetadataIndex`` as a second process reads it while the primary writes: ``mode=ro``,
    ``query_only``, a busy timeout; the best-effort writes a read may make (stat signature,
    checksum, access times) are dropped here (``WorkerReads`` queues the hits and checksums for
    the primary).

    ``immutable``: the primary opened the index read-only at start-up (a full disk,
    ``storage.recovery``), so nothing writes it until the node restarts and SQLite could not
    create the ``-shm`` file a WAL reader needs; it is opened with ``immutable=1`` as the
    primary's (https://www.sqlite.org/uri.html#uriimmutable)."""

    def __init__(self, path: Path, *, immutable: bool = False) -> None:  # only the primary writes
        self._path = path
        self.read_only = True
        self._immutable = immutable
        self._local = threading.local()
        self._xxh3_column = "xxh3_128"
        self.purges = {}  # a worker applies nothing: the version rule runs on the primary
        row = self._conn().execute("SELECT v FROM meta WHERE k = 'schema_version'").fetchone()
        if row is None or int(row[0]) not in READABLE_SCHEMA_VERSIONS:
            raise RuntimeError(f"metadata schema {row} cannot be read by a worker")
        if int(row[0]) < 2:
            self._xxh3_column = "NULL"

    def _conn(self) -> sqlite3.Connection:
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            uri = f"file:{self._path}?{'immutable=1' if self._immutable else 'mode=ro'}"
            conn = sqlite3.connect(uri, isolation_level=None, check_same_thread=True, uri=True)
            conn.execute("PRAGMA busy_timeout=5000")
            compat_view(conn)  # a file older than version 4 reads every writer as ''
            conn.execute("PRAGMA query_only=1")
            self._local.conn = conn
        return conn

    def set_stat_sig(self, artifact_id: str, sig: str) -> None:
        return None

    def set_xxh3_128(self, found: Iterable[tuple[Manifest, str]]) -> None:
        return None

    def touch(self, touches: Mapping[str, int]) -> None:
        return None


class WorkerReads:
    """What a worker process reads with (module docstring): ``reads``, its ``ArtifactReader``,
    is the primary's read path (``storage.reads.ArtifactReads``) over the shared index and blob
    files, with nothing of the write path; beside it, what goes to the primary. Create,
    ``attach()``, use, ``close()``."""

    def __init__(
        self,
        *,
        data_dir: Path,
        tmp_dir: Path,
        tenant_id: str,
        clock: Clock,
        verify_reads: str = "always",
        hot_cache_bytes: int = 64 * 1024 * 1024,
        promises: bool = True,
    ) -> None:
        self.clock = clock
        self._index: SharedReadIndex | None = None
        self._reader = ThreadPoolExecutor(4, thread_name_prefix="kura-read")
        # Where the read path asks for a verdict on damage (``_suspect_sync``) and records the
        # stat signatures (dropped by ``SharedReadIndex``): one thread, as the primary's writer.
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="kura-write")
        self.suspects: list[str] = []  # ids whose bytes failed a check here, for the primary
        self.checksums: list[tuple[Manifest, str]] = []  # verified here, for the primary
        self.reads = open_reads(
            data_dir=data_dir,
            tmp_dir=tmp_dir,
            tenant_id=tenant_id,
            clock=clock,
            verify_reads=verify_reads,
            hot_cache_bytes=hot_cache_bytes,
            index=self._require_index,
            reader=self._reader,
            writer=self._writer,
            damaged=self._suspect_sync,
            record_checksums=self._queue_checksums,
            # A miss is a miss here: whether the primary (or, through it, a peer) has it is
            # the worker app's routing decision (kura.workers.worker), not this reader's.
            note_exists=True,  # a HEAD hit here is a read for the primary's LRU
            promises=promises,  # for the primary: KURA_MIN_RETENTION is set
        )
        self.files, self.hot, self.verifier = self.reads.files, self.reads.hot, self.reads.verifier
        self.accesses = self.reads.accesses

    def attach(self, *, immutable: bool = False) -> None:
        """Open the shared index and change counter (the primary created both; it holds the
        data-dir lock). ``immutable``: the primary's index is read-only (``SharedReadIndex``)."""
        self._index = SharedReadIndex(self.files.data_dir / INDEX_NAME, immutable=immutable)
        self.hot.share(SharedGeneration.open(self.files.data_dir), follow=True)

    def _require_index(self) -> MetadataIndex:
        if self._index is None:
            raise RuntimeError("WorkerReads.attach() has not been called")
        return self._index

    async def close(self) -> None:
        """Release the threads. Safe to call once."""
        self.verifier.close()
        for pool in (self._reader, self._writer):
            pool.shutdown(wait=True)

    # -- what goes to the primary (kura.workers.worker) ----------------------------------------

    @property
    def pending_accesses(self) -> Mapping[str, int]:
        """The hits ``take_accesses`` would return now (read only)."""
        return self.accesses.pending

    def take_accesses(self) -> dict[str, int]:
        """The hits since the last call, artifact id -> unix ms (for the primary's LRU)."""
        return self.accesses.take()

    def take_promised(self) -> dict[str, int]:
        """The promises since the last call, artifact id -> unix ms told (``storage.retention``)."""
        return self.accesses.take_promised()

    def take_suspects(self) -> list[str]:
        found, self.suspects = self.suspects, []
        return found

    def take_checksums(self) -> list[tuple[Manifest, str]]:
        """The (manifest, XXH3-128 hex) pairs verified since the last call."""
        found, self.checksums = self.checksums, []
        return found

    def give_back(
        self,
        accesses: Mapping[str, int],
        suspects: Sequence[str],
        checksums: Sequence[tuple[Manifest, str]],
        promised: Mapping[str, int],
    ) -> None:
        """Queue again what a post to the primary that failed carried. Sending twice is
        harmless (a post that timed out may have been recorded): an access time is kept as the
        later one, a suspect is only re-verified, a checksum fills only an empty one."""
        self.accesses.merge(accesses)
        self.accesses.merge_promised(promised)
        self.suspects = list(dict.fromkeys([*suspects, *self.suspects]))
        self.checksums = [*checksums, *self.checksums]

    def _queue_checksums(self, found: list[tuple[Manifest, str]]) -> None:
        """For the primary, which records each if the row is still that version."""
        self.checksums.extend(found)

    def _suspect_sync(self, manifest: Manifest, detected_by: str) -> bool:
        """The verdict on damage (``ArtifactReads``' ``damaged``): never drop an entry here;
        read it as a miss. If its row is still the one read, the bytes really fail their check
        (the primary unlinks a file only after its row changed), so the id goes to the primary
        to verify; a changed row was a race."""
        current = self._require_index().get(manifest.artifact_id)
        if current is not None and current[0] == manifest:
            self.suspects.append(manifest.artifact_id)
        return True
