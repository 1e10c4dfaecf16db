"""Start-up reconciliation of blob files with index rows, and the layout-1 → 2 migration.

What a crash can leave behind, given the writer's order (``CacheService._commit_sync``:
publish the new version's file beside the old one, commit the row, then unlink the old file):

* a version file whose row never committed (killed between publish and commit);
* the previous version's file next to the committed one (killed between commit and unlink);
* a row whose file is gone (deleted behind the node's back, or a filesystem that lost it).

``reconcile`` makes files and rows agree again: every blob file that is not the file of its
row's *current* manifest is removed (it was never acknowledged, or it was superseded), and every
file-backed row whose file is missing is dropped (logged at WARNING and counted). The
``*.incoming-*`` files a publish left under ``blobs/`` are removed on the same walk of the blob
tree (``BlobFiles.stored_names``), never taken for a version even when named after an id, so
start-up lists that tree once. Acknowledged
versions are never touched: their row is durable before the answer (``storage.group_commit``), so
their file is the one the row names.

``migrate_layout_1`` renames each layout-1 file ``blobs/ab/cd/<artifact_id>`` to its layout-2
name derived from its row, fsyncs the directories and only then records the new layout, so a
crash half-way re-runs it (a renamed file is skipped). Blocking; run it before the node listens
(``recovery.open_index``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from kura.storage.blobs import BlobFiles, StoredVersions, blob_name
from kura.storage.fsync import fsync_path
from kura.storage.index import MetadataIndex
from kura.storage.paging import CurrentVersion

log = logging.getLogger(__name__)

# Rows per page of the index walk: memory holds one page (four short columns a row).
PAGE_ROWS = 1000


@dataclass
class ReconcileReport:
    """What one start-up did; counts are of files or rows."""

    migrated_files: int = 0
    removed_files: int = 0
    dropped_rows: int = 0
    # Rows that should have been dropped but could not (index read-only or disk full).
    rows_left: int = 0
    # ``*.incoming-*`` publish leftovers removed on the walk (``BlobFiles.stored_names``).
    swept_incoming: int = 0


def _current_versions(
    index: MetadataIndex, progress: Callable[[int], None] | None = None
) -> Iterator[CurrentVersion]:
    after = None
    done = 0
    while page := index.paging.current_versions_after(after, PAGE_ROWS):
        yield from page
        after = page[-1][0]
        done += len(page)
        if progress is not None:
            progress(done)


def _unlink(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def migrate_layout_1(files: BlobFiles, index: MetadataIndex) -> int:
    """Rename every layout-1 blob file to its layout-2 name; returns how many were renamed.

    A file whose row is missing or inline is left for ``reconcile`` to remove. Raises
    ``OSError`` (the layout is then left at 1 and the next start resumes).
    """
    renamed = 0
    buckets = set()
    for artifact_id, version_ms, sha256, inline in _current_versions(index):
        if inline:
            continue
        bucket = files.bucket(artifact_id)
        try:
            os.rename(bucket / artifact_id, bucket / blob_name(artifact_id, version_ms, sha256))
        except FileNotFoundError:
            continue
        renamed += 1
        buckets.add(bucket)
    for bucket in buckets:
        fsync_path(bucket)
    return renamed


def reconcile(
    files: BlobFiles,
    index: MetadataIndex,
    progress: Callable[[int], None] | None = None,
    drop: Callable[[list[str]], None] | None = None,
) -> ReconcileReport:
    """Remove blob files no current row names and drop rows whose file is missing (see module
    docstring), and the ``*.incoming-*`` leftovers of publishes met on the same walk (so it
    runs before anything publishes: ``storage.startup_work`` holds writes back meanwhile).
    ``progress(rows)`` hears of the rows walked so far after each page; ``drop(ids)`` deletes
    the rows (``index.delete`` by default; a node passes its writer thread's). Raises
    ``sqlite3.DatabaseError`` if the index cannot be read (damage)."""
    report = ReconcileReport()

    def leftover(path: str) -> None:
        _unlink(path)
        report.swept_incoming += 1

    # A merge of two streams in artifact_id order, the rows and the files, so that memory
    # holds one page of rows and a few bucket listings (``blobs.LIST_AHEAD``), whatever the
    # number of artifacts. Names
    # and ids are compared as strings: no path object per file.
    on_disk = files.stored_names(incoming=leftover)
    missing: list[str] = []

    def remove(stored: StoredVersions, keep: str | None = None) -> None:
        for name in stored.names:
            if name != keep:
                _unlink(os.path.join(stored.directory, name))
                report.removed_files += 1

    def next_placed() -> StoredVersions | None:
        """The next files in order; a file outside its id's bucket, which no row names and
        which is out of order in the stream, is removed on the way."""
        for stored in on_disk:
            if stored.placed:
                return stored
            remove(stored)
        return None

    pending = next_placed()
    for artifact_id, version_ms, sha256, inline in _current_versions(index, progress):
        while pending is not None and pending.artifact_id < artifact_id:
            remove(pending)  # files of artifacts with no row at all
            pending = next_placed()
        keep = None if inline else blob_name(artifact_id, version_ms, sha256)
        if pending is not None and pending.artifact_id == artifact_id:
            remove(pending, keep)
            if keep is not None and keep not in pending.names:
                missing.append(artifact_id)
            pending = next_placed()
        elif keep is not None:
            missing.append(artifact_id)
    while pending is not None:
        remove(pending)
        pending = next_placed()
    if missing:
        log.warning(
            "dropping %d index rows whose blob file is missing (first: %s)",
            len(missing),
            missing[0],
        )
        if index.read_only:
            report.rows_left = len(missing)
        else:
            try:
                (drop or index.delete)(missing)
                report.dropped_rows = len(missing)
            except sqlite3.OperationalError as exc:  # SQLITE_FULL: reads miss them anyway
                log.warning("could not drop them now (%s); the next start retries", exc)
                report.rows_left = len(missing)
    return report
