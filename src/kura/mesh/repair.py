"""Repair: a quarantined (damaged) artifact is fetched again from a peer, in the background.

Storage calls ``request_threadsafe(artifact_id)`` from its writer thread whenever it quarantines
an entry (the store's ``on_quarantine`` callback). The id is queued (at most ``max_pending``; more
are dropped and counted, the next read or scrub finds them again) and ``run()`` hands each to
the read-through fetch (``ReadThrough.repair``), which verifies the peer's copy and stores it
within the tmp and disk budgets. Without peers, or when no peer has it, the artifact stays a
miss until a client writes it again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)


@dataclass
class RepairStats:
    # result ("repaired", "not_found", "error", "dropped") -> count
    results_total: dict[str, int] = field(default_factory=dict)

    def count(self, result: str) -> None:
        self.results_total[result] = self.results_total.get(result, 0) + 1


class Repairer:
    """See module docstring. Run ``run()`` in the app's TaskGroup."""

    def __init__(self, fetch: Callable[[str], Awaitable[bool]], max_pending: int = 1000) -> None:
        self._fetch = fetch
        self._max_pending = max_pending
        self._queue: asyncio.Queue[str] = asyncio.Queue()
        self._pending: set[str] = set()
        self._loop: asyncio.AbstractEventLoop | None = None
        self.stats = RepairStats()

    def bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """The loop ``request_threadsafe`` hands ids to (the node's; set at start)."""
        self._loop = loop

    def request_threadsafe(self, artifact_id: str) -> None:
        """Queue a repair; callable from any thread. Ignored before ``bind``."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._request, artifact_id)

    def _request(self, artifact_id: str) -> None:
        if artifact_id in self._pending:
            return
        if len(self._pending) >= self._max_pending:
            self.stats.count("dropped")
            return
        self._pending.add(artifact_id)
        self._queue.put_nowait(artifact_id)

    async def run(self) -> None:
        """Forever: repair queued artifacts one at a time."""
        while True:
            aid = await self._queue.get()
            try:
                ok = await self._fetch(aid)
                self.stats.count("repaired" if ok else "not_found")
                if ok:
                    log.info("repaired quarantined artifact %s from a peer", aid)
            except Exception as exc:
                self.stats.count("error")
                log.warning("repairing %s from peers failed: %s", aid, exc)
            finally:
                self._pending.discard(aid)
