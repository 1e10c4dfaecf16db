"""fsync helpers: a file, a directory (renames and unlinks in it), a SQLite WAL.

Blocking; callers run them off the event loop. Each raises OSError when the fsync fails.
"""

from __future__ import annotations

import os
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """fsync a directory, making renames and unlinks in it durable."""
    dir_fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def fsync_path(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_wal(database: Path) -> None:
    """fsync ``database``'s WAL file (or, when there is none, the database file itself): every
    COMMIT made before the call is then durable. Raises OSError when the fsync fails."""
    try:
        fd = os.open(database.with_name(database.name + "-wal"), os.O_RDONLY)
    except FileNotFoundError:
        fd = os.open(database, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
