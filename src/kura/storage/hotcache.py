"""A bounded in-memory cache of small, verified artifacts, keyed by artifact id.

Small GETs dominate build-cache traffic and their cost is per request, not per byte: a thread
hop, an SQLite lookup, a file open and a hash. A hit here skips all four. Entries are bytes that
were verified against their manifest's SHA-256 when they entered the cache, so a hit is never a
corrupted body.

Coherence: every change to an artifact (commit, eviction, clean, a dropped corrupt entry)
invalidates it *and* bumps a generation counter; a reader only inserts what it read if the
generation did not move while it was reading, so a read racing a write can never re-insert the
old bytes. Thread-safe (writers run on the storage writer thread, readers on the loop).
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from kura.core.manifest import Manifest


class HotCache:
    def __init__(self, max_bytes: int, max_entry_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.max_entry_bytes = max_entry_bytes
        self.size_bytes = 0
        self.hits = 0
        self.misses = 0
        self._entries: OrderedDict[str, tuple[Manifest, bytes]] = OrderedDict()
        self._lock = threading.Lock()
        self._generation = 0

    @property
    def generation(self) -> int:
        return self._generation

    def get(self, artifact_id: str) -> tuple[Manifest, bytes] | None:
        with self._lock:
            entry = self._entries.get(artifact_id)
            if entry is None:
                self.misses += 1
                return None
            self._entries.move_to_end(artifact_id)
            self.hits += 1
            return entry

    def put(self, manifest: Manifest, data: bytes, generation: int) -> None:
        """Insert verified bytes read while the generation was ``generation``."""
        if self.max_bytes <= 0 or len(data) > self.max_entry_bytes:
            return
        with self._lock:
            if generation != self._generation:
                return  # something changed while the caller read: its bytes may be stale
            old = self._entries.pop(manifest.artifact_id, None)
            if old is not None:
                self.size_bytes -= len(old[1])
            self._entries[manifest.artifact_id] = (manifest, data)
            self.size_bytes += len(data)
            while self.size_bytes > self.max_bytes and self._entries:
                _aid, (_m, evicted) = self._entries.popitem(last=False)
                self.size_bytes -= len(evicted)

    def invalidate(self, artifact_ids: list[str] | tuple[str, ...] | set[str]) -> None:
        with self._lock:
            self._generation += 1
            for aid in artifact_ids:
                old = self._entries.pop(aid, None)
                if old is not None:
                    self.size_bytes -= len(old[1])
