"""The single writer thread, committing in groups: N concurrent writes share one WAL fsync.

Every index write runs on one thread (``storage.service``'s rule), one job after another in the
order they were submitted. ``GroupCommitWriter`` is that thread. Its SQLite connection commits
with ``synchronous=NORMAL``: a COMMIT appends to the WAL without an fsync
(https://www.sqlite.org/pragma.html#pragma_synchronous). The jobs that queued up while the
thread was busy form a *group*. After the group's last job the thread makes the group durable,
in this order:

1. it fsyncs each directory a job published a blob file into (``sync_dir_later``);
2. it calls ``sync`` (``fsync.WalSync``: fsync the WAL, which makes every COMMIT before it
   durable, since a checkpoint fsyncs the WAL before it copies it and the database after);
3. it unlinks the files the jobs replaced or dropped (``unlink_later``);
4. then, and only then, it resolves the jobs' futures.

So a job's future still resolves only once its rows and files are durable, exactly as with an
fsync in every COMMIT (``docs/durability.md``), and an older version's file is still unlinked
only after the row that replaced it is durable. What changes is the count: a group of N writes
pays one WAL fsync and one fsync per distinct directory, not N of each. The group forms
without waiting: a lone write syncs at once, and writes that arrive while a sync runs go
together in the next group (at most ``max_group`` jobs).

A crash before step 2 leaves each job's commit durable or not, with no acknowledgement given
either way; its file may be published without its row (start-up removes such orphans,
``storage.reconcile``). A job's commit is visible to readers (and to the shipper) from the
moment it commits, a few milliseconds before it is durable and answered, like any write in
flight; never partial.

A failed sync stops the writer for good (``failure``). After an fsync error the kernel may
have dropped the dirty pages, so a later fsync that succeeds proves nothing about them
(PostgreSQL's "fsyncgate", https://wiki.postgresql.org/wiki/Fsync_Errors). Every job of that
group that had succeeded fails with ``Unavailable`` (its write may or may not survive a power
loss; it may already be served), the group's unlinks are skipped (start-up removes files no row
names), and every later job fails with ``Unavailable`` without running: the node serves what
it has and refuses every write until it is restarted (``CacheService.warnings`` says so).

A shortage is not a failed sync. When a file to fsync cannot even be opened for want of a
descriptor or memory (``fsync.DescriptorShortage``: EMFILE, ENFILE, ENOMEM), no fsync ran on
it and the kernel dropped nothing, so nothing latches: the group's jobs that had succeeded fail
with ``Unavailable`` (retry later), its directories and unlinks are carried to the next group
(whose WAL fsync also covers these commits), and ``shortage`` says why until a sync succeeds.
While it lasts the thread retries an empty group every ``SHORTAGE_RETRY_SECONDS``, so writes
are taken again by themselves once descriptors free up, even if none arrives meanwhile.
(Field report, issue 26: idle connections to an uncapped listener exhausted the descriptors,
the WAL's open failed with EMFILE, and the node refused every write until a restart.)

Calls made off this thread, or outside a job, act at once: ``sync_dir_later`` fsyncs,
``unlink_later`` unlinks.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kit.failpoint import failpoint
from kura.core.errors import Unavailable
from kura.storage.fsync import DescriptorShortage, fsync_path, shortage_reason

log = logging.getLogger(__name__)

MAX_GROUP_JOBS = 256
SHORTAGE_RETRY_SECONDS = 1.0  # how often a sync that lacked descriptors is retried


@dataclass
class _Job:
    fn: Callable[..., Any]
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    future: Future[Any] = field(default_factory=Future)


@dataclass
class GroupStats:
    """Counters for ``/metrics``: groups made durable, the jobs in them, the largest group."""

    groups_total: int = 0
    jobs_total: int = 0
    largest_group: int = 0
    sync_failures_total: int = 0
    sync_shortages_total: int = 0  # groups failed for want of descriptors or memory (transient)


class GroupCommitWriter(Executor):
    """A one-thread ``Executor`` that makes its jobs durable in groups (module docstring).

    ``sync`` makes every COMMIT so far durable; set it with ``set_sync`` once the index is open
    (until then a group's step 2 does nothing). Raises RuntimeError on ``submit`` after
    ``shutdown``."""

    def __init__(self, name: str = "kura-write", max_group: int = MAX_GROUP_JOBS) -> None:
        self._queue: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._max_group = max_group
        self._sync: Callable[[], None] = lambda: None
        self._dirs: dict[str, None] = {}
        self._unlinks: dict[str, None] = {}
        self._in_group = False
        self._closed = False
        self.failure: str | None = None  # set by a failed sync: every later job fails
        self.shortage: str | None = None  # set by a sync that lacked descriptors, until one works
        self._lock = threading.Lock()
        self.stats = GroupStats()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def set_sync(self, sync: Callable[[], None]) -> None:
        self._sync = sync

    # -- Executor ----------------------------------------------------------------------------

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future[Any]:
        with self._lock:
            if self._closed:
                raise RuntimeError("cannot schedule new work after shutdown")
            job = _Job(fn, args, kwargs)
            self._queue.put(job)
        return job.future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._queue.put(None)
        if wait and threading.current_thread() is not self._thread:
            self._thread.join()

    # -- effects deferred to the end of the group ----------------------------------------------

    def _grouping(self) -> bool:
        return self._in_group and threading.current_thread() is self._thread

    def sync_dir_later(self, directory: Path) -> None:
        """fsync ``directory`` (a blob was renamed into it) before the group's futures resolve."""
        if self._grouping():
            self._dirs[str(directory)] = None
        else:
            fsync_path(directory)

    def unlink_later(self, path: Path) -> None:
        """Unlink ``path`` once the group is durable (the row that replaced or dropped it)."""
        if self._grouping():
            self._unlinks[str(path)] = None
        else:
            path.unlink(missing_ok=True)

    def published(self, path: Path) -> None:
        """A job published a file at ``path``: an unlink of that name an earlier job of the
        group asked for no longer applies (the same version of an artifact, dropped and stored
        again within one group, has the same file name)."""
        if self._grouping():
            self._unlinks.pop(str(path), None)

    # -- the thread ----------------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            try:
                retry = SHORTAGE_RETRY_SECONDS if self.shortage and not self.failure else None
                first = self._queue.get(timeout=retry)
            except queue.Empty:
                self._run_group([])  # no write came: retry the pending sync by itself
                continue
            if first is None:
                return
            group = [first]
            stop = False
            while len(group) < self._max_group:
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                if job is None:
                    stop = True
                    break
                group.append(job)
            self._run_group(group)
            if stop:
                return

    def _run_group(self, group: list[_Job]) -> None:
        if self.failure is not None:
            for job in group:
                if job.future.set_running_or_notify_cancel():
                    job.future.set_exception(Unavailable(self.failure))
            return
        outcomes: list[tuple[bool, Any]] = []
        self._in_group = True
        try:
            for job in group:
                if not job.future.set_running_or_notify_cancel():
                    outcomes.append((False, None))
                    continue
                try:
                    outcomes.append((True, job.fn(*job.args, **job.kwargs)))
                except BaseException as exc:  # the job's own failure, for its caller
                    outcomes.append((False, exc))
        finally:
            self._in_group = False
        failure = self._make_durable(len(group))
        if failure is None and group:
            self.stats.groups_total += 1
            self.stats.jobs_total += sum(1 for ok, _v in outcomes if ok)
            self.stats.largest_group = max(self.stats.largest_group, len(group))
        for job, (ok, value) in zip(group, outcomes, strict=True):
            if job.future.cancelled():
                continue
            if ok and failure is None:
                job.future.set_result(value)
            elif ok:
                job.future.set_exception(failure)
            else:
                job.future.set_exception(value)

    def _make_durable(self, jobs: int) -> Unavailable | None:
        dirs, self._dirs = list(self._dirs), {}
        unlinks, self._unlinks = list(self._unlinks), {}
        try:
            failpoint("storage.before_group_sync")
            for directory in dirs:
                try:
                    fsync_path(Path(directory))
                except FileNotFoundError:
                    continue  # emptied and removed since: nothing left to make durable
            self._sync()
        except DescriptorShortage as exc:
            return self._short_of_descriptors(jobs, exc, dirs, unlinks)
        except Exception as exc:
            self.stats.sync_failures_total += 1
            self.failure = (
                f"an fsync of the data directory or index failed ({exc}): this node refuses "
                "every write until it is restarted; check the disk (kernel log)"
            )
            log.critical(
                "could not make %d writes durable (fsync failed: %s); they are reported as "
                "failed, %d replaced files are kept for start-up to remove, and every later "
                "write is refused until a restart",
                jobs,
                exc,
                len(unlinks),
            )
            return Unavailable(f"the write could not be made durable: {exc}")
        if self.shortage is not None:
            log.warning("writes are made durable again (the descriptor shortage has passed)")
            self.shortage = None
        for path in unlinks:
            try:
                os.unlink(path)
            except FileNotFoundError:
                continue
            except OSError as exc:
                log.warning("could not remove replaced blob file %s: %s", path, exc)
        return None

    def _short_of_descriptors(
        self, jobs: int, exc: DescriptorShortage, dirs: list[str], unlinks: list[str]
    ) -> Unavailable:
        """A file to fsync could not be opened: fail this group's writes, keep its pending
        directory fsyncs and unlinks for the next group, and latch nothing (module docstring)."""
        self.stats.sync_shortages_total += 1
        self._dirs = dict.fromkeys(dirs) | self._dirs
        self._unlinks = dict.fromkeys(unlinks) | self._unlinks
        if self.shortage is None:  # one line per episode, not one per failed group
            log.error(
                "could not make %d writes durable: %s; they are reported as failed and writes "
                "are refused until a sync succeeds (retried every %g s)",
                jobs,
                exc,
                SHORTAGE_RETRY_SECONDS,
            )
        self.shortage = shortage_reason(exc)
        return Unavailable(f"the write could not be made durable now ({exc}); retry later")
