"""Read-through: a hit anywhere is a hit everywhere (beyond upstream Kura).

A node that misses locally asks its peers for the artifact: always (``KURA_READ_THROUGH=always``,
the default), only while it is not yet ready (``joining``), or never. Evictions are local, so
without it a key evicted on one node misses there and hits on its peer, and reads flip between
nodes behind one Service (issue 11, "A hit anywhere is a hit everywhere").

* The ask goes only to peers membership sees healthy (``peers()``; before the first discovery
  round, the seeds), one after the other, and the whole ask — every peer together, body
  included — is bounded by ``timeout_seconds``: a miss costs at most that much extra latency.
* The first peer that has it wins: its copy is verified (size and SHA-256 against its manifest),
  stored locally at the peer's version within the tmp budget (reserved before a byte is staged)
  and the disk budget (LRU eviction in the writer thread), and then served.
* A miss on every asked peer is remembered for ``negative_ttl_seconds`` (at most
  ``NEGATIVE_CACHE_ENTRIES`` ids, oldest forgotten first): a client probing keys that exist
  nowhere (every build's first run) costs one round of peer requests per key per TTL, not one per
  read. An error or a timeout counts as a miss there too, so a slow peer is not asked again on
  every read either. ``repair`` (a quarantined entry) ignores the negative cache.
* Concurrent misses of one artifact share one fetch.
* **Served before it is durable.** A body of at most ``IN_MEMORY_MAX_BYTES`` that storing would
  apply (``replica_outcome``: not covered by a local clean, newer than what is stored, within the
  skew gate) is read into memory, verified, and returned to be served at once (``fill`` gives a
  ``Filled`` with the body's ``data``); storing it (staging, fsync, commit) goes on in the background. The client does not wait for
  an fsync. A bootstrap's writes can keep the disk busy for hundreds of milliseconds, and this
  copy needs no durability: the peer holds the durable one, and nobody was promised it. A
  crash before the commit leaves no row, so the next read fetches the body again. At most
  ``IN_MEMORY_TOTAL_MAX_BYTES`` of such bodies are held at once; past that, and for larger
  bodies, the copy is stored first and then served from disk. ``repair`` always stores first.

The body is hashed chunk by chunk as it arrives, and its background store is created, written and
hashed on the ``kura-background`` threads (``kit.background``), never on the event loop: storing 4
MiB there held up every other request of the process (docs/benchmarks.md, "Read-through hits and
their bystanders"). A miss costs one internal request per healthy peer: on loopback with two peers,
one down, about 1.3 ms more at p50 than without read-through, nothing more for a repeat within the
negative TTL, and at most the timeout for a peer that hangs (docs/benchmarks.md, "Read-through
misses").
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

from kura.core.errors import KuraError
from kura.core.version import ApplyOutcome
from kura.mesh.client import FetchedArtifact, PeerClient, PeerError
from kura.storage.artifact import StoredBody
from kura.storage.body_count import check_sha256
from kura.storage.fill import Filled
from kura.storage.ports import ReplicaStore, one_piece
from kura.storage.small_body import buffer_small

log = logging.getLogger(__name__)

# Ids remembered as missing everywhere; past this the oldest entry is forgotten first.
NEGATIVE_CACHE_ENTRIES = 10_000
MiB = 1024 * 1024
# Bodies up to this size are served from memory while they are stored (module docstring)...
IN_MEMORY_MAX_BYTES = 4 * MiB
# ... as long as the ones being stored hold no more than this in all (bounded memory).
IN_MEMORY_TOTAL_MAX_BYTES = 16 * MiB


@dataclass
class ReadThroughStats:
    results_total: dict[str, int] = field(default_factory=dict)

    def count(self, result: str) -> None:
        self.results_total[result] = self.results_total.get(result, 0) + 1


class ReadThrough:
    """Fetches a missing artifact from peers: the ``storage.fill.FillSource`` of the reader
    ``kura.app`` composes (``FillingReader(..., read_through)``), and ``repair``'s fetch."""

    def __init__(
        self,
        service: ReplicaStore,
        client: PeerClient,
        peers: Callable[[], list[str]],
        enabled: Callable[[], bool],
        timeout_seconds: float,
        negative_ttl_seconds: float = 0.0,
        monotonic: Callable[[], float] | None = None,
    ) -> None:
        self._service = service
        self._client = client
        self._peers = peers
        self._enabled = enabled
        self._timeout = timeout_seconds
        self._negative_ttl = negative_ttl_seconds
        self._monotonic = monotonic or time.monotonic
        # artifact id -> monotonic seconds until which a miss everywhere is remembered
        self._negative: OrderedDict[str, float] = OrderedDict()
        self._inflight: dict[str, asyncio.Future[Filled | None]] = {}
        self._storing: set[asyncio.Task[None]] = set()
        self._held_bytes = 0  # of in-memory bodies still being stored
        self.stats = ReadThroughStats()

    async def fill(self, artifact_id: str, namespace_id: str) -> Filled | None:
        """The artifact fetched by this or a concurrent call: ``Filled`` with a verified body in
        memory, being stored meanwhile (module docstring), or without one once it is stored
        locally. ``namespace_id`` is not needed: peers address artifacts by id.

        None when no peer had it, and at once while read-through is off or while
        ``artifact_id`` is in the negative cache (counted as result ``negative_cached``)."""
        if not self._enabled():
            return None
        until = self._negative.get(artifact_id)
        if until is not None:
            if until > self._monotonic():
                self.stats.count("negative_cached")
                return None
            del self._negative[artifact_id]
        found = await self._single_flight(artifact_id, in_memory=True)
        if found is None and self._negative_ttl > 0:
            self._negative[artifact_id] = self._monotonic() + self._negative_ttl
            self._negative.move_to_end(artifact_id)
            while len(self._negative) > NEGATIVE_CACHE_ENTRIES:
                self._negative.popitem(last=False)
        if found is not None and found.body is not None:  # one per caller: the bytes are shared
            return Filled(StoredBody(found.body.manifest, data=found.body.data))
        return found

    async def repair(self, artifact_id: str) -> bool:
        """Like ``fill`` but whatever ``KURA_READ_THROUGH`` says, and stored before it
        returns: a quarantined (damaged) entry is fetched again from a peer that has it
        (``mesh.repair``). (Joining a concurrent ``fill`` that serves from memory, it returns
        while that copy is still being stored.)"""
        return await self._single_flight(artifact_id, in_memory=False) is not None

    async def close(self) -> None:
        """Let the copies being stored finish (a few seconds at most), then cancel the rest:
        each cleans up its staging file and reservation."""
        if self._storing:
            _, late = await asyncio.wait(set(self._storing), timeout=5)
            for task in late:
                task.cancel()
            await asyncio.gather(*late, return_exceptions=True)

    async def _single_flight(self, artifact_id: str, *, in_memory: bool) -> Filled | None:
        peers = self._peers()
        if not peers:
            return None
        pending = self._inflight.get(artifact_id)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[Filled | None] = asyncio.get_running_loop().create_future()
        self._inflight[artifact_id] = fut
        try:
            ok = await self._fetch_from_any(artifact_id, peers, in_memory)
            fut.set_result(ok)
            return ok
        except asyncio.CancelledError:
            fut.cancel()
            raise
        except BaseException as exc:
            fut.set_exception(exc)
            fut.exception()  # mark retrieved: waiters re-raise it themselves
            raise
        finally:
            del self._inflight[artifact_id]

    async def _fetch_from_any(
        self, artifact_id: str, peers: list[str], in_memory: bool
    ) -> Filled | None:
        deadline = self._monotonic() + self._timeout
        for peer in peers:
            remaining = deadline - self._monotonic()
            if remaining <= 0:
                self.stats.count("timeout")
                log.info("read-through of %s: no time left to ask %s", artifact_id, peer)
                break
            try:
                async with asyncio.timeout(remaining):
                    fetched = await self._client.fetch_artifact(
                        peer, artifact_id, remaining, read_through=True
                    )
                    if fetched is None:
                        continue
                    body = await self._from_memory(fetched) if in_memory else None
                    if body is not None:
                        self._store_later(body, peer)
                        self.stats.count("hit")
                        return Filled(body)
                    try:
                        # Wait (within the timeout) for room in the tmp budget rather than
                        # failing at once: a bootstrap may be holding it right now.
                        reservation = await self._service.budget.reserve(
                            max(1, fetched.manifest.size)
                        )
                        with reservation:
                            await self._service.apply_replica(
                                fetched.manifest,
                                fetched.chunks(),
                                declared_length=fetched.content_length,
                                source="read_through",
                                reservation=reservation,
                                via=peer,
                            )
                    finally:
                        await fetched.close()
                self.stats.count("hit")
                return Filled()
            except (PeerError, KuraError, TimeoutError) as exc:
                self.stats.count("error")
                log.info("read-through of %s from %s failed: %s", artifact_id, peer, exc)
        self.stats.count("miss")
        return None

    async def _from_memory(self, fetched: FetchedArtifact) -> StoredBody | None:
        """The body read and verified in memory, its bytes counted as held; or None (nothing
        read) when it is too large, the bound is reached, or storing it would not apply it:
        only what storing would apply is served, never a version that a local clean covers,
        an older one, or one past the skew gate (``replica_outcome``)."""
        size = fetched.manifest.size
        if size > IN_MEMORY_MAX_BYTES or self._held_bytes + size > IN_MEMORY_TOTAL_MAX_BYTES:
            return None
        self._held_bytes += size  # counted before any wait: concurrent fetches see it
        try:
            outcome = await self._service.replica_outcome(fetched.manifest, "read_through")
            if outcome is ApplyOutcome.APPLIED:
                return await self._read_verified(fetched)
        except BaseException:
            self._held_bytes -= size
            raise
        self._held_bytes -= size
        return None

    async def _read_verified(self, fetched: FetchedArtifact) -> StoredBody:
        """The whole body, checked against its manifest by the checks a small upload gets
        (``storage.small_body``: ``InvalidRequest``, ``IncompleteBody``; ``DigestMismatch``).
        Hashed chunk by chunk as it arrives, so the loop never blocks on hashing 4 MiB at once
        and the check costs no time after the last byte."""
        manifest = fetched.manifest
        digest = hashlib.sha256()
        try:
            data = await buffer_small(
                _hashed(fetched.chunks(), digest),
                manifest.size,
                # Past the limit: a byte more than the manifest says is "longer than
                # declared" (InvalidRequest), not a route's limit (PayloadTooLarge).
                limit_bytes=manifest.size + 1,
                declared_length=manifest.size,
            )
        finally:
            await fetched.close()
        assert isinstance(data, bytes)  # a declared length never spills
        check_sha256(digest.hexdigest(), manifest.sha256)
        return StoredBody(manifest, data=data)

    def _store_later(self, body: StoredBody, peer: str) -> None:
        """Store ``body`` (from ``peer``) in the background; its bytes stay counted as held
        until then."""
        task = asyncio.create_task(self._store(body, peer), name="kura-read-through-store")
        self._storing.add(task)
        task.add_done_callback(self._storing.discard)

    async def _store(self, body: StoredBody, peer: str) -> None:
        manifest, data = body.manifest, body.data
        assert data is not None  # read whole into memory (_read_verified)
        try:
            reservation = await self._service.budget.reserve(max(1, manifest.size))
            with reservation:
                await self._service.apply_replica(
                    manifest,
                    one_piece(data),
                    declared_length=len(data),
                    source="read_through",
                    reservation=reservation,
                    background=True,
                    via=peer,
                )
        except (KuraError, OSError) as exc:
            # Served already; only this copy is lost: the next read fetches it again.
            self.stats.count("store_failed")
            log.warning(
                "read-through of %s: storing the copy failed: %s", manifest.artifact_id, exc
            )
        finally:
            self._held_bytes -= len(data)


async def _hashed(chunks: AsyncIterator[bytes], digest: hashlib._Hash) -> AsyncIterator[bytes]:
    async for chunk in chunks:
        digest.update(chunk)
        yield chunk
