"""Every REAPI v2 cache RPC over a real gRPC channel to a ``kura serve`` process, and the one
store the gRPC and HTTP protocols share (blobs and action results cross both ways)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator

import grpc
import pytest

from kura.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as reapi,
)
from kura.protos.google.bytestream import bytestream_pb2 as bs
from tests.conftest import NodeProcess
from tests.e2e.mesh import wait_for
from tests.grpc_api.client import (
    Reapi,
    blob_name,
    digest,
    new_upload,
    start_grpc_node,
    write_requests,
)
from tests.reapi import action_result, tree

pytestmark = pytest.mark.in_process

EMPTY = digest(b"")


@pytest.fixture
def grpc_node(start_node: Callable[..., NodeProcess]) -> Iterator[tuple[NodeProcess, Reapi]]:
    node, client = start_grpc_node(start_node)
    yield node, client
    client.close()


def test_capabilities(grpc_node: tuple[NodeProcess, Reapi]) -> None:
    _, c = grpc_node
    caps = c.capabilities.GetCapabilities(reapi.GetCapabilitiesRequest()).cache_capabilities
    assert list(caps.digest_functions) == [reapi.DigestFunction.SHA256]
    assert caps.action_cache_update_capabilities.update_enabled
    assert caps.max_batch_total_size_bytes == 4 * 1024 * 1024 - 64 * 1024


def test_cas_batch_calls_and_find_missing(grpc_node: tuple[NodeProcess, Reapi]) -> None:
    node, c = grpc_node
    blobs = [os.urandom(n) for n in (1, 1000, 100_000)]
    assert sorted(c.find_missing([*blobs, b""])) == sorted(digest(b).hash for b in blobs)
    response = c.batch_update(blobs)
    assert [r.status.code for r in response.responses] == [0, 0, 0]
    assert c.find_missing(blobs) == []
    read = c.cas.BatchReadBlobs(
        reapi.BatchReadBlobsRequest(digests=[*(digest(b) for b in blobs), digest(b"absent"), EMPTY])
    )
    assert [r.data for r in read.responses] == [*blobs, b"", b""]
    codes = [r.status.code for r in read.responses]
    assert codes == [0, 0, 0, grpc.StatusCode.NOT_FOUND.value[0], 0]
    assert node.index_rows() == 3


def test_get_tree_pages(grpc_node: tuple[NodeProcess, Reapi]) -> None:
    _, c = grpc_node
    leaves = [reapi.Directory(files=[reapi.FileNode(name=f"f{i}", digest=EMPTY)]) for i in range(5)]
    leaf_bytes = [d.SerializeToString() for d in leaves]
    root = reapi.Directory(
        directories=[
            reapi.DirectoryNode(name=f"d{i}", digest=digest(b)) for i, b in enumerate(leaf_bytes)
        ]
    )
    root_bytes = root.SerializeToString()
    c.batch_update([root_bytes, *leaf_bytes])
    request = reapi.GetTreeRequest(root_digest=digest(root_bytes), page_size=2)
    pages = list(c.cas.GetTree(request))
    assert [list(p.directories) for p in pages] == [[root, leaves[0]], leaves[1:3], leaves[3:]]
    assert [bool(p.next_page_token) for p in pages] == [True, True, False]
    request.page_token = pages[0].next_page_token
    rest = list(c.cas.GetTree(request))
    assert [d for p in rest for d in p.directories] == leaves[1:]


def test_action_cache_completeness(grpc_node: tuple[NodeProcess, Reapi]) -> None:
    node, c = grpc_node
    out, log = os.urandom(5000), b"compiled\n"
    result = reapi.ActionResult.FromString(action_result({"out/a.o": out}, stdout=log))
    action = digest(b"action-1")
    c.ac.UpdateActionResult(
        reapi.UpdateActionResultRequest(action_digest=action, action_result=result)
    )
    # Its outputs are not in the CAS: the entry is a miss.
    with pytest.raises(grpc.RpcError) as missing:
        c.ac.GetActionResult(reapi.GetActionResultRequest(action_digest=action))
    assert missing.value.code() is grpc.StatusCode.NOT_FOUND
    c.batch_update([out, log])
    got = c.ac.GetActionResult(reapi.GetActionResultRequest(action_digest=action))
    assert got == result
    # An output directory's Tree must be stored, and every file in it.
    inner = os.urandom(300)
    t = tree({"x": inner}, {})
    result2 = reapi.ActionResult.FromString(action_result(trees={"out/dir": t}))
    action2 = digest(b"action-2")
    c.ac.UpdateActionResult(
        reapi.UpdateActionResultRequest(action_digest=action2, action_result=result2)
    )
    c.batch_update([t])
    with pytest.raises(grpc.RpcError) as no_file:
        c.ac.GetActionResult(reapi.GetActionResultRequest(action_digest=action2))
    assert no_file.value.code() is grpc.StatusCode.NOT_FOUND
    c.batch_update([inner])
    assert c.ac.GetActionResult(reapi.GetActionResultRequest(action_digest=action2)) == result2
    assert node.metric('kura_cache_lookups_total{protocol="grpc",result="hit"}') == 2
    assert node.metric('kura_cache_lookups_total{protocol="grpc",result="miss"}') == 2


def test_cross_protocol_one_store(grpc_node: tuple[NodeProcess, Reapi]) -> None:
    node, c = grpc_node
    with node.client() as http:
        # gRPC write -> HTTP /cas/ GET.
        blob = os.urandom(200_000)
        c.write(blob_name(blob, upload=new_upload()), blob)
        got = http.get(f"/cache/cas/{digest(blob).hash}")
        assert got.status_code == 200
        assert got.content == blob
        # HTTP /cas/ PUT -> gRPC ByteStream.Read and FindMissingBlobs.
        other = os.urandom(70_000)
        assert http.put(f"/cache/cas/{digest(other).hash}", content=other).status_code == 200
        assert c.read(blob_name(other)) == other
        # Already stored intact: a Write is answered at once with the full size.
        again = c.write(blob_name(other, upload=new_upload()), other)
        assert again.committed_size == len(other)
        # HTTP /ac/ PUT -> gRPC GetActionResult; gRPC UpdateActionResult -> HTTP /ac/ GET.
        entry = action_result({"a": blob, "b": other})
        assert http.put(f"/cache/ac/{digest(b'act-h').hash}", content=entry).status_code == 200
        got_result = c.ac.GetActionResult(
            reapi.GetActionResultRequest(action_digest=digest(b"act-h"))
        )
        assert got_result == reapi.ActionResult.FromString(entry)
        c.ac.UpdateActionResult(
            reapi.UpdateActionResultRequest(
                action_digest=digest(b"act-g"), action_result=reapi.ActionResult.FromString(entry)
            )
        )
        over_http = http.get(f"/cache/ac/{digest(b'act-g').hash}")
        assert over_http.status_code == 200
        assert reapi.ActionResult.FromString(over_http.content) == reapi.ActionResult.FromString(
            entry
        )
        # An instance name is the namespace /ns/{namespace}/cache names over HTTP.
        scoped = os.urandom(1000)
        c.write(blob_name(scoped, instance="team-a", upload=new_upload()), scoped)
        assert http.get(f"/ns/team-a/cache/cas/{digest(scoped).hash}").content == scoped
        assert http.get(f"/cache/cas/{digest(scoped).hash}").status_code == 404
        assert c.find_missing([scoped]) == [digest(scoped).hash]
        assert c.find_missing([scoped], instance="team-a") == []


def test_bytestream_read_offset_and_limit(grpc_node: tuple[NodeProcess, Reapi]) -> None:
    _, c = grpc_node
    blob = os.urandom(3 * 1024 * 1024 + 17)  # several 1 MiB read chunks, a file on disk
    c.write(blob_name(blob, upload=new_upload()), blob)
    name = blob_name(blob)
    assert c.read(name) == blob
    assert c.read(name, offset=1_500_000) == blob[1_500_000:]
    assert c.read(name, offset=1000, limit=2_000_000) == blob[1000:2_001_000]
    assert c.read(name, offset=len(blob)) == b""
    assert c.read(blob_name(b"")) == b""
    with pytest.raises(grpc.RpcError) as out:
        c.read(name, offset=len(blob) + 1)
    assert out.value.code() is grpc.StatusCode.OUT_OF_RANGE
    with pytest.raises(grpc.RpcError) as absent:
        c.read(blob_name(b"never written"))
    assert absent.value.code() is grpc.StatusCode.NOT_FOUND


def test_bytestream_write_cut_queried_resumed(grpc_node: tuple[NodeProcess, Reapi]) -> None:
    """A Write cut after half (the client cancels the call), QueryWriteStatus, then resumed."""
    node, c = grpc_node
    blob = os.urandom(2 * 1024 * 1024)
    name = blob_name(blob, instance="main", upload=new_upload())
    half = len(blob) // 2
    cut = threading.Event()

    def first_half() -> Iterator[bs.WriteRequest]:
        yield from write_requests(name, blob[:half], chunk=64 * 1024, finish=False)
        cut.wait(60)  # the stream stays open until the call is cancelled under it

    future = c.bytestream.Write.future(first_half())
    query = bs.QueryWriteStatusRequest(resource_name=name)
    assert wait_for(lambda: committed(c, query) == half, 30)
    future.cancel()
    cut.set()
    status = c.bytestream.QueryWriteStatus(query)
    assert status.committed_size == half
    assert not status.complete
    assert node.metric("kura_tmp_reserved_bytes") >= len(blob)  # reserved before writing
    assert c.find_missing([blob], instance="main") == [digest(blob).hash]
    done = c.write(name, blob, offset=half)
    assert done.committed_size == len(blob)
    assert c.bytestream.QueryWriteStatus(query).complete
    assert c.read(blob_name(blob, instance="main")) == blob
    assert wait_for(lambda: node.metric("kura_tmp_reserved_bytes") == 0, 10)
    assert node.metric('kura_grpc_requests_total{code="OK",method="Write"}') == 1


def committed(c: Reapi, query: bs.QueryWriteStatusRequest) -> int:
    """The committed size QueryWriteStatus reports, -1 while the upload is unknown."""
    try:
        return int(c.bytestream.QueryWriteStatus(query).committed_size)
    except grpc.RpcError as exc:
        if exc.code() is grpc.StatusCode.NOT_FOUND:
            return -1
        raise


def _sized(d: reapi.Digest, size_bytes: int) -> reapi.Digest:
    return reapi.Digest(hash=d.hash, size_bytes=size_bytes)


def test_a_blob_stored_with_one_size_is_not_present_for_a_digest_of_another_size(
    grpc_node: tuple[NodeProcess, Reapi],
) -> None:
    """A digest is hash and size (remote_execution.proto ``Digest``): the blob stored as
    (H, 1000) does not answer for (H, 999) in FindMissingBlobs, in ByteStream's and
    BatchUpdateBlobs' "already stored" answers, nor in the action cache's completeness check
    (an output file, a Tree, a file inside a Tree)."""
    node, c = grpc_node
    blob, inner = os.urandom(1000), os.urandom(300)
    t = tree({"x": inner}, {})
    c.batch_update([blob, inner, t])
    stored, wrong = digest(blob), _sized(digest(blob), 999)
    response = c.cas.FindMissingBlobs(
        reapi.FindMissingBlobsRequest(blob_digests=[stored, wrong, _sized(digest(t), 1)])
    )
    missing = {(d.hash, d.size_bytes) for d in response.missing_blob_digests}
    assert missing == {(wrong.hash, 999), (digest(t).hash, 1)}

    name = f"blobs/{stored.hash}/999"
    with pytest.raises(grpc.RpcError) as query:
        c.bytestream.QueryWriteStatus(bs.QueryWriteStatusRequest(resource_name=name))
    assert query.value.code() is grpc.StatusCode.NOT_FOUND
    # Not "already stored": the 999 bytes are taken, and refused as not hashing to H.
    with pytest.raises(grpc.RpcError) as write:
        c.write(name, blob[:999])
    assert write.value.code() is grpc.StatusCode.INVALID_ARGUMENT
    batch = c.cas.BatchUpdateBlobs(
        reapi.BatchUpdateBlobsRequest(
            requests=[reapi.BatchUpdateBlobsRequest.Request(digest=wrong, data=blob[:999])]
        )
    )
    assert batch.responses[0].status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]

    wrong_tree = reapi.Tree.FromString(t)
    wrong_tree.root.files[0].digest.size_bytes = 299
    c.batch_update([wrong_tree.SerializeToString()])
    results = {
        "output file": reapi.ActionResult(output_files=[reapi.OutputFile(path="a", digest=wrong)]),
        "tree": reapi.ActionResult(
            output_directories=[
                reapi.OutputDirectory(path="d", tree_digest=_sized(digest(t), len(t) + 1))
            ]
        ),
        "tree file": reapi.ActionResult(
            output_directories=[
                reapi.OutputDirectory(path="d", tree_digest=digest(wrong_tree.SerializeToString()))
            ]
        ),
        "hit": reapi.ActionResult(
            output_files=[reapi.OutputFile(path="a", digest=stored)],
            output_directories=[reapi.OutputDirectory(path="d", tree_digest=digest(t))],
        ),
    }
    found = {}
    for case, result in results.items():
        action = digest(case.encode())
        c.ac.UpdateActionResult(
            reapi.UpdateActionResultRequest(action_digest=action, action_result=result)
        )
        try:
            c.ac.GetActionResult(reapi.GetActionResultRequest(action_digest=action))
            found[case] = "hit"
        except grpc.RpcError as exc:
            found[case] = exc.code().name
    assert found == {
        "output file": "NOT_FOUND",
        "tree": "NOT_FOUND",
        "tree file": "NOT_FOUND",
        "hit": "hit",
    }
    assert node.staging_files() == []
    assert node.metric("kura_tmp_reserved_bytes") == 0


@pytest.mark.parametrize(("offset", "limit"), [(0, 0), (0, 1024 * 1024), (5, 0)])
def test_a_damaged_blob_is_never_read_whole(
    grpc_node: tuple[NodeProcess, Reapi], offset: int, limit: int
) -> None:
    """A whole Read (each message made on a verifier thread) and ranged ones: damage at the
    blob's last byte ends the stream NOT_FOUND before its last message, and quarantines the
    blob (a miss from then on)."""
    node, c = grpc_node
    data = os.urandom(3 * 1024 * 1024 + 7)
    name = blob_name(data)
    c.write(name, data, chunk=1024 * 1024)
    assert c.read(name) == data
    (path,) = node.blob_files()
    with path.open("r+b") as f:
        f.seek(len(data) - 1)
        f.write(bytes([data[-1] ^ 1]))
    got: list[bytes] = []
    request = bs.ReadRequest(resource_name=name, read_offset=offset, read_limit=limit)

    def read() -> None:
        for response in c.bytestream.Read(request, metadata=c.metadata):
            got.append(response.data)

    with pytest.raises(grpc.RpcError) as info:
        read()
    assert info.value.code() is grpc.StatusCode.NOT_FOUND, info.value
    wanted = data[offset : offset + limit] if limit else data[offset:]
    assert len(b"".join(got)) < len(wanted)
    assert wanted.startswith(b"".join(got))
    assert digest(data).hash in c.find_missing([data])
