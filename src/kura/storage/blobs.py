"""Blob files on disk and the tmp staging area.

Layout (``LAYOUT_VERSION`` is written to ``DATA_DIR/layout`` and checked at start-up)::

    DATA_DIR/index.sqlite3             metadata (storage.index)
    DATA_DIR/blobs/ab/cd/<artifact_id>.<version_ms>-<sha256[:16]>
                                       one file per artifact *version*, named from its manifest
    DATA_DIR/.kura.writer.lock         held (flock) by the one process that owns DATA_DIR
    TMP_DIR/.kura.tmp.lock             held (flock) by the same process: one owner per tmp dir
    TMP_DIR/uploads/upload-<uuid>      request bodies being staged
    TMP_DIR/parts/part-<uuid>          multipart parts waiting for completion
    TMP_DIR/bootstrap/bootstrap-<uuid> bodies fetched from peers

Staging files are worthless after a restart, so ``sweep_staging`` deletes them at start-up
(upstream Kura does the same; leftover files had filled disks), and so does the start-up walk
of ``blobs/`` (``stored_names``, in ``storage.reconcile``) with the ``*.incoming-*`` files a
publish left there. A blob becomes visible only by
``os.replace`` of a fully written, fsynced staging file, so a reader never sees a partial blob.

Each version has its own file name (layout 2), so an overwrite publishes the new version
*beside* the old one; the writer commits the new row and only then unlinks the old file
(``storage.reconcile`` removes whatever a crash leaves between those steps). Layout 1 named the
file by the artifact id alone, so an overwrite renamed the new bytes over the acknowledged ones
before the row committed, and a crash in that window lost the old version (issue 10).
``storage.reconcile`` migrates a layout-1 data dir at start-up.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import uuid
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, NamedTuple, Protocol

from kit import flock
from kura.core.errors import KuraError, ResourceExhausted
from kura.core.manifest import Manifest
from kura.core.versions import DataDirTooNew, damaged_message, shown, too_new_message
from kura.storage.body_count import BodyCount, check_sha256
from kura.storage.budget import Reservation
from kura.storage.checksum import BodyDigests
from kura.storage.fsync import fsync_path
from kura.storage.offload import OffloadedWrites, open_for_writing

LAYOUT_VERSION = "2"
# Layouts this code can open; older ones are migrated at start-up (storage.reconcile).
SUPPORTED_LAYOUTS = ("1", "2")
READABLE_LAYOUTS = f"{SUPPORTED_LAYOUTS[0]}-{SUPPORTED_LAYOUTS[-1]}"  # as refusals name them
STAGING_AREAS = ("uploads", "parts", "bootstrap")
# Bucket directories listed ahead of the start-up walk (``BlobFiles.stored_names``), by so
# many threads: a bound on the listings held in memory, and on the disk reads in flight.
LIST_AHEAD = 64
LIST_THREADS = 8
# In the name of a publish leftover under ``blobs/`` (``BlobFiles.persist``, ``put_concatenated``).
INCOMING = ".incoming-"
# Bodies without a Content-Length grow their reservation in steps of this many bytes.
GROW_STEP_BYTES = 1024 * 1024
HASH_CHUNK_BYTES = 1024 * 1024


class DataDirLocked(KuraError):
    """Another process already owns this data directory."""


@dataclass(frozen=True)
class Staged:
    """A fully received body in the tmp dir: its path, size, SHA-256 and XXH3-128 (hex, both
    over exactly the same bytes; ``storage.checksum``)."""

    path: Path
    size: int
    sha256: str
    xxh3_128: str


def _exclusive_lock(path: Path, what: str) -> int:
    """An flock held for the process's life; ``DataDirLocked`` if another process holds it,
    naming its pid when the kernel tells (``kit.flock``)."""
    try:
        return flock.exclusive(path)
    except flock.Held as held:
        by = f" (pid {held.pid})" if held.pid is not None else ""
        raise DataDirLocked(f"{what} is in use by another kura process{by}") from None


def stat_signature(st: os.stat_result) -> str:
    """Identity of a file's current contents as far as the kernel tells: any write, truncate,
    rename-over or utime changes ``st_ctime_ns``, so a changed signature means "re-verify"."""
    return f"{st.st_size}:{st.st_ino}:{st.st_ctime_ns}"


def sha256_file(path: Path) -> str:
    """SHA-256 of a whole file (blocking; call from an executor for large files)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(HASH_CHUNK_BYTES):
            h.update(chunk)
    return h.hexdigest()


def newer_layout(text: str) -> bool:
    """Whether ``text`` names a blob layout newer than ``LAYOUT_VERSION`` (a few digits: a
    longer run is no layout any kura writes, and ``int`` refuses over 4,300 digits)."""
    return text.isascii() and text.isdigit() and len(text) < 10 and int(text) > int(LAYOUT_VERSION)


def layout_refusal(layout: Path, problem: str, recorded: str | None) -> str:
    """The refusal of a data directory whose ``layout`` file (at ``layout``) ``problem`` (``is
    missing``, ``is empty``, ``says 'x'``): with the layout its index records (``recorded``; a
    readable one, ``SUPPORTED_LAYOUTS``) how to restore the file, else that no kura wrote it."""
    if recorded in SUPPORTED_LAYOUTS:
        return (
            f"the data directory's index records blob layout '{recorded}' but its layout file "
            f"{problem} ({layout}): restore the file (echo {recorded} > {layout}) or move the "
            "data directory aside and let the node bootstrap from its peers (docs/upgrading.md)"
        )
    return damaged_message(
        f"layout file {layout} {problem}", f"blob layouts {READABLE_LAYOUTS}", None
    )


class BlobFiles:
    """Paths and file operations for blobs and staging. Holds the data dir's writer lock.

    The local-disk ``storage.blobstore.BlobStore`` (``put``, ``open_blob``, ``remove``,
    ``remove_artifact``, ``artifact_ids``), plus what only a local disk has: paths for the
    integrity checks and the quarantine, the staging area, the layout and its migration.
    """

    def __init__(self, data_dir: Path, tmp_dir: Path) -> None:
        self.data_dir = data_dir
        self.tmp_dir = tmp_dir
        self.blobs_dir = data_dir / "blobs"
        self._lock_fds: list[int] = []
        # The writer's group commit (storage.group_commit): publishes fsync their directory
        # with the group. None: at once.
        self.group: PublishGroup | None = None

    def open(
        self,
        written_by: Callable[[], str | None] = lambda: None,
        recorded: Callable[[], str | None] = lambda: None,
    ) -> str | None:
        """Take the writer lock, read the layout version, create the directories.

        Returns the layout found (one of ``SUPPORTED_LAYOUTS``), or None for a data dir that has
        none yet; the caller migrates it and calls ``write_layout``. Raises ``DataDirLocked`` if
        another process holds the lock (field report B32: two servers on one data directory
        drift apart and serve entries the other deleted), ``DataDirTooNew`` for a layout newer
        than ``LAYOUT_VERSION`` (naming the kura ``written_by`` returns: the index's record of
        the kura that last wrote it, read without writing), ``KuraError`` for a ``layout`` file
        that is empty, not UTF-8 text, not a file, or names another layout (``layout_refusal``,
        with the layout the index records, ``recorded``, and what to do). The layout is read right after the lock is taken, so a refused data dir gets no
        directory of this layout's. Writes nothing when the directories and lock files exist
        (start-up on a full disk).
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.tmp_dir.mkdir(parents=True, exist_ok=True)
        self._lock_fds = [
            _exclusive_lock(self.data_dir / ".kura.writer.lock", f"data directory {self.data_dir}"),
        ]
        # The tmp dir is swept at start-up: a second node sharing it would delete this node's
        # in-flight staging files. So it has one owner too.
        try:
            self._lock_fds.append(
                _exclusive_lock(self.tmp_dir / ".kura.tmp.lock", f"tmp directory {self.tmp_dir}")
            )
        except DataDirLocked:
            self.close()
            raise
        try:
            found = self._read_layout(written_by, recorded)
        except KuraError:
            self.close()
            raise
        self.blobs_dir.mkdir(exist_ok=True)
        for area in STAGING_AREAS:
            (self.tmp_dir / area).mkdir(parents=True, exist_ok=True)
        return found

    def _read_layout(
        self, written_by: Callable[[], str | None], recorded: Callable[[], str | None]
    ) -> str | None:
        """The ``layout`` file's layout, None when there is none; raises as ``open`` says."""
        layout = self.data_dir / "layout"
        if not layout.exists() and not layout.is_symlink():
            return None
        if not layout.is_file():
            raise KuraError(layout_refusal(layout, "is not a regular file", recorded()))
        try:
            found = layout.read_bytes().decode("utf-8").strip()
        except UnicodeDecodeError:
            raise KuraError(layout_refusal(layout, "is not text", recorded())) from None
        if found in SUPPORTED_LAYOUTS:
            return found
        if newer_layout(found):
            raise DataDirTooNew(
                too_new_message("blob layout", found, READABLE_LAYOUTS, written_by())
            )
        problem = "is empty" if not found else f"says {shown(found)}"
        raise KuraError(layout_refusal(layout, problem, recorded()))

    def write_layout(self) -> None:
        """Record ``LAYOUT_VERSION`` durably (write a temporary file, fsync, rename, fsync dir)."""
        layout = self.data_dir / "layout"
        tmp = self.data_dir / "layout.tmp"
        with tmp.open("w") as f:
            f.write(LAYOUT_VERSION + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, layout)
        fsync_path(self.data_dir)

    def close(self) -> None:
        for fd in self._lock_fds:
            os.close(fd)
        self._lock_fds = []

    def bucket(self, artifact_id: str) -> Path:
        """The directory holding every version file of ``artifact_id``."""
        return self.blobs_dir / artifact_id[:2] / artifact_id[2:4]

    def blob_path(self, manifest: Manifest) -> Path:
        """The file of exactly this version of the artifact (layout 2): readers derive it from
        the row they read, so a reader holding an older row finds the older file or nothing."""
        m = manifest
        return self.bucket(m.artifact_id) / blob_name(m.artifact_id, m.version_ms, m.sha256)

    def legacy_blob_path(self, artifact_id: str) -> Path:
        """Where layout 1 kept an artifact's one file (migration only)."""
        return self.bucket(artifact_id) / artifact_id

    def new_staging_path(self, area: str) -> Path:
        prefix = {"uploads": "upload", "parts": "part", "bootstrap": "bootstrap"}[area]
        return self.tmp_dir / area / f"{prefix}-{uuid.uuid4().hex}"

    def sweep_staging(self) -> int:
        """Delete every staging file an earlier process left in the tmp dir's staging areas.
        Returns the number removed. The data dir's publish leftovers (``*.incoming-*``) are
        removed by the start-up walk of the blob tree instead (``stored_names`` with
        ``incoming``, in ``storage.reconcile``), so that start-up lists that tree once."""
        removed = 0
        for area in STAGING_AREAS:
            try:
                entries = list(os.scandir(self.tmp_dir / area))
            except FileNotFoundError:
                continue
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    shutil.rmtree(entry.path, ignore_errors=True)
                else:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(entry.path)
                removed += 1
        return removed

    def stored_names(
        self, incoming: Callable[[str], None] | None = None
    ) -> Iterator[StoredVersions]:
        """Every blob file under ``blobs/`` (any name starting with a 64-hex artifact id),
        grouped by artifact id, as strings: ``StoredVersions`` (the directory, the names and
        whether the directory is the id's ``bucket``), in ascending artifact_id order, holding
        at most ``LIST_AHEAD`` bucket directories' listings in memory (read ahead in
        ``LIST_THREADS`` threads; a million files must not cost a name each in RAM at
        start-up). Files in a directory that is not their id's bucket (no
        row names them) come first in their directory's turn, out of that order; the order of
        the others is kept.

        Names holding ``.incoming-`` are publish leftovers (``persist``'s copy across
        filesystems, ``put_concatenated``'s staging), never a version: they are not listed,
        even when they start with a 64-hex id, and when ``incoming`` is given each one's path
        is passed to it as the walk meets it (start-up removes them: ``storage.reconcile``).
        Only while nothing publishes: at run time such a file may be a publish in flight."""
        blobs = os.fspath(self.blobs_dir)
        # Bucket listings are read ahead in threads: cold, each is a disk read, and one at a
        # time a big walk is mostly waiting (issue 31: 51,000 buckets at 10^5 artifacts).
        pool = ThreadPoolExecutor(LIST_THREADS, thread_name_prefix="kura-walk")
        ahead: deque[tuple[str, str, str, Future[_Listing]]] = deque()
        try:
            for top, sub, directory in _bucket_dirs(blobs, incoming):
                ahead.append((top, sub, directory, pool.submit(_list_bucket, directory)))
                if len(ahead) >= LIST_AHEAD:
                    yield from _grouped(*ahead.popleft(), incoming)
            while ahead:
                yield from _grouped(*ahead.popleft(), incoming)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)

    def stored_files(
        self, incoming: Callable[[str], None] | None = None
    ) -> Iterator[tuple[str, list[Path]]]:
        """``(artifact_id, its version files)`` for every blob file, as ``stored_names`` lists
        them (same order, same ``incoming``), with a ``Path`` per file."""
        for stored in self.stored_names(incoming):
            directory = Path(stored.directory)
            yield stored.artifact_id, [directory / name for name in stored.names]

    def persist(self, staged_path: Path, manifest: Manifest) -> os.stat_result:
        """Publish a fsynced staging file as ``blob_path(manifest)`` (rename, then fsync the
        directory) and return its stat. Any other version's file is left alone: the caller
        removes the old one after the new row commits.

        Falls back to copy + fsync + rename when the tmp dir is on another filesystem.
        """
        artifact_id = manifest.artifact_id
        final = self.blob_path(manifest)
        # A directory created here is durable only once its parent is fsynced too.
        to_sync = [final.parent]
        missing = final.parent
        while not missing.is_dir() and missing != self.blobs_dir.parent:
            to_sync.append(missing.parent)
            missing = missing.parent
        final.parent.mkdir(parents=True, exist_ok=True)
        try:
            os.replace(staged_path, final)
        except OSError as exc:
            if exc.errno != 18:  # EXDEV: tmp and data on different filesystems
                raise
            incoming = final.with_name(f"{artifact_id}.incoming-{uuid.uuid4().hex}")
            try:
                shutil.copyfile(staged_path, incoming)
                fd = os.open(incoming, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
                os.replace(incoming, final)
            finally:
                incoming.unlink(missing_ok=True)
                staged_path.unlink(missing_ok=True)
        if self.group is not None:
            self.group.published(final)
        for directory in to_sync:
            if self.group is None:
                fsync_path(directory)
            else:
                self.group.sync_dir_later(directory)
        return os.stat(final)

    def put(self, staged_path: Path, manifest: Manifest) -> str | None:
        """``BlobStore.put``: ``persist``, returning the new file's ``stat_signature``."""
        return stat_signature(self.persist(staged_path, manifest))

    def open_blob(self, manifest: Manifest) -> BinaryIO:
        """``BlobStore.open_blob``: ``blob_path(manifest)`` opened for reading."""
        return self.blob_path(manifest).open("rb")

    def artifact_ids(self) -> Iterator[str]:
        """``BlobStore.artifact_ids``: the ids of ``stored_names``."""
        return (stored.artifact_id for stored in self.stored_names())

    def remove(self, manifest: Manifest) -> None:
        """Unlink this version's file (a reader that has it open keeps reading it)."""
        self.blob_path(manifest).unlink(missing_ok=True)

    def remove_artifact(self, artifact_id: str) -> None:
        """Unlink every version file of ``artifact_id`` (its row is gone: evicted, tombstoned,
        dropped). Writer thread only, so no version of it is being published meanwhile."""
        for path in self.artifact_files(artifact_id):
            path.unlink(missing_ok=True)

    def artifact_files(self, artifact_id: str) -> list[Path]:
        """Every version file of ``artifact_id`` on disk now."""
        bucket = self.bucket(artifact_id)
        try:
            names = os.listdir(bucket)
        except FileNotFoundError:
            return []
        return [bucket / name for name in names if name.startswith(artifact_id)]


class StoredVersions(NamedTuple):
    """One artifact's version files in one directory (``BlobFiles.stored_names``): their names
    in ``directory``, and whether that directory is the id's bucket (``BlobFiles.bucket``)."""

    artifact_id: str
    directory: str
    names: list[str]
    placed: bool


class PublishGroup(Protocol):
    """What ``BlobFiles.persist`` tells the writer's group commit (``storage.group_commit``)."""

    def published(self, path: Path) -> None: ...

    def sync_dir_later(self, directory: Path) -> None: ...


def blob_name(artifact_id: str, version_ms: int, sha256: str) -> str:
    """``<artifact_id>.<version_ms>-<first 16 hex of sha256>``: one name per version (a write
    at the same version with other bytes gets another name too)."""
    return f"{artifact_id}.{version_ms}-{sha256[:16]}"


async def stage_body(
    body: AsyncIterator[bytes],
    path: Path,
    reservation: Reservation,
    *,
    limit_bytes: int,
    declared_length: int | None,
    expected_sha256: str | None = None,
    offload: Executor | None = None,
) -> Staged:
    """Stream ``body`` into ``path`` within ``reservation`` and ``limit_bytes``: created,
    written and hashed on the event loop, or in the pool ``offload`` (storage.offload).
    Raises ``PayloadTooLarge`` past ``limit_bytes`` or past the tmp budget's whole capacity,
    ``ResourceExhausted`` when a body without a declared length cannot grow its reservation
    now, ``InvalidRequest`` when more than ``declared_length`` bytes arrive, ``IncompleteBody``
    when fewer, ``DigestMismatch`` when ``expected_sha256`` is given and does not match (those
    checks are ``storage.body_count``'s). On any failure (cancellation included) the partial
    file is deleted; the caller owns releasing the reservation. The file is not yet fsynced;
    the reservation is marked written (``Reservation.mark_written``)."""
    reservation.track(path)
    h = BodyDigests()
    count = BodyCount(limit_bytes=limit_bytes, declared_length=declared_length)
    offloaded: OffloadedWrites | None = None
    try:
        f = path.open("wb") if offload is None else await open_for_writing(path, offload)
        with f:
            if offload is not None:
                offloaded = OffloadedWrites(f, h, offload)
            async for chunk in body:
                size = count.add(chunk)
                if size > reservation.size_bytes:
                    # Grow by a step, but never ask for more than the limit or the budget's
                    # capacity, and only for what arrived when the step does not fit now: a
                    # body that fits must not fail on the step's overshoot. (A declared body
                    # reserved its whole length, so only a chunked one grows.)
                    step_to = reservation.size_bytes + GROW_STEP_BYTES
                    reservation.grow_for(
                        size, min(limit_bytes, reservation.capacity_bytes, step_to)
                    )
                if offloaded is None:
                    f.write(chunk)
                    h.update(chunk)
                else:
                    await offloaded.add(chunk)
            if offloaded is not None:
                await offloaded.finish()
        size = count.finish()
        digest = h.sha256
        check_sha256(digest, expected_sha256)
        reservation.mark_written()
        return Staged(path, size, digest, h.xxh3_128)
    except BaseException as exc:
        if offloaded is not None:
            offloaded.abandon()
        path.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno == 28:  # ENOSPC
            raise ResourceExhausted("insufficient free disk space in the tmp dir") from exc
        raise


def concatenate(parts: Sequence[Path], out: Path) -> Staged:
    """Write the concatenation of ``parts`` to ``out``, fsynced; its size and digests. On any
    failure ``out`` is removed. Blocking (multipart completion, in the sync pool)."""
    h = BodyDigests()
    size = 0
    try:
        with out.open("wb") as dst:
            for part in parts:
                with part.open("rb") as src:
                    while chunk := src.read(1024 * 1024):
                        dst.write(chunk)
                        h.update(chunk)
                        size += len(chunk)
            dst.flush()
            os.fsync(dst.fileno())
    except BaseException:
        out.unlink(missing_ok=True)
        raise
    return Staged(out, size, h.sha256, h.xxh3_128)


# (names of the files of at least 64 characters, paths of ``.incoming-`` non-directories)
_Listing = tuple[list[str], list[str]]


def _list_bucket(directory: str) -> _Listing:
    """One bucket's listing (``BlobFiles.stored_names``; run in a thread)."""
    names: list[str] = []
    leftovers: list[str] = []
    with os.scandir(directory) as entries:
        for entry in entries:
            name = entry.name
            if INCOMING in name:
                if not entry.is_dir(follow_symlinks=False):
                    leftovers.append(entry.path)
            elif len(name) >= 64 and entry.is_file(follow_symlinks=False):
                names.append(name)
    return names, leftovers


def _bucket_dirs(
    blobs: str, incoming: Callable[[str], None] | None
) -> Iterator[tuple[str, str, str]]:
    """``(top, sub, blobs/top/sub)`` for every bucket directory, by name."""
    for top in _sorted_dir_names(blobs, incoming):
        top_dir = os.path.join(blobs, top)
        for sub in _sorted_dir_names(top_dir, incoming):
            yield top, sub, os.path.join(top_dir, sub)


def _grouped(
    top: str,
    sub: str,
    directory: str,
    listing: Future[_Listing],
    incoming: Callable[[str], None] | None,
) -> Iterator[StoredVersions]:
    """One bucket's ``StoredVersions`` in ``stored_names`` order; its leftovers to ``incoming``."""
    names, leftovers = listing.result()
    if incoming is not None:
        for path in leftovers:
            incoming(path)
    found: dict[str, list[str]] = {}
    for name in names:
        found.setdefault(name[:64], []).append(name)
    misplaced = [a for a in found if a[:2] != top or a[2:4] != sub]
    for artifact_id in misplaced:
        yield StoredVersions(artifact_id, directory, found.pop(artifact_id), False)
    for artifact_id in sorted(found):
        yield StoredVersions(artifact_id, directory, found[artifact_id], True)


def _sorted_dir_names(parent: str, incoming: Callable[[str], None] | None) -> list[str]:
    """The names of the subdirectories of ``parent``, sorted (none when it is missing); each
    ``.incoming-`` file met on the way is passed to ``incoming`` (``stored_names``)."""
    try:
        with os.scandir(parent) as entries:
            names = []
            for entry in entries:
                if entry.is_dir(follow_symlinks=False):
                    names.append(entry.name)
                elif incoming is not None and INCOMING in entry.name:
                    incoming(entry.path)
    except FileNotFoundError:
        return []
    return sorted(names)
