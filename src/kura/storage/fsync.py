"""fsync helpers: a file, a directory (renames and unlinks in it), a SQLite WAL.

Blocking; callers run them off the event loop. Each raises OSError when the fsync fails.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_path(path: Path) -> None:
    """fsync a file (its bytes) or a directory (renames, creations and unlinks in it); either
    is opened read-only, which Linux fsyncs (fsync(2): "an explicit fsync() on a file
    descriptor for the directory is also needed")."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class WalSync:
    """``sync()`` makes every COMMIT to ``database`` so far durable: it fsyncs the WAL file (or,
    when there is none, the database file itself), and the first time it sees a WAL file (a new
    inode: SQLite created or re-created it) also the directory that holds its name. Raises
    OSError when an fsync fails."""

    def __init__(self, database: Path) -> None:
        self.database = database
        self._wal = database.with_name(database.name + "-wal")
        self._named_inode: int | None = None

    def __call__(self) -> None:
        try:
            fd = os.open(self._wal, os.O_RDONLY)
        except FileNotFoundError:
            fsync_path(self.database)
            return
        try:
            os.fsync(fd)
            inode = os.fstat(fd).st_ino
        finally:
            os.close(fd)
        if inode != self._named_inode:
            fsync_path(self.database.parent)
            self._named_inode = inode
