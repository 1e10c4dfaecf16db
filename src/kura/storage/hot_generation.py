"""A change counter shared by the processes of one node (``kura.workers``), so that a worker's
hot cache (``storage.hotcache``) never serves bytes the primary has replaced or dropped.

The counter is 8 bytes at the start of a file in the data dir, mapped ``MAP_SHARED`` into every
process (mmap(2): stores through a shared mapping are seen by every process that maps the same
file). Only the primary writes it: ``HotCache.invalidate`` bumps it *after* the change it covers
is committed (``storage.write_path``, ``storage.eviction``, ``storage.replica``). A worker reads
it before it reads a row and again before it keeps what it read; any difference empties its
cache. A torn read (the store is not guaranteed atomic) only ever differs from both the value
before and after the store, so it can cost a refill, never a stale hit.

The same kind of counter, in another file, tells workers the token files changed
(``api.auth.TokenAuth.share``).
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

NAME = ".kura.hot-generation"
_FORMAT = "<Q"
_SIZE = struct.calcsize(_FORMAT)
_UNPACK = struct.Struct(_FORMAT).unpack_from  # read on every hot-cache look-up of a worker


class SharedGeneration:
    """The node's shared change counter. ``create`` (the primary, holding the data-dir lock;
    OSError, e.g. ENOSPC, when its block cannot be allocated) or ``open`` (a worker;
    FileNotFoundError when the primary has not created it)."""

    def __init__(self, path: Path, *, create: bool) -> None:
        flags = os.O_RDWR | (os.O_CREAT if create else 0)
        fd = os.open(path, flags, 0o600)
        try:
            if create:
                os.ftruncate(fd, mmap.PAGESIZE)
                # Rewrite the counter through the file (its value is kept), so the filesystem
                # allocates its block now: a store through the mapping to a block never written
                # (a sparse file) raises SIGBUS when the disk is full (mmap(2)), and the primary
                # bumps the counter when eviction frees space. A disk full now raises OSError.
                os.pwrite(fd, os.pread(fd, _SIZE, 0), 0)
            access = mmap.ACCESS_WRITE if create else mmap.ACCESS_READ
            self._map = mmap.mmap(fd, _SIZE, access=access)  # both are MAP_SHARED
        finally:
            os.close(fd)
        self.path = path

    @classmethod
    def create(cls, data_dir: Path, name: str = NAME) -> SharedGeneration:
        return cls(data_dir / name, create=True)

    @classmethod
    def open(cls, data_dir: Path, name: str = NAME) -> SharedGeneration:
        return cls(data_dir / name, create=False)

    @property
    def value(self) -> int:
        value: int = _UNPACK(self._map)[0]
        return value

    def bump(self) -> None:
        """The primary only (the worker's mapping is read-only)."""
        struct.pack_into(_FORMAT, self._map, 0, (self.value + 1) % (1 << 64))

    def close(self) -> None:
        self._map.close()
