"""The state and helpers shared by the writing parts of ``CacheService`` (``storage.service``):
eviction (``storage.eviction``), the write path and budget (``storage.write_path``) and copies
from peers (``storage.replica``), each a class over the one before, ``StorageState`` last;
``CacheService`` owns construction and lifecycle. The read path is not one of them: it is an
object (``storage.reads.ArtifactReads``) given the pieces it needs, among them the
``AccessTimes`` defined here.

The threading rules are ``storage.service``'s: SQLite reads and file opens in the reader pool,
fsync and hashing in the sync pool, every index write (and the rename that publishes a blob)
on the single writer thread, which makes them durable in groups (``storage.group_commit``).
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import sqlite3
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor, ThreadPoolExecutor
from functools import cached_property
from typing import Concatenate, ParamSpec, TypeVar

from kit.clock import Clock
from kura.core.errors import ResourceExhausted
from kura.core.keys import artifact_id
from kura.core.manifest import Manifest
from kura.core.namespace_rule import NamespaceRules
from kura.core.version import (
    ApplyOutcome,
    FutureVersion,
    ahead_of_skew_ms,
    decide_apply,
)
from kura.storage import retention
from kura.storage.artifact import ArtifactRef
from kura.storage.blobs import BlobFiles
from kura.storage.budget import TmpBudget
from kura.storage.group_commit import GroupCommitWriter
from kura.storage.hotcache import HotCache
from kura.storage.index import MetadataIndex
from kura.storage.peer_queue import PeerQueues
from kura.storage.quarantine import Quarantine
from kura.storage.recovery import StartReport
from kura.storage.startup_work import StartupWork
from kura.storage.stats import StorageStats
from kura.storage.verify import ReadVerifier
from kura.storage.version_clock import VersionClock

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")


# Blobs up to this size are read into memory and hashed on every read.
SMALL_BLOB_BYTES = 64 * 1024


class AccessTimes:
    """Reads not yet recorded in the index (its LRU): artifact id -> unix ms. Written on the
    event loop; the writer thread may look up ``pending`` (the dict of the moment) to spare an
    artifact read since the times it was handed.

    With ``promises`` (``KURA_MIN_RETENTION`` set), ``promised`` holds the artifacts clients
    were told exist (artifact id -> unix ms told, ``storage.retention``) until the index has
    them: ``forget_promised`` drops them only once recorded, so a promise is always in memory or
    in the index, never in neither (the writer thread copies ``promised`` with ``dict.copy``,
    atomic under the GIL)."""

    def __init__(self, *, promises: bool = False) -> None:
        self.pending: dict[str, int] = {}
        self.promised: dict[str, int] = {}
        self._promises = promises

    def note(self, artifact_id: str, at_ms: int) -> None:
        """A read now (``at_ms``, unix ms)."""
        self.pending[artifact_id] = at_ms

    def promise(self, artifact_ids: Iterable[str], at_ms: int) -> None:
        """A client was told now (``at_ms``, unix ms) that the artifacts exist: a read, and a
        promise to keep them (``storage.retention``) when promises are on. In bulk (dict
        updates): 10,000 ids cost well under a millisecond."""
        told = dict.fromkeys(artifact_ids, at_ms)
        self.pending.update(told)
        if self._promises:
            self.promised.update(told)

    def merge_promised(self, promised: Mapping[str, int]) -> None:
        """Promises made elsewhere (a worker's answers), each kept if later than the one noted."""
        if not self._promises:
            return
        for aid, at_ms in promised.items():
            if at_ms > self.promised.get(aid, 0):
                self.promised[aid] = at_ms

    def forget_promised(self, recorded: Mapping[str, int], expired_before_ms: int) -> None:
        """Drop the promises ``recorded`` in the index (unless made again since), and any made
        before ``expired_before_ms`` (unix ms), which hold nothing back any more."""
        for aid, at_ms in recorded.items():
            if self.promised.get(aid) == at_ms:
                del self.promised[aid]
        if any(at_ms < expired_before_ms for at_ms in self.promised.values()):
            self.promised = {a: ms for a, ms in self.promised.items() if ms >= expired_before_ms}

    def take_promised(self) -> dict[str, int]:
        """The promises noted since the last call (a worker's, sent to its primary)."""
        taken, self.promised = self.promised, {}
        return taken

    def merge(self, accesses: Mapping[str, int]) -> None:
        """Reads made elsewhere (a worker's), each kept if later than the one noted."""
        for aid, at_ms in accesses.items():
            if at_ms > self.pending.get(aid, 0):
                self.pending[aid] = at_ms

    def take(self) -> dict[str, int]:
        """The reads noted since the last call."""
        taken, self.pending = self.pending, {}
        return taken


class StorageState:
    """The state every part of ``CacheService`` shares (set in ``CacheService.__init__``), and
    the small helpers they all use: identity, the skew gate, disk-space checks, counters, the
    executors. Not used on its own."""

    files: BlobFiles
    quarantine: Quarantine
    verifier: ReadVerifier
    _on_quarantine: Callable[[str], None]
    hot: HotCache
    # What replication asks of a local write, given at construction (``CacheService``).
    _replication_targets: Callable[[], Sequence[str]]
    _artifact_targets: Callable[[], Sequence[str]]
    _bucket_targets: Sequence[str]  # (OUTBOX_TARGET,) with the object-storage tier, else ()
    _outbox_written: Callable[[], None]
    _eviction_floor_ms: Callable[[], int | None]
    _touched: Callable[[Mapping[str, int]], None]
    outbox_max_depth: int
    tenant_id: str
    budget: TmpBudget
    clock: Clock
    max_disk_bytes: int
    min_retention_ms: int  # KURA_MIN_RETENTION in ms (storage.retention); 0 = off
    namespace_rules: NamespaceRules  # KURA_NAMESPACE_RULES (storage.eviction, .expiry)
    # Writer thread only: promises recorded by evictions since the last flush.
    _promises_recorded: dict[str, int]
    min_free_disk_bytes: int
    stats: StorageStats
    startup: StartupWork
    queues: PeerQueues
    _index: MetadataIndex | None
    _reader: ThreadPoolExecutor
    _syncer: ThreadPoolExecutor
    _background: ThreadPoolExecutor  # bulk background work at a lower CPU priority
    _writer: GroupCommitWriter
    max_clock_skew_ms: int
    max_inline_bytes: int
    inline_max_bytes: int
    versions: VersionClock
    accesses: AccessTimes
    start_report: StartReport
    # Whether the last free-space check refused a write (``_check_free_disk``): the disk is
    # full for writes even while a little more than the floor is free.
    refusing_for_space: bool = False

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

    def free_disk_bytes(self) -> int:
        """Free bytes on the data dir's filesystem (0 before ``start`` created the dir)."""
        try:
            return shutil.disk_usage(self.files.data_dir).free
        except FileNotFoundError:
            return 0

    def disk_full_reason(self) -> str | None:
        """Why writes are refused for want of space right now (a ``/ready`` reason), or
        ``None``: at most ``KURA_MIN_FREE_DISK_BYTES`` free on the data filesystem. One
        ``statvfs`` per call, so the reason clears by itself once space is freed, with no
        write needed to notice (issue 26: a full disk must not latch, and ``/ready`` is 503
        while writes are refused). Each write's own check (``_check_free_disk``) also counts
        the uploads in flight, so a write can be refused a little above the floor."""
        free = self.free_disk_bytes()
        if free > self.min_free_disk_bytes:
            return None
        return (
            f"disk full: {free} bytes free (KURA_MIN_FREE_DISK_BYTES="
            f"{self.min_free_disk_bytes}); writes answer 503 until space is freed"
        )

    @property
    def index_read_only(self) -> bool:
        """Whether the index was opened read-only (a full disk at start-up, ``storage.recovery``;
        a worker's is always): nothing writes it until a restart."""
        return self._require_index().read_only

    async def _reads_open(self) -> None:
        """Wait, on the event loop, until start-up's index check is over
        (``storage.startup_work``), at most ``KURA_STARTUP_WAIT_SECONDS``: every read waits
        here before it goes to the reader pool (``_in``, ``storage.reads``,
        ``storage.replica_log``), never in a reader thread. ``Unavailable`` (503,
        ``Retry-After``) after the wait."""
        await self.startup.wait_readable()

    async def _writes_open(self) -> None:
        """Wait until start-up's reconciliation is over (``storage.startup_work``), at most
        ``KURA_STARTUP_WAIT_SECONDS``: every write that publishes a file, adds a row or cleans
        calls it before it reaches the writer thread. ``Unavailable`` (503, ``Retry-After``;
        gRPC ``UNAVAILABLE``) after the wait, naming what still runs."""
        await self.startup.wait_writable()

    def _check_writable(self) -> None:
        """ResourceExhausted (503) while the index is read-only (a full disk at start-up)."""
        if reason := self.start_report.read_only_reason:
            raise ResourceExhausted(reason, retry_after_seconds=30)

    @cached_property
    def _tmp_on_data_fs(self) -> bool:
        """Whether the tmp dir is on the data dir's filesystem (cannot change while the node
        runs, so stat'ed once): the free-space floor counts the uploads in flight by it."""
        return os.stat(self.files.tmp_dir).st_dev == os.stat(self.files.data_dir).st_dev

    def _check_free_disk(self, incoming_bytes: int) -> None:
        """``ResourceExhausted`` (503) unless the data filesystem keeps
        ``KURA_MIN_FREE_DISK_BYTES`` free once ``incoming_bytes`` more and the uploads in
        flight have landed: with the tmp dir on the same filesystem, their reserved bytes not
        written yet (``TmpBudget.unwritten_bytes``); on another one, all they reserved (a
        commit copies them over). Each upload alone passing a check of free space minus its
        own length let concurrent ones take the disk below the floor (issue 26: 5.3 MB free
        under an 8 MiB floor). The unwritten bytes cost a ``stat`` per upload in flight, so
        they are counted only when all that is reserved (their upper bound) would not fit: 4.6
        ms on the event loop per check with 1,000 uploads in flight, twice per write."""
        self._check_writable()
        free = shutil.disk_usage(self.files.data_dir).free
        in_flight = self.budget.reserved_bytes
        if self._tmp_on_data_fs and free - in_flight - incoming_bytes < self.min_free_disk_bytes:
            in_flight = self.budget.unwritten_bytes()
        self.refusing_for_space = free - in_flight - incoming_bytes < self.min_free_disk_bytes
        if self.refusing_for_space:
            raise ResourceExhausted(
                f"insufficient free disk space: {free} bytes free, {in_flight} bytes of "
                f"uploads in flight and {incoming_bytes} bytes incoming, "
                f"{self.min_free_disk_bytes} bytes must stay free",
                retry_after_seconds=5,
            )

    def _take_touches(self) -> dict[str, int]:
        """The access times read since the last call (the index records them next);
        ``touched`` hears of them too (the bucket's touch markers, ``storage.bucket_touch``)."""
        touches = self.accesses.take()
        if touches:
            self._touched(touches)
        return touches

    def _promised_since_ms(self) -> int | None:
        """Artifacts promised at or after this (unix ms) are inside their retention window
        (``storage.retention``); None while ``KURA_MIN_RETENTION`` is 0."""
        if not self.min_retention_ms:
            return None
        return self.clock.now_ms() - self.min_retention_ms

    def _record_promises_sync(self, promised: Mapping[str, int], *, flush: bool = False) -> None:
        """Writer thread: record ``promised`` in the index and drop the expired promises
        (``retention.record``). An eviction records what is in memory before it picks; the
        ones it recorded are remembered (``_promises_recorded``), so the next eviction before a
        flush writes only the new ones. The ``flush`` (``CacheService.flush_promises``)
        forgets them in memory once recorded, and so resets that record."""
        since = self._promised_since_ms()
        if since is None:
            return
        done = self._promises_recorded
        fresh = {a: ms for a, ms in promised.items() if done.get(a) != ms}
        retention.record(self._require_index().connection(), fresh, since)
        if flush:
            self._promises_recorded = {}
        else:
            done.update(fresh)

    def _count(self, source: str, outcome: str) -> None:
        key = (source, outcome)
        self.stats.apply_outcomes_total[key] = self.stats.apply_outcomes_total.get(key, 0) + 1

    # -- plumbing ----------------------------------------------------------------------------

    def _require_index(self) -> MetadataIndex:
        if self._index is None:
            raise RuntimeError("CacheService.start() has not completed")
        return self._index

    def _unlink_artifact_later(self, artifact_id: str) -> None:
        """Writer thread: unlink every version file of ``artifact_id`` (its row is gone) once
        the group that removed the row is durable (``storage.group_commit``)."""
        for path in self.files.artifact_files(artifact_id):
            self._writer.unlink_later(path)

    async def _in(self, pool: Executor, fn: Callable[..., T], *args: object) -> T:
        if pool is self._reader:
            await self._reads_open()
        return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)

    async def _read_index(
        self, fn: Callable[Concatenate[sqlite3.Connection, P], T], *args: P.args, **kw: P.kwargs
    ) -> T:
        """``fn(connection, *args)`` on a reader thread with its index connection: the
        read-only queries of storage's own modules (expiry, the bucket's). Never lent outside
        ``kura.storage``: the mesh reaches the index through ``storage.ports.OutboxLog`` and
        ``ChangeLog``."""
        return await self._in(
            self._reader, lambda: fn(self._require_index().connection(), *args, **kw)
        )


def decide(index: MetadataIndex, incoming: Manifest, stored: Manifest | None) -> ApplyOutcome:
    """Last-writer-wins against what is stored and the namespace tombstone, or the purge of the
    incoming copy's writer there when it is newer (``MetadataIndex.covered``, core.version)."""
    return decide_apply(
        incoming.version_ms,
        None if stored is None else stored.version_ms,
        index.covered(incoming.namespace_id, incoming.writer),
        incoming.sha256,
        "" if stored is None else stored.sha256,
    )


def subject(manifest: Manifest) -> str:
    return f"{manifest.producer} artifact in namespace {manifest.namespace_id!r}"
