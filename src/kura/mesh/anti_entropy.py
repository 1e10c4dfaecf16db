"""Anti-entropy: a periodic, rate-bounded comparison with every healthy peer that repairs what
the outbox missed (a dropped queue, a refused copy, a restored backup). Issue 11, deliverable 3.

Pull model. Every ``interval_seconds`` (``KURA_ANTI_ENTROPY_INTERVAL``; 0 disables it), while
this node is ready, one *round* visits each healthy peer in turn (never one that is down):

1. ``GET /_internal/anti_entropy/digests?prefix=&depth=0``: the peer's whole-keyspace digest
   and its tombstones digest, compared with ours (``ChangeLog.range_digests``). Equal: done
   with this peer, one request of about 150 bytes whatever the dataset's size.
2. Tombstones differ: page the peer's tombstones (``/_internal/bootstrap/namespace_tombstones``)
   and apply each one newer than ours *first*, so nothing a clean covered is fetched back.
3. Artifacts differ: descend. ``depth=2`` under a mismatched range returns its 256 child
   digests; each child that differs is descended into while it holds more than
   ``LIST_MAX_ROWS`` rows on either side and is shorter than 4 hex digits, else listed
   (``/_internal/anti_entropy/range?prefix=``: manifests, paged). At 1 M keys a 4-digit range
   holds about 15 rows.
4. Each listed manifest that would replace ours (newer, or we lack it, and no tombstone of ours
   covers it: ``ReplicaSink.apply_outcome_for``) is fetched and applied through the bootstrap
   download path (``Bootstrapper.fetch_artifact``: single flight, tmp-budget reservation, last
   writer wins). A peer's copy older than ours is left alone: the peer pulls ours in its round.

**Eviction rule.** Evictions are local (LRU under ``KURA_MAX_DISK_BYTES``), so a key evicted
here and held by a peer looks like divergence. An artifact this node *lacks* is repaired only
when it fits the disk budget without evicting anything (``used + size <= max_disk_bytes``);
otherwise it is skipped and counted (``skipped_total["disk_budget"]``), and the read-through
path serves it on demand. A newer version of an artifact held here is always repaired (it
replaces a stale copy). So anti-entropy never evicts, and never fights the LRU.

**Rate bounds.** Every request of a round (digests, listings, tombstone pages, artifact
fetches) waits for a slot of ``max_requests_per_second``, and a round stops after
``max_requests_per_round`` requests (``stopped_at_cap``); what it did not reach is found again
by the next round. Ranges are visited in key order.

Metrics (``stats``) are read by ``api.anti_entropy_metrics``; ``summary()`` feeds ``/status``.
Event-loop confined.

Cost of a round: two equal nodes, one request per peer whatever the dataset's size
(docs/benchmarks.md, "Anti-entropy", 1 M keys). A few divergent keys ``d`` in distinct ranges at 1
M keys cost about ``2 + 2·d`` digest and listing requests plus one fetch each; a range of at most
``LIST_MAX_ROWS`` rows is listed at once, so a small node costs ``2 + d``. Each request's work is
bounded: at most 256 digest rows or one listing page.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from kit.backoff import every
from kit.clock import Clock
from kura.core.errors import KuraError
from kura.core.manifest import Manifest
from kura.core.version import ApplyOutcome, FutureVersion
from kura.mesh.client import PeerClient, PeerError
from kura.storage.outbox import DIGEST_DEEPEST, RangeDigests
from kura.storage.ports import ArtifactReader, ChangeLog, ReplicaSink

log = logging.getLogger(__name__)

LIST_MAX_ROWS = 64  # a mismatched range holding more rows than this is descended into
PAGE_LIMIT = 500
REQUEST_TIMEOUT_SECONDS = 10.0
REPAIR_KINDS = ("artifact", "tombstone")
SKIP_REASONS = ("disk_budget", "future_version", "error")


class RoundCapReached(Exception):
    """The round used its ``max_requests_per_round``; the next round goes on."""


@dataclass
class AntiEntropyStats:
    """Counters since start (read by metrics) and the last round's figures (``/status``)."""

    rounds_total: int = 0
    ranges_compared_total: int = 0
    ranges_mismatched_total: int = 0
    requests_total: int = 0
    bytes_total: int = 0
    repaired_total: dict[str, int] = field(default_factory=lambda: dict.fromkeys(REPAIR_KINDS, 0))
    skipped_total: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SKIP_REASONS, 0))
    last_round_seconds: float = 0.0
    last_round_at_ms: int | None = None
    last_round: dict[str, int] = field(default_factory=dict)


@dataclass
class _Round:
    """One round's request budget and pacing."""

    max_requests: int
    interval_seconds: float
    requests: int = 0
    bytes: int = 0
    mismatched: int = 0
    repaired: int = 0
    next_slot: float = 0.0


class AntiEntropy:
    """See module docstring. Run ``run()`` in the node's TaskGroup."""

    def __init__(
        self,
        *,
        service: ReplicaSink,
        reader: ArtifactReader,
        replica_log: ChangeLog,
        client: PeerClient,
        clock: Clock,
        peers: Callable[[], list[str]],
        ready: Callable[[], bool],
        fetch: Callable[[str, Manifest], Awaitable[str]],
        interval_seconds: float,
        max_requests_per_second: int,
        max_requests_per_round: int,
    ) -> None:
        self._service = service
        self._reader = reader
        self._log = replica_log
        self._client = client
        self._clock = clock
        self._peers = peers
        self._ready = ready
        self._fetch = fetch
        self.interval_seconds = interval_seconds
        self._max_rps = max_requests_per_second
        self._max_per_round = max_requests_per_round
        self.stats = AntiEntropyStats()
        self.running = False

    def summary(self) -> dict[str, Any]:
        """Progress for ``/status``."""
        s = self.stats
        return {
            "enabled": self.interval_seconds > 0,
            "interval_seconds": self.interval_seconds,
            "running": self.running,
            "rounds": s.rounds_total,
            "last_round_at_ms": s.last_round_at_ms,
            "last_round_seconds": round(s.last_round_seconds, 3),
            "last_round": dict(s.last_round),
            "repaired": dict(s.repaired_total),
            "skipped": dict(s.skipped_total),
        }

    async def run(self) -> None:
        """Forever (returns at once when disabled): wait an interval, then a round if ready.
        A round that crashes is logged and retried after a jittered, growing pause
        (``kit.backoff.every``)."""
        if self.interval_seconds <= 0:
            return
        await asyncio.sleep(self.interval_seconds)
        await every(self._round_if_ready, self.interval_seconds, what="anti-entropy round", log=log)

    async def _round_if_ready(self) -> None:
        if self._ready():
            await self.round_once()

    async def round_once(self) -> None:
        """One round over every healthy peer (see module docstring)."""
        rnd = _Round(self._max_per_round, 1.0 / self._max_rps)
        started = time.monotonic()
        self.running = True
        peers = self._peers()
        capped = 0
        try:
            for peer in peers:
                try:
                    await self._sync_peer(peer, rnd)
                except RoundCapReached:
                    capped = 1
                    log.info("anti-entropy: round stopped at %d requests", rnd.requests)
                    break
                except (PeerError, KuraError, TimeoutError) as exc:
                    log.warning("anti-entropy with %s stopped: %s", peer, exc)
        finally:
            self.running = False
            s = self.stats
            s.rounds_total += 1
            s.last_round_seconds = time.monotonic() - started
            s.last_round_at_ms = self._clock.now_ms()
            s.last_round = {
                "peers": len(peers),
                "requests": rnd.requests,
                "bytes": rnd.bytes,
                "ranges_mismatched": rnd.mismatched,
                "repaired": rnd.repaired,
                "stopped_at_cap": capped,
            }
        if rnd.repaired:
            log.info("anti-entropy round repaired %d items", rnd.repaired)

    # -- requests --------------------------------------------------------------------------

    async def _slot(self, rnd: _Round) -> None:
        if rnd.requests >= rnd.max_requests:
            raise RoundCapReached
        loop = asyncio.get_running_loop()
        wait = rnd.next_slot - loop.time()
        if wait > 0:
            await asyncio.sleep(wait)
        rnd.next_slot = max(rnd.next_slot, loop.time()) + rnd.interval_seconds
        rnd.requests += 1
        self.stats.requests_total += 1

    async def _get(self, rnd: _Round, peer: str, path: str, params: dict[str, str]) -> Any:
        await self._slot(rnd)
        data, size = await self._client.get_json_counted(
            peer + path, REQUEST_TIMEOUT_SECONDS, params
        )
        rnd.bytes += size
        self.stats.bytes_total += size
        return data

    async def _digests(
        self, rnd: _Round, peer: str, prefix: str, depth: int
    ) -> tuple[dict[str, tuple[int, str]], tuple[int, str]]:
        data = await self._get(
            rnd, peer, "/_internal/anti_entropy/digests", {"prefix": prefix, "depth": str(depth)}
        )
        try:
            ranges = {str(p): (int(n), str(h)) for p, n, h in data["ranges"]}
            count, digest = data["tombstones"]
            return ranges, (int(count), str(digest))
        except (KeyError, TypeError, ValueError) as exc:
            raise PeerError(f"{peer}: malformed digests answer: {exc!r}") from exc

    async def _local(
        self, prefix: str, depth: int
    ) -> tuple[dict[str, tuple[int, str]], RangeDigests]:
        found = await self._log.range_digests(prefix, depth)
        return {p: (n, h) for p, n, h in found.ranges}, found

    # -- comparison ------------------------------------------------------------------------

    async def _sync_peer(self, peer: str, rnd: _Round) -> None:
        theirs, their_tombstones = await self._digests(rnd, peer, "", 0)
        mine, found = await self._local("", 0)
        if their_tombstones != found.tombstones:
            await self._sync_tombstones(peer, rnd)
            mine, _ = await self._local("", 0)  # applying them may have deleted rows
        self.stats.ranges_compared_total += 1
        if theirs == mine:
            return
        self._mismatch(rnd)
        await self._descend(peer, "", rnd)

    def _mismatch(self, rnd: _Round) -> None:
        self.stats.ranges_mismatched_total += 1
        rnd.mismatched += 1

    async def _descend(self, peer: str, prefix: str, rnd: _Round) -> None:
        theirs, _ = await self._digests(rnd, peer, prefix, 2)
        mine, _ = await self._local(prefix, 2)
        for child in sorted(set(theirs) | set(mine)):
            self.stats.ranges_compared_total += 1
            their, my = theirs.get(child, (0, "")), mine.get(child, (0, ""))
            if their == my:
                continue
            self._mismatch(rnd)
            if their[0] == 0:
                continue  # only we hold rows there: the peer pulls them in its own round
            if len(child) < DIGEST_DEEPEST and max(their[0], my[0]) > LIST_MAX_ROWS:
                await self._descend(peer, child, rnd)
            else:
                await self._repair_range(peer, child, rnd)

    # -- repair ----------------------------------------------------------------------------

    async def _sync_tombstones(self, peer: str, rnd: _Round) -> None:
        mine = dict(await self._service.tombstones_page(None, 1_000_000))
        after: str | None = None
        while True:
            params = {"limit": str(PAGE_LIMIT)} | ({} if after is None else {"after": after})
            data = await self._get(rnd, peer, "/_internal/bootstrap/namespace_tombstones", params)
            try:
                page = [(str(t["namespace_id"]), int(t["version_ms"])) for t in data["tombstones"]]
                after = data.get("next_after")
            except (KeyError, TypeError, ValueError) as exc:
                raise PeerError(f"{peer}: malformed tombstones page: {exc!r}") from exc
            for namespace_id, version_ms in page:
                if version_ms <= mine.get(namespace_id, 0):
                    continue
                try:
                    await self._service.delete_namespace(
                        namespace_id, version_ms, source="anti_entropy"
                    )
                except FutureVersion:
                    self.stats.skipped_total["future_version"] += 1
                    continue
                self.stats.repaired_total["tombstone"] += 1
                rnd.repaired += 1
            if after is None:
                return

    async def _repair_range(self, peer: str, prefix: str, rnd: _Round) -> None:
        after: str | None = None
        while True:
            params = {"prefix": prefix, "limit": str(PAGE_LIMIT)}
            if after is not None:
                params["after"] = after
            data = await self._get(rnd, peer, "/_internal/anti_entropy/range", params)
            try:
                page = [Manifest.from_json(m) for m in data["manifests"]]
                after = data.get("next_after")
            except (KeyError, TypeError, ValueError) as exc:
                raise PeerError(f"{peer}: malformed range answer: {exc!r}") from exc
            for manifest in page:
                await self._repair_one(peer, manifest, rnd)
            if after is None:
                return

    async def _repair_one(self, peer: str, manifest: Manifest, rnd: _Round) -> None:
        service = self._service
        try:
            if await service.apply_outcome_for(manifest) is not ApplyOutcome.APPLIED:
                return  # ours is newer or equal, or a tombstone of ours covers it
            held = await self._reader.read_manifest(manifest.artifact_id)
            if held is None and service.stats.used_bytes + manifest.size > service.max_disk_bytes:
                self.stats.skipped_total["disk_budget"] += 1
                return  # the eviction rule: never evict to repair a missing artifact
            await self._slot(rnd)
            result = await self._fetch(peer, manifest)
        except FutureVersion:
            self.stats.skipped_total["future_version"] += 1
            return
        except (PeerError, KuraError, TimeoutError, OSError) as exc:
            self.stats.skipped_total["error"] += 1
            log.info(
                "anti-entropy: repair of %s from %s failed: %s", manifest.artifact_id, peer, exc
            )
            return
        if result == "rejected_future":
            self.stats.skipped_total["future_version"] += 1
        if result == ApplyOutcome.APPLIED.value:
            self.stats.repaired_total["artifact"] += 1
            self.stats.bytes_total += manifest.size
            rnd.bytes += manifest.size
            rnd.repaired += 1
