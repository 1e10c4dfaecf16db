"""A blob written over gRPC on node A of a three-node mesh replicates like every other
artifact: node C serves it over gRPC (ByteStream, BatchReadBlobs, FindMissingBlobs) and over
HTTP ``/cache/cas/``, byte-identical; an action result written over gRPC on A is a hit on C, and
so is a Remote Asset record pushed on A."""

from __future__ import annotations

import hashlib
import os
import signal
from pathlib import Path

from kura.protos.build.bazel.remote.asset.v1 import remote_asset_pb2 as ra
from kura.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as reapi,
)
from tests.e2e.mesh import Mesh, free_port, wait_for
from tests.grpc_api.client import Reapi, blob_name, digest, new_upload
from tests.reapi import action_result


def test_a_grpc_write_on_a_is_served_over_grpc_and_http_by_c(tmp_path: Path) -> None:
    ports = [free_port() for _ in range(3)]
    mesh = Mesh(
        tmp_path,
        3,
        node_settings={i: {"grpc_port": p} for i, p in enumerate(ports)},
        discovery_settle_ms=200,
    )
    a_client, c_client = Reapi(f"127.0.0.1:{ports[0]}"), Reapi(f"127.0.0.1:{ports[2]}")
    try:
        mesh.wait_ready()
        _a, _b, c = mesh.nodes
        big = os.urandom(3 * 1024 * 1024)  # a file on disk, several ByteStream chunks
        small = os.urandom(2000)
        a_client.write(blob_name(big, upload=new_upload()), big)
        a_client.batch_update([small])
        result = reapi.ActionResult.FromString(action_result({"out": big, "log": small}))
        action = digest(b"mesh action")
        a_client.ac.UpdateActionResult(
            reapi.UpdateActionResultRequest(action_digest=action, action_result=result)
        )
        # A Remote Asset record is an artifact too (kura.grpc.asset): pushed on A, fetched on C.
        uri = "urn:fdc:kura.test:2026:mesh"
        a_client.push.PushBlob(ra.PushBlobRequest(uris=[uri], blob_digest=digest(big)))
        mesh.wait_drained()
        assert wait_for(lambda: c_client.find_missing([big, small]) == [], 30)
        assert c_client.read(blob_name(big)) == big
        batch = c_client.cas.BatchReadBlobs(reapi.BatchReadBlobsRequest(digests=[digest(small)]))
        assert batch.responses[0].data == small
        got = c_client.ac.GetActionResult(reapi.GetActionResultRequest(action_digest=action))
        assert got == result
        fetched = c_client.fetch.FetchBlob(ra.FetchBlobRequest(uris=[uri]))
        assert fetched.blob_digest == digest(big), fetched.status
        with c.client() as http:
            served = http.get(f"/cache/cas/{hashlib.sha256(big).hexdigest()}")
            assert served.status_code == 200
            assert served.content == big
        assert c.metric('kura_grpc_requests_total{code="OK",method="Read"}') == 1
    finally:
        a_client.close()
        c_client.close()
        rcs = mesh.stop_all()
        assert all(rc in (0, -signal.SIGKILL) for rc in rcs), rcs
