"""Eviction: keep stored bytes within ``max_disk_bytes`` by least-recently-used order.

Evictions are local: they are never replicated. While an eviction floor is set (a
bootstrap runs: ``CacheService``'s ``eviction_floor_ms``), eviction only picks artifacts last used
before it; a write that finds nothing it may evict is still stored, over the budget, as when
nothing at all is evictable. Artifacts clients were told exist stay for ``KURA_MIN_RETENTION``
while the budget allows and they hold at most ``retention.PROMISE_SHARE`` of it; past it they go
too, counted, as are young blobs they push out (``storage.retention``). Equal access
stamps are evicted oldest version first (the index order ``artifacts_by_access_version``).
Retention per namespace (``KURA_NAMESPACE_RULES``, ``core.namespace_rule``) comes first and
around it: namespaces over their quota lose their own least recently used entries before
anything else, and the LRU passes skip entries used inside their rule's ``min_age`` until
nothing else is left, when the disk's budget wins (counted ``forced``, warned in ``/ready``).
Every eviction and expiry is counted by its namespace's rule and reason, and the age since last
use of every eviction goes to the shed-age histogram (``_shed_sync``; docs/durability.md).
Runs on the writer thread only. Other policies that drop artifacts (age expiry) live in their
own modules beside this one.

It is also the one place an entry is dropped for damage (``_confirm_corrupt_sync``, the
verdict the read path asks of the writer thread, ``storage.reads``).
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Sequence

from kit.log_limit import LogLimit
from kura.core.eviction import bytes_to_free
from kura.core.manifest import Manifest
from kura.storage import namespace_usage, retention
from kura.storage.fsync import disk_full
from kura.storage.namespace_usage import Protected
from kura.storage.paging import Victim
from kura.storage.state import StorageState
from kura.storage.verify import problem_with_bytes, problem_with_file

log = logging.getLogger(__name__)

# One line per minute for all the entries a full disk keeps in the index (``_undroppable``).
UNDROPPED_LOG_SECONDS = 60.0
_UNDROPPED_LIMIT = LogLimit(1, UNDROPPED_LOG_SECONDS)


class Eviction(StorageState):
    """Least-recently-used eviction, and quarantine of damaged entries (module docstring)."""

    async def evict_to_budget(self) -> None:
        """Evict least-recently-used artifacts until the store is within ``max_disk_bytes``
        (after an eviction floor held them back)."""
        await self._in(self._writer, self._evict_sync, 0, "")

    def _evict_sync(self, incoming_bytes: int, exclude: str) -> None:
        """Writer thread: make room for ``incoming_bytes`` more, never evicting ``exclude``.
        With ``KURA_NAMESPACE_RULES``, first the namespaces over their quota lose their own
        least recently used entries (``_evict_over_quota_sync``), and the passes below skip
        entries used inside their rule's ``min_age`` (``namespace_usage.protected``); when
        that leaves the budget exceeded, the passes run again without it, each eviction
        counted as ``forced``. With ``KURA_MIN_RETENTION`` set, in this order
        (``storage.retention``): unpromised artifacts last used before the window; promises
        over ``PROMISE_SHARE`` of the budget (least recently used first, counted as forced);
        unpromised artifacts used inside the window (counted as displaced while promises hold
        over ``DISPLACING_SHARE``); and, last, any promised one (forced)."""
        need = bytes_to_free(self.stats.used_bytes, incoming_bytes, self.max_disk_bytes)
        if need <= 0:
            return
        floor = self._eviction_floor_ms()
        protect: Protected = ()
        if self.namespace_rules:
            self._evict_over_quota_sync(exclude, floor)
            need = bytes_to_free(self.stats.used_bytes, incoming_bytes, self.max_disk_bytes)
            if need <= 0:
                return
            present = list(self.stats.namespace_usage)
            protect = namespace_usage.protected(self.namespace_rules, present, self.clock.now_ms())
        need = self._evict_budget_sync(need, exclude, floor, protect, "lru")
        if need > 0 and protect:  # the disk leaves no choice (module docstring)
            self._evict_budget_sync(need, exclude, floor, (), "forced")

    def _evict_budget_sync(
        self, need: int, exclude: str, floor: int | None, protect: Protected, reason: str
    ) -> int:
        """Writer thread: the LRU passes of ``_evict_sync`` (its docstring), each eviction
        counted under ``reason``; return the bytes still needed."""
        since = self._promised_since_ms()
        if since is None:
            return self._evict_lru_sync(need, exclude, floor, None, protect=protect, reason=reason)
        self._record_promises_sync(self.accesses.promised.copy())
        before_window = since if floor is None else min(floor, since)
        need = self._evict_lru_sync(
            need, exclude, before_window, since, protect=protect, reason=reason
        )
        if need > 0:
            need = self._evict_inside_window_sync(need, exclude, floor, since, protect, reason)
        return need

    def _evict_over_quota_sync(self, exclude: str, floor: int | None) -> None:
        """Writer thread: measure every namespace's usage (``StorageStats.namespace_usage``)
        and bring each namespace over its rule's quota back under it, taking its own least
        recently used entries (counted as ``quota``; promised and young ones too: a quota is
        a hard cap), never ``exclude``, nothing used at or after the eviction ``floor``, and
        nothing whose upload to the object-storage tier is pending."""
        s = self.stats
        s.namespace_usage = namespace_usage.usage(self._require_index().connection())
        s.namespace_usage_measured_ms = self.clock.now_ms()
        for namespace, (size, _entries) in sorted(s.namespace_usage.items()):
            rule = self.namespace_rules.rule_for(namespace)
            if rule is None or rule.quota_bytes is None or size <= rule.quota_bytes:
                continue
            over = size - rule.quota_bytes
            self._evict_lru_sync(over, exclude, floor, None, namespace=namespace, reason="quota")

    async def enforce_quotas(self) -> dict[str, tuple[int, int]]:
        """Measure every namespace's usage and evict what is over its quota
        (``_evict_over_quota_sync``; the expiry pass calls it, so a quota holds within one
        ``KURA_EXPIRY_INTERVAL`` even while the disk has room). Returns namespace -> (bytes,
        entries) after it; empty without ``KURA_NAMESPACE_RULES``, measuring nothing (only rules
        need it, and the scan needs their index, ``storage.schema``). Raises
        ``ResourceExhausted`` while the index is read-only."""
        self._check_writable()
        if not self.namespace_rules:
            return {}

        def run() -> dict[str, tuple[int, int]]:
            self._evict_over_quota_sync("", self._eviction_floor_ms())
            return dict(self.stats.namespace_usage)

        return await self._in(self._writer, run)

    def _evict_inside_window_sync(
        self,
        need: int,
        exclude: str,
        floor: int | None,
        since: int,
        protect: Protected = (),
        reason: str = "lru",
    ) -> int:
        """Writer thread: free ``need`` bytes from artifacts inside the retention window, each
        one counted (``storage.retention``: the cache is not keeping what it should); return
        the bytes still needed."""
        s = self.stats
        budget = self.max_disk_bytes
        promised = retention.promised_bytes(self._require_index().connection(), since)
        s.retention_promised_bytes = promised
        over_share = promised - int(budget * retention.PROMISE_SHARE)
        pass_ = (exclude, floor, protect, reason)
        if over_share > 0:
            freed = self._counted_sync(min(need, over_share), since, "forced", *pass_)
            need -= freed
            s.retention_promised_bytes -= freed
        if need > 0:
            displacing = s.retention_promised_bytes > budget * retention.DISPLACING_SHARE
            kind = "displaced" if displacing else ""
            need -= self._counted_sync(need, since, kind, *pass_)
        if need > 0:
            freed = self._counted_sync(need, None, "forced", *pass_)
            need -= freed
            s.retention_promised_bytes = max(0, s.retention_promised_bytes - freed)
        return need

    def _counted_sync(
        self,
        need: int,
        since: int | None,
        kind: str,
        exclude: str,
        floor: int | None,
        protect: Protected,
        reason: str,
    ) -> int:
        """Writer thread: one pass of ``_evict_lru_sync`` (``since`` None: any artifact; with
        ``kind`` "forced" and ``since``, only promised ones; else only unpromised ones) counted
        as ``kind`` ("forced", "displaced", or "" for none) and logged at WARNING; return the
        bytes freed."""
        s = self.stats
        evictions, evicted_bytes = s.evictions_total, s.evicted_bytes_total
        self._evict_lru_sync(
            need,
            exclude,
            floor,
            since,
            promised_only=kind == "forced",
            protect=protect,
            reason=reason,
        )
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
        namespace: str | None = None,
        protect: Protected = (),
        reason: str = "lru",
    ) -> int:
        """Evict least-recently-used artifacts (``paging.least_recently_used``'s filters)
        until ``need`` bytes are freed or none is left, counted under ``reason``
        (``_shed_sync``); return the bytes still needed."""
        index = self._require_index()
        while need > 0:
            batch = index.paging.least_recently_used(
                256,
                exclude,
                floor,
                promised_since,
                promised_only=promised_only,
                namespace=namespace,
                protect=protect,
            )
            if not batch:
                return need
            victims: list[Victim] = []
            for victim in batch:
                victims.append(victim)
                need -= victim.size
                if need <= 0:
                    break
            self._drop_sync(victims)
            self.stats.evictions_total += len(victims)
            self.stats.evicted_bytes_total += sum(v.size for v in victims)
            self._shed_sync(victims, reason)
        return need

    def _shed_sync(self, victims: Sequence[Victim], reason: str) -> None:
        """Writer thread: count ``victims`` by their namespace's rule and ``reason``
        (``core.namespace_rule.REASONS``); the ages since last use of evicted ones (every
        reason but ``max_age``) go to the shed-age histogram; a ``forced`` eviction is logged
        and warned in ``/ready`` (``namespace_shortfall_warning``)."""
        s = self.stats
        now_ms = self.clock.now_ms()
        by_label: dict[str, list[Victim]] = {}
        for v in victims:
            by_label.setdefault(self.namespace_rules.label(v.namespace_id), []).append(v)
            size, entries = s.namespace_usage.get(v.namespace_id, (0, 0))
            if entries > 1:  # the measurement follows what leaves until the next one
                s.namespace_usage[v.namespace_id] = (max(0, size - v.size), entries - 1)
            else:
                s.namespace_usage.pop(v.namespace_id, None)
        for label, shed in by_label.items():
            key = (label, reason)
            s.namespace_evictions_total[key] = s.namespace_evictions_total.get(key, 0) + len(shed)
            freed = sum(v.size for v in shed)
            s.namespace_evicted_bytes_total[key] = (
                s.namespace_evicted_bytes_total.get(key, 0) + freed
            )
            if reason != "max_age":
                s.shed_ages.observe(label, (max(0, now_ms - v.last_access_ms) / 1000 for v in shed))
            if reason == "forced":
                s.namespace_forced_last_ms = now_ms
                log.warning(
                    "evicted %d artifact(s) (%d bytes) of rule %s used inside its min_age "
                    "(KURA_NAMESPACE_RULES): nothing else was left to keep within "
                    "KURA_MAX_DISK_BYTES=%d",
                    len(shed),
                    freed,
                    label,
                    self.max_disk_bytes,
                )

    def _drop_sync(self, victims: Sequence[Victim]) -> None:
        """Writer thread: delete ``(artifact_id, size, inline)`` rows (and their digests, one
        transaction), hot-cache entries and blob files, and follow in the disk accounting. The
        one path eviction and expiry share; nothing is replicated (both are local)."""
        index = self._require_index()
        index.delete(v[0] for v in victims)
        self.hot.invalidate([v[0] for v in victims])
        for v in victims:
            if not v.inline:
                self._unlink_artifact_later(v.artifact_id)
            self.stats.used_bytes -= v.size
            self.stats.artifacts -= 1

    async def drop_unused(
        self, cutoff_ms: int, limit: int, namespace: str | None = None
    ) -> list[Victim]:
        """Expiry (``storage.expiry``): delete up to ``limit`` artifacts last used before
        ``cutoff_ms`` (wall-clock ms), of ``namespace`` alone unless it is None, oldest first,
        through eviction's path (counted as ``max_age``); return them, empty when none is
        that old. Access times still in
        memory are recorded first, and one touched meanwhile is kept, so a read since the last
        flush always counts. Under a bootstrap's eviction floor nothing used
        at or after the floor goes, nor anything inside its retention window
        (``storage.retention``). Raises ``ResourceExhausted`` while the index is read-only."""
        self._check_writable()
        return await self._in(
            self._writer,
            self._drop_unused_sync,
            cutoff_ms,
            limit,
            self._take_touches(),
            namespace,
        )

    def _drop_unused_sync(
        self, cutoff_ms: int, limit: int, touches: dict[str, int], namespace: str | None
    ) -> list[Victim]:
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
            for v in index.paging.least_recently_used(
                limit, "", before, promised_since, namespace=namespace
            )
            if pending.get(v.artifact_id, 0) < before
        ]
        if victims:
            self._drop_sync(victims)
            self._shed_sync(victims, "max_age")
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
        self.hot.invalidate([manifest.artifact_id])
        try:
            index.delete([manifest.artifact_id])
        except sqlite3.OperationalError as exc:
            if not disk_full(exc):
                raise
            _undroppable(manifest, problem, exc)
            return True  # a miss all the same: each read checks the bytes again and misses
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


def _undroppable(manifest: Manifest, problem: str, exc: sqlite3.OperationalError) -> None:
    """``_confirm_corrupt_sync`` found ``manifest``'s bytes damaged or gone but the disk is too
    full to drop its row (``SQLITE_FULL``): the entry stays, and reads as a miss (its bytes
    are checked on every read) until space is freed and a read drops it. One WARNING line per
    ``UNDROPPED_LOG_SECONDS`` for all such entries, not one per read (a tester's 30 reads of
    entries whose files were gone answered 500 each, with a traceback)."""
    left_out = _UNDROPPED_LIMIT.admit()
    if left_out is not None:
        log.warning(
            "could not drop artifact %s from the index, the disk is full (%s): %s; it reads as "
            "a miss until space is freed (%d more such entries not logged)",
            manifest.artifact_id,
            exc,
            problem,
            left_out,
        )
