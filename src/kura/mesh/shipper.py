"""The outbox shipper: delivers each peer's queued messages, deleting one only when the peer
acknowledged it (2xx).

One worker per peer, so a slow or dead peer never holds up the others (field report B34). A
worker wakes on every local write and every ``RETRY_SECONDS``; it takes the peer's oldest
messages in batches and delivers up to ``PIPELINE`` of them at once. After a failure the peer
backs off with a ceiling of 2 s doubling to ``backoff_max_seconds`` (kura-behaviour.md §3), each
pause drawn from half the ceiling to all of it (``kit.backoff``, equal jitter), so the nodes
that lost one peer together do not all retry it at the same instant; a success, or the
membership seeing the peer healthy again, resets the backoff.

An upsert ships the artifact as it is stored *now* (its current version); if it is gone (evicted
or cleaned) the message counts as delivered. Out-of-order delivery is safe: receivers apply
last-writer-wins.

A copy the peer refuses for good (``refusal_reason``: 413, 507, or any other 4xx except 401,
408 and 429) is dropped from that peer's queue, logged at WARNING with peer, artifact, status
and message, and counted in ``PeerShipping.dropped_total`` (``kura_replication_dropped_total``).
Retrying it would only hold the head of the queue forever: one artifact the peer cannot take
once delayed 285 of 300 later ones past 90 s. 5xx answers and unreachable peers are retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass, field
from typing import BinaryIO

from kit.backoff import Backoff
from kit.clock import Clock
from kura.core.errors import NotFound
from kura.core.object_layout import OUTBOX_TARGET
from kura.core.versions import UNSPOKEN_WIRE_VERSION
from kura.mesh.client import PeerClient, PeerError
from kura.mesh.wire import FUTURE_VERSION
from kura.storage.outbox import DELETE_NAMESPACE, PURGE_WRITER, OutboxMessage
from kura.storage.ports import ArtifactReader, OutboxLog

log = logging.getLogger(__name__)

RETRY_SECONDS = 2.0
BACKOFF_START_SECONDS = 2.0
BACKOFF_JITTER = 0.5  # each pause within [ceiling / 2, ceiling]
BATCH = 64
PIPELINE = 4


# Statuses of a refusal worth retrying: 401 (the peer credential may be rolled out yet; the
# queue waits for it rather than losing writes), 408 Request Timeout and 429 Too Many Requests
# (RFC 9110 §15.5.9, RFC 6585 §4: transient by definition).
RETRYABLE_4XX = frozenset({401, 408, 429})
# Failed deliveries in a row before a peer is named in /ready's warnings.
WARN_AFTER_FAILURES = 3
# The closed set of drop reasons (a metric label).
_REFUSALS = {
    400: "bad_request",
    403: "forbidden",
    404: "not_found",
    409: "conflict",
    413: "payload_too_large",
    422: "unprocessable_entity",
    507: "insufficient_storage",
}


def refusal_reason(status: int | None, refusal: str | None = None) -> str | None:
    """The drop reason when a peer's ``status`` refuses a copy for good, else None (retry).

    Permanent: 413, 507 and every 4xx but ``RETRYABLE_4XX``; a 4xx without its own name is
    ``"other_4xx"``. None for success, 5xx (507 aside), 3xx and an unreached peer (``None``).
    A copy refused with ``Kura-Refusal: future_version`` is not permanent either: the peer
    applies it once its clock is within its skew limit of the version, so it stays queued
    (dropping it lost the write for good, silently; the per-peer cap bounds the backlog).
    Nor is one refused with ``Kura-Refusal: wire_version`` (a peer of a kura whose wire this
    node does not speak, whatever the status): it applies it once the versions meet again.
    """
    if refusal in (FUTURE_VERSION, UNSPOKEN_WIRE_VERSION):
        return None
    if status is None:
        return None
    if status in _REFUSALS:
        return _REFUSALS[status]
    if 400 <= status < 500 and status not in RETRYABLE_4XX:
        return "other_4xx"
    return None


@dataclass
class PeerShipping:
    """Per-peer delivery state, read by metrics and ``kura status``."""

    peer: str
    backoff: Backoff  # failures in a row and the deadline of the next attempt
    depth: int = 0
    oldest_enqueued_ms: int | None = None
    last_error: str = ""
    last_status: int | None = None  # of the last failed delivery; None: unreached
    results_total: dict[tuple[str, str], int] = field(default_factory=dict)
    # reason (refusal_reason) -> copies dropped because the peer refused them for good
    dropped_total: dict[str, int] = field(default_factory=dict)
    wake: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def failures(self) -> int:
        """Failed deliveries in a row (0 after a success or the peer's return)."""
        return self.backoff.failures

    def count(self, operation: str, result: str) -> None:
        key = (operation, result)
        self.results_total[key] = self.results_total.get(key, 0) + 1


class Shipper:
    """Runs one delivery worker per peer that has (or may get) messages."""

    def __init__(
        self,
        reader: ArtifactReader,
        replica_log: OutboxLog,
        client: PeerClient,
        clock: Clock,
        backoff_max_seconds: float,
    ) -> None:
        self._reader = reader
        self._log = replica_log
        self._client = client
        self._clock = clock
        self._backoff_max = backoff_max_seconds
        self.peers: dict[str, PeerShipping] = {}
        self._workers: dict[str, asyncio.Task[None]] = {}
        self._refresh = asyncio.Event()

    def warnings(self) -> list[str]:
        """``/ready`` warnings: one per peer that failed ``WARN_AFTER_FAILURES`` deliveries in a
        row, with the last error. A 401 names the likely cause, a peer token the peer does not
        accept (the node stays ready: it still serves, and the copies wait in its outbox)."""
        out = []
        for state in sorted(self.peers.values(), key=lambda s: s.peer):
            if state.failures < WARN_AFTER_FAILURES or not state.last_error:
                continue
            hint = ""
            if state.last_status == 401:
                hint = (
                    "; the peer refuses this node's credential: the first of KURA_INTERNAL_TOKENS "
                    "must be a token the peer lists"
                )
            out.append(
                f"replication to {state.peer} failing ({state.failures} attempts in a row"
                f"{hint}): {state.last_error}"
            )
        return out

    def wake(self) -> None:
        """A local write enqueued messages: every worker looks again now."""
        self._refresh.set()
        for state in self.peers.values():
            state.wake.set()

    def peer_healthy_again(self, node_url: str) -> None:
        """Membership saw ``node_url`` come back: retry it now instead of after its backoff."""
        state = self.peers.get(node_url)
        if state is not None:
            state.backoff.reset()
            state.wake.set()

    async def run(self) -> None:
        """Forever: keep a worker for every peer with queued messages; refresh depth gauges."""
        try:
            while True:
                await self._sync_workers()
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(RETRY_SECONDS):
                        await self._refresh.wait()
                self._refresh.clear()
        finally:
            for task in self._workers.values():
                task.cancel()
            for task in self._workers.values():
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    async def _sync_workers(self) -> None:
        depths = await self._log.outbox_depths()
        depths.pop(OUTBOX_TARGET, None)  # the object tier's queue: storage.object_tier uploads it
        for peer, (count, oldest) in depths.items():
            state = self.peers.get(peer)
            if state is None:
                backoff = Backoff(BACKOFF_START_SECONDS, self._backoff_max, jitter=BACKOFF_JITTER)
                state = self.peers[peer] = PeerShipping(peer, backoff)
            state.depth, state.oldest_enqueued_ms = count, oldest
        for peer, state in self.peers.items():
            if peer not in depths:
                state.depth, state.oldest_enqueued_ms = 0, None
            task = self._workers.get(peer)
            if task is None or task.done():
                if task is not None and not task.cancelled() and task.exception() is not None:
                    raise RuntimeError(f"shipper worker for {peer} died") from task.exception()
                self._workers[peer] = asyncio.create_task(self._worker(state), name=f"ship {peer}")

    async def _worker(self, state: PeerShipping) -> None:
        while True:
            # Clear before looking, so a write that lands while we deliver wakes us again.
            state.wake.clear()
            if not state.backoff.waiting(self._clock.monotonic()):
                batch = await self._log.outbox_batch(state.peer, BATCH)
                if batch and await self._deliver(state, batch):
                    continue  # more may be waiting
            now = self._clock.monotonic()
            wait = state.backoff.remaining(now) if state.backoff.waiting(now) else RETRY_SECONDS
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await state.wake.wait()

    async def _deliver(self, state: PeerShipping, batch: list[OutboxMessage]) -> bool:
        """Deliver a batch; ack what succeeded. False (and back off) if anything failed."""
        sem = asyncio.Semaphore(PIPELINE)
        failed: list[PeerError] = []

        async def one(msg: OutboxMessage) -> int | None:
            async with sem:
                if failed:
                    return None
                try:
                    await self._send(state, msg)
                    return msg.id
                except PeerError as exc:
                    reason = refusal_reason(exc.status, exc.refusal)
                    if reason is not None:
                        _drop(state, msg, reason, exc)
                        return msg.id  # acknowledged: deleted from the queue
                    failed.append(exc)
                    return None

        results = await asyncio.gather(*(one(m) for m in batch))
        acked = [r for r in results if r is not None]
        recorded = await self._log.outbox_ack(acked)
        state.depth = max(0, state.depth - recorded)
        if state.depth == 0:
            state.oldest_enqueued_ms = None
        if recorded < len(acked) and not failed:
            # The disk is too full to record deliveries (SQLITE_FULL): back off rather than
            # deliver the same batch again at once; the peer ignores the repeats (LWW).
            backoff = state.backoff.failed(self._clock.monotonic())
            log.warning(
                "replication to %s: %d deliveries not recorded (disk full); retry in %.0fs",
                state.peer,
                len(acked) - recorded,
                backoff,
            )
            return False
        if failed:
            backoff = state.backoff.failed(self._clock.monotonic())
            long_pauses = state.backoff.ceiling(state.failures) >= 60
            error = str(failed[0])
            if state.last_error != error or state.failures in (1, 5, 10) or long_pauses:
                # A peer that does not speak this node's wire version is loud: a rollout to
                # finish or undo, not a passing fault.
                unspoken = failed[0].refusal == UNSPOKEN_WIRE_VERSION
                log.log(
                    logging.ERROR if unspoken else logging.WARNING,
                    "replication to %s failed (%d in a row, retry in %.0fs): %s",
                    state.peer,
                    state.failures,
                    backoff,
                    error,
                )
            state.last_error, state.last_status = error, failed[0].status
            return False
        if state.failures:
            log.info("replication to %s recovered after %d failures", state.peer, state.failures)
        state.backoff.reset()
        state.last_error, state.last_status = "", None
        return True

    async def _send(self, state: PeerShipping, msg: OutboxMessage) -> None:
        if msg.kind == PURGE_WRITER:
            try:
                await self._client.push_purge(
                    msg.peer, msg.namespace_id, msg.writer, msg.version_ms
                )
            except PeerError as exc:
                state.count(PURGE_WRITER, _failure(exc))
                raise
            state.count(PURGE_WRITER, "ok")
            return
        if msg.kind == DELETE_NAMESPACE:
            try:
                await self._client.push_tombstone(msg.peer, msg.namespace_id, msg.version_ms)
            except PeerError as exc:
                state.count("delete_namespace", _failure(exc))
                raise
            state.count("delete_namespace", "ok")
            return
        try:
            # Hashed first: a damaged copy is quarantined here, not refused by every peer.
            body = await self._reader.read_by_id(msg.artifact_id, hashed=True)
        except NotFound:
            state.count("upsert_artifact", "gone")
            return  # evicted or cleaned since: nothing to ship
        payload: bytes | BinaryIO
        if body.data is not None:
            payload = body.data
        else:
            assert body.file is not None
            payload = body.file
        try:
            outcome = await self._client.push_artifact(msg.peer, body.manifest, payload)
        except PeerError as exc:
            state.count("upsert_artifact", _failure(exc))
            raise
        finally:
            body.close()
        state.count("upsert_artifact", outcome)


def _failure(exc: PeerError) -> str:
    """The result label of a failed delivery: ``dropped`` (refused for good) or ``error``."""
    return "error" if refusal_reason(exc.status, exc.refusal) is None else "dropped"


def _drop(state: PeerShipping, msg: OutboxMessage, reason: str, exc: PeerError) -> None:
    state.dropped_total[reason] = state.dropped_total.get(reason, 0) + 1
    what = {
        DELETE_NAMESPACE: f"tombstone of namespace {msg.namespace_id!r} at version {msg.version_ms}",
        PURGE_WRITER: f"purge of writer {msg.writer!r} in namespace {msg.namespace_id!r} at "
        f"version {msg.version_ms}",
    }.get(msg.kind, f"artifact {msg.artifact_id}")
    log.warning(
        "replication to %s dropped %s: the peer refused it for good with %s (%s): %s",
        state.peer,
        what,
        exc.status,
        reason,
        exc,
    )
