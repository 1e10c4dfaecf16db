"""Bad input over a real gRPC channel gets the right status and stores nothing: after each
case there is no blob file, no index row, no staged file and no reserved tmp byte."""

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

pytestmark = pytest.mark.in_process

INVALID = grpc.StatusCode.INVALID_ARGUMENT
BLOB = os.urandom(300_000)
UUID = "0b7a4c1e-3f0e-4a8e-9f5d-2b7c9d1e0a11"


@pytest.fixture
def grpc_node(start_node: Callable[..., NodeProcess]) -> Iterator[tuple[NodeProcess, Reapi]]:
    # A short resume window: a cancelled write's reservation is given back within a second.
    node, client = start_grpc_node(start_node, grpc_upload_resume_seconds="1")
    yield node, client
    client.close()


def assert_nothing_stored(node: NodeProcess) -> None:
    assert wait_for(lambda: node.metric("kura_tmp_reserved_bytes") == 0, 15), node.metrics()
    assert node.index_rows() == 0
    assert node.blob_files() == []
    assert node.staging_files() == []
    assert node.metric("kura_grpc_uploads") == 0


def code_of(call: Callable[[], object]) -> grpc.StatusCode:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code()  # type: ignore[no-any-return]


def bad_hash(data: bytes) -> str:
    return f"uploads/{UUID}/blobs/{digest(b'other bytes').hash}/{len(data)}"


WRITES: dict[str, Callable[[Reapi], object]] = {
    "digest mismatch": lambda c: c.write(bad_hash(BLOB), BLOB),
    "size larger than the bytes": lambda c: c.write(
        f"uploads/{UUID}/blobs/{digest(BLOB).hash}/{len(BLOB) + 1}", BLOB
    ),
    "more bytes than the size": lambda c: c.write(
        f"uploads/{UUID}/blobs/{digest(BLOB).hash}/{len(BLOB) - 1}", BLOB
    ),
    "malformed resource name": lambda c: c.write(
        f"uploads/{UUID}/blobz/{digest(BLOB).hash}/1", BLOB
    ),
    "size not a number": lambda c: c.write(f"blobs/{digest(BLOB).hash}/12x", BLOB),
    "instance name not a namespace": lambda c: c.write(
        blob_name(BLOB, instance="a b", upload=UUID), BLOB
    ),
    "unknown compressor": lambda c: c.write(
        f"uploads/{UUID}/compressed-blobs/lz9/{digest(BLOB).hash}/{len(BLOB)}", BLOB
    ),
    "first write at an offset": lambda c: c.write(blob_name(BLOB, upload=UUID), BLOB, offset=1000),
    "offset jumps mid-stream": lambda c: c.bytestream.Write(jumping(blob_name(BLOB, upload=UUID))),
    "resource name changes mid-stream": lambda c: c.bytestream.Write(renaming()),
    "finish before the size": lambda c: c.bytestream.Write(
        iter(
            [
                bs.WriteRequest(
                    resource_name=blob_name(BLOB, upload=UUID), data=BLOB[:10], finish_write=True
                )
            ]
        )
    ),
    "batch: digest mismatch": lambda c: batch_status(
        c, reapi.Digest(hash=digest(b"x").hash, size_bytes=len(BLOB)), BLOB
    ),
    "batch: wrong size": lambda c: batch_status(
        c, reapi.Digest(hash=digest(BLOB).hash, size_bytes=5), BLOB
    ),
    "batch: malformed hash": lambda c: batch_status(
        c, reapi.Digest(hash="XYZ", size_bytes=3), b"abc"
    ),
    "action result with a malformed digest": lambda c: c.ac.UpdateActionResult(
        reapi.UpdateActionResultRequest(
            action_digest=digest(b"a"),
            action_result=reapi.ActionResult(
                output_files=[reapi.OutputFile(path="x", digest=reapi.Digest(hash="nope"))]
            ),
        )
    ),
    "action digest malformed": lambda c: c.ac.UpdateActionResult(
        reapi.UpdateActionResultRequest(
            action_digest=reapi.Digest(hash="abc"),
            action_result=reapi.ActionResult(exit_code=1),
        )
    ),
}


def jumping(name: str) -> Iterator[bs.WriteRequest]:
    yield bs.WriteRequest(resource_name=name, write_offset=0, data=BLOB[:1000])
    yield bs.WriteRequest(write_offset=5000, data=BLOB[5000:], finish_write=True)


def renaming() -> Iterator[bs.WriteRequest]:
    yield bs.WriteRequest(resource_name=blob_name(BLOB, upload=UUID), data=BLOB[:1000])
    yield bs.WriteRequest(
        resource_name=blob_name(BLOB, upload=new_upload()),
        write_offset=1000,
        data=BLOB[1000:],
        finish_write=True,
    )


def batch_status(c: Reapi, d: reapi.Digest, data: bytes) -> None:
    """Raise the per-blob status of a one-blob BatchUpdateBlobs as an RpcError-like failure."""
    response = c.cas.BatchUpdateBlobs(
        reapi.BatchUpdateBlobsRequest(
            requests=[reapi.BatchUpdateBlobsRequest.Request(digest=d, data=data)]
        )
    )
    raise BatchFailed(response.responses[0].status.code)


class BatchFailed(grpc.RpcError):
    def __init__(self, code: int) -> None:
        self._code = next(c for c in grpc.StatusCode if c.value[0] == code)

    def code(self) -> grpc.StatusCode:
        return self._code


@pytest.mark.parametrize("case", list(WRITES))
def test_bad_input_is_refused_and_leaves_nothing(
    grpc_node: tuple[NodeProcess, Reapi], case: str
) -> None:
    node, c = grpc_node
    assert code_of(lambda: WRITES[case](c)) is INVALID
    assert_nothing_stored(node)
    # The node still works: the same blob stores fine afterwards.
    assert c.write(blob_name(BLOB, upload=new_upload()), BLOB).committed_size == len(BLOB)
    assert c.read(blob_name(BLOB)) == BLOB


def test_client_cancelling_mid_stream_leaves_nothing(grpc_node: tuple[NodeProcess, Reapi]) -> None:
    node, c = grpc_node
    big = os.urandom(4 * 1024 * 1024)
    name = blob_name(big, upload=new_upload())
    cut = threading.Event()

    def half() -> Iterator[bs.WriteRequest]:
        yield from write_requests(name, big[: len(big) // 2], finish=False)
        cut.wait(60)

    call = c.bytestream.Write.future(half())
    assert wait_for(lambda: node.metric("kura_tmp_reserved_bytes") >= len(big), 30)
    call.cancel()
    cut.set()
    assert call.cancelled()
    assert_nothing_stored(node)  # once the 1 s resume window passed
    assert (
        code_of(
            lambda: c.bytestream.QueryWriteStatus(bs.QueryWriteStatusRequest(resource_name=name))
        )
        is grpc.StatusCode.NOT_FOUND
    )


def test_read_bad_names(grpc_node: tuple[NodeProcess, Reapi]) -> None:
    _, c = grpc_node
    assert code_of(lambda: c.read("blobs/abc/3")) is INVALID
    assert code_of(lambda: c.read(f"x/actions/blobs/{digest(b'a').hash}/1")) is INVALID
    assert code_of(lambda: c.read(f"x~y/blobs/{digest(b'a').hash}/1")) is INVALID
    assert code_of(lambda: c.read(f"compressed-blobs/lz4/{digest(b'a').hash}/1")) is INVALID
    assert code_of(lambda: c.read(blob_name(b"a"), limit=-1)) is INVALID


def test_a_stalled_write_gives_its_reservation_back(start_node: Callable[..., NodeProcess]) -> None:
    """A stream that stays open but sends nothing for KURA_BODY_IDLE_TIMEOUT_SECONDS ends
    with DEADLINE_EXCEEDED, and its upload is discarded after the resume window."""
    node, c = start_grpc_node(
        start_node, body_idle_timeout_seconds="1", grpc_upload_resume_seconds="1"
    )
    big = os.urandom(2 * 1024 * 1024)
    name = blob_name(big, upload=new_upload())
    stalled = threading.Event()

    def stall() -> Iterator[bs.WriteRequest]:
        yield from write_requests(name, big[:100_000], finish=False)
        stalled.wait(60)

    try:
        call = c.bytestream.Write.future(stall())
        with pytest.raises(grpc.RpcError) as info:
            call.result(timeout=30)
        assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        assert_nothing_stored(node)
        assert node.metric('kura_grpc_requests_total{code="DEADLINE_EXCEEDED",method="Write"}') == 1
    finally:
        stalled.set()
        c.close()
