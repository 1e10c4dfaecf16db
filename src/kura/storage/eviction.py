"""Eviction: keep stored bytes within ``max_disk_bytes`` by least-recently-used order.

Evictions are local: they are never replicated. While the hooks report an eviction floor (a
bootstrap runs: ``StorageHooks.eviction_floor_ms``), eviction only picks artifacts last used
before it; a write that finds nothing it may evict is still stored, over the budget, as when
nothing at all is evictable. Equal access stamps are evicted oldest version first (the index
order ``artifacts_by_access_version``). Runs on the writer thread only. Other policies that
drop artifacts (age expiry) live in their own modules beside this one.
"""

from __future__ import annotations

from collections.abc import Sequence

from kura.core.eviction import bytes_to_free
from kura.storage.state import StorageState


class Eviction(StorageState):
    """Least-recently-used eviction (module docstring)."""

    async def evict_to_budget(self) -> None:
        """Evict least-recently-used artifacts until the store is within ``max_disk_bytes``
        (after an eviction floor held them back: ``StorageHooks.eviction_floor_ms``)."""
        await self._in(self._writer, self._evict_sync, 0, "")

    def _evict_sync(self, incoming_bytes: int, exclude: str) -> None:
        index = self._require_index()
        need = bytes_to_free(self.stats.used_bytes, incoming_bytes, self.max_disk_bytes)
        while need > 0:
            batch = index.least_recently_used(256, exclude, self.hooks.eviction_floor_ms())
            if not batch:
                return
            victims: list[tuple[str, int, bool]] = []
            for victim in batch:
                victims.append(victim)
                need -= victim[1]
                if need <= 0:
                    break
            self._drop_sync(victims)
            self.stats.evictions_total += len(victims)
            self.stats.evicted_bytes_total += sum(v[1] for v in victims)

    def _drop_sync(self, victims: Sequence[tuple[str, int, bool]]) -> None:
        """Writer thread: delete ``(artifact_id, size, inline)`` rows (and their digests, one
        transaction), hot-cache entries and blob files, and follow in the disk accounting. The
        one path eviction and expiry share; nothing is replicated (both are local)."""
        index = self._require_index()
        index.delete(v[0] for v in victims)
        self.hot.invalidate([v[0] for v in victims])
        for aid, size, inline in victims:
            if not inline:
                self._unlink_artifact_later(aid)
            self.stats.used_bytes -= size
            self.stats.artifacts -= 1

    async def drop_unused(self, cutoff_ms: int, limit: int) -> list[tuple[str, int, bool]]:
        """Expiry (``storage.expiry``): delete up to ``limit`` artifacts last used before
        ``cutoff_ms`` (wall-clock ms), oldest first, through eviction's path; return them as
        ``(artifact_id, size, inline)``, empty when none is that old. Access times still in
        memory are recorded first, and one touched meanwhile is kept, so a read since the last
        flush always counts. Under a bootstrap's eviction floor (``StorageHooks``) nothing used
        at or after the floor goes. Raises ``ResourceExhausted`` while the index is read-only."""
        self._check_writable()
        return await self._in(
            self._writer, self._drop_unused_sync, cutoff_ms, limit, self._take_touches()
        )

    def _drop_unused_sync(
        self, cutoff_ms: int, limit: int, touches: dict[str, int]
    ) -> list[tuple[str, int, bool]]:
        index = self._require_index()
        if touches:
            index.touch(touches)
        floor = self.hooks.eviction_floor_ms()
        before = cutoff_ms if floor is None else min(cutoff_ms, floor)
        pending = self._touches  # read only: the event loop may add to it meanwhile
        victims = [
            v for v in index.least_recently_used(limit, "", before) if pending.get(v[0], 0) < before
        ]
        if victims:
            self._drop_sync(victims)
        return victims
