"""The background scrub: every stored artifact re-hashed once per period, at a bounded rate.

Reads verify what they send, but an artifact nobody reads can rot unseen until the day it is
needed, and its replicas with it. The scrub walks the index in ``artifact_id`` order (cursor
paging, one page of manifests at a time) and checks every entry, file-backed and inline, with
``ArtifactReads.verify_stored`` (size and SHA-256). A damaged entry is quarantined there,
counted under ``detected_by="scrub"``, and (with peers) fetched again.

Pace: a pass starts every ``interval_seconds`` (``KURA_SCRUB_INTERVAL_SECONDS``; the first one
``min(interval, FIRST_PASS_DELAY_SECONDS)`` after start-up, so a node that restarts daily is
still scrubbed) and hashes at most ``max_bytes_per_second`` (``KURA_SCRUB_MAX_BYTES_PER_SECOND``)
measured from the start of the pass. A pass that cannot finish inside its period logs a warning
and the next one starts when it ends. Between passes the scrub only sleeps. The hashing runs in
the scrub's own single thread, never on the event loop nor in the reader pool, so a slow scrub
of a large blob cannot delay reads.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from kit.background import background_pool
from kit.pace import seconds_ahead
from kura.storage.service import CacheService

log = logging.getLogger(__name__)

PAGE_SIZE = 100
FIRST_PASS_DELAY_SECONDS = 600.0


class ScrubStopped(Exception):
    """Raised inside the scrub thread when the scrub is shutting down."""


@dataclass
class ScrubStats:
    """Counters the metrics layer reads at scrape time."""

    scrubbed_bytes_total: int = 0
    scrubbed_artifacts_total: int = 0
    passes_total: int = 0


class _Pace:
    """Blocks the scrub thread so that bytes hashed since ``start`` stay within the rate."""

    def __init__(self, max_bytes_per_second: int, stop: threading.Event, stats: ScrubStats):
        self._rate = max_bytes_per_second
        self._stop = stop
        self._stats = stats
        self._start = time.monotonic()
        self._done = 0

    def __call__(self, n: int) -> None:
        self._done += n
        self._stats.scrubbed_bytes_total += n
        ahead = seconds_ahead(self._done, self._rate, time.monotonic() - self._start)
        if ahead > 0 and self._stop.wait(ahead):
            raise ScrubStopped
        if self._stop.is_set():
            raise ScrubStopped


class Scrubber:
    """See module docstring. Run ``run()`` in the app's TaskGroup; cancel it to stop."""

    def __init__(
        self, service: CacheService, *, interval_seconds: float, max_bytes_per_second: int
    ) -> None:
        self._service = service
        self.interval_seconds = interval_seconds
        self.max_bytes_per_second = max_bytes_per_second
        self.stats = ScrubStats()
        self._stop = threading.Event()

    async def run(self) -> None:
        """Forever: sleep until the next pass is due, run it. Returns at once when the interval
        is 0 (scrub off). A failed pass is logged and retried at the next period."""
        if self.interval_seconds <= 0:
            return
        pool = background_pool(1, "kura-scrub")  # yields the CPU to serving (kit.background)
        loop = asyncio.get_running_loop()
        try:
            due = loop.time() + min(self.interval_seconds, FIRST_PASS_DELAY_SECONDS)
            while True:
                await asyncio.sleep(max(0.0, due - loop.time()))
                started = loop.time()
                try:
                    await self.scrub_pass(pool)
                except Exception:
                    log.exception("scrub pass failed; next pass in %g s", self.interval_seconds)
                took = loop.time() - started
                if took > self.interval_seconds:
                    log.warning(
                        "a scrub pass took %.0f s, longer than KURA_SCRUB_INTERVAL_SECONDS=%g: "
                        "raise KURA_SCRUB_MAX_BYTES_PER_SECOND or the interval",
                        took,
                        self.interval_seconds,
                    )
                due = started + self.interval_seconds
        finally:
            self._stop.set()
            pool.shutdown(wait=False, cancel_futures=True)

    async def scrub_pass(self, pool: ThreadPoolExecutor) -> None:
        """Check every artifact stored when the pass reaches it, in artifact_id order."""
        pace = _Pace(self.max_bytes_per_second, self._stop, self.stats)
        after = ""
        while True:
            page = await self._service.manifests_page(after, PAGE_SIZE)
            for manifest in page:
                await self._service.reads.verify_stored(
                    manifest.artifact_id, detected_by="scrub", pace=pace, executor=pool
                )
                self.stats.scrubbed_artifacts_total += 1
            if len(page) < PAGE_SIZE:
                break
            after = page[-1].artifact_id
        self.stats.passes_total += 1
        log.info(
            "scrub pass %d done: %d bytes hashed in all passes",
            self.stats.passes_total,
            self.stats.scrubbed_bytes_total,
        )
