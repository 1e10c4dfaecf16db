"""Eviction while a bootstrap runs (issue 11, deliverable 4), on a real CacheService in-process
(real SQLite index and blob dir; the clock is a ManualClock so "used before" is exact).

While an eviction floor is set (``CacheService``'s ``eviction_floor_ms``, the bootstrap's
floor as ``kura.app`` gives it), eviction only picks artifacts last used before it: what the
bootstrap fetched (and anything written or read since) is never evicted, while older data still
makes room for live writes. Once the floor is cleared, eviction is plain LRU again.
"""

from __future__ import annotations

from pathlib import Path

from kit.clock import ManualClock
from kura.storage.budget import TmpBudget
from kura.storage.service import ArtifactRef, CacheService

SIZE = 1000
LIMIT = 10 * SIZE


class Floor:
    """The one thing this test drives: the bootstrap's eviction floor."""

    floor_ms: int | None = None

    def eviction_floor_ms(self) -> int | None:
        return self.floor_ms


def ref(key: str) -> ArtifactRef:
    return ArtifactRef("xcode", "ns", key)


async def held(service: CacheService, keys: list[str]) -> set[str]:
    return {k for k in keys if await service.reads.exists(ref(k))}


async def test_a_live_write_during_bootstrap_evicts_only_data_older_than_the_bootstrap(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    hooks = Floor()
    service = CacheService(
        data_dir=tmp_path / "data",
        tmp_dir=tmp_path / "tmp",
        tenant_id="t",
        budget=TmpBudget(1024 * 1024, tmp_dir=tmp_path / "tmp"),
        clock=clock,
        max_disk_bytes=LIMIT,
        min_free_disk_bytes=0,
        eviction_floor_ms=hooks.eviction_floor_ms,
    )
    await service.start()
    try:
        old = [f"old{i}" for i in range(6)]
        for key in old:
            await service.put_inline(ref(key), key.encode().ljust(SIZE, b"o"), "text/plain")
            clock.advance(0.001)
        clock.advance(1)
        hooks.floor_ms = clock.now_ms()  # the bootstrap starts
        fetched = [f"boot{i}" for i in range(4)]
        for key in fetched:  # stands for what the bootstrap commits (stamped at or after it)
            await service.put_inline(ref(key), key.encode().ljust(SIZE, b"b"), "text/plain")
            clock.advance(0.001)
        assert service.stats.used_bytes == LIMIT
        assert service.stats.evictions_total == 0

        live = [f"live{i}" for i in range(3)]
        for key in live:
            await service.put_inline(ref(key), key.encode().ljust(SIZE, b"l"), "text/plain")
            clock.advance(0.001)
        # Each live write made room from the old data only (down to the 95 % low watermark).
        assert await held(service, fetched + live) == set(fetched + live)
        assert service.stats.evictions_total == len(old) - len(await held(service, old))
        assert service.stats.evictions_total >= len(live)
        assert service.stats.used_bytes <= LIMIT

        # Nothing old left to evict: a live write is still stored, the bootstrap's data kept.
        for key in old:
            if await service.reads.exists(ref(key)):
                await service.put_inline(ref(f"more-{key}"), b"m" * SIZE, "text/plain")
                clock.advance(0.001)
        extra = [f"extra{i}" for i in range(2)]
        for key in extra:
            await service.put_inline(ref(key), b"x" * SIZE, "text/plain")
            clock.advance(0.001)
        assert await held(service, old) == set()
        assert await held(service, fetched) == set(fetched)
        assert service.stats.used_bytes > LIMIT  # over the budget rather than evict bootstrap's

        hooks.floor_ms = None  # the bootstrap ended: plain LRU again
        await service.put_inline(ref("after"), b"a" * SIZE, "text/plain")
        assert service.stats.used_bytes <= LIMIT
        assert "boot0" not in await held(service, fetched)  # the least recently used went first
    finally:
        await service.close()
