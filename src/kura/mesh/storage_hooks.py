"""``MeshHooks``: the ``storage.hooks.StorageHooks`` a node gives its ``CacheService``.

The service is built before the mesh components that answer its hooks (they take the service),
so the composition root (``kura.app``) creates this adapter first, passes it to the service,
and ``connect``s it once the shipper, catch-up, read-through and bootstrap exist. Until then it
behaves like ``storage.hooks.NoHooks`` (nothing is shipped, fetched or held back), which is
also what a node whose service has not started yet needs.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence

from kura.storage.artifact import StoredBody


class MeshHooks:
    """Forwards storage's hooks to the mesh components once ``connect`` gave them."""

    def __init__(self) -> None:
        self._targets: Callable[[], Sequence[str]] = tuple
        self._wake: Callable[[], None] = lambda: None
        self._fetch: Callable[[str], Awaitable[bool | StoredBody]] | None = None
        self._floor_ms: Callable[[], int | None] = lambda: None

    def connect(
        self,
        *,
        targets: Callable[[], Sequence[str]],
        wake: Callable[[], None],
        fetch: Callable[[str], Awaitable[bool | StoredBody]] | None,
        floor_ms: Callable[[], int | None],
    ) -> None:
        """Forward to these: ``targets()`` the peers local writes are enqueued for
        (``CatchUp.targets``), ``wake()`` the shipper, ``fetch(artifact_id)`` read-through
        (None: ``KURA_READ_THROUGH=never``), ``floor_ms()`` the bootstrap's eviction floor."""
        self._targets, self._wake, self._fetch, self._floor_ms = targets, wake, fetch, floor_ms

    def replication_targets(self) -> Sequence[str]:
        return self._targets()

    def artifact_targets(self) -> Sequence[str]:
        return self._targets()

    def on_outbox_write(self) -> None:
        self._wake()

    async def fetch_missing(self, artifact_id: str, namespace_id: str) -> bool | StoredBody:
        return self._fetch is not None and await self._fetch(artifact_id)

    def eviction_floor_ms(self) -> int | None:
        return self._floor_ms()

    def touched(self, accesses: Mapping[str, int]) -> None:
        return None  # access times never replicate (storage.expiry)

    def sent_again(self, artifact_id: str) -> None:
        return None  # a peer's copy is checked by anti-entropy, not by a client's re-PUT
