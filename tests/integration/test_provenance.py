"""Provenance (issue 29 item 4) across a mesh of in-process nodes on 127.0.0.1: the writer a
write records travels unchanged with every copy (the outbox push, a bootstrap), each node
records how its copy came (``via``), and an operator can list a namespace's writers.

Writes name their writer through the storage API (``ArtifactRef.writer``), as the HTTP and gRPC
routes do from the request's credential.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from kit.clock import ManualClock
from kit.wait import wait_until_async
from kura.core.errors import InsufficientStorage
from kura.core.version import ApplyOutcome
from kura.mesh.catch_up import CatchUp
from kura.mesh.client import PeerClient
from kura.mesh.wire import MANIFEST_HEADER, OUTCOME_HEADER, encode_manifest
from kura.storage import provenance
from kura.storage.artifact import ArtifactRef, WriterUsage
from kura.storage.outbox import PURGE_WRITER
from kura.storage.service import CacheService
from tests import oneshot
from tests.conftest import NodeProcess, node_env
from tests.e2e.mesh import Mesh, wait_for
from tests.inprocess import InProcessNode, start_in_process
from tests.integration.test_fill import make_store
from tests.integration.test_replica_log import one_peer

T = TypeVar("T")
CI, EVIL = "token:ci-main", "token:evil"


def on(node: NodeProcess, make: Any) -> Any:
    """``InProcessNode.call`` for the mesh's nodes (typed ``NodeProcess``)."""
    assert isinstance(node, InProcessNode)
    return node.call(make)


def write(node: NodeProcess, writer: str, key: str, body: bytes, namespace: str = "main") -> int:
    """Store ``body`` under ``key`` as ``writer``; its version (ms)."""
    ref = ArtifactRef("nx", namespace, key, writer=writer)
    result = on(node, lambda n: n.service.put_inline(ref, body, "application/octet-stream"))
    return int(result.manifest.version_ms)


def rows(node: NodeProcess, namespace: str = "main") -> dict[str, tuple[str, str, int]]:
    """key -> (writer, via, size) of the node's index rows of ``namespace``."""
    db = node.data_dir / "index.sqlite3"
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return {
            str(k): (str(w or ""), str(v or ""), int(s))
            for k, w, v, s in conn.execute(
                "SELECT key, writer, via, size FROM artifacts WHERE namespace_id = ?",
                (namespace,),
            )
        }
    finally:
        conn.close()


@pytest.fixture
def mesh3(tmp_path: Path) -> Iterator[Mesh]:
    m = Mesh(tmp_path, 3, in_process=True, read_through="never")
    try:
        m.wait_ready()
        yield m
    finally:
        m.stop_all()


def test_the_writer_arrives_unchanged_through_the_outbox_and_a_bootstrap(
    mesh3: Mesh, tmp_path: Path
) -> None:
    a = mesh3.nodes[0]
    write(a, CI, "k-ci", b"ci bytes")
    write(a, EVIL, "k-evil", b"evil bytes")
    want = {"k-ci": CI, "k-evil": EVIL}
    assert rows(a) == {"k-ci": (CI, "", 8), "k-evil": (EVIL, "", 10)}
    for peer in mesh3.nodes[1:]:  # the outbox push, naming the node it came from
        assert wait_for(lambda p=peer: len(rows(p)) == 2, 30), peer.log()[-2000:]
        assert {k: w for k, (w, _v, _s) in rows(peer).items()} == want
        assert {v for _w, v, _s in rows(peer).values()} == {a.internal_url}

    # A node no peer ships to (not in their KURA_PEERS) gets everything by its bootstrap.
    env = node_env(tmp_path / "newcomer", read_through="never")
    env["KURA_PEERS"] = ",".join(mesh3.internal_urls)
    newcomer = start_in_process(tmp_path / "newcomer", env)
    try:
        assert wait_for(lambda: len(rows(newcomer)) == 2, 30), newcomer.log()[-2000:]
        assert {k: w for k, (w, _v, _s) in rows(newcomer).items()} == want
        assert {v for _w, v, _s in rows(newcomer).values()} <= set(mesh3.internal_urls)
        usage = on(newcomer, lambda n: n.service.writers("main"))
        assert {u.writer: u.vias for u in usage}.keys() == {CI, EVIL}
        assert all(set(u.vias) <= set(mesh3.internal_urls) for u in usage), usage
    finally:
        assert newcomer.stop() == 0


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[CacheService]:
    service = make_store(tmp_path)
    await service.start()
    try:
        yield service
    finally:
        await service.close()


async def _put(service: CacheService, writer: str, key: str, body: bytes, ns: str = "main") -> int:
    ref = ArtifactRef("nx", ns, key, writer=writer)
    return (await service.put_inline(ref, body, "application/octet-stream")).manifest.version_ms


async def test_writers_lists_each_writer_by_bytes_and_written_by_its_entries_newest_first(
    store: CacheService,
) -> None:
    await _put(store, CI, "a", b"1" * 10)
    await _put(store, CI, "b", b"2" * 20)
    evil_first = await _put(store, EVIL, "c", b"3" * 100)
    evil_last = await _put(store, EVIL, "d", b"4" * 5)
    await _put(store, EVIL, "other", b"5" * 7, ns="pr-1")  # another namespace: not counted
    usage = await store.writers("main")
    assert usage == [
        WriterUsage(EVIL, 2, 105, evil_last, ("local",)),
        WriterUsage(CI, 2, 30, usage[1].last_version_ms, ("local",)),
    ]
    assert await store.writers("nothing-here") == []
    got = await store.written_by("main", EVIL, 10)
    assert [(m.key, m.version_ms, m.writer) for m in got] == [
        ("d", evil_last, EVIL),
        ("c", evil_first, EVIL),
    ]
    assert [m.key for m in await store.written_by("main", EVIL, 1)] == ["d"]
    assert await store.written_by("main", "token:nobody", 10) == []


def _holdings(node: NodeProcess) -> dict[str, tuple[str, int]]:
    """key -> (writer, size) of ``node``'s entries of ``main``."""
    return {k: (w, s) for k, (w, _v, s) in rows(node).items()}


def test_a_purge_removes_exactly_one_writers_entries_on_every_node_and_stays_purged(
    mesh3: Mesh,
) -> None:
    """The must-show of issue 29 item 4 at the storage level: ``token:evil`` poisons ``main``
    beside ``token:ci-main``, including one key both wrote (evil's version newer), and one
    purge on node 0 removes exactly evil's entries on all three nodes, one of them down while
    it ran. LWW keeps one version per key, so the key evil overwrote is a miss afterwards (not
    ci-main's older bytes, which no node holds any more): the safe answer, since a miss only
    rebuilds. A late copy of evil's at its old version is ignored; a new write by evil is
    stored, at a newer version."""
    a, b, c = mesh3.nodes
    good = {f"ci-{i}": bytes([65 + i]) * (100 + i) for i in range(4)}
    for key, body in good.items():
        write(a, CI, key, body)
    write(a, CI, "shared", b"main's bytes")
    mesh3.wait_drained()
    bad = {f"evil-{i}": bytes([97 + i]) * (50 + i) for i in range(3)}
    for key, body in bad.items():
        write(b, EVIL, key, body)
    write(b, EVIL, "shared", b"poisoned bytes")  # newer than ci-main's: wins everywhere
    mesh3.wait_drained()
    poisoned = {**{k: (CI, len(v)) for k, v in good.items()}, "shared": (EVIL, 14)}
    poisoned |= {k: (EVIL, len(v)) for k, v in bad.items()}
    for node in mesh3.nodes:
        assert _holdings(node) == poisoned
    evil_old = on(a, lambda n: n.service.written_by("main", EVIL, 10))
    assert {m.key for m in evil_old} == {*bad, "shared"}
    assert c.stop() == 0  # down while the purge runs

    purge = on(a, lambda n: n.service.purge_writer("main", EVIL))
    assert (purge.entries, purge.bytes) == (4, sum(map(len, bad.values())) + 14)
    assert purge.version_ms > max(m.version_ms for m in evil_old)
    clean = {k: (CI, len(v)) for k, v in good.items()}
    assert _holdings(a) == clean  # "shared" is a miss: LWW kept only evil's version
    assert wait_for(lambda: _holdings(b) == clean, 30), (_holdings(b), b.log()[-3000:])
    c = mesh3.restart(2)  # the durable outbox delivers the purge once it is back
    assert wait_for(lambda: _holdings(c) == clean, 60), (_holdings(c), c.log()[-3000:])
    mesh3.wait_drained()
    for node in mesh3.nodes:
        usage = on(node, lambda n: n.service.writers("main"))
        assert [u.writer for u in usage] == [CI], usage
        assert usage[0].entries == len(good)
        assert usage[0].bytes == sum(map(len, good.values()))
        assert on(node, lambda n: n.service.written_by("main", EVIL, 10)) == []
        assert "purged writer 'token:evil' in namespace 'main'" in node.log()
    assert a.metrics()['kura_writer_purges_total{source="local"}'] == 1
    for node in (b, c):
        assert node.metrics()['kura_writer_purges_total{source="replication"}'] == 1
    for key, body in good.items():  # ci-main's bytes, untouched
        got = on(c, lambda n, k=key: n.service.reads.read(ArtifactRef("nx", "main", k)))
        assert got.data == body

    # A late copy of evil's at its old version (a replica push replayed, say) is ignored.
    late = next(m for m in evil_old if m.key == "evil-0")
    r = oneshot.put(
        a.internal_url + "/_internal/replicate/artifact",
        content=bad["evil-0"],
        headers={MANIFEST_HEADER: encode_manifest(late)},
        timeout=10,
    )
    assert r.status_code == 204
    assert r.headers[OUTCOME_HEADER] == ApplyOutcome.IGNORED_TOMBSTONE.value
    assert "evil-0" not in _holdings(a)

    # A new write by the purged writer is stored, at a newer version, and replicates.
    version = write(b, EVIL, "evil-0", b"later bytes")
    assert version > purge.version_ms
    for node in mesh3.nodes:
        assert wait_for(lambda n=node: _holdings(n).get("evil-0") == (EVIL, 11), 30)


async def test_a_peer_no_pull_catches_up_is_re_offered_the_purges_with_the_tombstones(
    store: CacheService,
) -> None:
    """A marked peer that no pull will catch up (the bucket tier, a peer that does not list
    this node) gets the cleans it missed through its queue (``OutboxLog.reoffer_tombstones``):
    a purge of a writer is one of them, or that peer would keep serving the writer's entries."""
    await _put(store, EVIL, "e", b"evil")
    await store.delete_namespace("cleaned")
    purge = await store.purge_writer("main", EVIL)
    peer = "http://127.0.0.1:9"
    assert await store.replica_log.reoffer_tombstones(peer, 0) == 2
    batch = await store.replica_log.outbox_batch(peer, 10)
    assert sorted((m.kind, m.namespace_id, m.writer) for m in batch) == [
        ("delete_namespace", "cleaned", ""),
        ("purge_writer", "main", EVIL),
    ]
    assert next(m for m in batch if m.writer).version_ms == purge.version_ms
    assert await store.replica_log.reoffer_tombstones(peer, purge.version_ms + 1) == 0


@pytest.mark.in_process
async def test_a_marked_peer_told_to_pull_is_re_offered_the_purges_the_feed_does_not_carry(
    store: CacheService, start_node: Callable[..., NodeProcess], caplog: pytest.LogCaptureFixture
) -> None:
    """A peer whose queue was dropped catches up by pulling this node's change feed, which
    carries tombstones but not purges: once told to pull (a real peer that lists this node
    answers 204), it is re-offered the purges since its mark through its queue, once."""
    me = start_node("me").internal_url  # a real node the peer lists, so it takes the request
    peer = start_node("peer", peers=me).internal_url
    client = PeerClient("t", None)
    await client.start()
    try:
        catch_up = CatchUp(
            store.replica_log,
            one_peer(client, me, peer),
            ManualClock(),
            forget_after_seconds=3600,
            ask_to_pull=lambda p: client.ask_to_pull(p, me),
        )
        await store.replica_log.forget_peer(peer)  # marked
        await _put(store, EVIL, "e", b"evil")
        purge = await store.purge_writer("main", EVIL)  # a purge it missed (not queued for it)
        assert store.replica_log.queues.depth(peer) == 0
        told = f"re-offered {peer} 1 purges"

        async def check() -> bool:  # until the peer's discovery has seen this node
            await catch_up.check_once()
            return told in caplog.text

        with caplog.at_level(logging.INFO, logger="kura.mesh.catch_up"):
            assert await wait_until_async(check, 30), caplog.text[-2000:]
            await catch_up.check_once()  # told once: re-offered once
        [message] = await store.replica_log.outbox_batch(peer, 10)
        assert (message.kind, message.writer, message.version_ms) == (
            PURGE_WRITER,
            EVIL,
            purge.version_ms,
        )
        assert peer in store.replica_log.queues.marks  # cleared by its pull, as before
    finally:
        await client.close()


@pytest.mark.in_process
def test_a_malformed_purge_from_a_peer_is_refused_and_purges_nothing(
    start_node: Callable[..., NodeProcess],
) -> None:
    node = start_node("node")
    write(node, EVIL, "e", b"evil")
    url = node.internal_url + "/_internal/replicate/writer"
    for params, message in [
        ({"namespace_id": "main", "version_ms": "9" * 15}, "writer is required"),
        ({"namespace_id": "main", "writer": "a b", "version_ms": "9"}, "visible ASCII"),
        ({"namespace_id": "main", "writer": "x\x1b[31m", "version_ms": "9"}, "visible ASCII"),
        ({"namespace_id": "main", "writer": EVIL}, "version_ms is required"),
        ({"namespace_id": "main", "writer": EVIL, "version_ms": "0"}, "version_ms"),
    ]:
        r = oneshot.request("DELETE", url, params=params, timeout=10)
        assert r.status_code == 400, (params, r.text)
        assert message in r.json()["message"], (params, r.text)
    assert rows(node) == {"e": (EVIL, "", 4)}
    assert on(node, lambda n: n.service.writers("main"))[0].entries == 1
    r = oneshot.request(
        "DELETE", url, params={"namespace_id": "main", "writer": EVIL, "version_ms": "1"}
    )
    assert r.status_code == 204  # older than the entry: recorded, deletes nothing
    assert rows(node) == {"e": (EVIL, "", 4)}


async def test_a_node_records_at_most_its_cap_of_purges_and_a_clean_drops_those_it_covers(
    store: CacheService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Purges are recorded even when nothing matches (module docstring of
    ``storage.provenance``), so a caller with ``clean`` naming made-up writers could add rows
    without limit: past ``MAX_RECORDED_PURGES`` a local purge of a new pair is refused (507)
    and records nothing; purging a pair again, and a peer's purge, still go through. A
    namespace clean drops the namespace's purges at or below it, which frees the room, and a
    purge at or below the clean is not recorded again."""
    monkeypatch.setattr(provenance, "MAX_RECORDED_PURGES", 3)
    await _put(store, EVIL, "k", b"evil")
    for i in range(2):
        await store.purge_writer("pr-1", f"token:made-up-{i}")
    first = await store.purge_writer("main", EVIL)
    assert first.entries == 1
    with pytest.raises(InsufficientStorage, match="recorded 3 purges, the most it keeps"):
        await store.purge_writer("main", "token:one-more")
    assert len(_purge_rows(store)) == 3
    assert ("main", "token:one-more") not in store._require_index().purges
    again = await store.purge_writer("main", EVIL)  # the same pair: replaced, allowed
    assert again.version_ms > first.version_ms
    peers = await store.purge_writer("main", "token:from-a-peer", again.version_ms, source="peer")
    assert peers.version_ms == again.version_ms
    assert len(_purge_rows(store)) == 4
    # A clean of pr-1 covers its two purges: dropped, in the table and in memory.
    clean = await store.delete_namespace("pr-1")
    assert set(_purge_rows(store)) == {("main", EVIL), ("main", "token:from-a-peer")}
    assert set(store._require_index().purges) == set(_purge_rows(store))
    assert store._require_index().covered("pr-1", "token:made-up-0") == clean
    # A peer's purge of pr-1 at or below the clean is covered already: not recorded.
    late = await store.purge_writer("pr-1", "token:late", clean - 1, source="peer")
    assert late.entries == 0
    assert ("pr-1", "token:late") not in _purge_rows(store)
    # Below the cap again (2 rows of 3): a new local purge goes through.
    await store.purge_writer("main", "token:one-more")
    assert ("main", "token:one-more") in _purge_rows(store)


def _purge_rows(store: CacheService) -> dict[tuple[str, str], int]:
    """The ``purges`` table as it is on disk."""
    conn = sqlite3.connect(f"file:{store.files.data_dir / 'index.sqlite3'}?mode=ro", uri=True)
    try:
        return {(str(n), str(w)): int(v) for n, w, v in conn.execute("SELECT * FROM purges")}
    finally:
        conn.close()


async def test_one_namespace_cannot_use_up_the_room_of_the_others(
    store: CacheService, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A credential limited to one namespace with ``clean`` can fill only that namespace's
    room (``MAX_PURGES_PER_NAMESPACE``), and peers' purges count toward it: another namespace
    still takes purges, and the refusal names the namespace's bound."""
    monkeypatch.setattr(provenance, "MAX_PURGES_PER_NAMESPACE", 2)
    await store.purge_writer("tenant-a", "token:made-up-0")
    await store.purge_writer("tenant-a", "token:from-a-peer", 1, source="peer")
    with pytest.raises(InsufficientStorage, match="namespace 'tenant-a' has 2 recorded purges"):
        await store.purge_writer("tenant-a", "token:made-up-1")
    assert provenance.clean_route("tenant-a") == "DELETE /ns/tenant-a/cache"
    assert provenance.clean_route("") == "DELETE /cache"
    assert ("tenant-a", "token:made-up-1") not in _purge_rows(store)
    await store.purge_writer("tenant-b", "token:ci")  # another namespace: room left
    await store.purge_writer("tenant-a", "token:made-up-0")  # the same pair again: allowed
    assert set(_purge_rows(store)) == {
        ("tenant-a", "token:made-up-0"),
        ("tenant-a", "token:from-a-peer"),
        ("tenant-b", "token:ci"),
    }
