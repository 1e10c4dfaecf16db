"""``TierHooks``: with the object-storage tier, artifact writes go to the bucket only, cleans to
the peers and the bucket, and a miss asks the bucket before the peers (the mesh's hooks)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence

from kura.core.object_layout import OUTBOX_TARGET
from kura.storage.tier_hooks import TierHooks


class MeshDouble:
    """A test double of the mesh's hooks: records what it is asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.woken = 0
        self.touches: list[dict[str, int]] = []

    def replication_targets(self) -> Sequence[str]:
        return ("http://peer:1",)

    def artifact_targets(self) -> Sequence[str]:
        return ("http://peer:1",)

    def on_outbox_write(self) -> None:
        self.woken += 1

    async def fetch_missing(self, artifact_id: str, namespace_id: str) -> bool:
        self.asked.append(artifact_id)
        return artifact_id == "on-a-peer"

    def eviction_floor_ms(self) -> int | None:
        return 7

    def touched(self, accesses: Mapping[str, int]) -> None:
        self.touches.append(dict(accesses))

    def sent_again(self, artifact_id: str) -> None:
        self.asked.append("again " + artifact_id)


class TierDouble:
    """A test double of ObjectTier: the bucket holds ``in-bucket`` only."""

    def __init__(self) -> None:
        self.filled: list[tuple[str, str]] = []
        self.woken = 0

    async def fill(self, artifact_id: str, namespace_id: str) -> bool:
        self.filled.append((artifact_id, namespace_id))
        return artifact_id == "in-bucket"

    def wake(self) -> None:
        self.woken += 1

    def sent_again(self, artifact_id: str) -> None:
        self.filled.append(("again", artifact_id))


def test_tier_hooks_route_writes_cleans_and_misses() -> None:
    mesh, tier = MeshDouble(), TierDouble()
    hooks = TierHooks(mesh)
    assert asyncio.run(hooks.fetch_missing("in-bucket", "ns")) is False  # not connected yet
    hooks.connect(tier)  # type: ignore[arg-type]
    assert tuple(hooks.artifact_targets()) == (OUTBOX_TARGET,)
    assert tuple(hooks.replication_targets()) == ("http://peer:1", OUTBOX_TARGET)
    assert asyncio.run(hooks.fetch_missing("in-bucket", "ns")) is True
    assert asyncio.run(hooks.fetch_missing("on-a-peer", "ns")) is True
    assert asyncio.run(hooks.fetch_missing("nowhere", "")) is False
    assert tier.filled == [("in-bucket", "ns"), ("on-a-peer", "ns"), ("nowhere", "")]
    assert mesh.asked == ["in-bucket", "on-a-peer", "nowhere"]  # the first before connect
    hooks.on_outbox_write()
    assert (mesh.woken, tier.woken) == (1, 1)
    assert hooks.eviction_floor_ms() == 7
    hooks.sent_again("re-put")  # the bucket's copy is checked; the mesh hears it too
    assert tier.filled[-1] == ("again", "re-put")
    assert mesh.asked[-1] == "again re-put"


class ToucherDouble:
    """A test double of BucketToucher: records the accesses it is told."""

    def __init__(self) -> None:
        self.touches: list[dict[str, int]] = []

    def touched(self, accesses: Mapping[str, int]) -> None:
        self.touches.append(dict(accesses))


def test_tier_hooks_tell_the_toucher_and_the_mesh_about_accesses() -> None:
    mesh, tier, toucher = MeshDouble(), TierDouble(), ToucherDouble()
    hooks = TierHooks(mesh)
    hooks.touched({"a": 1})  # before connect: the mesh only
    hooks.connect(tier, toucher)  # type: ignore[arg-type]
    hooks.touched({"b": 2, "c": 3})
    assert toucher.touches == [{"b": 2, "c": 3}]
    assert mesh.touches == [{"a": 1}, {"b": 2, "c": 3}]
    hooks.connect(tier)  # type: ignore[arg-type]  # KURA_MAX_AGE off: no toucher
    hooks.touched({"d": 4})
    assert toucher.touches == [{"b": 2, "c": 3}]
