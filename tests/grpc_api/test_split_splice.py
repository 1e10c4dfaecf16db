"""SplitBlob and SpliceBlob over a real gRPC channel, driven by the stubs' client
(``tests.grpc_api.client``), which chunks on its own from the advertised FastCDC parameters:
a 64 MiB blob with one changed region moves only its changed chunks, and bad splices get their
status and store nothing."""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Iterator

import grpc
import pytest

from kura.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as reapi,
)
from tests.conftest import NodeProcess
from tests.e2e.mesh import manifests, status, wait_for
from tests.grpc_api.client import Reapi, blob_name, digest, fastcdc_chunks, start_grpc_node

pytestmark = pytest.mark.in_process

MiB = 1024 * 1024
RECEIVED = 'kura_http_received_bytes_total{protocol="grpc"}'


@pytest.fixture
def grpc_node(start_node: Callable[..., NodeProcess]) -> Iterator[tuple[NodeProcess, Reapi]]:
    node, client = start_grpc_node(start_node, read_only_tokens="ro", read_write_tokens="rw")
    client.token = "rw"
    yield node, client
    client.close()


def code_of(call: Callable[[], object]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()  # type: ignore[no-any-return]


def upload_chunks(c: Reapi, chunks: list[bytes]) -> int:
    """Upload the chunks the server lacks (FindMissingBlobs), each in its own batch; the
    blob bytes sent."""
    missing = set(c.find_missing(chunks))
    sent = 0
    for chunk in {digest(b).hash: b for b in chunks}.values():
        if digest(chunk).hash in missing:
            response = c.batch_update([chunk])
            assert [r.status.code for r in response.responses] == [0]
            sent += len(chunk)
    return sent


def test_a_changed_region_moves_only_its_chunks(grpc_node: tuple[NodeProcess, Reapi]) -> None:
    node, c = grpc_node
    caps = c.capabilities.GetCapabilities(
        reapi.GetCapabilitiesRequest(), metadata=c.metadata
    ).cache_capabilities
    assert caps.split_blob_support
    assert caps.splice_blob_support
    params = caps.fast_cdc_2020_params
    assert (params.avg_chunk_size_bytes, params.seed) == (512 * 1024, 0)

    data = random.Random(28).randbytes(64 * MiB)
    c.write(blob_name(data), data, chunk=MiB)
    mine = fastcdc_chunks(data, params)
    theirs = c.split(digest(data))
    # Server and client cut alike, and every chunk is stored.
    assert theirs == [digest(b) for b in mine]
    assert c.find_missing(mine) == []
    assert 64 <= len(mine) <= 128

    changed = bytearray(data)
    changed[40 * MiB : 40 * MiB + 4096] = random.Random(29).randbytes(4096)
    new = bytes(changed)
    new_chunks = fastcdc_chunks(new, params)
    before = node.metric(RECEIVED)
    sent = upload_chunks(c, new_chunks)
    response = c.splice(digest(new), [digest(b) for b in new_chunks])
    assert response.blob_digest == digest(new)
    received = node.metric(RECEIVED) - before
    ratio = sent / len(new)
    print(f"splice of 64 MiB with 4 KiB changed: sent {sent} bytes, {ratio:.2%} of the blob")
    assert received == sent  # the splice itself carries no blob bytes
    # One changed region: the chunk that holds it, and at most the next one (FastCDC
    # resynchronises at the first cut after the change): at most 2 maximum-size chunks.
    assert 0 < sent <= 2 * 4 * params.avg_chunk_size_bytes
    assert ratio < 0.07
    # Stored: the node checked the spliced bytes against the digest before storing them.
    assert c.find_missing([new]) == []


def test_split_is_a_read_and_splice_a_write(grpc_node: tuple[NodeProcess, Reapi]) -> None:
    node, c = grpc_node
    data = random.Random(1).randbytes(3 * MiB)
    c.write(blob_name(data), data, chunk=MiB)
    rows = node.index_rows()
    c.token = "ro"
    chunks = c.split(digest(data))
    assert b"".join(c.read(f"blobs/{d.hash}/{d.size_bytes}") for d in chunks) == data
    assert node.index_rows() == rows + len(chunks)
    other = data[::-1]
    assert code_of(lambda: c.splice(digest(other), chunks)) is grpc.StatusCode.PERMISSION_DENIED
    c.token = None
    assert code_of(lambda: c.split(digest(data))) is grpc.StatusCode.UNAUTHENTICATED


def test_bad_splices_store_nothing(grpc_node: tuple[NodeProcess, Reapi]) -> None:
    node, c = grpc_node
    parts = [random.Random(i).randbytes(300_000) for i in range(3)]
    assert upload_chunks(c, parts) == 900_000
    chunks = [digest(p) for p in parts]
    whole = b"".join(parts)
    rows = node.index_rows()
    absent = digest(b"never stored" * 1000)
    cases: dict[str, tuple[reapi.Digest, list[reapi.Digest], grpc.StatusCode]] = {
        "a chunk missing": (
            digest(whole[:600_000] + b"never stored" * 1000),
            [chunks[0], chunks[1], absent],
            grpc.StatusCode.NOT_FOUND,
        ),
        "a wrong blob digest": (digest(whole[::-1]), chunks, grpc.StatusCode.INVALID_ARGUMENT),
        "sizes that do not add up": (
            digest(whole + b"x"),
            chunks,
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        "a chunk digest of the wrong size": (
            digest(whole),
            [chunks[0], chunks[1], reapi.Digest(hash=chunks[2].hash, size_bytes=1)],
            grpc.StatusCode.INVALID_ARGUMENT,  # the sizes no longer add up
        ),
        "a malformed chunk digest": (
            digest(whole),
            [chunks[0], chunks[1], reapi.Digest(hash="zz", size_bytes=300_000)],
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
        "chunks in the wrong order": (
            digest(whole),
            [chunks[1], chunks[0], chunks[2]],
            grpc.StatusCode.INVALID_ARGUMENT,
        ),
    }
    for name, (blob, names, code) in cases.items():
        assert code_of(lambda blob=blob, names=names: c.splice(blob, names)) is code, name
        assert wait_for(lambda: node.metric("kura_tmp_reserved_bytes") == 0, 15), name
        assert node.index_rows() == rows, name
        assert node.staging_files() == [], name
    md5 = reapi.SpliceBlobRequest(
        blob_digest=digest(whole),
        chunk_digests=chunks,
        digest_function=reapi.DigestFunction.MD5,
    )
    assert code_of(lambda: c.cas.SpliceBlob(md5, metadata=c.metadata)) is (
        grpc.StatusCode.INVALID_ARGUMENT
    )
    assert code_of(lambda: c.split(absent)) is grpc.StatusCode.NOT_FOUND
    assert node.index_rows() == rows
    # The good splice, then again: a no-op.
    for _ in range(2):
        assert c.splice(digest(whole), chunks).blob_digest == digest(whole)
        assert node.index_rows() == rows + 1
    assert c.read(blob_name(whole)) == whole


def test_too_many_chunks_is_refused(start_node: Callable[..., NodeProcess]) -> None:
    """At most ``KURA_MAX_ARTIFACT_BYTES`` / 128 KiB chunks (FastCDC's most for the largest
    blob): with a 1 MiB limit, 8."""
    node, c = start_grpc_node(start_node, max_artifact_bytes="1MiB")
    try:
        parts = [bytes([i]) * 1000 for i in range(9)]
        upload_chunks(c, parts)
        rows = node.index_rows()
        whole = b"".join(parts)
        code = code_of(lambda: c.splice(digest(whole), [digest(p) for p in parts]))
        assert code is grpc.StatusCode.INVALID_ARGUMENT
        assert c.splice(digest(whole[:8000]), [digest(p) for p in parts[:8]])
        assert node.index_rows() == rows + 1
    finally:
        c.close()


def test_splits_past_the_nodes_cap_are_resource_exhausted(
    start_node: Callable[..., NodeProcess],
) -> None:
    """``KURA_GRPC_MAX_SPLIT_SPLICE_CALLS=1``: of six SplitBlobs of a 32 MiB blob sent at once,
    one runs (about 16 MiB held) and the others are refused at once, RESOURCE_EXHAUSTED;
    the place frees when it ends (the refusal does not latch)."""
    _node, c = start_grpc_node(start_node, grpc_max_split_splice_calls="1")
    try:
        data = random.Random(30).randbytes(32 * MiB)
        c.write(blob_name(data), data, chunk=MiB)
        start = threading.Barrier(6)
        codes: list[grpc.StatusCode] = []

        def one() -> None:
            start.wait()
            try:
                c.split(digest(data))
                codes.append(grpc.StatusCode.OK)
            except grpc.RpcError as exc:
                codes.append(exc.code())

        threads = [threading.Thread(target=one) for _ in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert grpc.StatusCode.RESOURCE_EXHAUSTED in codes, codes
        assert set(codes) == {grpc.StatusCode.OK, grpc.StatusCode.RESOURCE_EXHAUSTED}, codes
        assert len(c.split(digest(data))) >= 16
    finally:
        c.close()


def test_a_damaged_blob_does_not_split(grpc_node: tuple[NodeProcess, Reapi]) -> None:
    """The blob is verified as it is read: damage at its end (found after earlier windows'
    chunks were stored, each a correct blob of its own digest) is NOT_FOUND, with no staged
    file or reservation left and no store left running."""
    node, c = grpc_node
    data = random.Random(2).randbytes(12 * MiB)
    c.write(blob_name(data), data, chunk=MiB)
    (path,) = node.blob_files()
    with path.open("r+b") as f:
        f.seek(len(data) - 1)
        f.write(bytes([data[-1] ^ 1]))
    assert code_of(lambda: c.split(digest(data))) is grpc.StatusCode.NOT_FOUND
    assert wait_for(lambda: node.metric("kura_tmp_reserved_bytes") == 0, 15)
    assert node.staging_files() == []
    assert digest(data).hash in c.find_missing([data])  # quarantined: a miss from now on


def test_chunks_replicate_like_any_blob(start_node: Callable[..., NodeProcess]) -> None:
    """Chunks are ordinary CAS blobs: the ones ``SplitBlob`` stores on A are shipped to its
    peer B (read from B's own index, not read through)."""
    b = start_node("b")
    a, c = start_grpc_node(start_node, "a", peers=b.internal_url, discovery_settle_ms=200)
    try:
        assert wait_for(lambda: status(a)["ready"] is True, 30), status(a)
        data = random.Random(3).randbytes(3 * MiB)
        c.write(blob_name(data), data, chunk=MiB)
        chunks = c.split(digest(data))
        assert len(chunks) > 1
        keys = {f"cas/{d.hash}" for d in [digest(data), *chunks]}
        assert wait_for(lambda: {m["key"] for m in manifests(b).values()} == keys, 30)
    finally:
        c.close()
