"""One expiry pass (``storage.expiry``) on a real CacheService in-process (real SQLite index and
blob dir), on virtual time: a ManualClock, and a sleep that advances it, so the pace and the
cut-off are exact. The process-level behaviour is in ``test_expiry.py``."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from kit.clock import ManualClock
from kura.storage.budget import TmpBudget
from kura.storage.expiry import ExpiredArtifact, Expiry
from kura.storage.service import ArtifactRef, CacheService


class RecordingListener:
    """A test double of the object-storage tier's hook: records what it is told."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[list[ExpiredArtifact], int]] = []
        self.fail = fail

    async def expired(self, artifacts: Sequence[ExpiredArtifact], cutoff_ms: int) -> None:
        self.calls.append((list(artifacts), cutoff_ms))
        if self.fail:
            raise RuntimeError("bucket unreachable")


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


class FloorHooks:
    """No mesh, but a bootstrap's eviction floor the test can set."""

    floor_ms: int | None = None

    def eviction_floor_ms(self) -> int | None:
        return self.floor_ms


@pytest.fixture
def hooks() -> FloorHooks:
    return FloorHooks()


@pytest.fixture
async def service(
    tmp_path: Path, clock: ManualClock, hooks: FloorHooks
) -> AsyncIterator[CacheService]:
    s = CacheService(
        data_dir=tmp_path / "data",
        tmp_dir=tmp_path / "tmp",
        tenant_id="t",
        budget=TmpBudget(1024 * 1024, tmp_dir=tmp_path / "tmp"),
        clock=clock,
        max_disk_bytes=10 * 1024 * 1024,
        min_free_disk_bytes=0,
        eviction_floor_ms=hooks.eviction_floor_ms,
    )
    await s.start()
    yield s
    await s.close()


def ref(key: str) -> ArtifactRef:
    return ArtifactRef("http", "", key)


async def _one(data: bytes) -> AsyncIterator[bytes]:
    yield data


async def put(service: CacheService, key: str, size: int = 100) -> None:
    data = key.encode().ljust(size, b".")
    await service.put_stream(
        ref(key),
        _one(data),
        declared_length=len(data),
        limit_bytes=1 << 20,
        content_type="application/octet-stream",
    )


def expiry(
    service: CacheService, clock: ManualClock, slept: list[float], **kwargs: object
) -> Expiry:
    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.advance(seconds)

    settings: dict[str, object] = {
        "max_age_seconds": 60.0,
        "interval_seconds": 30.0,
        "max_deletes_per_second": 10,
        "batch_size": 4,
        **kwargs,
    }
    return Expiry(service, clock, sleep=sleep, **settings)  # type: ignore[arg-type]


async def test_a_pass_deletes_oldest_first_in_batches_at_its_rate_and_tells_its_listeners(
    service: CacheService, clock: ManualClock
) -> None:
    keys = [f"k{i:02}" for i in range(25)]
    for key in keys:
        await put(service, key)
        clock.advance(1)
    clock.advance(60)
    await put(service, "fresh")
    listener, slept = RecordingListener(), []
    e = expiry(service, clock, slept, listeners=[listener])
    started = clock.monotonic()
    cutoff = clock.now_ms() - 60_000

    assert await e.expiry_pass() == 25

    # 25 deletions at 10/s: the pass took at least 2.5 s (virtual), in batches of 4.
    assert clock.monotonic() - started == pytest.approx(2.5)
    assert [len(batch) for batch, _ in listener.calls] == [4, 4, 4, 4, 4, 4, 1]
    told = [a.artifact_id for batch, _ in listener.calls for a in batch]
    assert told == [service.artifact_id(ref(k)) for k in keys]  # oldest use first
    assert {c for _, c in listener.calls} == {cutoff}
    assert all(a.size_bytes == 100 for batch, _ in listener.calls for a in batch)
    assert [await service.reads.exists(ref(k)) for k in keys] == [False] * 25
    assert await service.reads.exists(ref("fresh"))
    blobs = [p for p in (service.files.data_dir / "blobs").rglob("*") if p.is_file()]
    assert len(blobs) == 1  # the expired artifacts' files are gone
    assert (service.stats.artifacts, service.stats.used_bytes) == (1, 100)
    assert service.stats.evictions_total == 0
    assert (e.stats.deleted_total, e.stats.deleted_bytes_total, e.stats.passes_total) == (
        25,
        2500,
        1,
    )
    assert e.stats.last_pass_seconds == pytest.approx(2.5)
    # "fresh" was written as the pass began (ManualClock keeps whole milliseconds).
    assert e.stats.oldest_access_age_seconds == pytest.approx(2.5, abs=0.01)
    assert await e.expiry_pass() == 0  # nothing more is that old
    assert e.stats.passes_total == 2


async def test_a_read_still_buffered_in_memory_keeps_its_artifact(
    service: CacheService, clock: ManualClock
) -> None:
    await put(service, "idle")
    await put(service, "read")
    clock.advance(120)
    (await service.reads.read(ref("read"))).close()  # a touch in memory, not flushed to the index
    slept: list[float] = []
    assert await expiry(service, clock, slept).expiry_pass() == 1
    assert not await service.reads.exists(ref("idle"))
    assert await service.reads.exists(ref("read"))
    body = await service.reads.read(ref("read"))
    assert body.data == b"read".ljust(100, b".")


async def test_nothing_used_at_or_after_the_bootstrap_floor_expires(
    service: CacheService, clock: ManualClock, hooks: FloorHooks
) -> None:
    await put(service, "before")
    clock.advance(10)
    hooks.floor_ms = clock.now_ms()
    await put(service, "during")
    clock.advance(600)
    slept: list[float] = []
    assert await expiry(service, clock, slept).expiry_pass() == 1
    assert not await service.reads.exists(ref("before"))
    assert await service.reads.exists(ref("during"))


async def test_a_failing_listener_is_counted_and_the_pass_goes_on(
    service: CacheService, clock: ManualClock
) -> None:
    for key in ("a", "b", "c", "d", "e"):
        await put(service, key)
    clock.advance(120)
    failing, slept = RecordingListener(fail=True), []
    e = expiry(service, clock, slept, listeners=[failing], batch_size=2)
    assert await e.expiry_pass() == 5
    assert len(failing.calls) == 3
    assert e.stats.listener_failures_total == 3


async def test_with_no_max_age_the_task_returns_at_once(
    service: CacheService, clock: ManualClock
) -> None:
    slept: list[float] = []
    await expiry(service, clock, slept, max_age_seconds=0.0).run()
    assert slept == []
