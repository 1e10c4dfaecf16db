"""fsync helpers: a file, a directory (renames and unlinks in it), a SQLite WAL.

Blocking; callers run them off the event loop. Each raises OSError when the fsync fails, and
``DescriptorShortage`` (an OSError) when the file could not even be opened for want of a
descriptor or memory: then no fsync ran on it and nothing was lost, so a caller may retry once
the shortage passes (``storage.group_commit`` does, instead of refusing writes for good).
"""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import sqlite3
import sys
import time
from collections.abc import Callable
from pathlib import Path

# open(2) fails with these when the process (EMFILE) or the system (ENFILE) has no descriptor
# left, or the kernel no memory (ENOMEM): conditions that pass, unlike an I/O error.
SHORTAGE_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM})


SYNC_FILE_RANGE_WRITE = 2  # <fcntl.h>


@functools.cache
def _sync_file_range() -> Callable[[int, int, int, int], int] | None:
    """glibc's ``sync_file_range`` (Linux only; ``os`` has no binding), or None. Looked up in
    the process's own symbols (``CDLL(None)``), so a preloaded library that wraps it
    (libeatmydata, ``bench/grpc_cas.py --eatmydata``) is the one called, as for ``fsync``."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None)
    except OSError:
        return None
    call = getattr(libc, "sync_file_range", None)
    if call is None:
        return None
    call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    call.restype = ctypes.c_int
    fn: Callable[[int, int, int, int], int] = call
    return fn


def start_writeback(fd: int, offset: int, length: int) -> None:
    """Ask the kernel to start writing bytes ``[offset, offset + length)`` of ``fd`` to the
    disk now, without waiting for them (sync_file_range(2), ``SYNC_FILE_RANGE_WRITE``), so the
    fsync that later makes the file durable has less left to write. It promises nothing about
    durability itself. A staged 64 MiB body written a 1 MiB block at a time, with this after
    each block: its final fsync 118 -> 84 to 93 ms, write + fsync 192 -> 166 to 178 ms (medians
    of 5 on this machine's ext4). It can block (ext4 block allocation, a full device queue: up
    to 11 ms seen), so it runs in the sync pool (``storage.offload``), never on the event loop.
    A no-op where the call is missing; never raises (a failure only leaves the bytes to the
    fsync)."""
    call = _sync_file_range()
    if call is not None and length > 0:
        call(fd, offset, length, SYNC_FILE_RANGE_WRITE)


class DescriptorShortage(OSError):
    """A file to fsync could not be opened (``SHORTAGE_ERRNOS``): no fsync ran on it."""


def open_to_sync(path: Path) -> int:
    """``os.open(path, O_RDONLY)``; raises ``DescriptorShortage`` for ``SHORTAGE_ERRNOS`` and
    the OSError itself otherwise (FileNotFoundError included)."""
    try:
        return os.open(path, os.O_RDONLY)
    except OSError as exc:
        if exc.errno in SHORTAGE_ERRNOS:
            raise DescriptorShortage(exc.errno, exc.strerror, str(path)) from exc
        raise


def disk_full(exc: BaseException) -> bool:
    """Whether ``exc`` says the disk is full: an SQLite error whose code is ``SQLITE_FULL``
    (https://www.sqlite.org/rescode.html#full: the index's journal or WAL could not grow), or
    an OSError ``ENOSPC``. The one test every listener's error path asks
    (``kura.api.malformed.disk_full_error``)."""
    if isinstance(exc, sqlite3.Error):
        return getattr(exc, "sqlite_errorname", None) == "SQLITE_FULL"
    return isinstance(exc, OSError) and exc.errno == errno.ENOSPC


def shortage_reason(exc: OSError) -> str:
    """The ``/ready`` reason while the process is short of descriptors or memory for a file."""
    return (
        f"writes are refused for now: the process is short of descriptors or memory "
        f"({exc.strerror}); they resume by themselves once it passes"
    )


def descriptor_shortage() -> OSError | None:
    """Whether the process is short of a descriptor (or memory) for a file right now: opens
    and closes ``os.devnull`` and returns the OSError for ``SHORTAGE_ERRNOS``, else None. A
    reading, not a latch. Neither a count of open descriptors (a new one takes the lowest free
    number and fails with EMFILE at or past the soft ``RLIMIT_NOFILE``, Linux ``alloc_fd``) nor
    the last sync's outcome can tell: a descriptor freed for a moment lets a sync succeed, and
    the next connection accepted takes it again. Any other OSError (no ``/dev/null`` in a
    sandbox, EACCES) is not a shortage: None, so that /ready and a miss never turn into a 500.
    The probe holds the lowest free descriptor for the instant of the open: a file opened at
    that very instant with exactly one free may fail as it would have a moment later."""
    try:
        fd = os.open(os.devnull, os.O_RDONLY)
    except OSError as exc:
        return exc if exc.errno in SHORTAGE_ERRNOS else None
    os.close(fd)
    return None


SHORTAGE_READING_SECONDS = 0.1  # how long a ``ShortageReading`` keeps its last reading


class ShortageReading:
    """``descriptor_shortage()`` read at most once per ``SHORTAGE_READING_SECONDS`` of
    ``now`` (seconds, monotonic), the last reading answered in between: ``/ready``, ``/status``
    and the read-through decision made at each local miss ask for it many times a second, and
    each reading opens and closes ``os.devnull``. Still a reading, not a latch: a shortage that
    passed is reported at most that long after, except by ``refresh``, which takes one now
    (``/ready`` and ``/status`` do: a probe must see the shortage of this very moment).
    ``probes`` counts the readings taken."""

    def __init__(self, now: Callable[[], float] = time.monotonic) -> None:
        self._now = now
        self._at: float | None = None
        self._last: OSError | None = None
        self.probes = 0

    def __call__(self) -> OSError | None:
        now = self._now()
        if self._at is None or now - self._at >= SHORTAGE_READING_SECONDS or now < self._at:
            return self.refresh()
        return self._last

    def refresh(self) -> OSError | None:
        """Take a reading now, kept for the calls that follow."""
        self._last, self._at = descriptor_shortage(), self._now()
        self.probes += 1
        return self._last


# This process's reading: descriptors are the process's, whichever component asks.
process_shortage = ShortageReading()


def fsync_path(path: Path) -> None:
    """fsync a file (its bytes) or a directory (renames, creations and unlinks in it); either
    is opened read-only, which Linux fsyncs (fsync(2): "an explicit fsync() on a file
    descriptor for the directory is also needed")."""
    fd = open_to_sync(path)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class WalSync:
    """``sync()`` makes every COMMIT to ``database`` so far durable: it fdatasyncs the WAL file
    (or, when there is none, fsyncs the database file itself), and the first time it sees a WAL
    file (a new inode: SQLite created or re-created it) also fsyncs the directory that holds its
    name. Raises OSError when a sync fails.

    fdatasync, not fsync: it flushes the WAL's bytes and the metadata needed to read them back
    (its size), not its timestamps (fdatasync(2)), which is what SQLite itself calls on the WAL
    on Linux, and PostgreSQL's default ``wal_sync_method`` there. SQLite reuses the WAL file
    from its start after a checkpoint, so most syncs extend nothing and skip the filesystem's
    journal commit a changed mtime costs: 1 KiB writes one after another, fsync and fdatasync
    interleaved 8 x 150 on this machine (load 7 to 8), WAL sync p50 0.50 -> 0.33 ms and write
    p50 1.30 -> 0.96 ms."""

    def __init__(self, database: Path) -> None:
        self.database = database
        self._wal = database.with_name(database.name + "-wal")
        self._named_inode: int | None = None

    def __call__(self) -> None:
        try:
            fd = open_to_sync(self._wal)
        except FileNotFoundError:
            fsync_path(self.database)
            return
        try:
            os.fdatasync(fd)
            inode = os.fstat(fd).st_ino
        finally:
            os.close(fd)
        if inode != self._named_inode:
            fsync_path(self.database.parent)
            self._named_inode = inode
