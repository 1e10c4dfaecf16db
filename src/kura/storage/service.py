"""CacheService: the one façade protocols use to store and read artifacts.

Guarantees:

* A write is visible only once whole, never partial: its body is staged in the tmp dir under a
  reservation from the tmp budget, fsynced, renamed into place beside any older version and
  then recorded in the index; the writer makes its group of commits durable (one WAL fsync,
  ``storage.group_commit``) before answering, and only then unlinks the older version's file.
  A body of at most ``inline_max_bytes`` is read into memory and committed inside its index
  row instead (``storage.small_body``). A crash at any point leaves the acknowledged version
  intact, and start-up removes the rest (``storage.reconcile``; ``docs/durability.md``). A
  rejected write leaves no blob, no index row and no reserved bytes; a write whose group's
  fsync fails is answered 503 though its row may stay, and the node then refuses every write
  until it is restarted.
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
  local: they are never replicated. While ``eviction_floor_ms()`` is set (a bootstrap
  runs), eviction only picks artifacts last used before it; a write that finds nothing it may
  evict is still stored, over the budget, as when nothing at all is evictable. A bootstrap copy
  is stamped as last used at the floor, and equal stamps are evicted oldest version first.
* Every local write (and namespace clean) enqueues one outbox message per replication target
  (``targets()``; with ``bucket``, the bucket's uploader too, and for an artifact write the
  bucket alone: nodes sharing it copy no bodies) in the same SQLite transaction as the data,
  and then ``outbox_written()`` is called (it wakes the shipper). Copies
  received from peers (``apply_replica``) are applied by last-writer-wins and are not
  re-enqueued: every node ships its own writes to all.
  A peer whose queue holds ``outbox_max_depth`` messages gets no more and is marked to be
  caught up (``storage.peer_queue``); a write is never refused because of a peer.

Storage never asks the mesh or the bucket for a miss: the readers above it wrap this one
(``storage.fill.FillingReader``, composed in ``kura.app``). What replication needs of a write is
given at construction, as callables that must be cheap and must not raise: ``targets`` and
``eviction_floor_ms`` run on the writer thread, ``outbox_written``, ``touched`` (access times
just taken for the index, for the bucket's touch markers) and ``sent_again`` (an intact
artifact a client sent again: the bucket's copy is checked) on the event loop. The defaults are
a node on its own: no targets, no floor.

This module owns construction, lifecycle and peer paging. The outbox, the change feed, the
cursors into peers' feeds and the range digests are reached only through ``replica_log`` (the
``storage.ports.OutboxLog`` and ``ChangeLog`` ports, ``storage.replica_log``). The read path is
one object, ``storage.reads.ArtifactReads``, over the index, files, hot cache and executors it
shares with the store (a worker's reader composes the same one, ``storage.worker_reads``;
both are built by ``storage.read_side.open_reads``); it is the store's ``ArtifactReader``,
``reads``. The writing side is still one line of classes over
one shared state (``storage.state``): ``storage.replica`` (copies from peers) over
``storage.write_path`` (checks, staging, commit, namespace cleans) over ``storage.eviction``
(LRU, and the quarantine of damaged entries). The layers above use the ports
(``storage.ports``), not this class. Bytes live behind ``storage.blobstore.BlobStore``
(``storage.blobs.BlobFiles`` on disk), metadata in ``storage.index``.

Blocking work runs off the event loop: SQLite reads and file opens in a small reader pool,
fsync and hashing in a sync pool, and every index write plus the rename that publishes a blob in
one single-threaded writer, which serialises commits of the same key.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import TypeVar

from kit.background import background_pool
from kit.backoff import Backoff, every
from kit.clock import Clock
from kit.log_limit import LogLimit
from kura.core.errors import Unavailable
from kura.core.manifest import Manifest
from kura.core.namespace_rule import NO_RULES, NamespaceRules
from kura.core.object_layout import OUTBOX_TARGET
from kura.core.version import ahead_of_skew_ms
from kura.storage import namespace_usage, provenance, retention
from kura.storage.artifact import ArtifactRef, PutResult, StoredBody, WriterUsage
from kura.storage.budget import TmpBudget
from kura.storage.fsync import (
    SHORTAGE_ERRNOS,
    DescriptorShortage,
    descriptor_shortage,
    disk_full,
    process_shortage,
    shortage_reason,
)
from kura.storage.group_commit import GroupCommitWriter, GroupStats
from kura.storage.index import MetadataIndex
from kura.storage.peer_queue import PeerQueues
from kura.storage.quarantine import Quarantine
from kura.storage.read_side import open_reads
from kura.storage.reconcile import ReconcileReport, reconcile
from kura.storage.recovery import (
    IndexDamaged,
    StartReport,
    check_index,
    is_damage,
    mark_damaged,
    note_reconciled,
    open_index,
    replace_damaged,
)
from kura.storage.replica import ReplicaApply
from kura.storage.replica_log import IndexReplicaLog
from kura.storage.startup_work import StartupWork
from kura.storage.stats import StorageStats
from kura.storage.version_clock import VersionClock

__all__ = ["ArtifactRef", "CacheService", "PutResult", "StorageStats", "StoredBody"]

log = logging.getLogger(__name__)
T = TypeVar("T")

TOUCH_FLUSH_SECONDS = 5.0
# How long the start-up work waits before it tries again after a shortage (``_shortage``):
# the first wait, doubled after each failure in a row up to the cap, with equal jitter
# (``kit.backoff``); and at most one WARNING about it per interval (``kit.log_limit``).
STARTUP_RETRY_SECONDS = 5.0
STARTUP_RETRY_MAX_SECONDS = 60.0
STARTUP_RETRY_LOG_SECONDS = 60.0


class CacheService(ReplicaApply):
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
        min_retention_ms: int = 0,
        namespace_rules: NamespaceRules = NO_RULES,
        outbox_max_depth: int = 100_000,
        hot_cache_bytes: int = 64 * 1024 * 1024,
        verify_reads: str = "always",
        quarantine_max_bytes: int = 1024 * 1024 * 1024,
        on_quarantine: Callable[[str], None] = lambda artifact_id: None,
        max_clock_skew_ms: int = 300_000,
        max_inline_bytes: int = 1024 * 1024,
        inline_max_bytes: int = 0,
        targets: Callable[[], Sequence[str]] = tuple,
        bucket: bool = False,
        outbox_written: Callable[[], None] = lambda: None,
        eviction_floor_ms: Callable[[], int | None] = lambda: None,
        touched: Callable[[Mapping[str, int]], None] = lambda accesses: None,
        sent_again: Callable[[str], None] = lambda artifact_id: None,
        startup_wait_seconds: float = 10.0,
    ) -> None:
        self.quarantine = Quarantine(data_dir / "quarantine", quarantine_max_bytes)
        self._on_quarantine = on_quarantine
        self.outbox_max_depth = outbox_max_depth
        # What replication needs of a write (module docstring); with the bucket, every clean
        # goes to it too, and an artifact write to it alone.
        self._replication_targets = (lambda: [*targets(), OUTBOX_TARGET]) if bucket else targets
        self._artifact_targets = (lambda: (OUTBOX_TARGET,)) if bucket else targets
        self._bucket_targets = (OUTBOX_TARGET,) if bucket else ()
        self._outbox_written = outbox_written
        self._eviction_floor_ms = eviction_floor_ms
        self._touched = touched
        self._sent_again = sent_again
        self.tenant_id = tenant_id
        self.budget = budget
        self.clock = clock
        self.max_disk_bytes = max_disk_bytes
        self.min_free_disk_bytes = min_free_disk_bytes
        self.min_retention_ms = min_retention_ms
        self.namespace_rules = namespace_rules
        self._promises_recorded = {}
        self.stats = StorageStats()
        self.queues = PeerQueues(lambda: self.stats, outbox_max_depth)
        self._index: MetadataIndex | None = None
        self._reader = ThreadPoolExecutor(4, thread_name_prefix="kura-read")
        self._syncer = ThreadPoolExecutor(4, thread_name_prefix="kura-sync")
        # Bodies nobody waits on (a bootstrap's, a read-through copy already served) are
        # written and hashed here, at a lower CPU priority than serving (kit.background):
        # maintenance must not take the cores clients wait on, nor block the event loop.
        self._background = background_pool(2, "kura-background")
        self._writer = GroupCommitWriter("kura-write")
        # What the mesh reads and changes of the outbox, the feed, cursors and digests.
        self.replica_log = IndexReplicaLog(
            index=self._require_index,
            reader=self._reader,
            writer=self._writer,
            queues=self.queues,
            clock=clock,
            evict_to_budget=lambda: self._evict_sync(0, ""),
            reads_open=self._reads_open,
        )
        self.max_clock_skew_ms = max_clock_skew_ms
        # Inline bodies are read into memory and stored in SQLite, outside the tmp budget: a
        # peer's copy that claims to be inline may be no larger than a local inline write
        # (KURA_MAX_KEYVALUE_BYTES or KURA_INLINE_MAX_BYTES, as upstream Kura limits inline
        # replicas).
        self.max_inline_bytes = max(max_inline_bytes, inline_max_bytes)
        # Local writes of at most this many bytes are stored inline (KURA_INLINE_MAX_BYTES).
        self.inline_max_bytes = inline_max_bytes
        self.versions = VersionClock()
        self.start_report = StartReport()
        # The start-up work after the cheap part (storage.startup_work): its progress and
        # waits, its thread, and its stop (seen inside a statement: ``_startup_connection``).
        self.startup = StartupWork(startup_wait_seconds, clock)
        self._startup_pool = ThreadPoolExecutor(1, thread_name_prefix="kura-startup")
        self._startup_stop = threading.Event()
        # The read path, one object over the pieces it shares with the rest (storage.reads).
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
            damaged=self._confirm_corrupt_sync,
            record_checksums=self.record_xxh3_128,
            sent_again=sent_again,
            promises=min_retention_ms > 0,
            reads_open=self._reads_open,
        )
        self.files, self.hot, self.verifier = self.reads.files, self.reads.hot, self.reads.verifier
        self.accesses = self.reads.accesses
        self.files.group = self._writer  # blob renames are made durable with their group

    # -- lifecycle ---------------------------------------------------------------------------

    async def start(self, *, background: bool = False) -> None:
        """Open the data dir (taking its lock), sweep staging leftovers and orphans. With
        ``background`` only the cheap part (``recovery.open_index``) runs here and the caller
        runs ``finish_start`` once it listens (``storage.startup_work``: reads wait for the
        index check, writes for the reconciliation); else all of it runs before this returns."""
        started = time.monotonic()
        await self._in(self._writer, self._open_sync)
        # The start-up thread's connection, opened before the node listens: a descriptor
        # shortage once clients connect cannot fail it then.
        await self._in(self._startup_pool, self._startup_connection)
        if not background:
            await self.finish_start()
            return
        log.info(
            "data dir opened in %.2f s; checking the index and reconciling it in the background",
            time.monotonic() - started,
        )

    def _open_sync(self) -> None:
        self._index, self.start_report = open_index(self.files)
        self._open_writer_sync()
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
        full = self.disk_full_reason()  # a /ready reason; the start report is logged already
        for warning in self.queues.warnings() + ([full] if full else []):
            log.warning("at start-up: %s", warning)
        # Nobody queries it but the start-up thread until it was checked (finish_start).
        self._index.hold(self.startup.unavailable)

    def _open_writer_sync(self) -> None:
        """Writer thread: what it keeps of the index (again after a damaged one was replaced)."""
        index = self._require_index()
        if not index.read_only:
            self._writer.set_sync(index.group_commits())
            # Only rules need it, and every touch flush pays for it (storage.schema).
            index.keep_namespace_access_index(bool(self.namespace_rules))
        self.queues.load(index.connection(), index.read_only)

    async def finish_start(self) -> None:
        """The start-up work after ``start(background=True)`` (``storage.startup_work``): the
        index check, with the index held, then the reconciliation, while writes wait. A
        damaged index found by the check is replaced in place; one found by the
        reconciliation (reads are served by then) is marked for the next start and
        ``IndexDamaged`` raised, which stops the node. A shortage (a full disk, no descriptor
        to spare: ``_shortage``) is neither: logged at WARNING, and the step tried again after
        ``STARTUP_RETRY_SECONDS``, reads served as far as the step allows meanwhile. Returns
        early when ``stop_startup`` stops it."""
        started = time.monotonic()
        try:
            replaced = await self._retrying(self._check_sync, "checking the index")
        except _Stopped:
            return  # the hold stays until ``close`` has waited for the start-up thread
        self._release_index()
        self.startup.mark_checked()
        log.info(
            "index checked in %.2f s (the check: PRAGMA quick_check %.2f s, the row totals and "
            "the range digests); reads are served, reconciling %d rows with the files",
            time.monotonic() - started,
            self.start_report.quick_check_seconds,
            self.startup.rows_expected,
        )
        if replaced:
            await self._in(self._writer, self._open_writer_sync)
        try:
            reconciled = await self._retrying(self._reconcile_sync, "reconciling the index")
        except _Stopped:
            return  # stopping; the next start does it again
        note_reconciled(self.start_report, reconciled)
        if reconciled.dropped_rows:  # the totals were read by the check, before these went
            index = self._require_index()

            def totals() -> tuple[int, int]:
                try:
                    return index.totals()
                finally:
                    index.close_thread_connection()

            try:
                counted = await self._retrying(totals, "re-reading the totals")
            except _Stopped:
                return
            self.stats.artifacts, self.stats.used_bytes = counted
        self.startup.finish()
        log.info(
            "start-up work done in %.2f s: %d rows reconciled; writes are taken",
            time.monotonic() - started,
            self.startup.rows_done,
        )
        swept, rec = self.start_report.swept_files, self.start_report.reconciled
        if swept or rec.removed_files or rec.dropped_rows:
            orphans = rec.removed_files + rec.dropped_rows
            log.info("start-up sweep removed %d staging files and %d orphans", swept, orphans)

    async def _retrying(self, step: Callable[[], T], what: str) -> T:
        """``step()`` on the start-up thread, again for as long as it fails with a shortage
        (``_shortage``), after a jittered backoff on ``self.clock`` (``STARTUP_RETRY_SECONDS``
        doubling up to ``STARTUP_RETRY_MAX_SECONDS``, equal jitter) with at most one WARNING
        per ``STARTUP_RETRY_LOG_SECONDS``; ``_Stopped`` once stopped."""
        backoff = Backoff(STARTUP_RETRY_SECONDS, STARTUP_RETRY_MAX_SECONDS, jitter=0.5)
        lines = LogLimit(1, STARTUP_RETRY_LOG_SECONDS, self.clock.monotonic)
        while True:
            try:
                return await self._in(self._startup_pool, step)
            except (OSError, sqlite3.OperationalError) as exc:
                if self._startup_stop.is_set():
                    raise _Stopped from None
                reason = _shortage(exc)
                if reason is None:
                    raise
                delay = backoff.failed()
                if (left_out := lines.admit()) is not None:
                    log.warning(
                        "start-up: %s failed for want of %s (%s); reads are served as far as "
                        "they can be, writes wait; trying again in %.1f s (%d more such "
                        "failures since the last line)",
                        what,
                        reason,
                        exc,
                        delay,
                        left_out,
                    )
            await self.clock.sleep(delay)
            if self._startup_stop.is_set():
                raise _Stopped

    def _release_index(self) -> None:
        if self._index is not None:
            self._index.release()

    def _startup_connection(self) -> sqlite3.Connection:
        """Start-up thread: claim the index's hold and return this thread's connection, its
        progress handler set to end a statement once ``stop_startup`` was called (again after
        a damaged index was replaced: a fresh connection)."""
        index = self._require_index()
        index.claim_hold()
        conn = index.connection()
        conn.set_progress_handler(self._startup_progress, self.startup.statement_steps)
        return conn

    def _startup_progress(self) -> int:
        """Progress handler of the start-up connection: nonzero (the statement ends with
        ``sqlite3.OperationalError: interrupted``) once ``stop_startup`` was called."""
        self.startup.at("statement")
        return int(self._startup_stop.is_set())

    def _check_sync(self) -> bool:
        """Start-up thread, holding the index: check it; replace it if damaged. Returns
        whether it was replaced; ``_Stopped`` when ``stop_startup`` ended it."""
        index = self._require_index()
        replaced = False
        self.startup.at("check")
        try:
            self._startup_connection()
            if self._startup_stop.is_set():
                raise _Stopped
            if self.start_report.checked:
                count, used = index.totals()
            else:
                count, used = check_index(index, self.start_report)
        except sqlite3.OperationalError:
            if not self._startup_stop.is_set():
                raise
            log.info("stopped during the start-up index check; the next start does it again")
            raise _Stopped from None
        except _Stopped:
            log.info("stopped during the start-up index check; the next start does it again")
            raise
        except IndexDamaged as exc:
            replace_damaged(self.files, index, str(exc), self.start_report)
            self._startup_connection()  # the fresh index's, with the progress handler
            count, used, replaced = 0, 0, True
        self.stats.artifacts, self.stats.used_bytes = count, used
        self.startup.reconciling(count)
        return replaced

    def _reconcile_sync(self) -> ReconcileReport:
        """Start-up thread: reconcile (``storage.reconcile``), the rows it drops deleted on the
        writer thread. ``_Stopped`` when ``stop_startup`` ended it."""
        index = self._require_index()

        def progress(rows: int) -> None:
            self.startup.rows_done = rows
            self.startup.at("reconcile_page")
            if self._startup_stop.is_set():
                raise _Stopped

        def drop(ids: list[str]) -> None:
            try:
                self._writer.submit(index.delete, ids).result()
            except Unavailable as exc:  # the group's fsync was short of descriptors: passing
                if self._writer.failure is not None:
                    raise  # a failed fsync latches the writer: not a shortage
                raise DescriptorShortage(errno.EMFILE, str(exc)) from exc  # _retrying retries

        self.startup.at("reconcile")
        try:
            self._startup_connection()
            return reconcile(self.files, index, progress, drop)
        except _Stopped:
            log.info("stopped during start-up reconciliation; the next start does it again")
            raise
        except sqlite3.DatabaseError as exc:
            if self._startup_stop.is_set() and isinstance(exc, sqlite3.OperationalError):
                log.info("stopped during start-up reconciliation; the next start does it again")
                raise _Stopped from None
            if not is_damage(exc):
                raise
            reason = f"{exc} ({exc.sqlite_errorname})"
            mark_damaged(self.files, reason)
            log.error(
                "the index is damaged (%s), found while reconciling it with reads served: "
                "stopping; the next start sets it aside and starts with a fresh one",
                reason,
            )
            raise IndexDamaged(reason) from exc
        finally:
            index.close_thread_connection()  # the start-up thread's: its work is over

    @property
    def commit_stats(self) -> GroupStats:
        """The writer's group-commit counters (``storage.group_commit``)."""
        return self._writer.stats

    def write_refusals(self) -> list[str]:
        """Why writes are refused right now (``/ready`` reasons), empty when they are taken:
        a failed fsync (until a restart), a descriptor shortage (until a sync succeeds again,
        which the writer retries by itself; ``storage.group_commit``), a full disk (while it
        lasts, ``disk_full_reason``) or an index opened read-only on a full disk at start-up
        (until a restart, ``storage.recovery``). The shortage is also read live
        (``fsync.process_shortage``): the writer's retry may succeed on a descriptor freed
        for a moment that the next accepted connection takes again, and a staged write's
        open is refused without the writer ever knowing."""
        writer = self._writer
        short = writer.shortage
        if short is None and (exc := process_shortage()) is not None:
            short = shortage_reason(exc)
        found = [self.start_report.read_only_reason, writer.failure, short]
        return [r for r in (*found, self.disk_full_reason()) if r]

    def warnings(self) -> list[str]:
        """Storage problems for an operator that do not block readiness (``/ready``
        warnings): what start-up found (``StartReport.warnings``), the peer queues, and a
        failed fsync (a reason too)."""
        found = self.start_report.warnings + self.queues.warnings()
        shortfall = retention.shortfall_warning(
            self.stats, self.clock.now_ms(), self.min_retention_ms, self.max_disk_bytes
        )
        found += [shortfall] if shortfall else []
        forced = namespace_usage.shortfall_warning(self.stats, self.clock.now_ms())
        found += [forced] if forced else []
        return found + ([self._writer.failure] if self._writer.failure else [])

    def stop_startup(self) -> None:
        """Stop the start-up work (``finish_start`` returns; the next start does it again): a
        statement it runs ends within ``statement_steps`` SQLite steps (the connection's
        progress handler, ``_startup_progress``), the reconciliation at its next page too,
        and every request waiting on it is answered 503 at once, saying the node is stopping
        (``StartupWork.stop``). Any thread; ``close`` calls it too."""
        self._startup_stop.set()
        self.startup.stop()

    async def close(self) -> None:
        """Flush access times and release the data dir. Safe to call once after start. Start-up
        work still running is stopped (``stop_startup``) and waited for off the event loop,
        and only then is the index released."""
        self.stop_startup()
        await asyncio.to_thread(self._startup_pool.shutdown, wait=True)
        self._release_index()
        if self._index is not None and self._writer.failure is None:
            if self.startup.checked:  # else nothing was read: no access time, no promise
                await self.flush_touches()
            await self._in(self._writer, self._close_sync)
        elif self._index is not None:  # the writer refuses every job: close here
            self._close_sync()
        self.verifier.close()
        for pool in (self._reader, self._syncer, self._background, self._writer):
            pool.shutdown(wait=True)
        if self._index is not None:
            self._index.close_all()  # the reader threads' and the constructing thread's too

    def _close_sync(self) -> None:
        if self._index is not None:
            self._index.close_thread_connection()
        self.files.close()

    async def run_maintenance(self) -> None:
        """Forever: flush batched access times. Run it in the app's TaskGroup."""
        await every(self._maintain, TOUCH_FLUSH_SECONDS, what="flushing access times", log=log)

    async def _maintain(self) -> None:
        await self.flush_touches()
        await self._retry_digests()

    async def _retry_digests(self) -> None:
        """Build the range digests the start-up check could not (a full disk:
        ``MetadataIndex.digests_ready``), on the writer thread, once the disk has room."""
        index = self._require_index()
        if index.digests_ready or self.free_disk_bytes() <= self.min_free_disk_bytes:
            return
        try:
            await self._in(self._writer, index.ensure_digests)
        except sqlite3.OperationalError as exc:
            if _shortage(exc) is None:
                raise
            log.warning("range digests still not built (%s); trying again later", exc)

    async def flush_touches(self) -> None:
        touches = self._take_touches()
        # Access times are best effort: not recorded while the disk is full or read-only.
        index = self._require_index()
        full = self.free_disk_bytes() <= self.min_free_disk_bytes
        try:
            if touches and not index.read_only and not full and self._writer.failure is None:
                await self._in(self._writer, index.touch, touches)
        finally:
            await self.flush_promises()

    async def flush_promises(self) -> None:
        """Record the promises made since the last flush (``storage.retention``) and forget
        them in memory. While the disk is full they stay in memory (the expired ones go), to
        be recorded once it is not; an index opened read-only is never written nor evicted
        from until a restart, so its promises are dropped, as are a failed writer's (it writes
        nothing more until a restart: kept, they would grow with every answer)."""
        since = self._promised_since_ms()
        if since is None:
            return
        promised = self.accesses.promised.copy()
        index = self._require_index()
        if index.read_only or self._writer.failure is not None:
            since = 1 << 62  # every promise forgotten: nothing to hold back
        elif self.free_disk_bytes() <= self.min_free_disk_bytes:
            promised = {}
        elif promised:
            await self._in(self._writer, partial(self._record_promises_sync, flush=True), promised)
        self.accesses.forget_promised(promised, since)
        if not index.read_only:  # kura_retention_promised_bytes, off the writer thread
            self.stats.retention_promised_bytes = await self._read_index(
                retention.promised_bytes, since
            )

    # -- reads: this store's ArtifactReader is ``reads`` (storage.reads.ArtifactReads) --------
    # What the store's other ports (ArtifactWriter, WorkerSupport) ask of it is answered there.

    async def intact(self, ref: ArtifactRef, size_bytes: int | None = None) -> bool:
        return await self.reads.intact(ref, size_bytes)

    async def verify_stored(self, artifact_id: str, *, detected_by: str) -> bool:
        return await self.reads.verify_stored(artifact_id, detected_by=detected_by)

    def note_access(self, accesses: dict[str, int]) -> None:
        """Reads made elsewhere (a worker's hits): artifact id -> unix ms, kept if later."""
        self.accesses.merge(accesses)

    def note_promised(self, promised: dict[str, int]) -> None:
        """Promises a worker made (``storage.retention``): artifact id -> unix ms told."""
        self.accesses.merge_promised(promised)

    def record_xxh3_128(self, found: Sequence[tuple[Manifest, str]]) -> None:
        """Senders verified rows without a checksum with SHA-256 and computed each one's
        XXH3-128 in the same pass: record ``(manifest, xxh3_128)`` pairs (one writer-thread
        task, not waited for; best effort) so the next read of that version checks the fast
        one (``MetadataIndex.set_xxh3_128``)."""
        index = self._require_index()
        with contextlib.suppress(RuntimeError):  # the writer pool is shutting down
            self._writer.submit(index.set_xxh3_128, list(found))

    # -- provenance (storage.ports.Provenance) --------------------------------------------------

    async def writers(self, namespace_id: str) -> list[WriterUsage]:
        """Every writer of ``namespace_id``, most bytes first (``provenance.writers``)."""
        return await self._read_index(provenance.writers, namespace_id)

    async def written_by(self, namespace_id: str, writer: str, limit: int) -> list[Manifest]:
        """``writer``'s manifests in ``namespace_id``, newest first, at most ``limit``."""
        return await self._read_index(provenance.written_by, namespace_id, writer, limit)

    async def namespaces(self) -> dict[str, tuple[int, int]]:
        """Namespace -> (bytes, entries), measured now (``namespace_usage.usage``)."""
        return await self._read_index(namespace_usage.usage)

    # -- paging for peers ----------------------------------------------------------------------

    async def manifests_page(self, after: str | None, limit: int) -> list[Manifest]:
        """Manifests in artifact_id order strictly after ``after`` (None: from the first)."""
        return await self._in(
            self._reader, self._require_index().paging.manifests_after, after, limit
        )

    async def manifests_newest_page(
        self, after: tuple[int, str] | None, limit: int
    ) -> list[Manifest]:
        """Manifests by (version_ms descending, artifact_id) strictly after the cursor ``after``
        (None: from the newest); ``MetadataIndex.manifests_newest``."""
        return await self._in(
            self._reader, self._require_index().paging.manifests_newest, after, limit
        )

    async def tombstones_page(self, after: str | None, limit: int) -> list[tuple[str, int]]:
        """Tombstones in namespace_id order strictly after ``after`` (None: from the first)."""
        return await self._in(
            self._reader, self._require_index().paging.tombstones_after, after, limit
        )


class _Stopped(Exception):
    """``stop_startup`` stopped the start-up work (``CacheService.finish_start``)."""


def _shortage(exc: BaseException) -> str | None:
    """What the process ran short of, when ``exc`` is a passing shortage rather than damage or
    a fault: a full disk (``ENOSPC``, ``SQLITE_FULL``), descriptors or memory for a file
    (``fsync.SHORTAGE_ERRNOS``; ``SQLITE_CANTOPEN`` always, on an index already open:
    a temp file's failed open, ``recovery._is_damage``; ``SQLITE_IOERR`` while
    ``descriptor_shortage()`` reads one: SQLite reports a failed open as either). Else None."""
    if disk_full(exc):
        return "disk space"
    if isinstance(exc, OSError):
        return "descriptors" if exc.errno in SHORTAGE_ERRNOS else None
    if not isinstance(exc, sqlite3.DatabaseError):
        return None
    name = exc.sqlite_errorname
    if name.startswith("SQLITE_CANTOPEN"):
        return "descriptors"
    if name.startswith("SQLITE_IOERR") and descriptor_shortage():
        return "descriptors"
    return None
