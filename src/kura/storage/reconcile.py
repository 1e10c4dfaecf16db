"""Start-up reconciliation of blob files with index rows, and the layout-1 → 2 migration.

What a crash can leave behind, given the writer's order (``CacheService._commit_sync``:
publish the new version's file beside the old one, commit the row, then unlink the old file):

* a version file whose row never committed (killed between publish and commit);
* the previous version's file next to the committed one (killed between commit and unlink);
* a row whose file is gone (deleted behind the node's back, or a filesystem that lost it).

``reconcile`` makes files and rows agree again: every blob file that is not the file of its
row's *current* manifest is removed (it was never acknowledged, or it was superseded), and every
file-backed row whose file is missing is dropped (logged at WARNING and counted). Acknowledged
versions are never touched: their row is durable before the answer (``storage.group_commit``), so
their file is the one the row names.

``migrate_layout_1`` renames each layout-1 file ``blobs/ab/cd/<artifact_id>`` to its layout-2
name derived from its row, fsyncs the directories and only then records the new layout, so a
crash half-way re-runs it (a renamed file is skipped). Blocking; run it in the writer thread
before the node serves.
"""

from __future__ import annotations

import logging
import os
import sqlite3
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kura.core.manifest import Manifest
from kura.storage.blobs import BlobFiles
from kura.storage.fsync import fsync_path
from kura.storage.index import MetadataIndex

log = logging.getLogger(__name__)

PAGE_ROWS = 1000


@dataclass
class ReconcileReport:
    """What one start-up did; counts are of files or rows."""

    migrated_files: int = 0
    removed_files: int = 0
    dropped_rows: int = 0
    # Rows that should have been dropped but could not (index read-only or disk full).
    rows_left: int = 0


def _manifests(index: MetadataIndex) -> Iterator[Manifest]:
    after = ""
    while page := index.paging.manifests_after(after, PAGE_ROWS):
        yield from page
        after = page[-1].artifact_id


def migrate_layout_1(files: BlobFiles, index: MetadataIndex) -> int:
    """Rename every layout-1 blob file to its layout-2 name; returns how many were renamed.

    A file whose row is missing or inline is left for ``reconcile`` to remove. Raises
    ``OSError`` (the layout is then left at 1 and the next start resumes).
    """
    renamed = 0
    buckets = set()
    for m in _manifests(index):
        if m.inline:
            continue
        legacy = files.legacy_blob_path(m.artifact_id)
        try:
            os.rename(legacy, files.blob_path(m))
        except FileNotFoundError:
            continue
        renamed += 1
        buckets.add(legacy.parent)
    for bucket in buckets:
        fsync_path(bucket)
    return renamed


def reconcile(files: BlobFiles, index: MetadataIndex) -> ReconcileReport:
    """Remove blob files no current row names and drop rows whose file is missing (see module
    docstring). Raises ``sqlite3.DatabaseError`` if the index cannot be read (damage)."""
    report = ReconcileReport()
    # A merge of two streams in artifact_id order, the rows and the files, so that memory
    # holds one page of rows and one bucket of names, whatever the number of artifacts.
    on_disk = files.stored_files()
    missing: list[str] = []

    def remove(versions: list[Path], keep: Path | None = None) -> None:
        for path in versions:
            if path != keep:
                path.unlink(missing_ok=True)
                report.removed_files += 1

    def next_placed() -> tuple[str, list[Path]] | None:
        """The next files in order; a file outside its id's bucket, which no row names and
        which is out of order in the stream, is removed on the way."""
        for artifact_id, versions in on_disk:
            if versions[0].parent == files.bucket(artifact_id):
                return artifact_id, versions
            remove(versions)
        return None

    pending = next_placed()
    for m in _manifests(index):
        while pending is not None and pending[0] < m.artifact_id:
            remove(pending[1])  # files of artifacts with no row at all
            pending = next_placed()
        versions: list[Path] = []
        if pending is not None and pending[0] == m.artifact_id:
            versions = pending[1]
            pending = next_placed()
        keep = None if m.inline else files.blob_path(m)
        if keep is not None and keep not in versions:
            missing.append(m.artifact_id)
        remove(versions, keep)
    while pending is not None:
        remove(pending[1])
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
                index.delete(missing)
                report.dropped_rows = len(missing)
            except sqlite3.OperationalError as exc:  # SQLITE_FULL: reads miss them anyway
                log.warning("could not drop them now (%s); the next start retries", exc)
                report.rows_left = len(missing)
    return report
