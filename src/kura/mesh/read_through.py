"""Read-through while joining (beyond upstream Kura).

A node that misses locally while it is not yet ready (``KURA_READ_THROUGH=joining``, the
default) or always (``always``) asks its healthy peers for the artifact, each within
``timeout_seconds``. The first peer that has it wins: its copy is verified (size and SHA-256
against its manifest), stored locally at the peer's version, and then served — so clients see
hits during a node's first minutes instead of misses. Concurrent misses of one artifact share
one fetch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from kura.core.errors import KuraError
from kura.mesh.client import PeerClient, PeerError
from kura.storage.service import CacheService

log = logging.getLogger(__name__)


@dataclass
class ReadThroughStats:
    results_total: dict[str, int] = field(default_factory=dict)

    def count(self, result: str) -> None:
        self.results_total[result] = self.results_total.get(result, 0) + 1


class ReadThrough:
    """Fetches a missing artifact from peers. Install with ``service.on_miss = rt.fetch``."""

    def __init__(
        self,
        service: CacheService,
        client: PeerClient,
        peers: Callable[[], list[str]],
        enabled: Callable[[], bool],
        timeout_seconds: float,
    ) -> None:
        self._service = service
        self._client = client
        self._peers = peers
        self._enabled = enabled
        self._timeout = timeout_seconds
        self._inflight: dict[str, asyncio.Future[bool]] = {}
        self.stats = ReadThroughStats()

    async def fetch(self, artifact_id: str) -> bool:
        """True if the artifact is now stored locally (fetched by this or a concurrent call)."""
        if not self._enabled():
            return False
        return await self.repair(artifact_id)

    async def repair(self, artifact_id: str) -> bool:
        """Like ``fetch`` but whatever ``KURA_READ_THROUGH`` says: a quarantined (damaged)
        entry is fetched again from a peer that has it (``mesh.repair``)."""
        peers = self._peers()
        if not peers:
            return False
        pending = self._inflight.get(artifact_id)
        if pending is not None:
            return await asyncio.shield(pending)
        fut: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        self._inflight[artifact_id] = fut
        try:
            ok = await self._fetch_from_any(artifact_id, peers)
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

    async def _fetch_from_any(self, artifact_id: str, peers: list[str]) -> bool:
        for peer in peers:
            try:
                async with asyncio.timeout(self._timeout):
                    fetched = await self._client.fetch_artifact(peer, artifact_id, self._timeout)
                    if fetched is None:
                        continue
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
                            )
                    finally:
                        await fetched.close()
                self.stats.count("hit")
                return True
            except (PeerError, KuraError, TimeoutError) as exc:
                self.stats.count("error")
                log.info("read-through of %s from %s failed: %s", artifact_id, peer, exc)
        self.stats.count("miss")
        return False
