"""The replica log ports (``storage.ports.OutboxLog`` and ``ChangeLog``, issue 27 item 1): the
mesh reads and changes the outbox, the change feed, the cursors, the range digests and the
catch-up marks through a few typed methods of a real store in-process, never through a SQLite
connection lent by storage."""

from __future__ import annotations

import inspect
import logging
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest

from kit.clock import ManualClock, SystemClock
from kura.mesh.catch_up import CatchUp
from kura.mesh.client import PeerClient
from kura.mesh.membership import Membership, Peer
from kura.storage.budget import TmpBudget
from kura.storage.ports import ChangeLog, OutboxLog
from kura.storage.replica_log import IndexReplicaLog
from kura.storage.service import ArtifactRef, CacheService
from tests.conftest import NodeProcess

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


def one_peer(client: PeerClient, self_url: str, peer: str) -> Membership:
    """A membership (no discovery run) that knows one peer, ``peer``, healthy."""
    membership = Membership(
        self_url=lambda: self_url,
        tenant_id="t",
        seeds=(),
        dns_name=None,
        client=client,
        clock=ManualClock(),
        interval_seconds=1,
        settle_seconds=0,
        initial_timeout_seconds=0,
        tls=False,
    )
    membership.peers[peer] = Peer(peer, healthy=True)
    return membership


@pytest.mark.in_process
async def test_a_marked_peer_that_will_not_pull_is_told_then_warned_and_re_offered_its_cleans(
    service: CacheService, start_node: Callable[..., NodeProcess], caplog: pytest.LogCaptureFixture
) -> None:
    """Issue 27 item 3, on virtual time: a marked peer seen healthy is told to pull; a real
    node that does not list this one answers 404 (so it never pulls, nor runs anti-entropy
    against this node), and after the grace this node logs one WARNING and re-offers it the
    clean it missed, which clears the mark: no clean is lost to a peer that never pulls."""
    peer = start_node("peer").internal_url
    client = PeerClient("t", None)
    await client.start()
    try:
        membership = one_peer(client, "http://127.0.0.1:9", peer)
        clock = ManualClock()
        catch_up = CatchUp(
            service.replica_log,
            membership,
            clock,
            forget_after_seconds=3600,
            ask_to_pull=lambda p: client.ask_to_pull(p, "http://127.0.0.1:9"),
            pull_grace_seconds=30,
        )
        await service.replica_log.forget_peer(peer)  # marked
        await service.delete_namespace("cleaned")  # a clean it missed (not queued for it)
        assert service.replica_log.queues.depth(peer) == 0
        with caplog.at_level(logging.INFO, logger="kura.mesh.catch_up"):
            await catch_up.check_once()
            assert f"could not tell {peer} to pull" in caplog.text
            assert "is not a peer this node pulls from" in caplog.text  # the peer's 404
            clock.advance(31)
            for _ in range(3):
                await catch_up.check_once()
        warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert len(warnings) == 1, [r.getMessage() for r in warnings]
        assert "re-offering it the namespace tombstones" in warnings[0].getMessage()
        assert f"{peer} caught up by re-offering 1 namespace tombstones" in caplog.text
        assert peer not in service.replica_log.queues.marks  # cleared by the re-offer
        assert service.replica_log.queues.depth(peer) == 1  # the clean, queued for it
    finally:
        await client.close()
