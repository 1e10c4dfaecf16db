"""A REAPI v2 client written from the generated stubs (``kura.protos``, from proto/), over a
real gRPC channel to a ``kura serve`` process: the independent client the gRPC tests drive.

``start_grpc_node`` starts a node with ``KURA_GRPC_PORT`` on a free port and returns it with a
``Reapi`` bound to it.
"""

from __future__ import annotations

import hashlib
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import grpc
from pyfastcdc import FastCDC

from kura.protos.build.bazel.remote.asset.v1 import remote_asset_pb2_grpc as ra_grpc
from kura.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as reapi,
)
from kura.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2_grpc as reapi_grpc,
)
from kura.protos.google.bytestream import bytestream_pb2 as bs
from kura.protos.google.bytestream import bytestream_pb2_grpc as bs_grpc
from kura_harness.launch.process import free_port
from tests.conftest import NodeProcess


def digest(data: bytes) -> reapi.Digest:
    return reapi.Digest(hash=hashlib.sha256(data).hexdigest(), size_bytes=len(data))


def blob_name(
    data: bytes, instance: str = "", upload: str | None = None, compressor: str = ""
) -> str:
    """The ByteStream name of ``data``; ``compressor`` (e.g. ``zstd``) names compressed-blobs."""
    d = digest(data)
    head = f"{instance}/" if instance else ""
    up = f"uploads/{upload}/" if upload is not None else ""
    kind = f"compressed-blobs/{compressor}" if compressor else "blobs"
    return f"{head}{up}{kind}/{d.hash}/{d.size_bytes}"


@dataclass
class Reapi:
    """Stubs for every service on one channel; ``token`` goes as ``authorization`` metadata."""

    target: str
    token: str | None = None

    def __post_init__(self) -> None:
        self.channel = grpc.insecure_channel(
            self.target, options=[("grpc.max_receive_message_length", 64 * 1024 * 1024)]
        )
        self.cas = reapi_grpc.ContentAddressableStorageStub(self.channel)
        self.ac = reapi_grpc.ActionCacheStub(self.channel)
        self.capabilities = reapi_grpc.CapabilitiesStub(self.channel)
        self.bytestream = bs_grpc.ByteStreamStub(self.channel)
        self.fetch = ra_grpc.FetchStub(self.channel)  # the Remote Asset API
        self.push = ra_grpc.PushStub(self.channel)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return (("authorization", f"Bearer {self.token}"),) if self.token else ()

    def close(self) -> None:
        self.channel.close()

    def write(
        self, name: str, data: bytes, *, chunk: int = 64 * 1024, offset: int = 0
    ) -> bs.WriteResponse:
        """ByteStream.Write ``data[offset:]`` from ``offset`` in ``chunk``-byte messages."""
        return self.bytestream.Write(  # type: ignore[no-any-return]
            write_requests(name, data, chunk=chunk, offset=offset), metadata=self.metadata
        )

    def read(self, name: str, offset: int = 0, limit: int = 0) -> bytes:
        return b"".join(
            r.data
            for r in self.bytestream.Read(
                bs.ReadRequest(resource_name=name, read_offset=offset, read_limit=limit),
                metadata=self.metadata,
            )
        )

    def find_missing(
        self, blobs: Sequence[bytes], instance: str = "", timeout: float | None = None
    ) -> list[str]:
        response = self.cas.FindMissingBlobs(
            reapi.FindMissingBlobsRequest(
                instance_name=instance, blob_digests=[digest(b) for b in blobs]
            ),
            metadata=self.metadata,
            timeout=timeout,
        )
        return [d.hash for d in response.missing_blob_digests]

    def batch_update(
        self, blobs: Sequence[bytes], instance: str = ""
    ) -> reapi.BatchUpdateBlobsResponse:
        return self.cas.BatchUpdateBlobs(  # type: ignore[no-any-return]
            reapi.BatchUpdateBlobsRequest(
                instance_name=instance,
                requests=[
                    reapi.BatchUpdateBlobsRequest.Request(digest=digest(b), data=b) for b in blobs
                ],
            ),
            metadata=self.metadata,
        )

    def split(self, blob: reapi.Digest, instance: str = "") -> list[reapi.Digest]:
        """SplitBlob: the digests of ``blob``'s chunks, in order."""
        response = self.cas.SplitBlob(
            reapi.SplitBlobRequest(
                instance_name=instance,
                blob_digest=blob,
                chunking_function=reapi.ChunkingFunction.FAST_CDC_2020,
            ),
            metadata=self.metadata,
        )
        assert response.chunking_function == reapi.ChunkingFunction.FAST_CDC_2020
        return list(response.chunk_digests)

    def splice(
        self, blob: reapi.Digest, chunks: Sequence[reapi.Digest], instance: str = ""
    ) -> reapi.SpliceBlobResponse:
        return self.cas.SpliceBlob(  # type: ignore[no-any-return]
            reapi.SpliceBlobRequest(
                instance_name=instance,
                blob_digest=blob,
                chunk_digests=chunks,
                chunking_function=reapi.ChunkingFunction.FAST_CDC_2020,
            ),
            metadata=self.metadata,
        )


def fastcdc_chunks(data: bytes, params: reapi.FastCdc2020Params) -> list[bytes]:
    """``data`` cut as a client does from a server's advertised ``fast_cdc_2020_params``, by
    remote_execution.proto's text alone: minimum avg / 4, maximum avg * 4, normalization
    level 2, the advertised seed."""
    avg = params.avg_chunk_size_bytes
    cutter = FastCDC(
        avg, min_size=avg // 4, max_size=avg * 4, normalized_chunking=2, seed=params.seed
    )
    return [bytes(c.data) for c in cutter.cut_buf(data)]


def write_requests(
    name: str,
    data: bytes,
    *,
    chunk: int = 64 * 1024,
    offset: int = 0,
    finish: bool = True,
    pace_seconds: float = 0.0,
) -> Iterator[bs.WriteRequest]:
    """The Write messages of ``data[offset:]``, ``pace_seconds`` apart (0: at once)."""
    pos = offset
    first = True
    while True:
        piece = data[pos : pos + chunk]
        last = pos + len(piece) >= len(data)
        yield bs.WriteRequest(
            resource_name=name if first else "",
            write_offset=pos,
            data=piece,
            finish_write=last and finish,
        )
        first = False
        pos += len(piece)
        if last:
            return
        if pace_seconds:
            time.sleep(pace_seconds)


def new_upload() -> str:
    return str(uuid.uuid4())


def start_grpc_node(
    start_node: Callable[..., NodeProcess], name: str = "node", **settings: object
) -> tuple[NodeProcess, Reapi]:
    port = free_port()
    node = start_node(name, grpc_port=port, **settings)
    return node, Reapi(f"127.0.0.1:{port}")
