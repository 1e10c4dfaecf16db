"""Hostile and unlucky gRPC clients against a real ``kura serve`` (issue 26): garbage messages,
cancelled Reads, trickling Writes and stalled Reads. Each costs the node a bounded amount of
log, tmp budget and memory, and none is counted or logged as a server error."""

from __future__ import annotations

import collections
import os
from collections.abc import Callable

import grpc
import httpx
from buildgrid.common.protos.google.bytestream import bytestream_pb2 as bs

from kura.api.malformed import LOG_LINES
from tests.conftest import NodeProcess
from tests.e2e.mesh import wait_for
from tests.grpc_api.client import blob_name, start_grpc_node

MiB = 1024 * 1024
CAS = "/build.bazel.remote.execution.v2.ContentAddressableStorage/"
GARBAGE_METHODS = (
    CAS + "FindMissingBlobs",
    CAS + "BatchUpdateBlobs",
    CAS + "GetTree",
    "/build.bazel.remote.execution.v2.ActionCache/GetActionResult",
    "/google.bytestream.ByteStream/Read",
    "/google.bytestream.ByteStream/Write",
)


def recent_errors(node: NodeProcess, token: str | None = None) -> list[object]:
    """The status page's list of recent warnings and errors (``GET /status``)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    body = httpx.get(node.url + "/status", headers=headers, timeout=10).json()
    return list(body["recent_errors"])


def garbage_call(channel: grpc.Channel, i: int) -> grpc.Future:
    """Call number ``i`` of the garbage test: a message whose first field has wire type 7,
    which does not exist, so it never decodes."""
    method = GARBAGE_METHODS[i % len(GARBAGE_METHODS)]
    garbage = b"\x0f" + os.urandom(i % 100)
    if method.endswith("/Write"):
        return channel.stream_unary(method).future(iter([garbage]), timeout=60)
    if method.endswith("/Read"):  # a server-streaming call has no future: its iterator is one
        return channel.unary_stream(method)(garbage, timeout=60)  # type: ignore[return-value]
    return channel.unary_unary(method).future(garbage, timeout=60)


def test_garbage_grpc_requests_get_invalid_argument_and_a_few_log_lines(
    start_node: Callable[..., NodeProcess],
) -> None:
    """2,000 calls without a token whose message is not protobuf (wire type 7 does not exist):
    on main each was UNKNOWN with a 7-line ERROR traceback (about 1.5 MB of log)."""
    node, client = start_grpc_node(start_node, read_write_tokens="tok", workers=1)
    lines_before = len(node.log().splitlines())
    codes: collections.Counter[grpc.StatusCode] = collections.Counter()
    for first in range(0, 2000, 100):  # 100 at a time: a client's usual concurrency
        calls = [garbage_call(client.channel, i) for i in range(first, first + 100)]
        codes.update(call.exception().code() for call in calls)  # type: ignore[union-attr]
    client.close()

    assert codes == {grpc.StatusCode.INVALID_ARGUMENT: 2000}, codes
    new_lines = node.log().splitlines()[lines_before:]
    assert len(new_lines) <= LOG_LINES, new_lines[:20]
    assert all(" INFO " in line for line in new_lines), new_lines
    assert "Traceback" not in node.log()
    assert node.metric_sum("kura_grpc_requests_total") == 2000
    assert recent_errors(node, "tok") == []
    assert node.staging_files() == []
    assert node.metric("kura_tmp_reserved_bytes") == 0


def test_a_read_the_client_cancels_is_not_an_error(start_node: Callable[..., NodeProcess]) -> None:
    """On main a cancelled Read was counted INTERNAL and logged at ERROR with a traceback."""
    node, client = start_grpc_node(start_node, workers=1)
    data = os.urandom(8 * MiB)
    name = blob_name(data)
    client.write(name, data, chunk=MiB)
    for _ in range(5):
        reading = client.bytestream.Read(bs.ReadRequest(resource_name=name))
        assert len(next(reading).data) > 0
        reading.cancel()
    cancelled = 'kura_grpc_requests_total{code="CANCELLED",method="Read"}'
    assert wait_for(lambda: node.metric(cancelled) == 5, 15), node.metrics()
    assert node.metric('kura_grpc_requests_total{code="INTERNAL",method="Read"}') == 0
    assert " ERROR " not in node.log()
    assert "Traceback" not in node.log()
    assert recent_errors(node) == []
    assert client.read(name) == data  # and the node serves the blob whole
    client.close()
