"""Bootstrap: a node pulls every peer's state, within the tmp budget, and gates ``/ready`` on it.

This is the fix for the stall in docs/reference/kura-behaviour.md §0, built right from the start
(kura-behaviour.md §0 and §5):

* **Order.** For each known peer: namespace tombstones first (so nothing they cover is ever
  resurrected), then manifests cursor-paged newest first, then artifact bodies (small ones in
  batches: ``mesh.bootstrap_batch``). A first
  walk over the manifests counts what is needed (bytes and artifacts) so progress can be shown
  as a percentage; the second walk fetches. Artifacts already held at an equal or newer version
  are skipped, so a retried pass, or a restarted node, never re-downloads what it has.
* **Disk budget.** A pass fetches newest first, stops fetching at the first artifact that would
  take the store past its share of ``KURA_MAX_DISK_BYTES``, never evicts to make room, and keeps
  eviction off everything it fetched while bootstrap is active; it then completes, counting what
  it skipped (``mesh.bootstrap_budget`` owns these rules).
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
  incomplete and is retried with backoff: a ceiling of 1 s doubling to 60 s, each pause drawn
  from half the ceiling to all of it (``kit.backoff``, equal jitter), so the nodes that failed
  against one peer together do not all return to it at the same instant. A pass that makes no progress for
  ``stall_timeout_seconds`` is abandoned and retried.
* **Readiness.** The node is ready once every known peer's pass has completed. A peer whose
  passes fail ``max_failed_passes`` times in a row stops gating readiness (upstream's stall was
  readiness that could wait forever); it is named in ``/ready``, in
  ``kura_bootstrap_peer_abandoned`` and in the log, and it is still retried in the background.
  A peer that joins later re-opens bootstrap for that peer.
* **One pass, a start cursor.** Every pass is a ``CursorPass`` (``mesh.incremental``): against
  a peer this node holds a durable cursor for, it pulls only the peer's changes since it
  (``apply_changes``, the same download path); without one it runs the full walk above, then
  pulls the feed from the head it read first. Readiness is gated the same way in both modes.
  Why the full walk is not a pull of the feed from 0: ``docs/architecture.md``.
  Once a peer's pass is done, a background pass every ``poll_interval_seconds``
  (``KURA_CHANGES_POLL_INTERVAL``) moves the cursor past what arrived through the outbox
  meanwhile, so a restart pulls what changed since the last poll, not since the last restart.
  A background pass never gates readiness; one that fails is retried at the next interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

from kit.backoff import Backoff
from kit.clock import Clock
from kura.core.errors import KuraError
from kura.core.manifest import Manifest
from kura.core.version import ApplyOutcome, FutureVersion
from kura.mesh.bootstrap_batch import BatchFetcher
from kura.mesh.bootstrap_budget import (
    SKIPPED_BUDGET,
    BudgetReport,
    DiskAllowance,
    EvictionGuard,
    VersionGate,
    budget_report,
    newest_pages,
)
from kura.mesh.client import PeerClient, PeerError
from kura.mesh.incremental import INCREMENTAL, CursorPass, EpochChanged
from kura.mesh.wire import PAGE_LIMIT_DEFAULT
from kura.storage.budget import TmpBudget
from kura.storage.ports import ReplicaSink

log = logging.getLogger(__name__)

TICK_SECONDS = 0.5
POLLING = float("inf")  # next_poll_at while a changes poll runs
# Artifact results that finish an artifact for good (the rest are retried by the next pass).
DONE_RESULTS = frozenset(
    {"applied", "ignored_stale", "ignored_tombstone", "gone", "rejected_future"}
)
RETRY_START_SECONDS = 1.0
RETRY_MAX_SECONDS = 60.0
RETRY_JITTER = 0.5  # each pause within [ceiling / 2, ceiling]


def _retry_backoff() -> Backoff:
    return Backoff(RETRY_START_SECONDS, RETRY_MAX_SECONDS, jitter=RETRY_JITTER)


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
    # failed passes in a row, and the monotonic deadline of the next attempt
    backoff: Backoff = field(default_factory=_retry_backoff)
    abandoned: bool = False  # stopped gating readiness after too many failed passes
    bytes_total: int = 0
    bytes_done: int = 0
    artifacts_total: int = 0
    artifacts_done: int = 0
    last_error: str = ""
    results_total: dict[str, int] = field(default_factory=dict)
    # The last pass's walk (mesh.bootstrap_budget): everything the peer listed, what did not fit
    # the disk budget, and whether the pass stopped fetching there.
    listed_artifacts: int = 0
    listed_bytes: int = 0
    applied_artifacts: int = 0
    applied_bytes: int = 0
    skipped_artifacts: int = 0
    skipped_bytes: int = 0
    budget_stopped: bool = False
    mode: str = ""  # "full" or "incremental" (mesh.incremental); "" before the first pass
    cursor_seq: int | None = None  # the durable cursor into the peer's change feed
    next_poll_at: float = 0.0  # monotonic seconds: the next background pass (once DONE)

    def count(self, result: str) -> None:
        self.results_total[result] = self.results_total.get(result, 0) + 1

    @property
    def failed_passes_in_a_row(self) -> int:
        """Passes failed since the last complete one (or the peer's return once done)."""
        return self.backoff.failures

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
        service: ReplicaSink,
        client: PeerClient,
        budget: TmpBudget,
        clock: Clock,
        peers: Callable[[], list[str]],
        max_concurrent_peers: int,
        downloads_per_peer: int,
        max_failed_passes: int,
        stall_timeout_seconds: float,
        disk_limit_bytes: int | None = None,
        rest_served_by: str = "the rest is served by read-through",
        cursors: CursorPass,
        poll_interval_seconds: float = 30.0,
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
        self._cursors = cursors
        self._poll_interval = poll_interval_seconds
        self.progress: dict[str, PeerProgress] = {}
        self._running: dict[str, asyncio.Task[None]] = {}
        self._inflight: dict[str, asyncio.Future[None]] = {}
        # The disk budget (mesh.bootstrap_budget); None: no limit.
        self.allowance = (
            None
            if disk_limit_bytes is None
            else DiskAllowance(disk_limit_bytes, lambda: service.stats.used_bytes)
        )
        self._evictions: set[asyncio.Task[None]] = set()
        # Read by storage (the store's eviction_floor_ms, given in kura.app): what eviction must keep.
        self.eviction_floor_ms: int | None = None
        self._guard = EvictionGuard(lambda ms: setattr(self, "eviction_floor_ms", ms), clock.now_ms)
        self._rest_served_by = rest_served_by
        self._gate = VersionGate(self._budget_may_bind)
        self._batches = BatchFetcher(
            service=service,
            client=client,
            budget=budget,
            inflight=self._inflight,
            timeout_seconds=stall_timeout_seconds,
        )

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
        incremental = sum(1 for p in gating if p.mode == INCREMENTAL)
        return [
            f"bootstrap in progress: {done} of {len(known)} peers, {pct}% of bytes "
            f"({done_bytes} of {total_bytes})"
            + (f"; {incremental} incremental from a cursor" if incremental else "")
        ]

    def warnings(self) -> list[str]:
        warnings = [
            f"bootstrap from {p.peer} abandoned after {p.failed_passes_in_a_row} failed passes "
            f"(still retrying): {p.last_error}"
            for p in self.progress.values()
            if p.abandoned and p.phase is not PeerPhase.DONE
        ]
        report = self.budget()
        if report.stopped:
            warnings.append(report.warning(self._rest_served_by))
        return warnings

    def budget(self) -> BudgetReport:
        """The share of the peers' data held, and whether a pass stopped at the disk budget."""
        limit = -1 if self.allowance is None else self.allowance.limit_bytes
        return budget_report([self._progress(p) for p in self._peers()], limit)

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
        """A peer (re)joined the mesh or is healthy again: pass over it again (incremental
        from the cursor when there is one)."""
        state = self._progress(peer)
        if state.phase is PeerPhase.DONE:
            state.phase = PeerPhase.PENDING
            state.backoff.reset()

    def pull_now(self, peer: str) -> bool:
        """``peer`` asks this node to pull its change feed (``mesh.catch_up``): a peer whose
        pass is done is polled at the next tick (a pending pass pulls anyway). False when
        ``peer`` is not a known peer."""
        if peer not in self._peers():
            return False
        self._progress(peer).next_poll_at = 0.0
        return True

    # -- loop ----------------------------------------------------------------------------------

    async def run(self) -> None:
        """Forever: start a pass for every known peer that needs one and is due."""
        try:
            while True:
                now = self._clock.monotonic()
                if self._active():
                    self._guard.update(True)
                else:
                    self._release_floor_if_idle()
                for peer in self._peers():
                    state = self._progress(peer)
                    task = self._running.get(peer)
                    if task is not None and not task.done():
                        continue
                    if state.phase is PeerPhase.DONE:
                        if state.next_poll_at <= now:
                            state.next_poll_at = POLLING  # until it ends (or pull_now)
                            self._running[peer] = asyncio.create_task(
                                self._background_pass(state), name=f"changes poll {peer}"
                            )
                        continue
                    if state.backoff.waiting(now):
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

    def _budget_may_bind(self) -> bool:
        """Some running pass is still counting, or what they still need exceeds the allowance."""
        if self.allowance is None:
            return False
        if self._gate.counting:
            return True
        running = [self._progress(p) for p in self._gate.peers]
        needed = sum(max(0, p.bytes_total - p.bytes_done) for p in running)
        used = self._service.stats.used_bytes + self.allowance.claimed_bytes
        return used + needed > self.allowance.limit_bytes

    def _release_floor_if_idle(self) -> None:
        """At the end of a pass: if no other pass runs, lift the eviction floor now (not at
        the next tick: writes arriving meanwhile would be spared for good) and evict what the
        floor held back, so the store is within its budget again."""
        if self._guard.floor_ms is not None and not self._active():
            self._guard.update(False)
            task = asyncio.get_running_loop().create_task(self._service.evict_to_budget())
            self._evictions.add(task)  # held until done: the loop keeps only weak references
            task.add_done_callback(self._evictions.discard)

    def _active(self) -> bool:
        """A pass runs, or a peer still gates readiness: eviction must spare bootstrap's data."""
        # A changes poll of a DONE peer is not a bootstrap: it must not hold eviction back.
        running = any(
            not t.done() and self._progress(p).phase is not PeerPhase.DONE
            for p, t in self._running.items()
        )
        return running or any(self._progress(p).gates_readiness for p in self._peers())

    async def _guarded_pass(self, state: PeerProgress) -> None:
        async with self._semaphore:
            self._guard.update(True)
            state.phase = PeerPhase.RUNNING
            state.passes += 1
            try:
                await self._pass(state)
            except asyncio.CancelledError:
                state.phase = PeerPhase.PENDING
                raise
            except (PassIncomplete, PeerError, KuraError, TimeoutError, EpochChanged) as exc:
                self._failed(state, str(exc) or type(exc).__name__)
                return
            except Exception as exc:  # a bug: log it loudly, count the pass failed, retry
                log.exception("bootstrap pass from %s crashed", state.peer)
                self._failed(state, f"internal error: {exc!r}")
                return
            state.phase = PeerPhase.DONE
            self._release_floor_if_idle()
            state.next_poll_at = self._clock.monotonic() + self._poll_interval
            state.backoff.reset()
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
            if state.budget_stopped:
                log.warning(
                    "bootstrap from %s stopped at the disk budget: %d artifacts (%d bytes) of "
                    "its %d skipped",
                    state.peer,
                    state.skipped_artifacts,
                    state.skipped_bytes,
                    state.listed_artifacts,
                )

    async def _background_pass(self, state: PeerProgress) -> None:
        """A pass over a DONE peer that does not touch its phase (nor readiness)."""
        async with self._semaphore:
            try:
                await self._pass(state, background=True)
            except (PassIncomplete, PeerError, KuraError, TimeoutError, EpochChanged) as exc:
                log.info(
                    "changes poll of %s incomplete (retried next interval): %s", state.peer, exc
                )
            except Exception:
                log.exception("changes poll of %s crashed", state.peer)
            finally:
                if state.next_poll_at == POLLING:  # else pull_now asked for another one
                    state.next_poll_at = self._clock.monotonic() + self._poll_interval

    def _failed(self, state: PeerProgress, error: str) -> None:
        state.phase = PeerPhase.FAILED
        state.last_error = error
        backoff = state.backoff.failed(self._clock.monotonic())
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

    async def _pass(self, state: PeerProgress, background: bool = False) -> None:
        watchdog = asyncio.timeout(self._stall_timeout)

        def progressed() -> None:
            watchdog.reschedule(asyncio.get_running_loop().time() + self._stall_timeout)

        self._gate.join(state.peer)
        try:
            async with watchdog:
                await self._cursors.run(
                    state, progressed, self.full_pass, self.apply_changes, background=background
                )
        finally:
            self._gate.leave(state.peer)

    async def full_pass(self, state: PeerProgress, progressed: Callable[[], None]) -> None:
        """The whole walk: tombstones, count, fetch. Raises PassIncomplete if any failed."""
        await self._apply_tombstones(state.peer, progressed)
        await self._count_needed(state, progressed)
        failures = await self._fetch_all(state, progressed)
        if failures:
            raise PassIncomplete(f"{len(failures)} artifacts failed, e.g. {failures[0]}")

    async def apply_changes(
        self,
        state: PeerProgress,
        tombstones: list[tuple[str, int]],
        manifests: list[Manifest],
        progressed: Callable[[], None],
    ) -> None:
        """One change-feed page: its tombstones first (so nothing they cover is resurrected),
        then its manifests' bodies, the full pass's way. Raises PassIncomplete if any failed."""
        await self._apply_tombstone_list(tombstones)
        outcomes = await self._service.apply_outcomes_for(manifests)
        for manifest, outcome in zip(manifests, outcomes, strict=True):
            if outcome is ApplyOutcome.APPLIED:
                state.bytes_total += manifest.size
                state.artifacts_total += 1
        failures = await self._fetch_all(state, progressed, _one_page(manifests))
        if failures:
            raise PassIncomplete(f"{len(failures)} artifacts failed, e.g. {failures[0]}")

    async def _apply_tombstone_list(self, tombstones: list[tuple[str, int]]) -> None:
        for namespace_id, version_ms in tombstones:
            try:
                await self._service.delete_namespace(namespace_id, version_ms, source="bootstrap")
            except FutureVersion:
                continue  # logged and counted by the service; the pass goes on

    async def _apply_tombstones(self, peer: str, progressed: Callable[[], None]) -> None:
        after: str | None = None  # the first page
        while True:
            page, next_after = await self._client.tombstones_page(peer, after, PAGE_LIMIT_DEFAULT)
            await self._apply_tombstone_list(page)
            progressed()
            if next_after is None:
                return
            after = next_after

    async def _count_needed(self, state: PeerProgress, progressed: Callable[[], None]) -> None:
        bytes_total = artifacts_total = listed_bytes = listed_artifacts = 0
        async for page in newest_pages(self._client, state.peer, progressed):
            outcomes = await self._service.apply_outcomes_for(page)
            for manifest, outcome in zip(page, outcomes, strict=True):
                listed_bytes += manifest.size
                listed_artifacts += 1
                if outcome is ApplyOutcome.APPLIED:
                    bytes_total += manifest.size
                    artifacts_total += 1
        state.bytes_total, state.artifacts_total = bytes_total, artifacts_total
        state.bytes_done = state.artifacts_done = 0
        state.listed_bytes, state.listed_artifacts = listed_bytes, listed_artifacts
        state.skipped_bytes = state.skipped_artifacts = 0
        state.applied_bytes = state.applied_artifacts = 0
        state.budget_stopped = False

    async def _fetch_all(
        self,
        state: PeerProgress,
        progressed: Callable[[], None],
        pages: AsyncIterator[list[Manifest]] | None = None,
    ) -> list[str]:
        """Fetch what ``pages`` list (default: the peer's whole walk, newest first) and this
        node needs, within the disk budget: small artifacts in batches
        (``mesh.bootstrap_batch``), the rest one by one, ``downloads_per_peer`` requests at a
        time. Returns the failures, described."""
        if pages is None:
            pages = newest_pages(self._client, state.peer, progressed)
        failures: list[str] = []
        downloads = asyncio.Semaphore(self._downloads_per_peer)
        tasks: set[asyncio.Task[None]] = set()

        def record(manifest: Manifest, result: str | None, error: str | None) -> None:
            if error is not None:
                state.count("error")
                failures.append(f"{manifest.artifact_id}: {error}")
                log.info(
                    "bootstrap of %s from %s failed: %s", manifest.artifact_id, state.peer, error
                )
                return
            assert result is not None
            state.count(result)
            if result == SKIPPED_BUDGET:
                state.skipped_artifacts += 1
                state.skipped_bytes += manifest.size
            elif result == "applied":
                state.applied_artifacts += 1
                state.applied_bytes += manifest.size
            if result in DONE_RESULTS:
                state.bytes_done += manifest.size
                state.artifacts_done += 1
            progressed()

        async def one(manifest: Manifest) -> None:
            try:
                result = await self._fetch_one(state, manifest)
            except (PeerError, KuraError, TimeoutError, OSError) as exc:
                record(manifest, None, str(exc))
            else:
                record(manifest, result, None)

        async def batch_of(chosen: list[Manifest], claims: list[str]) -> None:
            try:
                await self._batches.fetch(state.peer, chosen, record, one)
            finally:
                if self.allowance is not None:
                    for aid in claims:
                        self.allowance.release(aid)

        async def spawn(work: Awaitable[None]) -> None:
            await downloads.acquire()

            async def run() -> None:
                try:
                    await work
                finally:
                    downloads.release()

            task = asyncio.create_task(run())
            tasks.add(task)
            task.add_done_callback(tasks.discard)

        batch: list[Manifest] = []
        claims: list[str] = []
        try:
            async for page in pages:
                outcomes = await self._service.apply_outcomes_for(page)
                for manifest, outcome in zip(page, outcomes, strict=True):
                    if state.budget_stopped:
                        self._gate.leave(state.peer)  # admits no more: it only counts the rest
                    else:
                        await self._gate.turn(state.peer, manifest, progressed)
                    if outcome is not ApplyOutcome.APPLIED:
                        record(manifest, str(outcome.value), None)
                    elif not self._batches.batchable(state.peer, manifest):
                        await spawn(one(manifest))
                    elif state.budget_stopped:
                        record(manifest, SKIPPED_BUDGET, None)
                    else:
                        aid = manifest.artifact_id
                        claim = (
                            True
                            if self.allowance is None
                            else self.allowance.claim(aid, manifest.size)
                        )
                        if claim is False:
                            state.budget_stopped = True
                            record(manifest, SKIPPED_BUDGET, None)
                            continue
                        if claim and self.allowance is not None:
                            claims.append(aid)
                        batch.append(manifest)
                        if self._batches.full(batch):
                            await spawn(batch_of(batch, claims))
                            batch, claims = [], []
            if batch:
                await spawn(batch_of(batch, claims))
            self._gate.leave(state.peer)  # listed everything: it no longer holds others back
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
        return await self._fetch_one(self._progress(peer), manifest)

    async def _fetch_one(self, state: PeerProgress, manifest: Manifest) -> str:
        """Fetch and apply one artifact within the disk budget; returns the outcome label."""
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
            if state.budget_stopped:
                return SKIPPED_BUDGET  # the pass stopped fetching; it only counts the rest
            claim = True if self.allowance is None else self.allowance.claim(aid, manifest.size)
            if claim is False:
                state.budget_stopped = True
                return SKIPPED_BUDGET
            try:
                return await self._download(state.peer, manifest)
            finally:
                if claim and self.allowance is not None:
                    self.allowance.release(aid)
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
                    via=peer,
                )
            finally:
                await fetched.close()
        return str(outcome.value)


async def _one_page(manifests: list[Manifest]) -> AsyncIterator[list[Manifest]]:
    yield manifests
