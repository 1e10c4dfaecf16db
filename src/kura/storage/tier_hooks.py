"""The storage hooks of a node with the object-storage tier (``storage.object_tier``): the
bucket first, then the mesh's own hooks (``TierHooks``)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from kura.core.object_layout import OUTBOX_TARGET
from kura.storage.artifact import StoredBody
from kura.storage.bucket_touch import BucketToucher
from kura.storage.hooks import StorageHooks
from kura.storage.object_tier import ObjectTier


class TierHooks:
    """The ``storage.hooks.StorageHooks`` of a node with the tier, around the mesh's own
    (``inner``): local artifact writes are queued for the bucket only, cleans for the peers and
    the bucket, a local miss is filled from the bucket before any peer is asked, and every
    outbox write wakes the uploader too. ``connect(tier)`` once the tier exists (it needs the
    service, which needs these hooks); until then it forwards to ``inner`` alone."""

    def __init__(self, inner: StorageHooks) -> None:
        self._inner = inner
        self._tier: ObjectTier | None = None
        self._toucher: BucketToucher | None = None

    def connect(self, tier: ObjectTier, toucher: BucketToucher | None = None) -> None:
        """``toucher``: writes the bucket's touch markers (with ``KURA_MAX_AGE`` set)."""
        self._tier = tier
        self._toucher = toucher

    def replication_targets(self) -> Sequence[str]:
        return [*self._inner.replication_targets(), OUTBOX_TARGET]

    def artifact_targets(self) -> Sequence[str]:
        return (OUTBOX_TARGET,)

    def on_outbox_write(self) -> None:
        self._inner.on_outbox_write()
        if self._tier is not None:
            self._tier.wake()

    async def fetch_missing(self, artifact_id: str, namespace_id: str) -> bool | StoredBody:
        if self._tier is not None and await self._tier.fill(artifact_id, namespace_id):
            return True
        return await self._inner.fetch_missing(artifact_id, namespace_id)

    def eviction_floor_ms(self) -> int | None:
        return self._inner.eviction_floor_ms()

    def touched(self, accesses: Mapping[str, int]) -> None:
        self._inner.touched(accesses)
        if self._toucher is not None:
            self._toucher.touched(accesses)

    def sent_again(self, artifact_id: str) -> None:
        self._inner.sent_again(artifact_id)
        if self._tier is not None:
            self._tier.sent_again(artifact_id)
