"""Eviction: keep stored bytes within ``max_disk_bytes`` by least-recently-used order.

Evictions are local: they are never replicated. While an eviction floor is set (a
bootstrap runs: ``CacheService``'s ``eviction_floor_ms``), eviction only picks artifacts last used
before it; a write that finds nothing it may evict is still stored, over the budget, as when
nothing at all is evictable. Artifacts clients were told exist stay for ``KURA_MIN_RETENTION``
while the budget allows and they hold at most ``retention.PROMISE_SHARE`` of it; past it they go
too, counted, as are young blobs they push out (``storage.retention``). Equal access
stamps are evicted oldest version first (the index order ``artifacts_by_access_version``).
Runs on the writer thread only. Other policies that drop artifacts (age expiry) live in their
own modules beside this one.

It is also the one place an entry is dropped for damage (``_confirm_corrupt_sync``, the
verdict the read path asks of the writer thread, ``storage.reads``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from kura.core.eviction import bytes_to_free
from kura.core.manifest import Manifest
from kura.storage import retention
from kura.storage.state import StorageState
from kura.storage.verify import problem_with_bytes, problem_with_file

log = logging.getLogger(__name__)


class Eviction(StorageState):
    """Least-recently-used eviction, and quarantine of damaged entries (module docstring)."""

    async def evict_to_budget(self) -> None:
        """Evict least-recently-used artifacts until the store is within ``max_disk_bytes``
        (after an eviction floor held them back)."""
        await self._in(self._writer, self._evict_sync, 0, "")

    def _evict_sync(self, incoming_bytes: int, exclude: str) -> None:
        """Writer thread: make room for ``incoming_bytes`` more, never evicting ``exclude``.
        With ``KURA_MIN_RETENTION`` set, in this order (``storage.retention``): unpromised
        artifacts last used before the window; promises over ``PROMISE_SHARE`` of the budget
        (least recently used first, counted as forced); unpromised artifacts used inside the
        window (counted as displaced while promises hold over ``DISPLACING_SHARE``); and, last,
        any promised one (forced)."""
        need = bytes_to_free(self.stats.used_bytes, incoming_bytes, self.max_disk_bytes)
        if need <= 0:
            return
        floor = self._eviction_floor_ms()
        since = self._promised_since_ms()
        if since is None:
            self._evict_lru_sync(need, exclude, floor, None)
            return
        self._record_promises_sync(self.accesses.promised.copy())
        before_window = since if floor is None else min(floor, since)
        need = self._evict_lru_sync(need, exclude, before_window, since)
        if need > 0:
            self._evict_inside_window_sync(need, exclude, floor, since)

    def _evict_inside_window_sync(
        self, need: int, exclude: str, floor: int | None, since: int
    ) -> None:
        """Writer thread: free ``need`` bytes from artifacts inside the retention window, each
        one counted (``storage.retention``: the cache is not keeping what it should)."""
        s = self.stats
        budget = self.max_disk_bytes
        promised = retention.promised_bytes(self._require_index().connection(), since)
        s.retention_promised_bytes = promised
        over_share = promised - int(budget * retention.PROMISE_SHARE)
        if over_share > 0:
            freed = self._counted_sync(min(need, over_share), exclude, floor, since, "forced")
            need -= freed
            s.retention_promised_bytes -= freed
        if need > 0:
            displacing = s.retention_promised_bytes > budget * retention.DISPLACING_SHARE
            kind = "displaced" if displacing else ""
            need -= self._counted_sync(need, exclude, floor, since, kind)
        if need > 0:
            freed = self._counted_sync(need, exclude, floor, None, "forced")
            s.retention_promised_bytes = max(0, s.retention_promised_bytes - freed)

    def _counted_sync(
        self, need: int, exclude: str, floor: int | None, since: int | None, kind: str
    ) -> int:
        """Writer thread: one pass of ``_evict_lru_sync`` (``since`` None: any artifact; with
        ``kind`` "forced" and ``since``, only promised ones; else only unpromised ones) counted
        as ``kind`` ("forced", "displaced", or "" for none) and logged at WARNING; return the
        bytes freed."""
        s = self.stats
        evictions, evicted_bytes = s.evictions_total, s.evicted_bytes_total
        self._evict_lru_sync(need, exclude, floor, since, promised_only=kind == "forced")
        count, freed = s.evictions_total - evictions, s.evicted_bytes_total - evicted_bytes
        if not count or not kind:
            return freed
        if kind == "forced":
            s.retention_evictions_total += count
            s.retention_evicted_bytes_total += freed
        else:
            s.retention_displaced_evictions_total += count
            s.retention_displaced_bytes_total += freed
        s.retention_last_eviction_ms = self.clock.now_ms()
        log.warning(
            "evicted %d artifact(s) (%d bytes) %s inside their retention window "
            "(KURA_MIN_RETENTION): promises hold %d bytes of KURA_MAX_DISK_BYTES=%d",
            count,
            freed,
            "that clients were told exist" if kind == "forced" else "written or used, unpromised,",
            s.retention_promised_bytes,
            self.max_disk_bytes,
        )
        return freed

    def _evict_lru_sync(
        self,
        need: int,
        exclude: str,
        floor: int | None,
        promised_since: int | None,
        *,
        promised_only: bool = False,
    ) -> int:
        """Evict least-recently-used artifacts (``paging.least_recently_used``'s filters)
        until ``need`` bytes are freed or none is left; return the bytes still needed."""
        index = self._require_index()
        while need > 0:
            batch = index.paging.least_recently_used(
                256, exclude, floor, promised_since, promised_only=promised_only
            )
            if not batch:
                return need
            victims: list[tuple[str, int, bool]] = []
            for victim in batch:
                victims.append(victim)
                need -= victim[1]
                if need <= 0:
                    break
            self._drop_sync(victims)
            self.stats.evictions_total += len(victims)
            self.stats.evicted_bytes_total += sum(v[1] for v in victims)
        return need

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
        flush always counts. Under a bootstrap's eviction floor nothing used
        at or after the floor goes, nor anything inside its retention window
        (``storage.retention``). Raises ``ResourceExhausted`` while the index is read-only."""
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
        floor = self._eviction_floor_ms()
        before = cutoff_ms if floor is None else min(cutoff_ms, floor)
        pending = self.accesses.pending  # read only: the event loop may add to it meanwhile
        promised_since = self._promised_since_ms()
        if promised_since is not None:
            self._record_promises_sync(self.accesses.promised.copy())
        victims = [
            v
            for v in index.paging.least_recently_used(limit, "", before, promised_since)
            if pending.get(v[0], 0) < before
        ]
        if victims:
            self._drop_sync(victims)
        return victims

    def _confirm_corrupt_sync(self, manifest: Manifest, detected_by: str) -> bool:
        """Writer thread (no commit runs concurrently): if ``manifest`` is still the stored
        version and its bytes still do not match it, quarantine the entry and return True.
        False means the caller raced a write and should look again.

        This is the one place an entry is dropped for damage: the file (or inline body) moves to
        the quarantine, the row goes, the hot cache and disk accounting follow, a WARNING names
        what was expected and what was found, and ``on_quarantine`` is told.
        """
        index = self._require_index()
        current = index.get(manifest.artifact_id)
        if current is None or current[0] != manifest:
            return False
        path = None if manifest.inline else self.files.blob_path(manifest)
        if path is None:
            problem = problem_with_bytes(current[1], manifest)
        else:
            problem = problem_with_file(path, manifest)
        if problem is None:
            return False
        if index.read_only:  # cannot drop it now: a miss, until a restart reconciles
            return True
        log.warning(
            "quarantined artifact %s (producer %s, namespace %r, key %r): expected %d bytes "
            "with sha256 %s, but %s (detected by %s)",
            manifest.artifact_id,
            manifest.producer,
            manifest.namespace_id,
            manifest.key,
            manifest.size,
            manifest.sha256,
            problem,
            detected_by,
        )
        index.delete([manifest.artifact_id])
        self.hot.invalidate([manifest.artifact_id])
        try:
            self.quarantine.admit(
                manifest,
                blob=path,
                inline_body=current[1] if path is None else None,
                found=problem,
                detected_by=detected_by,
                now_ms=self.clock.now_ms(),
            )
        except OSError:
            log.exception("could not quarantine %s; removing it", manifest.artifact_id)
            if path is not None:
                path.unlink(missing_ok=True)
        by = self.stats.corrupt_total
        by[detected_by] = by.get(detected_by, 0) + 1
        self.stats.used_bytes -= manifest.size
        self.stats.artifacts -= 1
        try:
            self._on_quarantine(manifest.artifact_id)
        except Exception:
            log.exception("on_quarantine hook failed for %s", manifest.artifact_id)
        return True
