"""Eviction: keep stored bytes within ``max_disk_bytes`` by least-recently-used order.

Evictions are local: they are never replicated. While the hooks report an eviction floor (a
bootstrap runs: ``StorageHooks.eviction_floor_ms``), eviction only picks artifacts last used
before it; a write that finds nothing it may evict is still stored, over the budget, as when
nothing at all is evictable. Equal access stamps are evicted oldest version first (the index
order ``artifacts_by_access_version``). Runs on the writer thread only. Other policies that
drop artifacts (age expiry) live in their own modules beside this one.
"""

from __future__ import annotations

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
            index.delete(v[0] for v in victims)
            self.hot.invalidate([v[0] for v in victims])
            for aid, size, inline in victims:
                if not inline:
                    self.files.remove_artifact(aid)
                self.stats.used_bytes -= size
                self.stats.artifacts -= 1
                self.stats.evictions_total += 1
                self.stats.evicted_bytes_total += size
