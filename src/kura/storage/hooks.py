"""What storage asks of the layer above it (the mesh), given to ``CacheService`` at
construction: who local writes are shipped to, how to wake the shipper, how to fetch a local
miss (from the object-storage tier, then peers), the eviction floor while a bootstrap runs, and
which artifacts were used (for the bucket's touch markers).

Storage never imports the mesh (import-linter layers): the composition root (``kura.app``)
passes an object with these methods, which forwards to the mesh components once they
exist. ``NoHooks`` is the default: a node on its own, that ships to nobody, fetches nothing
and has no floor. Every method must be cheap and must not raise; ``replication_targets`` and
``eviction_floor_ms`` are called on the storage writer thread, the others on the event loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol

from kura.storage.artifact import StoredBody


class StorageHooks(Protocol):
    """The mesh, as storage sees it (module docstring)."""

    def replication_targets(self) -> Sequence[str]:
        """The outbox targets every local clean is enqueued for (empty: none): peer URLs, and
        with the object-storage tier ``core.object_layout.OUTBOX_TARGET`` too."""
        ...

    def artifact_targets(self) -> Sequence[str]:
        """The outbox targets every local artifact write is enqueued for: the peers, or with
        the object-storage tier the bucket only (nodes sharing it copy no bodies)."""
        ...

    def on_outbox_write(self) -> None:
        """Outbox messages were committed: wake the shipper."""
        ...

    async def fetch_missing(self, artifact_id: str, namespace_id: str) -> bool | StoredBody:
        """Try to fetch a locally missing artifact (of ``namespace_id``) from the object-storage
        tier, then from peers (read-through); True when it is stored here now, or the verified
        body in memory to serve while it is being stored (``mesh.read_through``)."""
        ...

    def eviction_floor_ms(self) -> int | None:
        """While a bootstrap runs, the wall-clock ms before which an artifact must have been
        last used for eviction to pick it (so it never evicts what the bootstrap fetched);
        None: plain LRU."""
        ...

    def touched(self, accesses: Mapping[str, int]) -> None:
        """``accesses`` ({artifact_id: access wall-clock ms}, non-empty) were just taken from
        memory to be recorded in the index; called on the event loop, must not block."""
        ...

    def sent_again(self, artifact_id: str) -> None:
        """A client sent ``artifact_id`` again and the PUT found it stored and intact here (so
        stored nothing): the object-storage tier checks its copy in the bucket and re-uploads
        a damaged one. Called on the event loop, must not block."""
        ...


class NoHooks:
    """``StorageHooks`` of a node on its own: no targets, no wake-up, no fetch, no floor."""

    def replication_targets(self) -> Sequence[str]:
        return ()

    def artifact_targets(self) -> Sequence[str]:
        return ()

    def on_outbox_write(self) -> None:
        return None

    async def fetch_missing(self, artifact_id: str, namespace_id: str) -> bool:
        return False

    def eviction_floor_ms(self) -> int | None:
        return None

    def touched(self, accesses: Mapping[str, int]) -> None:
        return None

    def sent_again(self, artifact_id: str) -> None:
        return None
