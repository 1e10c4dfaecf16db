"""Touch markers: each node records in the shared bucket which artifacts it uses.

Bucket expiry (``core.bucket_expiry``) must see every node's use, but reads touch only the
node that served them. So when ``CacheService`` records access times (its ``touched``,
on the event loop, off the request path: every few seconds and before each local expiry pass),
``touched`` queues each artifact whose marker this node has not rewritten within
``marker_refresh_ms`` (a quarter of ``KURA_MAX_AGE``), and ``run`` writes the zero-byte markers
(``core.object_layout.touch_key``) in the background:

* at most ``max_writes_per_second`` markers per second (``KURA_EXPIRY_MAX_DELETES_PER_SECOND``);
* memory is bounded: at most ``MAX_QUEUED`` artifacts wait (more are dropped and counted
  ``dropped``; their next use queues them again) and at most ``MAX_REMEMBERED`` marker times
  are kept (forgetting one only rewrites its marker sooner);
* a failed write (store down, 5xx, SlowDown) is counted ``error``, stays queued and is retried
  after the shared jittered backoff (``kit.backoff``); it is never fatal and never blocks a
  request. An artifact no longer in the local index is skipped (its namespace is unknown).

Counts by result (``ok``, ``error``, ``dropped``) are ``stats``, exported as
``kura_expiry_bucket_touches_total{result}``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sqlite3
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Mapping

from kit.backoff import Backoff
from kit.clock import Clock
from kit.pace import seconds_ahead
from kura.core.bucket_expiry import marker_refresh_ms
from kura.core.object_layout import touch_key
from kura.storage.object_store import ObjectStore, ObjectStoreError
from kura.storage.service import CacheService

log = logging.getLogger(__name__)

TOUCH_RESULTS = ("ok", "error", "dropped")
MAX_QUEUED = 10_000
MAX_REMEMBERED = 100_000
BATCH = 200  # also under SQLite's bound on ``?`` parameters in one statement
PIPELINE = 4
IDLE_POLL_SECONDS = 5.0


def namespaces_of(conn: sqlite3.Connection, artifact_ids: list[str]) -> dict[str, str]:
    """{artifact_id: namespace_id} of those in the index (absent ones are left out)."""
    if not artifact_ids:
        return {}
    marks = ",".join("?" * len(artifact_ids))
    rows = conn.execute(
        f"SELECT artifact_id, namespace_id FROM artifacts WHERE artifact_id IN ({marks})",
        artifact_ids,
    ).fetchall()
    return {str(r[0]): str(r[1]) for r in rows}


class BucketToucher:
    """See module docstring. ``touched`` from the event loop; ``run()`` in the app's TaskGroup."""

    def __init__(
        self,
        service: CacheService,
        store: ObjectStore,
        clock: Clock,
        *,
        max_age_seconds: float,
        max_writes_per_second: int,
        backoff_max_seconds: float = 30.0,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if max_writes_per_second <= 0:
            raise ValueError("max_writes_per_second must be above 0")
        self._service = service
        self._store = store
        self._clock = clock
        self.refresh_ms = marker_refresh_ms(max_age_seconds)
        self.max_writes_per_second = max_writes_per_second
        self._sleep = sleep
        self._backoff = Backoff(0.5, backoff_max_seconds, jitter=0.5)
        self._marked: OrderedDict[str, int] = OrderedDict()  # artifact -> when we wrote its marker
        self._queued: dict[str, int] = {}  # artifact -> its latest access (ms) to record
        self._wake = asyncio.Event()
        self.stats: dict[str, int] = dict.fromkeys(TOUCH_RESULTS, 0)

    def pending(self) -> int:
        """Artifacts waiting for their marker."""
        return len(self._queued)

    def touched(self, accesses: Mapping[str, int]) -> None:
        """``accesses`` ({artifact_id: access ms}) were recorded on this node: queue those whose
        marker is older than the refresh interval. Cheap, never raises, no IO."""
        for artifact_id, access_ms in accesses.items():
            written_ms = self._marked.get(artifact_id)
            if written_ms is not None and access_ms - written_ms < self.refresh_ms:
                continue
            if artifact_id not in self._queued and len(self._queued) >= MAX_QUEUED:
                self.stats["dropped"] += 1
                continue
            self._queued[artifact_id] = access_ms
        if self._queued:
            self._wake.set()

    async def run(self) -> None:
        """Forever: write queued markers at the bounded rate, backing off after a failure."""
        while True:
            if not self._queued:
                self._wake.clear()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(IDLE_POLL_SECONDS):
                        await self._wake.wait()
                continue
            try:
                complete = await self.write_once()
            except Exception:  # an index problem: keep the queue, try again later
                log.exception("touch markers: a pass failed; retrying with backoff")
                complete = False
            if complete:
                self._backoff.reset()
            else:
                await self._backoff.sleep(self._sleep)

    async def write_once(self) -> bool:
        """Write up to ``BATCH`` queued markers, paced; True when none failed."""
        started = self._clock.monotonic()
        batch = list(self._queued)[:BATCH]
        namespaces = await self._service._read_index(namespaces_of, batch)
        sem = asyncio.Semaphore(PIPELINE)
        failures = 0
        tenant = self._service.tenant_id

        async def write(artifact_id: str) -> None:
            nonlocal failures
            namespace_id = namespaces.get(artifact_id)
            if namespace_id is None:
                self._queued.pop(artifact_id, None)
                return
            async with sem:
                try:
                    await self._store.put_marker(touch_key(tenant, namespace_id, artifact_id))
                except ObjectStoreError as exc:
                    failures += 1
                    self.stats["error"] += 1
                    log.warning("touch marker of %s not written: %s", artifact_id, exc.message)
                    return
            self.stats["ok"] += 1
            self._queued.pop(artifact_id, None)
            self._remember(artifact_id, self._clock.now_ms())

        await asyncio.gather(*(write(a) for a in batch))
        ahead = seconds_ahead(
            len(batch), self.max_writes_per_second, self._clock.monotonic() - started
        )
        if ahead > 0:
            await self._sleep(ahead)
        return failures == 0

    def _remember(self, artifact_id: str, written_ms: int) -> None:
        self._marked[artifact_id] = written_ms
        self._marked.move_to_end(artifact_id)
        while len(self._marked) > MAX_REMEMBERED:
            self._marked.popitem(last=False)
