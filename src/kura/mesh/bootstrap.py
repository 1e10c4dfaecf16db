"""Bootstrap: a node pulls every peer's state, within the tmp budget, and gates ``/ready`` on it.

This is the fix for the incident in shared/seeds/000_*, built right from the start
(kura-behaviour.md §0 and §5):

* **Order.** For each known peer: namespace tombstones first (so nothing they cover is ever
  resurrected), then manifests in cursor-paged artifact_id order, then artifact bodies. A first
  walk over the manifests counts what is needed (bytes and artifacts) so progress can be shown
  as a percentage; the second walk fetches. Artifacts already held at an equal or newer version
  are skipped, so a retried pass, or a restarted node, never re-downloads what it has.
* **Concurrency.** At most ``max_concurrent_peers`` passes at once, at most one per peer, and
  ``downloads_per_peer`` body downloads per pass. Two passes never download the same artifact at
  once (single flight per artifact_id).
* **Reservation before staging.** Each body reserves ``max(manifest size, declared
  Content-Length)`` from the node's one tmp budget *before* a byte is written, with the waiting
  ``reserve()`` that never fails because the budget is full. A body longer than its reservation
  is cut off and rejected. The reservation is released on every path once the artifact is
  persisted or abandoned. An artifact larger than the whole budget can never be staged: it is
  refused up front with a clear error (counted as ``too_large``) instead of waiting forever.
* **Versions from the future.** A tombstone or manifest further ahead of this node's clock than
  ``KURA_MAX_CLOCK_SKEW_MS`` is refused by the service (logged, counted), skipped here (result
  ``rejected_future``) and does not fail the pass: a peer holding one cannot stall bootstrap.
* **Failures.** One failing artifact does not stop a pass; the pass then reports itself
  incomplete and is retried with backoff. A pass that makes no progress for
  ``stall_timeout_seconds`` is abandoned and retried.
* **Readiness.** The node is ready once every known peer's pass has completed. A peer whose
  passes fail ``max_failed_passes`` times in a row stops gating readiness (upstream's stall was
  readiness that could wait forever); it is named in ``/ready``, in
  ``kura_bootstrap_peer_abandoned`` and in the log, and it is still retried in the background.
  A peer that joins later re-opens bootstrap for that peer.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from kit.clock import Clock
from kura.core.errors import KuraError
from kura.core.manifest import Manifest
from kura.core.version import ApplyOutcome, FutureVersion
from kura.mesh.client import PeerClient, PeerError
from kura.mesh.wire import PAGE_LIMIT_DEFAULT
from kura.storage.budget import TmpBudget
from kura.storage.service import CacheService

log = logging.getLogger(__name__)

TICK_SECONDS = 0.5
# Artifact results that finish an artifact for good (the rest are retried by the next pass).
DONE_RESULTS = frozenset(
    {"applied", "ignored_stale", "ignored_tombstone", "gone", "rejected_future"}
)
RETRY_START_SECONDS = 1.0
RETRY_MAX_SECONDS = 60.0


class PeerPhase(enum.Enum):
    PENDING = "pending"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"


@dataclass
class PeerProgress:
    """One peer's bootstrap state (read by /ready, /status and metrics)."""

    peer: str
    phase: PeerPhase = PeerPhase.PENDING
    passes: int = 0
    failed_passes_in_a_row: int = 0
    abandoned: bool = False  # stopped gating readiness after too many failed passes
    next_attempt_at: float = 0.0
    bytes_total: int = 0
    bytes_done: int = 0
    artifacts_total: int = 0
    artifacts_done: int = 0
    last_error: str = ""
    results_total: dict[str, int] = field(default_factory=dict)

    def count(self, result: str) -> None:
        self.results_total[result] = self.results_total.get(result, 0) + 1

    @property
    def gates_readiness(self) -> bool:
        return self.phase is not PeerPhase.DONE and not self.abandoned


class PassIncomplete(Exception):
    """A pass applied what it could but some artifacts failed; it will be retried."""


class Bootstrapper:
    """Runs bootstrap passes against every known peer. Event-loop confined."""

    def __init__(
        self,
        *,
        service: CacheService,
        client: PeerClient,
        budget: TmpBudget,
        clock: Clock,
        peers: Callable[[], list[str]],
        max_concurrent_peers: int,
        downloads_per_peer: int,
        max_failed_passes: int,
        stall_timeout_seconds: float,
    ) -> None:
        self._service = service
        self._client = client
        self._budget = budget
        self._clock = clock
        self._peers = peers
        self._semaphore = asyncio.Semaphore(max_concurrent_peers)
        self._downloads_per_peer = downloads_per_peer
        self._max_failed_passes = max_failed_passes
        self._stall_timeout = stall_timeout_seconds
        self.progress: dict[str, PeerProgress] = {}
        self._running: dict[str, asyncio.Task[None]] = {}
        self._inflight: dict[str, asyncio.Future[None]] = {}

    # -- views ---------------------------------------------------------------------------------

    def reasons(self) -> list[str]:
        """Why bootstrap keeps the node from being ready (empty: it does not)."""
        known = [self._progress(p) for p in self._peers()]
        gating = [p for p in known if p.gates_readiness]
        if not gating:
            return []
        done = sum(1 for p in known if p.phase is PeerPhase.DONE)
        total_bytes = sum(p.bytes_total for p in known)
        done_bytes = sum(min(p.bytes_done, p.bytes_total) for p in known)
        pct = 100 if total_bytes == 0 else int(100 * done_bytes / total_bytes)
        return [
            f"bootstrap in progress: {done} of {len(known)} peers, {pct}% of bytes "
            f"({done_bytes} of {total_bytes})"
        ]

    def warnings(self) -> list[str]:
        return [
            f"bootstrap from {p.peer} abandoned after {p.failed_passes_in_a_row} failed passes "
            f"(still retrying): {p.last_error}"
            for p in self.progress.values()
            if p.abandoned and p.phase is not PeerPhase.DONE
        ]

    def summary(self) -> dict[str, int]:
        known = [self._progress(p) for p in self._peers()]
        return {
            "peers_total": len(known),
            "peers_done": sum(1 for p in known if p.phase is PeerPhase.DONE),
            "bytes_total": sum(p.bytes_total for p in known),
            "bytes_done": sum(min(p.bytes_done, p.bytes_total) for p in known),
            "artifacts_total": sum(p.artifacts_total for p in known),
            "artifacts_done": sum(p.artifacts_done for p in known),
        }

    def _progress(self, peer: str) -> PeerProgress:
        state = self.progress.get(peer)
        if state is None:
            state = self.progress[peer] = PeerProgress(peer)
        return state

    def peer_joined(self, peer: str) -> None:
        """A peer (re)joined the mesh: bootstrap from it (again)."""
        state = self._progress(peer)
        if state.phase is PeerPhase.DONE:
            state.phase = PeerPhase.PENDING
            state.next_attempt_at = 0.0

    # -- loop ----------------------------------------------------------------------------------

    async def run(self) -> None:
        """Forever: start a pass for every known peer that needs one and is due."""
        try:
            while True:
                now = self._clock.monotonic()
                for peer in self._peers():
                    state = self._progress(peer)
                    task = self._running.get(peer)
                    if task is not None and not task.done():
                        continue
                    if state.phase is PeerPhase.DONE or state.next_attempt_at > now:
                        continue
                    self._running[peer] = asyncio.create_task(
                        self._guarded_pass(state), name=f"bootstrap {peer}"
                    )
                await asyncio.sleep(TICK_SECONDS)
        finally:
            for task in self._running.values():
                task.cancel()
            for task in self._running.values():
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _guarded_pass(self, state: PeerProgress) -> None:
        async with self._semaphore:
            state.phase = PeerPhase.RUNNING
            state.passes += 1
            try:
                await self._pass(state)
            except asyncio.CancelledError:
                state.phase = PeerPhase.PENDING
                raise
            except (PassIncomplete, PeerError, KuraError, TimeoutError) as exc:
                self._failed(state, str(exc) or type(exc).__name__)
                return
            except Exception as exc:  # a bug: log it loudly, count the pass failed, retry
                log.exception("bootstrap pass from %s crashed", state.peer)
                self._failed(state, f"internal error: {exc!r}")
                return
            state.phase = PeerPhase.DONE
            state.failed_passes_in_a_row = 0
            state.last_error = ""
            if state.abandoned:
                log.info("bootstrap from %s completed after being abandoned", state.peer)
            state.abandoned = False
            log.info(
                "bootstrap from %s complete: %d artifacts, %d bytes applied",
                state.peer,
                state.artifacts_done,
                state.bytes_done,
            )

    def _failed(self, state: PeerProgress, error: str) -> None:
        state.phase = PeerPhase.FAILED
        state.failed_passes_in_a_row += 1
        state.last_error = error
        backoff = min(
            RETRY_START_SECONDS * 2 ** (state.failed_passes_in_a_row - 1), RETRY_MAX_SECONDS
        )
        state.next_attempt_at = self._clock.monotonic() + backoff
        if state.failed_passes_in_a_row >= self._max_failed_passes and not state.abandoned:
            state.abandoned = True
            log.error(
                "bootstrap from %s failed %d passes in a row; it no longer gates readiness "
                "(still retrying every %.0fs): %s",
                state.peer,
                state.failed_passes_in_a_row,
                backoff,
                error,
            )
        else:
            log.warning(
                "bootstrap pass from %s incomplete (%d in a row, retry in %.0fs): %s",
                state.peer,
                state.failed_passes_in_a_row,
                backoff,
                error,
            )

    async def _pass(self, state: PeerProgress) -> None:
        watchdog = asyncio.timeout(self._stall_timeout)

        def progressed() -> None:
            watchdog.reschedule(asyncio.get_running_loop().time() + self._stall_timeout)

        async with watchdog:
            await self._apply_tombstones(state.peer, progressed)
            await self._count_needed(state, progressed)
            failures = await self._fetch_all(state, progressed)
        if failures:
            raise PassIncomplete(f"{len(failures)} artifacts failed, e.g. {failures[0]}")

    async def _apply_tombstones(self, peer: str, progressed: Callable[[], None]) -> None:
        after: str | None = None  # the first page
        while True:
            page, next_after = await self._client.tombstones_page(peer, after, PAGE_LIMIT_DEFAULT)
            for namespace_id, version_ms in page:
                try:
                    await self._service.delete_namespace(
                        namespace_id, version_ms, source="bootstrap"
                    )
                except FutureVersion:
                    continue  # logged and counted by the service; the pass goes on
            progressed()
            if next_after is None:
                return
            after = next_after

    async def _count_needed(self, state: PeerProgress, progressed: Callable[[], None]) -> None:
        bytes_total = artifacts_total = 0
        async for manifest in self._manifests(state.peer, progressed):
            if await self._service.apply_outcome_for(manifest) is ApplyOutcome.APPLIED:
                bytes_total += manifest.size
                artifacts_total += 1
        state.bytes_total, state.artifacts_total = bytes_total, artifacts_total
        state.bytes_done = state.artifacts_done = 0

    async def _manifests(
        self, peer: str, progressed: Callable[[], None]
    ) -> AsyncIterator[Manifest]:
        after: str | None = None  # the first page
        while True:
            page, next_after = await self._client.manifests_page(peer, after, PAGE_LIMIT_DEFAULT)
            progressed()
            for manifest in page:
                yield manifest
            if next_after is None:
                return
            after = next_after

    async def _fetch_all(self, state: PeerProgress, progressed: Callable[[], None]) -> list[str]:
        failures: list[str] = []
        downloads = asyncio.Semaphore(self._downloads_per_peer)
        tasks: set[asyncio.Task[None]] = set()

        async def one(manifest: Manifest) -> None:
            try:
                result = await self._fetch_one(state.peer, manifest)
            except (PeerError, KuraError, TimeoutError, OSError) as exc:
                state.count("error")
                failures.append(f"{manifest.artifact_id}: {exc}")
                log.info(
                    "bootstrap of %s from %s failed: %s", manifest.artifact_id, state.peer, exc
                )
            else:
                state.count(result)
                if result in DONE_RESULTS:
                    state.bytes_done += manifest.size
                    state.artifacts_done += 1
                progressed()
            finally:
                downloads.release()

        try:
            async for manifest in self._manifests(state.peer, progressed):
                await downloads.acquire()
                task = asyncio.create_task(one(manifest))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
            while tasks:
                await asyncio.gather(*tasks)
        finally:
            for task in list(tasks):
                task.cancel()
            for task in list(tasks):
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        return failures

    async def fetch_artifact(self, peer: str, manifest: Manifest) -> str:
        """Fetch and apply one of ``peer``'s artifacts through the bootstrap download path
        (single flight, tmp-budget reservation, last writer wins); returns the outcome label
        (``DONE_RESULTS``, ``too_large``). Raises like a download (``PeerError``,
        ``KuraError``, ``TimeoutError``, ``OSError``). Used by ``mesh.anti_entropy``."""
        return await self._fetch_one(peer, manifest)

    async def _fetch_one(self, peer: str, manifest: Manifest) -> str:
        """Fetch and apply one artifact; returns the outcome label."""
        aid = manifest.artifact_id
        while (pending := self._inflight.get(aid)) is not None:
            await asyncio.wait({pending})  # another pass is fetching it: wait, then re-check
        # Claim it before any await, so no other pass can start the same download.
        done: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._inflight[aid] = done
        try:
            outcome = await self._service.apply_outcome_for(manifest, source="bootstrap")
            if outcome is not ApplyOutcome.APPLIED:
                return str(outcome.value)
            if manifest.size > self._budget.capacity_bytes:
                log.error(
                    "bootstrap: artifact %s (%d bytes) is larger than the whole tmp budget "
                    "KURA_TMP_DIR_MAX_BYTES=%d; it cannot be staged on this node",
                    aid,
                    manifest.size,
                    self._budget.capacity_bytes,
                )
                return "too_large"
            return await self._download(peer, manifest)
        except FutureVersion:
            return "rejected_future"  # logged and counted by the service; never retried
        finally:
            done.set_result(None)
            if self._inflight.get(aid) is done:
                del self._inflight[aid]

    async def _download(self, peer: str, manifest: Manifest) -> str:
        # Reserve before a byte is written; waits (never fails) while the budget is full.
        with await self._budget.reserve(max(1, manifest.size)) as reservation:
            fetched = await self._client.fetch_artifact(
                peer, manifest.artifact_id, self._stall_timeout
            )
            if fetched is None:
                return "gone"  # the peer evicted or cleaned it since listing
            try:
                declared = fetched.content_length
                if declared is not None and declared > reservation.size_bytes:
                    raise KuraError(
                        f"peer declares {declared} bytes, more than the {manifest.size} bytes "
                        "of its manifest"
                    )
                if fetched.manifest.artifact_id != manifest.artifact_id:
                    raise KuraError("peer sent a different artifact than asked for")
                outcome = await self._service.apply_replica(
                    fetched.manifest,
                    fetched.chunks(),
                    declared_length=declared,
                    source="bootstrap",
                    reservation=reservation,
                )
            finally:
                await fetched.close()
        return str(outcome.value)
