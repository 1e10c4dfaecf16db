"""BatchUpdateBlobs stores a whole batch under one durable commit (``storage.batch_write``):
one writer group, hence one WAL fsync, for N blobs inline and in files alike, where each blob
used to be a group of its own (100 x 1 KiB took 115 ms, BuildGrid 16 ms). A bad blob in the
batch gets its own INVALID_ARGUMENT and leaves nothing behind; the others are stored."""

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
from tests.grpc_api.client import digest, start_grpc_node
from tests.inline_index import stored_as

pytestmark = pytest.mark.in_process

KiB = 1024
GROUPS = "kura_storage_commit_groups_total"
APPLIED = 'kura_replication_apply_results_total{outcome="applied",source="local"}'


def test_a_batch_is_one_durable_commit_and_a_bad_blob_in_it_leaves_nothing(
    start_node: Callable[..., NodeProcess],
) -> None:
    node, c = start_grpc_node(start_node, inline_max_bytes=16 * KiB)
    try:
        small = [os.urandom(KiB) for _ in range(30)]
        large = [os.urandom(100 * KiB) for _ in range(2)]
        bad = [os.urandom(KiB), os.urandom(100 * KiB)]
        lies = [
            reapi.Digest(hash=hashlib.sha256(b + b"x").hexdigest(), size_bytes=len(b)) for b in bad
        ]
        requests = [
            *(reapi.BatchUpdateBlobsRequest.Request(digest=digest(b), data=b) for b in small),
            reapi.BatchUpdateBlobsRequest.Request(digest=lies[0], data=bad[0]),
            *(reapi.BatchUpdateBlobsRequest.Request(digest=digest(b), data=b) for b in large),
            reapi.BatchUpdateBlobsRequest.Request(digest=lies[1], data=bad[1]),
            reapi.BatchUpdateBlobsRequest.Request(digest=digest(small[0]), data=small[0]),
        ]
        groups = node.metric(GROUPS)

        response = c.cas.BatchUpdateBlobs(reapi.BatchUpdateBlobsRequest(requests=requests))

        assert node.metric(GROUPS) - groups == 1  # one WAL fsync for all 32 blobs
        invalid = grpc.StatusCode.INVALID_ARGUMENT.value[0]
        codes = [r.status.code for r in response.responses]
        assert codes == [0] * 30 + [invalid] + [0, 0] + [invalid] + [0]
        assert [r.digest for r in response.responses] == [r.digest for r in requests]
        assert c.find_missing([*small, *large]) == []
        missing = c.cas.FindMissingBlobs(reapi.FindMissingBlobsRequest(blob_digests=lies))
        assert list(missing.missing_blob_digests) == lies
        assert [stored_as(node, b) for b in (small[0], large[0])] == ["inline", "file"]
        assert node.index_rows() == 32
        assert len(node.blob_files()) == 2
        assert node.staging_files() == []
        assert node.metric("kura_tmp_reserved_bytes") == 0
        read = c.cas.BatchReadBlobs(
            reapi.BatchReadBlobsRequest(digests=[digest(b) for b in [*small, *large]])
        )
        assert [r.data for r in read.responses] == [*small, *large]

        applied = node.metric(APPLIED)
        assert applied >= 32  # the 32 blobs written above, each counted
        again = c.cas.BatchUpdateBlobs(reapi.BatchUpdateBlobsRequest(requests=requests[:30]))
        assert [r.status.code for r in again.responses] == [0] * 30
        # Stored intact already: not written again (a rewrite keeps the row count, so the
        # count of local writes applied is what tells).
        assert node.metric(APPLIED) == applied
        assert node.index_rows() == 32
    finally:
        c.close()
