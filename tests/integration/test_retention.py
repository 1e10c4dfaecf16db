"""The retention floor (issue 28 item 7, ``storage.retention``): a blob a client was told exists
(a ``FindMissingBlobs`` answer, an action-cache hit over gRPC or HTTP: the entry, its outputs and
its output directories' Trees)
is not evicted for ``KURA_MIN_RETENTION`` while the disk budget allows. On main such a blob was
only touched in the LRU, so a build's own later uploads pushed it out and Bazel's build without
the bytes failed with "lost inputs" (``tests/grpc_api/test_bazel_retention.py`` shows it with a
real Bazel). When only promised blobs are left to make room, the budget and the new write win:
the blob goes, ``kura_retention_evictions_total`` counts it, and ``/ready`` and the status page
warn until ``retention.WARNING_SECONDS`` pass without another.

Two levels: a real node in this process over gRPC and HTTP (the surfaces), and a real
``CacheService`` on a ``ManualClock`` (the window and the warning's end, in virtual time).
"""

from __future__ import annotations

import errno
import hashlib
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from kit.clock import ManualClock
from kura.core.errors import KuraError
from kura.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as reapi,
)
from kura.storage.budget import TmpBudget
from kura.storage.retention import PROMISE_SHARE, WARNING_SECONDS
from kura.storage.service import ArtifactRef, CacheService
from tests.conftest import NodeProcess
from tests.e2e.mesh import wait_for
from tests.grpc_api.client import Reapi, digest, start_grpc_node
from tests.integration.test_workers import fresh, start_with_workers, worker_metrics
from tests.reapi import action_result, tree
from tests.unit.test_group_commit import CountingSync

pytestmark = pytest.mark.in_process

SIZE = 10 * 1024
BUDGET = 10 * SIZE
FORCED = "kura_retention_evictions_total"
SHORTFALL = "retention floor not held"


def blobs(n: int) -> list[bytes]:
    return [os.urandom(SIZE) for _ in range(n)]


def stored(c: Reapi, data: list[bytes]) -> int:
    """How many of ``data`` the node still has (FindMissingBlobs: a promise again, harmless)."""
    return len(data) - len(c.find_missing(data))


def fill_past_the_budget(c: Reapi) -> None:
    """Twice the budget of new blobs, one batch each: every older unpromised blob goes."""
    for data in blobs(2 * BUDGET // SIZE):
        assert [r.status.code for r in c.batch_update([data]).responses] == [0]


def test_blobs_clients_were_told_exist_outlive_a_build_s_own_uploads(
    start_node: Callable[..., NodeProcess],
) -> None:
    node, c = start_grpc_node(start_node, max_disk_bytes=BUDGET, inline_max_bytes=0)
    try:
        # Told over FindMissingBlobs.
        found = blobs(2)
        c.batch_update(found)
        assert c.find_missing(found) == []
        # Told by an action-cache hit over gRPC: an output file, stdout, a Tree and its file.
        out, log, inner = blobs(3)
        t = tree({"x": inner}, {})
        result = reapi.ActionResult.FromString(
            action_result({"out/a.o": out}, stdout=log, trees={"out/dir": t})
        )
        action = digest(b"retention-action")
        c.ac.UpdateActionResult(
            reapi.UpdateActionResultRequest(action_digest=action, action_result=result)
        )
        c.batch_update([out, log, inner, t])
        assert c.ac.GetActionResult(reapi.GetActionResultRequest(action_digest=action)) == result
        # Told by a hit on the HTTP /ac/ route Bazel's HTTP cache uses.
        (http_out,) = blobs(1)
        entry = action_result({"out/b.o": http_out})
        http_action = hashlib.sha256(b"http-action").hexdigest()
        with node.client() as h:
            assert h.put(f"/cache/ac/{http_action}", content=entry).status_code < 300
            c.batch_update([http_out])
            assert h.get(f"/cache/ac/{http_action}").content == entry
        # Not told: written only.
        untold = blobs(2)
        c.batch_update(untold)

        fill_past_the_budget(c)

        promised = [*found, out, log, inner, t, http_out]
        assert node.metric("kura_storage_evictions_total") >= 2 * BUDGET // SIZE - len(promised)
        assert stored(c, untold) == 0
        assert stored(c, promised) == len(promised)  # main: 0, all pushed out by the uploads
        # The entry of a hit is kept too, so the kept outputs can still be hit.
        assert c.ac.GetActionResult(reapi.GetActionResultRequest(action_digest=action)) == result
        with node.client() as h:
            assert h.get(f"/cache/ac/{http_action}").content == entry
        assert node.metric(FORCED) == 0
        assert node.metric("kura_disk_used_bytes") <= BUDGET
    finally:
        c.close()


def test_when_only_promised_blobs_are_left_the_budget_wins_counted_and_warned(
    start_node: Callable[..., NodeProcess],
) -> None:
    node, c = start_grpc_node(start_node, max_disk_bytes=BUDGET, inline_max_bytes=0)
    try:
        told = blobs(BUDGET // SIZE)
        c.batch_update(told)
        assert c.find_missing(told) == []  # the whole budget promised
        (new,) = blobs(1)
        assert [r.status.code for r in c.batch_update([new]).responses] == [0]  # the write wins
        assert c.find_missing([new]) == []
        assert node.metric("kura_disk_used_bytes") <= BUDGET  # and the budget
        forced = node.metric(FORCED)
        assert forced >= 1
        assert node.metric("kura_retention_evicted_bytes_total") == forced * SIZE
        assert stored(c, told) == len(told) - forced
        # What is promised now, for sizing the disk (main: no such gauge).
        assert 0 < node.metric("kura_retention_promised_bytes") <= BUDGET
        with node.client() as h:
            ready = h.get("/ready")
            assert ready.status_code == 200  # a warning, not a reason: the node still serves
            assert any(SHORTFALL in w for w in ready.json()["warnings"]), ready.text
            assert SHORTFALL in h.get("/ui").text
    finally:
        c.close()


def test_a_read_only_client_asking_about_everything_cannot_silently_starve_new_writes(
    start_node: Callable[..., NodeProcess],
) -> None:
    """The hostile client, scaled down: a read-only token's FindMissingBlobs over 80 % of the
    budget, then a budget of new writes, all answered OK. On main the new blobs went within
    seconds while every counter, /ready and the log stayed silent."""
    node, anonymous = start_grpc_node(
        start_node,
        max_disk_bytes=BUDGET,
        inline_max_bytes=0,
        read_write_tokens="rw",
        read_only_tokens="ro",
    )
    rw, ro = Reapi(anonymous.target, "rw"), Reapi(anonymous.target, "ro")
    try:
        told = blobs(8)
        rw.batch_update(told)
        assert ro.find_missing(told) == []
        new = blobs(BUDGET // SIZE)
        for data in new:
            assert [r.status.code for r in rw.batch_update([data]).responses] == [0]
        assert node.metric(FORCED) >= 1  # promises past 3/4 of the budget gave way; main: 0
        assert node.metric("kura_retention_displaced_evictions_total") >= 1
        promised = node.metric("kura_retention_promised_bytes")
        assert 0 < promised <= BUDGET * PROMISE_SHARE
        with node.client() as h:
            (warning,) = [w for w in h.get("/ready").json()["warnings"] if SHORTFALL in w]
        assert f"of KURA_MAX_DISK_BYTES={BUDGET} bytes" in warning
        assert stored(rw, new[-3:]) == 3  # a quarter of the budget stays for new writes
        assert node.metric("kura_disk_used_bytes") <= BUDGET
    finally:
        for c in (anonymous, rw, ro):
            c.close()


# -- the window and the warning in virtual time, on the store itself -------------------------


def ref(i: int) -> ArtifactRef:
    return ArtifactRef("bazel", "", f"cas/{i:064x}")


def store(tmp_path: Path, clock: ManualClock, min_retention_ms: int, **kw: object) -> CacheService:
    """A store of ``BUDGET`` bytes on ``clock`` (``kw``: more CacheService arguments)."""
    return CacheService(
        data_dir=tmp_path / "data",
        tmp_dir=tmp_path / "tmp",
        tenant_id="t",
        budget=TmpBudget(1024 * 1024, tmp_dir=tmp_path / "tmp"),
        clock=clock,
        max_disk_bytes=BUDGET,
        min_free_disk_bytes=0,
        min_retention_ms=min_retention_ms,
        **kw,  # type: ignore[arg-type]
    )


async def write(service: CacheService, clock: ManualClock, keys: range) -> None:
    for i in keys:
        await service.put_inline(ref(i), os.urandom(SIZE), "application/octet-stream")
        clock.advance(0.001)


async def held(service: CacheService, keys: range) -> int:
    return len(keys) - len(await service.reads.missing([ref(i) for i in keys]))


HOUR_MS = 3600 * 1000


async def test_a_promise_holds_for_the_window_then_lru_takes_it(tmp_path: Path) -> None:
    clock = ManualClock()
    service = store(tmp_path, clock, HOUR_MS)
    await service.start()
    try:
        await write(service, clock, range(3))
        assert await held(service, range(3)) == 3  # told: promised now
        await service.flush_promises()  # recorded in the index, forgotten in memory
        assert service.accesses.promised == {}
        clock.advance(HOUR_MS / 1000 - 1)
        await write(service, clock, range(100, 120))  # twice the budget
        assert await held(service, range(3)) == 3
        assert service.stats.retention_evictions_total == 0
        # Past the window the promise holds nothing back: plain LRU (they were touched last
        # by the look-up above, so it takes a budget of writes to push them out again).
        clock.advance(HOUR_MS / 1000 + 1)
        await write(service, clock, range(200, 220))
        assert await held(service, range(3)) == 0
        assert service.stats.retention_evictions_total == 0
    finally:
        await service.close()


async def test_with_the_floor_off_a_promise_is_only_an_lru_touch(tmp_path: Path) -> None:
    clock = ManualClock()
    on, off = store(tmp_path / "on", clock, HOUR_MS), store(tmp_path / "off", clock, 0)
    for service in (on, off):
        await service.start()
    try:
        for service in (on, off):
            await write(service, clock, range(3))
            assert await held(service, range(3)) == 3
            await write(service, clock, range(100, 120))
        assert (await held(on, range(3)), await held(off, range(3))) == (3, 0)
        assert off.accesses.promised == {}  # nothing kept for a floor that is off
    finally:
        for service in (on, off):
            await service.close()


async def test_the_shortfall_warning_clears_once_none_had_to_go_for_a_while(
    tmp_path: Path,
) -> None:
    clock = ManualClock()
    service = store(tmp_path, clock, HOUR_MS)
    await service.start()
    try:
        await write(service, clock, range(10))
        assert await held(service, range(10)) == 10  # the whole budget promised
        await write(service, clock, range(100, 101))
        assert service.stats.retention_evictions_total >= 1
        assert service.stats.used_bytes <= BUDGET
        assert any(SHORTFALL in w for w in service.warnings())
        clock.advance(WARNING_SECONDS - 1)
        assert any(SHORTFALL in w for w in service.warnings())
        clock.advance(1)
        assert not any(SHORTFALL in w for w in service.warnings())  # transient: no latch
        assert service.stats.retention_evictions_total >= 1  # the counter keeps the history
    finally:
        await service.close()


async def test_promises_filling_the_budget_give_way_and_crowding_out_new_blobs_is_loud(
    tmp_path: Path,
) -> None:
    """A client (a read-only token will do) asks about nearly all the budget; then new blobs
    are written. On main the promises held, the new blobs went within seconds, and nothing
    counted, warned or logged it: the cache kept nothing new for KURA_MIN_RETENTION."""
    clock = ManualClock()
    service = store(tmp_path, clock, HOUR_MS)
    await service.start()
    try:
        await write(service, clock, range(8))
        assert await held(service, range(8)) == 8  # 80 % of the budget promised
        await service.flush_promises()
        assert service.stats.retention_promised_bytes == 8 * SIZE  # the gauge
        new = range(100, 110)
        await write(service, clock, new)
        s = service.stats
        # Past PROMISE_SHARE the least recently told give way, counted as forced...
        assert s.retention_evictions_total >= 1  # main: 0
        assert s.retention_promised_bytes <= BUDGET * PROMISE_SHARE
        # ... so new writes keep their quarter of the budget (main: the last 2 of the 10)...
        assert await held(service, new[-3:]) == 3
        # ... and the young blobs the promises still push out are counted as displaced.
        assert s.retention_displaced_evictions_total >= 1
        assert s.retention_displaced_bytes_total == s.retention_displaced_evictions_total * SIZE
        (warning,) = [w for w in service.warnings() if SHORTFALL in w]
        assert f"promises held {s.retention_promised_bytes} of KURA_MAX_DISK_BYTES={BUDGET}" in (
            warning
        )
        assert s.used_bytes <= BUDGET
    finally:
        await service.close()


async def test_promises_survive_a_restart_and_hold_back_age_expiry(tmp_path: Path) -> None:
    clock = ManualClock()
    service = store(tmp_path, clock, HOUR_MS)
    await service.start()
    await write(service, clock, range(4))
    assert await held(service, range(2)) == 2
    await service.close()  # flushes the promises into the index
    service = store(tmp_path, clock, HOUR_MS)
    await service.start()
    try:
        clock.advance(60)
        # KURA_MAX_AGE's pass asks for everything unused since now: only the promised stay.
        dropped = await service.drop_unused(clock.now_ms(), 100)
        assert sorted(v[0] for v in dropped) == sorted(
            service.artifact_id(ref(i)) for i in range(2, 4)
        )
        await write(service, clock, range(100, 120))
        assert await held(service, range(2)) == 2
    finally:
        await service.close()


# -- a worker process's answers ------------------------------------------------------------

BAZEL_HIT = 'kura_cache_lookups_total{protocol="bazel",result="hit"}'


def test_a_hit_a_worker_answered_is_kept_by_the_primary(
    start_node: Callable[..., NodeProcess],
) -> None:
    """The worker sends its promises to the primary with its hits (``/hits``); before, the
    primary heard only of the access, and the outputs of a hit a worker served were evicted."""
    node = start_with_workers(start_node, "w", workers=2, max_disk_bytes=BUDGET, inline_max_bytes=0)
    for _ in range(100):  # a new entry each time, until the worker alone answered one
        (out,) = blobs(1)
        entry = action_result({"out/w.o": out})
        action = hashlib.sha256(entry).hexdigest()
        assert fresh(node, "PUT", f"/cache/cas/{digest(out).hash}", content=out).is_success
        assert fresh(node, "PUT", f"/cache/ac/{action}", content=entry).is_success
        by_worker, by_all = worker_metrics(node).get(BAZEL_HIT, 0), node.metric(BAZEL_HIT)
        assert fresh(node, "GET", f"/cache/ac/{action}").content == entry
        if (worker_metrics(node).get(BAZEL_HIT, 0), node.metric(BAZEL_HIT)) == (
            by_worker + 1,
            by_all + 1,
        ):
            break
    else:
        raise AssertionError("the worker answered none of 100 look-ups")
    assert wait_for(lambda: worker_metrics(node)["kura_worker_unreported_hits"] == 0, 20)
    for data in blobs(2 * BUDGET // SIZE):
        assert fresh(node, "PUT", f"/cache/cas/{digest(data).hash}", content=data).is_success
    assert fresh(node, "GET", f"/cache/cas/{digest(out).hash}").status_code == 200
    assert fresh(node, "GET", f"/cache/ac/{action}").content == entry
    assert node.metric("kura_storage_evictions_total") >= BUDGET // SIZE
    assert node.metric(FORCED) == 0


async def test_a_writer_that_failed_for_good_keeps_no_promises_in_memory(tmp_path: Path) -> None:
    """After a failed fsync the writer refuses every write until a restart (only that latches):
    promises could never be recorded, and kept in memory they grew with every answer. The
    flush drops them, as a read-only index's."""
    clock = ManualClock()
    service = store(tmp_path, clock, HOUR_MS)
    await service.start()
    try:
        await write(service, clock, range(3))
        sync = CountingSync()
        sync.fail = OSError(errno.EIO, "Input/output error")
        service._writer.set_sync(sync)
        with pytest.raises(KuraError):
            await write(service, clock, range(3, 4))
        assert service._writer.failure is not None
        assert await held(service, range(3)) == 3  # reads go on, and promise
        assert service.accesses.promised != {}
        await service.flush_touches()
        assert service.accesses.promised == {}
    finally:
        await service.close()
