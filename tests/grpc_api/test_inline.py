"""The gRPC CAS stores small blobs inline in the index and large ones as files, like HTTP: both
BatchUpdateBlobs and ByteStream.Write (many chunks), read back over gRPC and over HTTP, and a
blob whose bytes do not match its digest leaves nothing behind."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable

import grpc
import pytest

from kura.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as reapi,
)
from tests.conftest import NodeProcess
from tests.grpc_api.client import blob_name, digest, new_upload, start_grpc_node
from tests.inline_index import stored_as

pytestmark = pytest.mark.in_process

KiB = 1024
THRESHOLD = 16 * KiB


def test_grpc_small_blobs_are_inline_and_large_ones_files(
    start_node: Callable[..., NodeProcess],
) -> None:
    node, c = start_grpc_node(start_node, inline_max_bytes=THRESHOLD)
    try:
        batch = [os.urandom(n) for n in (1, 2 * KiB, THRESHOLD, 100 * KiB)]
        assert [r.status.code for r in c.batch_update(batch).responses] == [0, 0, 0, 0]
        streamed = [os.urandom(n) for n in (5 * KiB, 300 * KiB)]
        for data in streamed:
            # 1 KiB messages: the small one arrives in five chunks, yet is stored inline.
            w = c.write(blob_name(data, upload=new_upload()), data, chunk=1 * KiB)
            assert w.committed_size == len(data)
        for data in [*batch, *streamed]:
            assert stored_as(node, data) == ("inline" if len(data) <= THRESHOLD else "file")
            assert c.read(blob_name(data)) == data
            assert (
                c.read(blob_name(data), offset=1, limit=len(data) // 2)
                == data[1 : 1 + len(data) // 2]
            )
            with node.client() as h:
                r = h.get(f"/cache/cas/{hashlib.sha256(data).hexdigest()}")
            assert r.content == data
        read = c.cas.BatchReadBlobs(reapi.BatchReadBlobsRequest(digests=[digest(b) for b in batch]))
        assert [r.data for r in read.responses] == batch
        assert len(node.blob_files()) == 2
        assert node.staging_files() == []
    finally:
        c.close()


def test_a_small_grpc_blob_that_does_not_match_its_digest_leaves_nothing(
    start_node: Callable[..., NodeProcess],
) -> None:
    node, c = start_grpc_node(start_node, inline_max_bytes=THRESHOLD)
    try:
        data = os.urandom(2 * KiB)
        liar = reapi.Digest(hash=hashlib.sha256(b"other").hexdigest(), size_bytes=len(data))
        response = c.cas.BatchUpdateBlobs(
            reapi.BatchUpdateBlobsRequest(
                requests=[reapi.BatchUpdateBlobsRequest.Request(digest=liar, data=data)]
            )
        )
        assert response.responses[0].status.code == grpc.StatusCode.INVALID_ARGUMENT.value[0]
        name = f"uploads/{new_upload()}/blobs/{liar.hash}/{len(data)}"
        with pytest.raises(grpc.RpcError) as err:
            c.write(name, data, chunk=1 * KiB)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert node.index_rows() == 0
        assert node.blob_files() == []
        assert node.staging_files() == []
    finally:
        c.close()
