"""A bounded in-memory cache of small, verified artifacts, keyed by artifact id.

Small GETs dominate build-cache traffic and their cost is per request, not per byte: a thread
hop, an SQLite lookup, a file open and a hash. A hit here skips all four. Entries are bytes that
were verified against their manifest's SHA-256 when they entered the cache, so a hit is never a
corrupted body.

Coherence: every change to an artifact (commit, eviction, clean, a dropped corrupt entry)
invalidates it *and* bumps a generation counter; a reader only inserts what it read if the
generation did not move while it was reading, so a read racing a write can never re-insert the
old bytes. Thread-safe (writers run on the storage writer thread, readers on the loop).

Across the processes of one node (``kura.workers``) the counter is shared
(``storage.hot_generation``): the primary's ``invalidate`` bumps it too, and a worker's cache,
which never invalidates anything itself, empties whenever the shared value moved.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from kura.core.manifest import Manifest
from kura.storage.hot_generation import SharedGeneration


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
        self._shared: SharedGeneration | None = None
        self._follows = False  # a worker's: the shared counter is the generation

    def share(self, shared: SharedGeneration, *, follow: bool) -> None:
        """Bump ``shared`` on every invalidation (the primary), or, with ``follow``, take it as
        this cache's generation and empty the cache whenever it moves (a worker)."""
        self._shared, self._follows = shared, follow
        self._generation = shared.value if follow else self._generation

    @property
    def generation(self) -> int:
        if self._follows:
            with self._lock:
                self._follow()
        return self._generation

    def _follow(self) -> None:
        assert self._shared is not None
        current = self._shared.value
        if current != self._generation:
            self._generation = current
            self._entries.clear()
            self.size_bytes = 0

    def get(self, artifact_id: str) -> tuple[Manifest, bytes] | None:
        with self._lock:
            if self._follows:
                self._follow()
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
            if self._follows:
                self._follow()
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

    def invalidate(
        self, artifact_ids: list[str] | tuple[str, ...] | set[str], *, replaced: bool = True
    ) -> None:
        """After a commit changed ``artifact_ids``. ``replaced=False`` says none of them had a
        row before it (a first write): no other process can hold their bytes, so the shared
        counter stays, and workers keep their caches through a stream of new writes."""
        with self._lock:
            self._generation += 1
            if self._shared is not None and replaced:
                self._shared.bump()
            for aid in artifact_ids:
                old = self._entries.pop(aid, None)
                if old is not None:
                    self.size_bytes -= len(old[1])
