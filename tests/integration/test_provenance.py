"""Provenance (issue 29 item 4) across a mesh of in-process nodes on 127.0.0.1: the writer a
write records travels unchanged with every copy (the outbox push, a bootstrap), each node
records how its copy came (``via``), and an operator can list a namespace's writers.

Writes name their writer through the storage API (``ArtifactRef.writer``), as the HTTP and gRPC
routes do from the request's credential.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest

from kura.storage.artifact import ArtifactRef, WriterUsage
from kura.storage.service import CacheService
from tests.conftest import NodeProcess, node_env
from tests.e2e.mesh import Mesh, wait_for
from tests.inprocess import InProcessNode, start_in_process
from tests.integration.test_fill import make_store

T = TypeVar("T")
CI, EVIL = "token:ci-main", "token:evil"


def on(node: NodeProcess, make: Any) -> Any:
    """Run ``make(node.node)`` (a coroutine) on the in-process node's own event loop."""
    assert isinstance(node, InProcessNode)
    assert node.node is not None
    assert node.loop is not None
    return asyncio.run_coroutine_threadsafe(make(node.node), node.loop).result(30)


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
    for peer in mesh3.nodes[1:]:  # the outbox push
        assert wait_for(lambda p=peer: len(rows(p)) == 2, 30), peer.log()[-2000:]
        assert {k: w for k, (w, _v, _s) in rows(peer).items()} == want
        assert {v for _w, v, _s in rows(peer).values()} == {"replication"}

    # A node no peer ships to (not in their KURA_PEERS) gets everything by its bootstrap.
    env = node_env(tmp_path / "newcomer", read_through="never")
    env["KURA_PEERS"] = ",".join(mesh3.internal_urls)
    newcomer = start_in_process(tmp_path / "newcomer", env)
    try:
        assert wait_for(lambda: len(rows(newcomer)) == 2, 30), newcomer.log()[-2000:]
        assert {k: w for k, (w, _v, _s) in rows(newcomer).items()} == want
        assert {v for _w, v, _s in rows(newcomer).values()} == {"bootstrap"}
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
