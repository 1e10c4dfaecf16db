"""The replica log ports (``storage.ports.OutboxLog`` and ``ChangeLog``, issue 27 item 1): the
mesh reads and changes the outbox, the change feed, the cursors, the range digests and the
catch-up marks through a few typed methods of a real store in-process, never through a SQLite
connection lent by storage."""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from kit.clock import SystemClock
from kura.storage.budget import TmpBudget
from kura.storage.ports import ChangeLog, OutboxLog
from kura.storage.replica_log import IndexReplicaLog
from kura.storage.service import ArtifactRef, CacheService

MiB = 1024 * 1024
PEERS = ("http://127.0.0.1:1", "http://127.0.0.1:2")


def members(cls: type) -> set[str]:
    return {n for n in vars(cls) if not n.startswith("_")}


def test_the_replica_log_is_a_narrow_async_port_and_storage_lends_no_connection() -> None:
    for port in (members(OutboxLog), members(ChangeLog)):
        assert len(port) <= 10, sorted(port)
        assert port <= members(IndexReplicaLog), sorted(port - members(IndexReplicaLog))
        methods = port - {"queues"}
        assert all(inspect.iscoroutinefunction(getattr(IndexReplicaLog, m)) for m in methods)
    lenders = {n for n in dir(CacheService) if n in ("in_reader", "in_writer")}
    assert not lenders, lenders


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[CacheService]:
    s = CacheService(
        data_dir=tmp_path / "data",
        tmp_dir=tmp_path / "tmp",
        tenant_id="t",
        budget=TmpBudget(64 * MiB, tmp_dir=tmp_path / "tmp"),
        clock=SystemClock(),
        max_disk_bytes=1024 * MiB,
        min_free_disk_bytes=0,
        targets=lambda: PEERS,
    )
    await s.start()
    try:
        yield s
    finally:
        await s.close()


async def test_the_mesh_ships_pulls_compares_and_catches_up_through_the_replica_log(
    service: CacheService,
) -> None:
    log: OutboxLog = service.replica_log
    feed: ChangeLog = service.replica_log  # the same object, typed as each consumer sees it
    for i in range(3):
        await service.put_inline(ArtifactRef("xcode", "ns", f"k{i}"), b"%d" % i, "text/plain")
    first, second = PEERS

    # The outbox: one message per write and peer, oldest first; acknowledged ones are gone.
    assert {p: n for p, (n, _) in (await log.outbox_depths()).items()} == dict.fromkeys(PEERS, 3)
    batch = await log.outbox_batch(first, 2)
    assert [m.peer for m in batch] == [first, first]
    assert batch[0].id < batch[1].id
    assert await log.outbox_ack([m.id for m in batch]) == 2
    assert (await log.outbox_depths())[first][0] == 1 == log.queues.depth(first)

    # The change feed, and a cursor into a peer's feed that survives as written.
    page = await feed.changes_page(0, 10)
    assert (len(page.manifests), page.head_seq, page.more) == (3, 3, False)
    assert await feed.load_cursor(first) is None
    await feed.store_cursor(first, page.epoch, 2)
    cursor = await feed.load_cursor(first)
    assert cursor is not None
    assert (cursor.epoch, cursor.seq) == (page.epoch, 2)

    # The range digests, in the wire's shape: three rows at the root, no tombstone.
    digests = await feed.range_digests("", 0)
    assert [(p, n) for p, n, _ in digests.ranges] == [("", 3)]
    assert digests.tombstones == (0, "0" * 16)
    with pytest.raises(ValueError, match="prefix length"):
        await feed.range_digests("a", 0)

    # A peer absent too long (or at its cap) loses its queue in one transaction and is marked;
    # it pulls the change feed (mesh.catch_up), after which the mark is cleared.
    assert await log.forget_peer(second) == (3, 3)
    mark = log.queues.marks[second]
    assert (mark.reason, mark.dropped_messages, log.queues.depth(second)) == ("absent", 3, 0)
    await service.put_inline(ArtifactRef("xcode", "ns", "k3"), b"3", "text/plain")
    assert log.queues.depth(second) == 1  # a later write is queued for it again
    assert await log.forget_peer(second) == (1, 4)  # dropped again: the mark adds it up
    assert log.queues.marks[second].dropped_messages == 4
    assert log.queues.depth(second) == 0
    skipped = log.queues.skipped_total.get(second, 0)
    assert not await log.clear_mark(second, skipped - 1)  # skipped meanwhile: not cleared
    assert await log.clear_mark(second, skipped)
    assert second not in log.queues.marks
