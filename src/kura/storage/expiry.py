"""Age-based expiry: artifacts not used on this node for longer than ``KURA_MAX_AGE`` are dropped.

Teams whose cache only grows ask for this (turborepo-remote-cache issues 433 and 734:
https://github.com/ducktors/turborepo-remote-cache/issues/433). "Used" is the artifact's
``last_access_ms`` in the index: set by a write, by every read that hits (GET and HEAD, a
reference checked by an action-cache or key-value hit) and by a bootstrap copy (stamped when
the bootstrap began). Reads record their access in memory and ``CacheService`` flushes it every few
seconds; a pass records what is still in memory before it selects anything
(``CacheService.drop_unused``), so a read is never lost to the flush interval.

**Per namespace.** With ``KURA_NAMESPACE_RULES`` each namespace has its own age (its rule's
``max_age``, else ``KURA_MAX_AGE``; none for 0), and a pass deletes each namespace's entries
past it, one namespace at a time (a seek on ``artifacts_by_namespace_access``, which exists
only while rules are set: ``storage.schema``). Every pass with rules first measures each
namespace's usage and evicts what is over a quota (``CacheService.enforce_quotas``; nothing
without rules), so quotas hold within one interval while the disk has room.

**Local, never replicated.** Each node applies the rule to its own access times; an expiry is
not a tombstone and is not shipped to peers, exactly like an LRU eviction. Reads touch only the
node that served them (access times do not replicate), so an artifact idle here may be in daily
use on a peer: a replicated delete would take it from the node that needs it. Tombstones also
exist only per namespace (``core.version``), and a per-artifact one would have to outrank
every later write of the key. So what expired here can come back by read-through (a miss asks
the peers) or anti-entropy (it pulls what a peer holds and this node lacks, within the disk
budget), stamped as used then; with the same ``KURA_MAX_AGE`` on every node, an artifact nobody
uses anywhere leaves every node within one age plus one interval.

**Pace.** A pass starts every ``interval_seconds`` (``KURA_EXPIRY_INTERVAL``; the first one an
interval after start-up) and deletes oldest first, in batches of
``min(batch_size, max_deletes_per_second)`` artifacts, each batch one index transaction on the
writer thread (the same path as eviction: rows, range digests, hot cache, blob files, disk
accounting), and after each batch it sleeps until ``deleted / max_deletes_per_second`` seconds
have passed since the pass began: a pass that deletes N artifacts takes at least
N / ``KURA_EXPIRY_MAX_DELETES_PER_SECOND`` seconds, and writes queue behind one batch at most.
The cut-off (now - max age) is taken once per pass. A failed pass is logged and retried at the
next interval; a read-only index (a full disk at start-up) skips passes.

**The object-storage tier** expires its bucket beside this pass (``storage.bucket_expiry``, on
every node's use recorded as touch markers, ``storage.bucket_touch``). ``ExpiryListener`` is
told after every batch which artifacts expired here and the pass's cut-off; none is wired.
"""

from __future__ import annotations

import asyncio
import logging
import sqlite3
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from kit.backoff import every
from kit.clock import Clock
from kit.pace import Pace
from kura.core.errors import ResourceExhausted
from kura.core.namespace_rule import NO_RULES, NamespaceRules
from kura.storage.service import CacheService

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ExpiredArtifact:
    """One artifact an expiry pass deleted here: its id and its size in bytes."""

    artifact_id: str
    size_bytes: int


class ExpiryListener(Protocol):
    """Told what each expiry batch deleted (for a tier that keeps copies elsewhere)."""

    async def expired(self, artifacts: Sequence[ExpiredArtifact], cutoff_ms: int) -> None:
        """``artifacts`` (non-empty, oldest use first) were last used here before ``cutoff_ms``
        (wall-clock ms) and are gone from the local tier. An exception is logged and counted
        (``listener_failures_total``); the pass goes on."""


@dataclass
class ExpiryStats:
    """Counters and gauges the metrics layer reads at scrape time (``api.expiry_metrics``)."""

    deleted_total: int = 0
    deleted_bytes_total: int = 0
    passes_total: int = 0
    listener_failures_total: int = 0
    last_pass_timestamp_seconds: float = 0.0  # wall clock at the end of the last pass; 0 = none
    last_pass_seconds: float = 0.0  # how long the last pass took
    oldest_access_age_seconds: float = 0.0  # of the least recently used artifact, at pass end


def oldest_access_ms(conn: sqlite3.Connection) -> int | None:
    """The smallest ``last_access_ms`` stored (None when the index is empty); a seek on the
    index ``artifacts_by_access_version``, not a scan."""
    row = conn.execute("SELECT MIN(last_access_ms) FROM artifacts").fetchone()
    return None if row is None or row[0] is None else int(row[0])


class Expiry:
    """See module docstring. Run ``run()`` in the app's TaskGroup; cancel it to stop.

    ``max_age_seconds`` 0 turns expiry off (``run`` returns at once). ``clock`` gives the
    wall-clock cut-off and the pass's monotonic pace; with ``sleep`` it can be virtual in tests."""

    def __init__(
        self,
        service: CacheService,
        clock: Clock,
        *,
        max_age_seconds: float,
        interval_seconds: float,
        max_deletes_per_second: int,
        batch_size: int,
        rules: NamespaceRules = NO_RULES,
        listeners: Sequence[ExpiryListener] = (),
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if max_deletes_per_second <= 0 or batch_size <= 0:
            raise ValueError("max_deletes_per_second and batch_size must be above 0")
        self._service = service
        self._clock = clock
        self.max_age_seconds = max_age_seconds
        self.rules = rules
        self.interval_seconds = interval_seconds
        self.max_deletes_per_second = max_deletes_per_second
        self.batch_size = min(batch_size, max_deletes_per_second)
        self.listeners = list(listeners)
        self._sleep = sleep
        self.stats = ExpiryStats()

    async def run(self) -> None:
        """Forever: sleep one interval, run a pass. Returns at once when expiry is off: no
        ``KURA_MAX_AGE`` and no ``KURA_NAMESPACE_RULES``."""
        if self.max_age_seconds <= 0 and not self.rules:
            return

        async def one_pass() -> None:
            try:
                await self.expiry_pass()
            except ResourceExhausted as exc:  # a read-only index: no traceback, no backoff
                log.warning("expiry pass skipped: %s", exc.message)

        await self._sleep(self.interval_seconds)
        await every(one_pass, self.interval_seconds, what="expiry pass", log=log, sleep=self._sleep)

    async def expiry_pass(self) -> int:
        """With rules, measure every namespace's usage and enforce the quotas (``enforce_quotas``), then
        delete every artifact last used before now - its max age (its namespace's rule's, else
        ``KURA_MAX_AGE``; none for 0), at the bounded rate (module docstring). Returns how
        many were deleted for age. Raises ``ResourceExhausted`` (read-only index) before
        deleting anything; not safe to run twice at once."""
        started = self._clock.monotonic()
        pace = Pace(self.max_deletes_per_second, self._clock.monotonic, self._sleep)
        now_ms = self._clock.now_ms()
        usage = await self._service.enforce_quotas()
        deleted = 0
        if not self.rules:
            if self.max_age_seconds > 0:
                cutoff_ms = now_ms - int(self.max_age_seconds * 1000)
                deleted = await self._expire(cutoff_ms, None, pace, deleted)
        else:
            for namespace in sorted(usage):
                age_seconds = self.rules.max_age_seconds(namespace, self.max_age_seconds)
                if age_seconds > 0:
                    cutoff_ms = now_ms - int(age_seconds * 1000)
                    deleted = await self._expire(cutoff_ms, namespace, pace, deleted)
        oldest = await self._service._read_index(oldest_access_ms)
        now_ms = self._clock.now_ms()
        s = self.stats
        s.oldest_access_age_seconds = 0.0 if oldest is None else max(0, now_ms - oldest) / 1000
        s.passes_total += 1
        s.last_pass_seconds = self._clock.monotonic() - started
        s.last_pass_timestamp_seconds = now_ms / 1000
        if deleted:
            log.info(
                "expiry pass: %d artifacts unused for longer than their max age deleted in %.1f s",
                deleted,
                s.last_pass_seconds,
            )
        return deleted

    async def _expire(self, cutoff_ms: int, namespace: str | None, pace: Pace, deleted: int) -> int:
        """Delete what was last used before ``cutoff_ms`` (of ``namespace`` alone unless it is
        None), in paced batches; return ``deleted`` plus how many went."""
        while True:
            victims = await self._service.drop_unused(cutoff_ms, self.batch_size, namespace)
            if not victims:
                return deleted
            deleted += len(victims)
            size = sum(v.size for v in victims)
            self.stats.deleted_total += len(victims)
            self.stats.deleted_bytes_total += size
            log.debug(
                "expired %d artifacts (%d bytes) unused since %d", len(victims), size, cutoff_ms
            )
            await self._tell([ExpiredArtifact(v.artifact_id, v.size) for v in victims], cutoff_ms)
            await pace.wait(deleted)

    async def _tell(self, artifacts: list[ExpiredArtifact], cutoff_ms: int) -> None:
        for listener in self.listeners:
            try:
                await listener.expired(artifacts, cutoff_ms)
            except Exception:
                self.stats.listener_failures_total += 1
                log.exception("expiry listener %r failed; the pass goes on", listener)
