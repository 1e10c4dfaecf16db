"""One bucket expiry pass and the touch-marker writer, in-process, against a real SeaweedFS.

A real ``CacheService`` (SQLite index, blob dir) and kura's own ``ObjectStore`` client; time is
virtual for the deciding node: a ``ManualClock`` a day ahead of the store (so every object in
the bucket is past the age), and a sleep that advances it, so the pace is exact.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kit.clock import ManualClock
from kit.wait import wait_until_async
from kura.core.namespace_rule import NamespaceRules
from kura.core.object_layout import object_key, touch_key
from kura.settings_rules import parse_namespace_rules
from kura.storage.bucket_expiry import BucketExpiry, bucket_aging
from kura.storage.bucket_touch import BucketToucher
from kura.storage.budget import TmpBudget
from kura.storage.object_store import ObjectStore, ObjectStoreConfig, ObjectStoreError
from kura.storage.service import ArtifactRef, CacheService
from kura_harness.launch.seaweedfs import SeaweedFS
from tests.objectstore.faultproxy import FaultProxy
from tests.objectstore.test_client import manifest_of

DAY_MS = 86_400_000


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(now_ms=int(time.time() * 1000) + DAY_MS)


@pytest.fixture
async def service(tmp_path: Path, clock: ManualClock) -> AsyncIterator[CacheService]:
    s = CacheService(
        data_dir=tmp_path / "data",
        tmp_dir=tmp_path / "tmp",
        tenant_id="t",
        budget=TmpBudget(1024 * 1024, tmp_dir=tmp_path / "tmp"),
        clock=clock,
        max_disk_bytes=10 * 1024 * 1024,
        min_free_disk_bytes=0,
        bucket=True,  # a node with the tier but no uploader running: writes stay pending
    )
    await s.start()
    yield s
    await s.close()


def store_for(seaweedfs: SeaweedFS, prefix: str) -> ObjectStore:
    env = seaweedfs.env("kura", prefix)
    return ObjectStore(ObjectStoreConfig.from_env(env["KURA_OBJECT_STORE_URL"], env, 10))


async def keys(store: ObjectStore) -> set[str]:
    return {o.key async for page in store.list_prefix("t/") for o in page}


async def write_local(service: CacheService, key: str, namespace: str = "") -> str:
    async def body() -> AsyncIterator[bytes]:
        yield b"local body"

    ref = ArtifactRef("http", namespace, key)
    await service.put_stream(
        ref,
        body(),
        declared_length=10,
        limit_bytes=1 << 20,
        content_type="application/octet-stream",
    )
    return service.artifact_id(ref)


async def test_a_pass_deletes_old_objects_and_stale_markers_at_the_bounded_rate_and_keeps_pending(
    seaweedfs: SeaweedFS, service: CacheService, clock: ManualClock
) -> None:
    store = store_for(seaweedfs, "pass")
    old = [object_key("t", "n", f"old{i}") for i in range(30)]
    for key in old:
        await store.put_marker(key)  # any object: the pass reads only keys and times
    orphan = touch_key("t", "n", "gone")  # a marker whose object was cleaned
    await store.put_marker(orphan)
    pending_id = await write_local(service, "pending")  # its upload is queued here
    pending = object_key("t", "", pending_id)
    await store.put_marker(pending)  # an older version of it in the bucket
    assert await keys(store) == {*old, orphan, pending}

    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.advance(seconds)

    expiry = BucketExpiry(
        service,
        store,
        clock,
        max_age_seconds=60,
        interval_seconds=30,
        max_deletes_per_second=10,
        batch_size=4,
        sleep=sleep,
    )
    assert await expiry.expiry_pass() == 30
    assert await keys(store) == {pending}  # never the object whose upload is pending here
    assert expiry.stats.deleted_total == 30
    assert expiry.stats.markers_deleted_total == 1
    # 31 deletions at 10 per second: the pass took 3.1 s, never more than one batch ahead.
    assert sum(slept) == pytest.approx(3.1)
    assert max(slept) <= 4 / 10 + 1e-9
    # Idempotent: a second pass (or another node's) finds nothing more to delete.
    assert await expiry.expiry_pass() == 0
    assert await keys(store) == {pending}


async def test_the_toucher_writes_a_marker_once_per_refresh_interval(
    seaweedfs: SeaweedFS, service: CacheService, clock: ManualClock
) -> None:
    store = store_for(seaweedfs, "touch")
    aid = await write_local(service, "used")
    toucher = BucketToucher(service, store, clock, max_age_seconds=40, max_writes_per_second=100)
    assert toucher.refresh_ms == 10_000
    toucher.touched({aid: clock.now_ms()})
    assert toucher.pending() == 1
    assert await toucher.write_once()
    marker = touch_key("t", "", aid)
    assert await keys(store) == {marker}
    first = await store.modified_ms(marker)
    assert first is not None
    clock.advance(9)  # within the refresh interval: no second write
    toucher.touched({aid: clock.now_ms()})
    assert toucher.pending() == 0
    clock.advance(2)
    toucher.touched({aid: clock.now_ms()})
    assert toucher.pending() == 1
    assert await toucher.write_once()
    assert toucher.stats == {"ok": 2, "error": 0, "dropped": 0}
    # An artifact no longer held here is skipped, not retried forever.
    toucher.touched({"not-in-the-index": clock.now_ms()})
    assert await toucher.write_once()
    assert toucher.pending() == 0
    assert await keys(store) == {marker}


async def test_an_unreachable_store_fails_markers_and_passes_without_losing_the_queue(
    seaweedfs: SeaweedFS, fault_proxy: FaultProxy, service: CacheService, clock: ManualClock
) -> None:
    fault_proxy.set_mode("refuse")
    env = seaweedfs.env("kura", "down") | {"AWS_ENDPOINT_URL": fault_proxy.endpoint}
    store = ObjectStore(ObjectStoreConfig.from_env(env["KURA_OBJECT_STORE_URL"], env, 1))
    aid = await write_local(service, "used")
    toucher = BucketToucher(service, store, clock, max_age_seconds=40, max_writes_per_second=100)
    toucher.touched({aid: clock.now_ms()})
    assert not await toucher.write_once()
    assert toucher.stats["error"] == 1
    assert toucher.pending() == 1  # kept for the retry
    expiry = BucketExpiry(
        service,
        store,
        clock,
        max_age_seconds=40,
        interval_seconds=30,
        max_deletes_per_second=10,
        batch_size=4,
    )
    with pytest.raises(ObjectStoreError) as failed:
        await expiry.expiry_pass()
    assert failed.value.result == "unreachable"
    assert expiry.stats.deleted_total == 0
    # Once the store answers, the queued marker is written.
    fault_proxy.set_mode("pass")
    assert await toucher.write_once()
    assert toucher.pending() == 0
    assert await keys(store_for(seaweedfs, "down")) == {touch_key("t", "", aid)}


def with_rules(
    service: CacheService, store: ObjectStore, clock: ManualClock, rules: NamespaceRules
) -> tuple[BucketToucher, BucketExpiry]:
    """``bucket_aging`` with ``rules`` alone (no KURA_MAX_AGE), 30 s passes, 100 deletions/s."""
    return bucket_aging(
        service,
        store,
        clock,
        max_age_seconds=0,
        interval_seconds=30,
        max_deletes_per_second=100,
        batch_size=10,
        rules=rules,
    )


async def test_a_pass_honours_each_namespace_s_max_age(
    seaweedfs: SeaweedFS, service: CacheService, clock: ManualClock
) -> None:
    """Every object is a day old for the deciding node: ``pr-*``'s (1 h) go with their
    markers, ``main``'s (30 d) and those of a namespace with no rule (no KURA_MAX_AGE) stay.
    On main the pass had one age for the whole bucket."""
    store = store_for(seaweedfs, "rules")
    pr = [object_key("t", f"pr-{i}", f"a{i}") for i in range(3)]
    kept = [object_key("t", "main", "m0"), object_key("t", "docs", "d0")]
    for key in [*pr, *kept]:
        await store.put_marker(key)
    pr_marker = touch_key("t", "pr-0", "a0")
    await store.put_marker(pr_marker)
    rules = parse_namespace_rules("main:max_age=30d;pr-*:max_age=1h")
    toucher, expiry = with_rules(service, store, clock, rules)
    assert toucher.refresh_ms == 900_000  # a quarter of the shortest age, 1 h
    assert await expiry.expiry_pass() == 3
    assert await keys(store) == set(kept)


async def test_a_pass_deletes_an_orphan_marker_at_its_namespace_s_age(
    seaweedfs: SeaweedFS, service: CacheService, clock: ManualClock
) -> None:
    """With rules and no KURA_MAX_AGE, a marker whose object is gone goes at its namespace's
    age. Before, the recheck read the namespace off the marker key (``touch/ns-pr-0/...`` gave
    ``ch``, which has no age): the marker stayed and was counted kept on every pass."""
    store = store_for(seaweedfs, "orphan-rules")
    orphan = touch_key("t", "pr-0", "gone")
    kept = touch_key("t", "main", "gone")  # main's 30 d: a day-old orphan stays
    for key in (orphan, kept):
        await store.put_marker(key)
    _, expiry = with_rules(
        service, store, clock, parse_namespace_rules("main:max_age=30d;pr-*:max_age=1h")
    )
    assert await expiry.expiry_pass() == 0  # no object deleted: only the marker
    assert await keys(store) == {kept}
    assert expiry.stats.markers_deleted_total == 1
    assert expiry.stats.kept_total == 0


async def test_a_namespace_over_its_quota_in_the_bucket_loses_its_own_least_recently_used(
    seaweedfs: SeaweedFS, service: CacheService, clock: ManualClock
) -> None:
    """``pr-*`` may hold 3.5 objects' bytes in the bucket and ``pr-1`` holds 5: its two least
    recently used go, with their markers; ``a0`` and ``a1`` are as old but were used since
    (their markers are newer), the one whose upload is pending here is as old and stays.
    ``main`` holds more than ``pr-1`` and is within its own quota: it keeps everything. On main
    the bucket had no quota: nothing was deleted (and with no age, no pass ran at all)."""
    store = store_for(seaweedfs, "quota")
    body = b"x" * 1000

    async def put(namespace: str, artifact_id: str) -> str:
        key = object_key("t", namespace, artifact_id)
        await store.put_file(key, manifest_of(body, namespace), body)
        return key

    pending = await put("pr-1", await write_local(service, "pending", "pr-1"))
    used = [await put("pr-1", f"a{i}") for i in range(2)]  # sort before b*: taken if not used
    unused = [await put("pr-1", f"b{i}") for i in range(2)]
    main = [await put("main", f"m{i}") for i in range(6)]
    size = await store.head(pending)
    assert size is not None
    assert size > len(body)
    # The store's times are whole seconds: use a0 and a1 once its clock has moved past.
    written = await store.modified_ms(unused[-1])
    assert written is not None

    async def touched() -> bool:
        for i in range(2):
            await store.put_marker(touch_key("t", "pr-1", f"a{i}"))
        return ((await store.modified_ms(touch_key("t", "pr-1", "a1"))) or 0) > written

    assert await wait_until_async(touched, 10, interval=0.2)
    rules = parse_namespace_rules(f"pr-*:quota={size * 7 // 2};main:quota={size * 8}")
    toucher, expiry = with_rules(service, store, clock, rules)
    assert toucher.refresh_ms == 30_000  # no age: markers at the pace of the passes
    assert await expiry.expiry_pass() == 2
    markers = {touch_key("t", "pr-1", f"a{i}") for i in range(2)}
    assert await keys(store) == {pending, *used, *markers, *main}
    assert expiry.stats.evictions_total == {("pr-*", "quota"): 2}
    assert expiry.stats.evicted_bytes_total == {("pr-*", "quota"): 2 * size}
    assert await expiry.expiry_pass() == 0  # within its quota now
