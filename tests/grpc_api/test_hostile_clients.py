"""Hostile and unlucky gRPC clients (issue 26): garbage messages, cancelled Reads, trickling
Writes and stalled Reads. The first three run against a real ``kura serve`` process, as the issue
asks (a process's log also holds what gRPC's core writes to stderr); the others, in process.
Each costs the node a bounded amount of log, tmp budget and memory, and none is counted or logged
as a server error."""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator

import grpc
import pytest

from kura.api.malformed import LOG_LINES
from kura.protos.google.bytestream import bytestream_pb2 as bs
from tests import oneshot
from tests.conftest import NodeProcess
from tests.e2e.mesh import wait_for
from tests.grpc_api.client import (
    Reapi,
    blob_name,
    new_upload,
    start_grpc_node,
    write_requests,
)

pytestmark = pytest.mark.in_process

MiB = 1024 * 1024
GRACE_SECONDS = 2
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
    body = oneshot.get(node.url + "/status", headers=headers, timeout=10).json()
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


@pytest.mark.process  # issue 26: injected into a real `kura serve` (its stderr is in its log)
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
    # Start-up may still log its own INFO lines (peer discovery) meanwhile: those are not ours.
    about_garbage = [line for line in new_lines if "malformed" in line]
    assert 1 <= len(about_garbage) <= LOG_LINES, about_garbage[:20]
    assert all(" INFO " in line for line in new_lines), new_lines
    assert len(new_lines) <= LOG_LINES + 3, new_lines[:20]
    assert "Traceback" not in node.log()
    assert node.metric_sum("kura_grpc_requests_total") == 2000
    assert recent_errors(node, "tok") == []
    assert node.staging_files() == []
    assert node.metric("kura_tmp_reserved_bytes") == 0


@pytest.mark.process  # issue 26: injected into a real `kura serve` (its stderr is in its log)
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


def trickle(
    name: str, stop: threading.Event, piece: bytes, every_seconds: float
) -> Iterator[bs.WriteRequest]:
    """A Write stream sending ``piece`` every ``every_seconds`` until ``stop`` is set."""
    offset = 0
    while not stop.is_set():
        yield bs.WriteRequest(
            resource_name=name if offset == 0 else "", write_offset=offset, data=piece
        )
        offset += len(piece)
        stop.wait(every_seconds)


@pytest.mark.process  # issue 26: injected into a real `kura serve` (its stderr is in its log)
def test_trickling_and_parked_writes_give_their_budget_back_and_others_are_served(
    start_node: Callable[..., NodeProcess],
) -> None:
    """Three Writes declaring 8 MiB that send a byte every 0.5 s, and a resumable Write that
    sent a byte and dropped (parked for 600 s), hold the whole tmp budget: on main they held it
    for good (the idle timeout never fired, the resume window was 600 s) and every other write
    was RESOURCE_EXHAUSTED. Past the grace period all four are discarded, and a write at four
    times the minimum rate that outlasts the grace period is stored."""
    held = 4 * 8 * MiB
    node, client = start_grpc_node(
        start_node,
        workers=1,
        tmp_dir_max_bytes=held + MiB,
        min_upload_bytes_per_second=16 * 1024,
        upload_grace_seconds=GRACE_SECONDS,
        body_idle_timeout_seconds=60,
        grpc_upload_resume_seconds=600,
    )
    stop = threading.Event()
    parked = blob_name(os.urandom(8 * MiB), upload=new_upload())
    with pytest.raises(grpc.RpcError) as dropped:
        client.bytestream.Write(iter([bs.WriteRequest(resource_name=parked, data=b"x")]))
    assert dropped.value.code() is grpc.StatusCode.INVALID_ARGUMENT  # ended without finish
    trickles = [
        client.bytestream.Write.future(trickle(blob_name(os.urandom(8 * MiB)), stop, b"x", 0.5))
        for _ in range(3)
    ]
    modest_data = os.urandom(24 * 8 * 1024)
    modest = client.bytestream.Write.future(
        write_requests(blob_name(modest_data), modest_data, chunk=8 * 1024, pace_seconds=0.125)
    )
    try:
        assert wait_for(lambda: node.metric("kura_tmp_reserved_bytes") >= held, 30)
        other = os.urandom(4 * MiB)
        with pytest.raises(grpc.RpcError) as refused:
            client.write(blob_name(other), other)
        assert refused.value.code() is grpc.StatusCode.RESOURCE_EXHAUSTED

        def other_stored() -> bool:
            try:
                return client.write(blob_name(other), other).committed_size == len(other)
            except grpc.RpcError as exc:
                if exc.code() is not grpc.StatusCode.RESOURCE_EXHAUSTED:
                    raise
                return False

        assert wait_for(other_stored, GRACE_SECONDS + 20, interval=0.25)
        for call in trickles:
            error = call.exception(timeout=30)
            assert isinstance(error, grpc.Call)
            assert error.code() is grpc.StatusCode.DEADLINE_EXCEEDED
            assert "upload too slow" in (error.details() or "")
        assert modest.result(timeout=30).committed_size == len(modest_data)
    finally:
        stop.set()
    assert wait_for(lambda: node.metric("kura_tmp_reserved_bytes") == 0, 15), node.metrics()
    assert node.staging_files() == []
    assert node.metric("kura_grpc_uploads") == 0
    assert node.metric('kura_http_aborted_uploads_total{reason="slow"}') == 3
    with pytest.raises(grpc.RpcError) as gone:
        client.bytestream.QueryWriteStatus(bs.QueryWriteStatusRequest(resource_name=parked))
    assert gone.value.code() is grpc.StatusCode.NOT_FOUND
    assert client.read(blob_name(other)) == other
    assert node.index_rows() == 2  # the modest write and the other client's
    client.close()


# Opens N Reads of one blob, takes each one's first message, says so, then reads no more.
# A gRPC client's transport keeps taking the messages its application does not read, up to its
# HTTP/2 flow-control window, and by default it grows that window as it measures the link
# (BDP probing). Under load, while the reader was still opening its later Reads, its first
# ones were taken whole and ended OK: 33 of 50 in one run, neither cut nor cancelled. A fixed
# window of 4 MiB per stream (no probing) makes each Read stall after a few messages, as meant.
STALLED_READER = """
import sys, time, grpc
target, n, request = sys.argv[1], int(sys.argv[2]), bytes.fromhex(sys.argv[3])
window = [("grpc.http2.bdp_probe", 0), ("grpc.http2.lookahead_bytes", 4 << 20)]
channels = [grpc.insecure_channel(target, options=window) for _ in range(n // 10 + 1)]
calls = []
for i in range(n):
    call = channels[i % len(channels)].unary_stream("/google.bytestream.ByteStream/Read")(request)
    next(call)
    calls.append(call)
print("opened", flush=True)
time.sleep(600)
"""


@contextlib.contextmanager
def stalled_reader(client: Reapi, name: str, reads: int) -> Iterator[subprocess.Popen[str]]:
    """Run ``STALLED_READER`` with ``reads`` Reads of the blob ``name``: yields once each took
    its first message, and kills the reader on the way out."""
    request = bs.ReadRequest(resource_name=name).SerializeToString().hex()
    with subprocess.Popen(
        [sys.executable, "-c", STALLED_READER, client.target, str(reads), request],
        stdout=subprocess.PIPE,
        text=True,
    ) as reader:
        try:
            assert reader.stdout is not None
            assert reader.stdout.readline() == "opened\n"
            yield reader
        finally:
            reader.kill()


def read_codes(node: NodeProcess) -> dict[str, float]:
    """How the node's ByteStream Reads ended so far, by status code: what a failed count shows,
    instead of the first metrics of a truncated dictionary."""
    return {
        name: value
        for name, value in node.metrics().items()
        if name.startswith("kura_grpc_requests_total") and 'method="Read"' in name
    }


def rss_bytes(node: NodeProcess) -> int:
    """The node process's resident set size (proc(5), /proc/PID/statm: pages)."""
    with open(f"/proc/{node.proc.pid}/statm") as statm:
        return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_stalled_reads_are_cut_at_the_idle_timeout_and_their_memory_returned(
    start_node: Callable[..., NodeProcess],
) -> None:
    """50 Reads of a 64 MiB blob whose client stops (SIGSTOP) after their first message: on
    main they were never cut (the node held each call, its open file and ~6 MiB of messages
    for as long as the client lived), and once the client was gone the node kept most of that
    memory. Now each is cut at the idle timeout (DEADLINE_EXCEEDED, no ERROR), and the memory
    is back once the client is gone."""
    node, client = start_grpc_node(  # a process: its RSS (rss_bytes)
        start_node, workers=1, body_idle_timeout_seconds=2, process=True
    )
    data = os.urandom(64 * MiB)
    client.write(blob_name(data), data, chunk=MiB)
    baseline = rss_bytes(node)
    cut = 'kura_grpc_requests_total{code="DEADLINE_EXCEEDED",method="Read"}'
    with stalled_reader(client, blob_name(data), 50) as reader:
        os.kill(reader.pid, signal.SIGSTOP)
        held = rss_bytes(node) - baseline
        assert wait_for(lambda: node.metric(cut) == 50, 30), (held, read_codes(node))
    assert wait_for(lambda: rss_bytes(node) - baseline < 32 * MiB, 15), (
        f"held {held / MiB:.0f} MiB while stalled, "
        f"{(rss_bytes(node) - baseline) / MiB:.0f} MiB after the client left"
    )
    assert " ERROR " not in node.log()
    assert "Traceback" not in node.log()
    assert node.metric('kura_grpc_requests_total{code="INTERNAL",method="Read"}') == 0
    assert client.read(blob_name(data)) == data
    client.close()


def test_reads_whose_client_dies_mid_stream_are_not_errors(
    start_node: Callable[..., NodeProcess],
) -> None:
    """A client killed while 50 of its Reads stream: on main each was INTERNAL with an ERROR
    traceback ("Read failed", GeneratorExit), and grpcio logged its failed send at ERROR too."""
    node, client = start_grpc_node(start_node, workers=1)
    data = os.urandom(64 * MiB)
    client.write(blob_name(data), data, chunk=MiB)
    with stalled_reader(client, blob_name(data), 50):
        pass  # killed on the way out, 50 Reads streaming
    cancelled = 'kura_grpc_requests_total{code="CANCELLED",method="Read"}'
    assert wait_for(lambda: node.metric(cancelled) == 50, 30), read_codes(node)
    assert node.metric('kura_grpc_requests_total{code="INTERNAL",method="Read"}') == 0
    assert " ERROR " not in node.log()
    assert "Traceback" not in node.log()
    assert recent_errors(node) == []
    client.close()
