"""zstd ``compressed-blobs`` over a real gRPC channel to a ``kura serve`` process: blobs
round-trip byte-identical across compressed and identity names and HTTP ``/cas/``, a cut zstd
write resumes at its compressed offset, and a bomb, a corrupt or truncated frame leave nothing
behind (no blob, no index row, no staged file, no reserved tmp byte)."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import grpc
import pytest
import zstandard

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
from tests.grpc_api.test_bad_input import assert_nothing_stored
from tests.grpc_api.test_reapi import committed

pytestmark = pytest.mark.in_process

INVALID = grpc.StatusCode.INVALID_ARGUMENT


@pytest.fixture
def grpc_node(start_node: Callable[..., NodeProcess]) -> Iterator[tuple[NodeProcess, Reapi]]:
    node, client = start_grpc_node(start_node, grpc_upload_resume_seconds="1")
    yield node, client
    client.close()


def zstd(data: bytes) -> bytes:
    return zstandard.ZstdCompressor(level=3).compress(data)


def streamed_zstd(data: bytes, window_log: int) -> bytes:
    """A frame as a streaming client writes it: no content size, the window it was told."""
    params = zstandard.ZstdCompressionParameters.from_level(
        3, window_log=window_log, write_content_size=False
    )
    out = zstandard.ZstdCompressor(compression_params=params).compressobj()
    return out.compress(data) + out.flush()


def unzstd(data: bytes) -> bytes:
    """Decompress as a client would, with no trust in a content size in the frame header."""
    out = zstandard.ZstdDecompressor().decompressobj()
    return out.decompress(data)


def mixed_blob(n: int) -> bytes:
    """Half random, half repetitive: compresses, but not to nothing."""
    return (os.urandom(n // 4) + b"kura build cache " * (n // 34))[:n].ljust(n, b"x")


def test_zstd_write_then_identity_read_and_http_get(grpc_node: tuple[NodeProcess, Reapi]) -> None:
    node, c = grpc_node
    blob = mixed_blob(3 * 1024 * 1024 + 5)
    frame = zstd(blob)
    assert len(frame) < len(blob) * 0.6
    done = c.write(blob_name(blob, upload=new_upload(), compressor="zstd"), frame)
    assert done.committed_size == len(frame)  # compressed bytes, as the offsets are
    assert c.read(blob_name(blob)) == blob
    with node.client() as http:
        got = http.get(f"/cache/cas/{digest(blob).hash}")
        assert got.status_code == 200
        assert got.content == blob  # stored uncompressed: one store for both protocols
    assert node.index_rows() == 1
    # Already stored: a compressed write is answered at once with -1 (REAPI).
    again = c.write(blob_name(blob, upload=new_upload(), compressor="zstd"), frame)
    assert again.committed_size == -1
    assert wait_for(lambda: node.metric("kura_tmp_reserved_bytes") == 0, 10)


def test_identity_write_then_zstd_read(grpc_node: tuple[NodeProcess, Reapi]) -> None:
    node, c = grpc_node
    blob = mixed_blob(2 * 1024 * 1024 + 1)
    with node.client() as http:
        assert http.put(f"/cache/cas/{digest(blob).hash}", content=blob).status_code == 200
    name = blob_name(blob, compressor="zstd")
    sent = c.read(name)
    assert len(sent) < len(blob)
    assert unzstd(sent) == blob
    # read_offset is in the uncompressed blob; read_limit must be 0 (remote_execution.proto).
    assert unzstd(c.read(name, offset=1_000_000)) == blob[1_000_000:]
    assert unzstd(c.read(name, offset=len(blob))) == b""
    with pytest.raises(grpc.RpcError) as limited:
        c.read(name, limit=10)
    assert limited.value.code() is INVALID
    assert unzstd(c.read(blob_name(b"", compressor="zstd"))) == b""
    with pytest.raises(grpc.RpcError) as absent:
        c.read(blob_name(b"never written", compressor="zstd"))
    assert absent.value.code() is grpc.StatusCode.NOT_FOUND


def test_zstd_write_cut_queried_resumed(grpc_node: tuple[NodeProcess, Reapi]) -> None:
    """A zstd Write cut after half its compressed bytes, queried, and resumed there."""
    node, c = grpc_node
    blob = os.urandom(2 * 1024 * 1024)
    frame = zstd(blob)
    name = blob_name(blob, instance="main", upload=new_upload(), compressor="zstd")
    half = len(frame) // 2
    cut = threading.Event()

    def first_half() -> Iterator[bs.WriteRequest]:
        yield from write_requests(name, frame[:half], chunk=64 * 1024, finish=False)
        cut.wait(60)

    future = c.bytestream.Write.future(first_half())
    query = bs.QueryWriteStatusRequest(resource_name=name)
    assert wait_for(lambda: committed(c, query) == half, 30)
    future.cancel()
    cut.set()
    assert c.bytestream.QueryWriteStatus(query).committed_size == half  # compressed bytes
    assert node.metric("kura_tmp_reserved_bytes") >= len(blob)  # the uncompressed size
    done = c.write(name, frame, offset=half)
    assert done.committed_size == len(frame)
    assert c.bytestream.QueryWriteStatus(query).complete
    assert c.read(blob_name(blob, instance="main")) == blob
    assert wait_for(lambda: node.metric("kura_tmp_reserved_bytes") == 0, 10)


def test_empty_messages_inside_a_zstd_write_are_skipped(
    grpc_node: tuple[NodeProcess, Reapi],
) -> None:
    """Messages without data (a client's closing ``finish_write``, or between pieces) are no
    end of the compressed stream: the blob is stored whole."""
    _node, c = grpc_node
    blob = mixed_blob(1024 * 1024 + 3)
    frame = zstd(blob)
    name = blob_name(blob, upload=new_upload(), compressor="zstd")
    half = len(frame) // 2

    def messages() -> Iterator[bs.WriteRequest]:
        yield bs.WriteRequest(resource_name=name, write_offset=0, data=frame[:half])
        yield bs.WriteRequest(write_offset=half, data=b"")
        yield bs.WriteRequest(write_offset=half, data=frame[half:])
        yield bs.WriteRequest(write_offset=len(frame), data=b"", finish_write=True)

    done = c.bytestream.Write(messages())
    assert done.committed_size == len(frame)
    assert c.read(blob_name(blob)) == blob


BOMB_DECLARED = 1024
BOMB_TARGET = digest(os.urandom(BOMB_DECLARED)).hash


@pytest.mark.process  # its peak RSS
def test_zstd_bomb_is_refused_at_once(grpc_node: tuple[NodeProcess, Reapi]) -> None:
    """Declared 1 KiB, the stream decompresses to 100 MiB: INVALID_ARGUMENT, nothing kept."""
    node, c = grpc_node
    bomb = zstd(bytes(100 * 1024 * 1024))
    assert len(bomb) < 10_000
    name = f"uploads/{new_upload()}/compressed-blobs/zstd/{BOMB_TARGET}/{BOMB_DECLARED}"
    peak_before = peak_rss_bytes(node)
    with pytest.raises(grpc.RpcError) as refused:
        c.write(name, bomb)  # one message
    assert refused.value.code() is INVALID
    assert "more than the declared 1024 bytes" in str(refused.value.details())
    assert_nothing_stored(node)
    # Never buffered: the node's peak RSS grew by far less than the 100 MiB the bomb holds.
    grown = peak_rss_bytes(node) - peak_before
    assert grown < 40 * 1024 * 1024, grown


@pytest.mark.process  # its peak RSS
def test_a_highly_compressed_blob_is_stored_with_bounded_memory(
    grpc_node: tuple[NodeProcess, Reapi],
) -> None:
    """An honest 256 MiB blob sent as a zstd frame of a few KB: stored intact while the node's
    peak RSS grows by far less than the blob (issue 26: a 1 GiB one added 1,033 MiB, because the
    decompressor expanded a whole input slice at once)."""
    node, c = grpc_node
    blob = bytes(256 * 1024 * 1024)
    frame = zstd(blob)
    assert len(frame) < 64 * 1024
    peak_before = peak_rss_bytes(node)
    done = c.write(blob_name(blob, upload=new_upload(), compressor="zstd"), frame)
    assert done.committed_size == len(frame)
    grown = peak_rss_bytes(node) - peak_before
    assert grown < 64 * 1024 * 1024, f"peak RSS grew by {grown / 2**20:.0f} MiB"
    assert c.find_missing([blob]) == []
    assert wait_for(lambda: node.metric("kura_tmp_reserved_bytes") == 0, 10)


def peak_rss_bytes(node: NodeProcess) -> int:
    """The ``kura serve`` process's peak resident set (``VmHWM``, proc(5))."""
    status = Path(f"/proc/{node.proc.pid}/status").read_text(encoding="ascii")
    for line in status.splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM in /proc/PID/status")


@pytest.mark.parametrize(
    "case",
    [
        "corrupt frame",
        "truncated frame",
        "wrong content",
        "garbage after the frame",
        "a window past 8 MiB",
    ],
)
def test_bad_zstd_streams_leave_nothing(grpc_node: tuple[NodeProcess, Reapi], case: str) -> None:
    node, c = grpc_node
    blob = mixed_blob(500_000)
    frame = zstd(blob)
    stream = {
        "corrupt frame": frame[:4] + os.urandom(len(frame) - 4),
        "truncated frame": frame[: len(frame) // 2],
        "wrong content": zstd(mixed_blob(500_000)),
        "garbage after the frame": frame + b"\x00not zstd at all",
        # Memory the decoder would hold for the whole upload: more than RFC 8878 recommends.
        "a window past 8 MiB": streamed_zstd(blob, window_log=24),
    }[case]
    name = blob_name(blob, upload=new_upload(), compressor="zstd")
    with pytest.raises(grpc.RpcError) as refused:
        c.write(name, stream)
    assert refused.value.code() is INVALID, refused.value.details()
    assert_nothing_stored(node)
    assert c.find_missing([blob]) == [digest(blob).hash]
