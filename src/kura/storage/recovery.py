"""Opening a data dir at start-up so that a full disk or a damaged index never crash-loops.

Start-up takes the data dir (``BlobFiles.open``), sweeps the tmp dir's staging leftovers,
opens the index, migrates the layout, checks the index and reconciles files with rows
(``storage.reconcile``, which also removes the publish leftovers under ``blobs/``). ``kura
serve`` runs it in parts so that it listens at once whatever the cache size (issue 31 item 2):
``open_index`` before it listens (cheap), then ``check_index`` and ``reconcile`` in the
background (``storage.startup_work``, which replaces a damaged index in place with
``replace_damaged``). Two faults are handled instead of exiting (issue 10: a node on a full disk exited with an SQLite I/O error,
and 4 of 6 nodes with a damaged index exited 1; both then crash-looped):

* **Full disk.** With a clean previous stop SQLite must create and size the ``-shm`` file for
  WAL, which fails with ``SQLITE_IOERR_SHMSIZE`` when no block is free. If the disk is full and
  the WAL is empty, the index is opened read-only (``immutable=1``): reads are served, every
  write answers 503 with the reason, and ``/ready`` is 503 naming it
  (``StartReport.read_only_reason``), until a restart after space was freed. Start-up itself
  writes nothing else then (directories and lock files exist; reconciliation only deletes).
* **Damaged index.** A ``sqlite3.DatabaseError`` of the damage kind (``SQLITE_CORRUPT``,
  ``SQLITE_NOTADB``, ``SQLITE_CANTOPEN``) while opening, checking (``PRAGMA quick_check``) or
  reconciling (behind the listener, reads being served: recorded by ``mark_damaged`` and
  handled at the next start, before it listens); a zero-length index file in a data dir that has a layout (it held rows once);
  or a WAL whose header is not a WAL header. The damaged files are renamed to
  ``index.sqlite3.damaged-<UTC stamp>`` (and ``-wal``/``-shm`` likewise) for an operator to
  inspect, the blob files are moved aside with it to ``blobs.damaged-<UTC stamp>`` (without
  their manifests they cannot be served, but they are never deleted; peers refill the node by
  bootstrap), and a fresh index is created. Logged at ERROR.

Every other such reason lands in ``StartReport.warnings`` (``/ready`` warnings). Other errors (an
unknown layout, a locked data dir, I/O errors on a disk with space) still stop the start:
restarting would not help. A data dir a newer kura wrote (a layout or metadata schema past this
code's) stops it with ``DataDirTooNew`` before anything in the data dir is written or removed
(the layout is read before any directory is made; the schema on a read-only connection,
``schema.refuse_if_too_new``, before a damaged WAL is set aside, before the index is opened for
writing and before reconciliation removes orphans; only SQLite's ``-shm`` may change): its
message names the kura that wrote it and what to do (docs/upgrading.md). The index records the
layout too (``meta['layout']``, written after the ``layout`` file): a ``layout`` file that is
missing or disagrees with it stops the start (``_refuse_lost_layout``), rather than the data dir
being taken for a fresh one.
"""

from __future__ import annotations

import logging
import os
import shutil
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path

from kura.core.errors import KuraError
from kura.core.versions import (
    DataDirDamaged,
    DataDirTooNew,
    damaged_message,
    shown,
    too_new_message,
)
from kura.storage.blobs import (
    LAYOUT_VERSION,
    READABLE_LAYOUTS,
    SUPPORTED_LAYOUTS,
    BlobFiles,
    layout_refusal,
    newer_layout,
)
from kura.storage.fsync import descriptor_shortage, disk_full, fsync_path
from kura.storage.index import MetadataIndex
from kura.storage.reconcile import ReconcileReport, migrate_layout_1
from kura.storage.schema import peek_kura_version, peek_layout, refuse_if_too_new

log = logging.getLogger(__name__)

INDEX_NAME = "index.sqlite3"
# Below this many free bytes an SQLite I/O error at open is taken for a full disk.
FULL_DISK_BYTES = 1024 * 1024
_DAMAGE_CODES = ("SQLITE_CORRUPT", "SQLITE_NOTADB", "SQLITE_CANTOPEN")
# First four bytes of a WAL file, big- or little-endian checksums (https://www.sqlite.org/fileformat2.html#walformat).
_WAL_MAGIC = (b"\x37\x7f\x06\x82", b"\x37\x7f\x06\x83")
# Beside the index: the reason reconciliation found it damaged (``mark_damaged``).
DAMAGE_MARKER = ".damaged-found"


class IndexDamaged(Exception):
    """The index file is unusable; ``reason`` says how."""


@dataclass
class StartReport:
    """What start-up found and did. ``warnings`` are for an operator (``/ready``)."""

    # Staging files in the tmp dir and ``*.incoming-*`` publish leftovers under ``blobs/``.
    swept_files: int = 0
    reconciled: ReconcileReport = field(default_factory=ReconcileReport)
    read_only_reason: str = ""
    index_damaged: bool = False
    quick_check_seconds: float = 0.0
    # Whether ``check_index`` ran (or the index is fresh); ``kura serve`` runs it after
    # listening (``storage.startup_work``).
    checked: bool = False
    warnings: list[str] = field(default_factory=list)


def open_index(files: BlobFiles) -> tuple[MetadataIndex, StartReport]:
    """What must run before a node listens, cheap at any cache size: take the data dir
    (``BlobFiles.open``), sweep the tmp dir's staging leftovers, open the index (a damaged one
    found here is set aside as the module docstring says) and, on a layout-1 data dir only,
    check the index (``check_index``) and migrate the layout, once per data dir: reads look
    files up by their layout-2 names. A reconcile that found damage the check had missed left
    a marker (``mark_damaged``): the index is set aside here, before anyone reads it.

    ``report.checked`` says whether ``check_index`` ran. Raises ``DataDirLocked``/``KuraError``
    from ``BlobFiles.open``, ``OSError``/``sqlite3.Error`` for faults that are neither of the
    module docstring's two.
    """
    path = files.data_dir / INDEX_NAME
    layout = files.open(
        written_by=lambda: peek_kura_version(path), recorded=lambda: peek_layout(path)
    )
    try:
        _refuse_lost_layout(path, layout)
    except KuraError:
        files.close()
        raise
    report = StartReport(swept_files=files.sweep_staging())
    marker = path.with_name(path.name + DAMAGE_MARKER)
    index: MetadataIndex | None = None
    try:
        if marker.exists():
            raise IndexDamaged(marker.read_text(errors="replace").strip() or "marked damaged")
        index = _open_checked(files, path, layout, report)
        if layout not in (None, LAYOUT_VERSION):
            check_index(index, report)
        migrated = _migrate(files, index, layout, report)
    except (IndexDamaged, sqlite3.DatabaseError) as exc:
        opened = index is not None  # past the first open: CANTOPEN is no damage (_is_damage)
        if isinstance(exc, sqlite3.DatabaseError) and not _is_damage(exc, opened=opened):
            raise
        if index is not None:
            index.close_thread_connection()
        _start_fresh(files, path, str(exc), report)
        index = MetadataIndex(path)
        migrated = _migrate(files, index, None, report)
        report.checked = True  # a fresh index: nothing to check
    marker.unlink(missing_ok=True)
    report.reconciled.migrated_files = migrated
    return index, report


def check_index(index: MetadataIndex, report: StartReport) -> tuple[int, int]:
    """``PRAGMA quick_check``, then a first read of every row (damage quick_check missed
    surfaces there as an error) and the anti-entropy digests' check against the row count
    (``MetadataIndex.ensure_digests``, which back-fills them if needed). Returns ``MetadataIndex.totals()`` (rows, bytes). Raises
    ``IndexDamaged``, or ``sqlite3.DatabaseError`` of another kind than damage. O(index size):
    6.4 s for the check of a 669 MB index of 10^6 rows, cold (docs/benchmarks.md)."""
    try:
        started = time.monotonic()
        verdict = index.quick_check()
        report.quick_check_seconds = time.monotonic() - started
        if verdict != "ok":
            raise IndexDamaged(f"PRAGMA quick_check: {' '.join(verdict.split())}")
        totals = index.totals()
        _ensure_digests(index, report)  # the anti-entropy range digests (MetadataIndex)
    except sqlite3.DatabaseError as exc:
        if not _is_damage(exc, opened=True):
            raise
        raise IndexDamaged(f"{exc} ({exc.sqlite_errorname})") from exc
    report.checked = True
    return totals


def _ensure_digests(index: MetadataIndex, report: StartReport) -> None:
    """``index.ensure_digests()``; on a full disk (``SQLITE_FULL``, or ``SQLITE_IOERR`` with
    less than ``FULL_DISK_BYTES`` free) a WARNING instead: the digests stay unbuilt
    (``MetadataIndex.digests_ready``: anti-entropy answers 503) and maintenance tries again
    (``CacheService._retry_digests``), while the node serves reads."""
    try:
        index.ensure_digests()
    except sqlite3.OperationalError as exc:
        full = disk_full(exc) or (
            exc.sqlite_errorname.startswith("SQLITE_IOERR")
            and shutil.disk_usage(index.path.parent).free < FULL_DISK_BYTES
        )
        if not full:
            raise
        reason = f"range digests not built, the disk is full ({exc}): anti-entropy waits"
        log.warning("%s; tried again once there is space", reason)
        report.warnings.append(reason)


def replace_damaged(
    files: BlobFiles, index: MetadataIndex, reason: str, report: StartReport
) -> None:
    """Set the damaged index aside and make a fresh one in its place, in the same
    ``MetadataIndex`` (``replace_with_fresh``: call it on the thread holding it, nobody else
    querying), with the blob files moved aside as the module docstring says."""
    path = files.data_dir / INDEX_NAME
    index.replace_with_fresh(lambda: _start_fresh(files, path, reason, report))
    _migrate(files, index, None, report)


def is_damage(exc: BaseException, *, at_first_open: bool = False) -> bool:
    """Whether ``exc`` is ``IndexDamaged`` or an SQLite error of the damage kind, raised by a
    query on an index ``open_index`` has opened (``SQLITE_CANTOPEN`` is never damage then),
    or with ``at_first_open`` by the index's first open (``_is_damage``)."""
    if isinstance(exc, IndexDamaged):
        return True
    return isinstance(exc, sqlite3.DatabaseError) and _is_damage(exc, opened=not at_first_open)


def mark_damaged(files: BlobFiles, reason: str) -> None:
    """Record that the index is damaged (found by reconciliation while reads were served, when
    it can no longer be replaced in place): the next start sets it aside before it listens
    (``open_index``). Written and fsynced, with its directory."""
    marker = files.data_dir / (INDEX_NAME + DAMAGE_MARKER)
    with marker.open("w") as f:
        f.write(reason + "\n")
        f.flush()
        os.fsync(f.fileno())
    fsync_path(files.data_dir)


def note_reconciled(report: StartReport, reconciled: ReconcileReport) -> None:
    """Fold what ``reconcile`` did into ``report`` (the migration count is kept)."""
    reconciled.migrated_files = report.reconciled.migrated_files
    report.reconciled = reconciled
    report.swept_files += reconciled.swept_incoming


def _is_damage(exc: sqlite3.DatabaseError, *, opened: bool = False) -> bool:
    """A damage code. ``SQLITE_CANTOPEN`` is damage only at the index's first open (``opened``
    False), and then not while the process is short of descriptors
    (``fsync.descriptor_shortage``). Once the index is open, SQLite reports a failed open of a
    temp file (a sorter spilling, a statement journal) as ``SQLITE_CANTOPEN`` too: a shortage
    that may have passed before any probe could read it, never the index's damage."""
    name = exc.sqlite_errorname
    if name == "SQLITE_CANTOPEN" and (opened or descriptor_shortage() is not None):
        return False
    return name in _DAMAGE_CODES


def _migrate(
    files: BlobFiles, index: MetadataIndex, layout: str | None, report: StartReport
) -> int:
    """Bring the blob layout to ``LAYOUT_VERSION``; returns the files renamed. The renames
    need no free space; if recording the layout fails (a full disk) the next start redoes it."""
    if layout == LAYOUT_VERSION:
        index.record_layout(LAYOUT_VERSION)  # a data dir of an earlier 0.x has no record yet
        return 0
    migrated = migrate_layout_1(files, index) if layout == "1" else 0
    if migrated:
        log.info("migrated %d blob files from layout 1 to %s", migrated, LAYOUT_VERSION)
    try:
        files.write_layout()
    except OSError as exc:
        report.warnings.append(f"could not record data dir layout {LAYOUT_VERSION}: {exc}")
        log.warning("%s", report.warnings[-1])
    else:
        index.record_layout(LAYOUT_VERSION)  # after the file: a record always has its file
    return migrated


def _refuse_lost_layout(path: Path, found: str | None) -> None:
    """Refuse a data dir whose ``layout`` file disagrees with the layout its index records
    (``schema.peek_layout``; read only): ``DataDirTooNew`` when the record is newer than
    ``LAYOUT_VERSION`` (whatever the file says), ``DataDirDamaged`` when it is no layout any
    kura writes, ``KuraError`` when the file is missing or names another layout. The record is written only after the file (``_migrate``), so either
    means the file was lost or changed since; taking the data dir for a fresh one would write
    layout ``LAYOUT_VERSION`` over a newer kura's files and reconcile them away."""
    recorded = peek_layout(path)
    if recorded is None or recorded == found:
        return
    if newer_layout(recorded):
        raise DataDirTooNew(
            too_new_message("blob layout", recorded, READABLE_LAYOUTS, peek_kura_version(path))
        )
    if recorded not in SUPPORTED_LAYOUTS:
        raise DataDirDamaged(
            damaged_message(
                f"index records blob layout {shown(recorded)}",
                f"blob layouts {READABLE_LAYOUTS}",
                peek_kura_version(path),
            )
        )
    problem = "is missing" if found is None else f"says {shown(found)}"
    raise KuraError(layout_refusal(path.parent / "layout", problem, recorded))


def _open_checked(
    files: BlobFiles, path: Path, layout: str | None, report: StartReport
) -> MetadataIndex:
    """The index, opened (not yet checked: ``check_index``), or ``IndexDamaged``."""
    if path.is_dir():
        raise IndexDamaged(f"{path} is a directory")
    if layout is not None and path.exists() and path.stat().st_size == 0:
        raise IndexDamaged(f"{path} is empty although the data dir has layout {layout}")
    # Before the damaged-WAL check renames anything: a newer kura's data dir is left as is.
    refuse_if_too_new(path)
    _set_aside_damaged_wal(path, report)
    return _open(files, path, report)


def _open(files: BlobFiles, path: Path, report: StartReport) -> MetadataIndex:
    """Read-write, or read-only when the disk is full (see module docstring)."""
    try:
        # The digests' O(rows) check waits for check_index, behind the listener.
        return MetadataIndex(path, check_digests=False)
    except sqlite3.OperationalError as exc:
        name = exc.sqlite_errorname
        if not (name.startswith("SQLITE_IOERR") or name == "SQLITE_FULL"):
            raise
        free = shutil.disk_usage(files.data_dir).free
        wal = path.with_name(path.name + "-wal")
        wal_bytes = wal.stat().st_size if wal.exists() else 0
        if free >= FULL_DISK_BYTES or wal_bytes or not path.exists():
            raise
        report.read_only_reason = (
            f"disk full at start-up ({free} bytes free; SQLite: {exc}): index opened read-only, "
            f"reads are served and writes answer 503 until a restart after freeing space"
        )
        log.error("%s", report.read_only_reason)  # a /ready reason: CacheService.write_refusals
        return MetadataIndex(path, read_only=True)


def _set_aside_damaged_wal(path: Path, report: StartReport) -> None:
    """SQLite silently ignores a WAL with a bad header, losing the commits it held: say so,
    and keep the file for an operator."""
    wal = path.with_name(path.name + "-wal")
    try:
        with wal.open("rb") as f:
            head = f.read(4)
    except FileNotFoundError:
        return
    except IsADirectoryError:
        head = b"dir!"
    if not head or head in _WAL_MAGIC:
        return
    aside = _aside_name(wal)
    os.rename(wal, aside)
    path.with_name(path.name + "-shm").unlink(missing_ok=True)
    reason = (
        f"index write-ahead log was damaged (no WAL header) and was moved to {aside.name}; "
        f"commits it held are lost"
    )
    log.error("%s", reason)
    report.warnings.append(reason)


def _start_fresh(files: BlobFiles, path: Path, reason: str, report: StartReport) -> None:
    """Move the damaged index aside, and the blob files with it (without their manifests they
    cannot be served, but they are acknowledged data: kept for an operator, never deleted)."""
    moved = []
    for suffix in ("", "-wal", "-shm"):
        part = path.with_name(path.name + suffix)
        if part.exists() or part.is_symlink():
            aside = _aside_name(part)
            os.rename(part, aside)
            moved.append(aside.name)
    kept = sum(len(stored.names) for stored in files.stored_names())
    blobs_aside = ""
    if kept:
        target = _aside_name(files.blobs_dir)
        os.rename(files.blobs_dir, target)  # one rename, whatever the count
        files.blobs_dir.mkdir()
        blobs_aside = target.name
    message = (
        f"index was damaged ({reason}); moved to {', '.join(moved) or '(nothing)'} and started "
        f"with an empty index; "
        + (
            f"{kept} blob files that have no manifest left were moved to {blobs_aside} "
            "(not counted in the disk budget; delete it once peers have refilled this node)"
            if kept
            else "there were no blob files"
        )
    )
    log.error("%s", message)
    report.index_damaged = True
    report.warnings.append(message)


def _aside_name(path: Path) -> Path:
    """``<name>.damaged-<UTC stamp>`` beside ``path``; the index's parts share one stamp."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
    base = path.name
    for suffix in ("-wal", "-shm"):
        if base.endswith(suffix):
            return path.with_name(f"{base[: -len(suffix)]}.damaged-{stamp}{suffix}")
    return path.with_name(f"{base}.damaged-{stamp}")
