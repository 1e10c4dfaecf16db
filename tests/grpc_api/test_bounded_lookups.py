"""Look-ups whose cost the request does not show are bounded, on a real ``kura serve`` process
(one process, so ``/proc/PID`` is the whole node): an action-cache entry naming one large Tree in
many output directories (issue 26 item 3), and ``GetTree`` of a tree of large directories,
which pages by bytes under ``KURA_GRPC_MAX_MESSAGE_BYTES`` (item 10)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import grpc
import pytest

from kura.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as reapi,
)
from tests.conftest import NodeProcess
from tests.grpc_api.client import Reapi, blob_name, digest, start_grpc_node
from tests.grpc_api.test_zstd import peak_rss_bytes

pytestmark = pytest.mark.in_process

NOT_FOUND = grpc.StatusCode.NOT_FOUND
OBJECT = b"one object file\n"


def big_tree(files: int, tag: str = "") -> bytes:
    """A serialized Tree whose root holds ``files`` names, all of them ``OBJECT``."""
    root = reapi.Directory(
        files=[reapi.FileNode(name=f"{tag}f{i:06d}.o", digest=digest(OBJECT)) for i in range(files)]
    )
    return reapi.Tree(root=root).SerializeToString()


def store_result(c: Reapi, action: bytes, trees: list[bytes]) -> reapi.ActionResult:
    """Store ``trees`` and ``OBJECT`` in the CAS and an ActionResult naming the trees in
    order as output directories ``out/0``, ``out/1``, ...; the result."""
    for t in dict.fromkeys(trees):
        c.write(blob_name(t), t)
    c.batch_update([OBJECT])
    result = reapi.ActionResult(
        output_directories=[
            reapi.OutputDirectory(path=f"out/{i}", tree_digest=digest(t))
            for i, t in enumerate(trees)
        ]
    )
    result.execution_metadata.worker = "test"
    c.ac.UpdateActionResult(
        reapi.UpdateActionResultRequest(action_digest=digest(action), action_result=result)
    )
    return result


def get(c: Reapi, action: bytes) -> reapi.ActionResult:
    return c.ac.GetActionResult(reapi.GetActionResultRequest(action_digest=digest(action)))


def test_one_tree_named_by_many_output_directories_is_read_once(
    start_node: Callable[..., NodeProcess],
) -> None:
    """A 2 MB Tree named by 120 output directories (a 10 KB entry): each look-up, over gRPC and
    HTTP, is a hit in well under a second's work and a few MiB of memory. Before: every look-up
    read and parsed the Tree 120 times and kept 120 copies of its file list (about 4 s and
    +300 MiB here)."""
    node, c = start_grpc_node(start_node, workers=1, process=True)  # its peak RSS
    try:
        tree = big_tree(25_000)
        assert len(tree) > 2_000_000
        action = b"action with one big tree, 120 times"
        result = store_result(c, action, [tree] * 120)
        assert result.ByteSize() < 12_000
        peak_before = peak_rss_bytes(node)
        started = time.monotonic()
        for _ in range(3):
            assert get(c, action) == result
        with node.client() as http:
            got = http.get(f"/cache/ac/{digest(action).hash}")
            assert got.status_code == 200
            assert got.content == result.SerializeToString()
        took = time.monotonic() - started
        grown = peak_rss_bytes(node) - peak_before
        assert took < 4.0, f"4 look-ups took {took:.1f} s"
        assert grown < 64 * 1024 * 1024, f"peak RSS grew by {grown / 2**20:.0f} MiB"
    finally:
        c.close()


def test_trees_past_the_byte_bound_are_a_miss(start_node: Callable[..., NodeProcess]) -> None:
    """With ``KURA_ACTION_CACHE_TREE_MAX_BYTES`` at 1 MiB, an entry whose distinct Trees add up
    to 1.2 MB is a miss (Bazel then runs the action again) naming the setting; one whose Trees
    add up to 0.8 MB, each named twice, is a hit."""
    node, c = start_grpc_node(start_node, workers=1, action_cache_tree_max_bytes="1MiB")
    try:
        trees = [big_tree(5_000, tag=f"t{n}") for n in range(3)]
        assert all(400_000 < len(t) < 460_000 for t in trees)
        store_result(c, b"over", trees)
        with pytest.raises(grpc.RpcError) as over:
            get(c, b"over")
        assert over.value.code() is NOT_FOUND
        assert "KURA_ACTION_CACHE_TREE_MAX_BYTES" in str(over.value.details())
        with node.client() as http:
            assert http.get(f"/cache/ac/{digest(b'over').hash}").status_code == 404
        within = store_result(c, b"within", trees[:2] * 2)
        assert get(c, b"within") == within
    finally:
        c.close()


def test_a_check_past_its_time_bound_is_a_miss(start_node: Callable[..., NodeProcess]) -> None:
    """With ``KURA_ACTION_CACHE_CHECK_SECONDS`` at 1 ms, reading a 2 MB Tree cannot finish in
    time: the entry is a miss naming the setting, and the node keeps answering."""
    # A process: in process, the node's unclosed blob file (a ResourceWarning) fails the test.
    node, c = start_grpc_node(
        start_node, workers=1, action_cache_check_seconds="0.001", process=True
    )
    try:
        store_result(c, b"slow", [big_tree(25_000)])
        with pytest.raises(grpc.RpcError) as slow:
            get(c, b"slow")
        assert slow.value.code() is NOT_FOUND
        assert "KURA_ACTION_CACHE_CHECK_SECONDS" in str(slow.value.details())
        with node.client() as http:
            assert http.get("/up").status_code == 200
    finally:
        c.close()


def test_get_tree_pages_by_bytes_under_the_message_limit(
    start_node: Callable[..., NodeProcess],
) -> None:
    """A root of 1,100 directories of about 2 KB each, with ``KURA_GRPC_MAX_MESSAGE_BYTES`` at
    1 MiB: every page fits the message limit, together they hold each directory once in
    breadth-first order, and a call resumes from a page's token. Before: a page was 1,000
    directories whatever their size, and the call failed ("Sent message larger than max")."""
    _node, c = start_grpc_node(start_node, workers=1, grpc_max_message_bytes="1MiB")
    try:
        children = [
            reapi.Directory(
                files=[
                    reapi.FileNode(name=f"d{n:04d}-f{i:02d}.o", digest=digest(OBJECT))
                    for i in range(25)
                ]
            )
            for n in range(1_100)
        ]
        blobs = [d.SerializeToString() for d in children]
        assert all(len(b) > 2_000 for b in blobs)
        root = reapi.Directory(
            directories=[
                reapi.DirectoryNode(name=f"d{n:04d}", digest=digest(b)) for n, b in enumerate(blobs)
            ]
        )
        root_bytes = root.SerializeToString()
        for start in range(0, len(blobs), 400):
            c.batch_update(blobs[start : start + 400])
        c.write(blob_name(root_bytes), root_bytes)
        request = reapi.GetTreeRequest(root_digest=digest(root_bytes))
        pages = list(c.cas.GetTree(request))
        assert [d for p in pages for d in p.directories] == [root, *children]
        assert len(pages) >= 3
        assert all(p.ByteSize() <= 1024 * 1024 for p in pages)
        assert [bool(p.next_page_token) for p in pages] == [True] * (len(pages) - 1) + [False]
        request.page_token = pages[1].next_page_token
        rest = [d for p in c.cas.GetTree(request) for d in p.directories]
        assert rest == [d for p in pages[2:] for d in p.directories]
    finally:
        c.close()


def test_a_walk_of_large_directories_leaves_the_event_loop_free(
    start_node: Callable[..., NodeProcess],
) -> None:
    """GetTree of 80 directories of 750 KB (8 levels deep) under a 64 MiB message limit, walked
    3 times while ``/up`` is probed: no probe waits half a second. Before (issue 26): the walk
    built and serialized one 60 MB page on the event loop, and ``/up`` waited about 1 s."""
    node, c = start_grpc_node(start_node, workers=1, grpc_max_message_bytes="64MiB")
    try:
        blobs: list[bytes] = []
        for level in range(8):
            for k in range(10):
                d = reapi.Directory(
                    files=[
                        reapi.FileNode(name=f"l{level}k{k}f{i:05d}", digest=digest(OBJECT))
                        for i in range(9_000)
                    ]
                )
                if blobs:
                    d.directories.add(name="sub", digest=digest(blobs[-1]))
                blobs.append(d.SerializeToString())
        root = reapi.Directory(
            directories=[
                reapi.DirectoryNode(name=f"r{n:02d}", digest=digest(b)) for n, b in enumerate(blobs)
            ]
        )
        root_bytes = root.SerializeToString()
        for b in [*blobs, root_bytes]:
            c.write(blob_name(b), b)
        stop = threading.Event()
        waits: list[float] = []

        def probe() -> None:
            with node.client() as http:
                while not stop.is_set():
                    started = time.monotonic()
                    assert http.get("/up").status_code == 200
                    waits.append(time.monotonic() - started)

        prober = threading.Thread(target=probe)
        prober.start()
        try:
            for _ in range(3):
                request = reapi.GetTreeRequest(root_digest=digest(root_bytes))
                assert sum(len(p.directories) for p in c.cas.GetTree(request)) == 81
        finally:
            stop.set()
            prober.join()
        assert len(waits) > 10
        assert max(waits) < 0.5, f"/up waited up to {max(waits):.2f} s during the walks"
    finally:
        c.close()
