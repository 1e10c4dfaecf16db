"""The two blocking clients ``bench/grpc_cas.py`` drives, one connection each: a REAPI client
from the REAPI stubs kura generates (``kura.protos``, as tests/grpc_api) and an ``http.client``
client of kura's ``/cache/cas/<sha256>``. Every call checks its answer (committed size, byte
count, status) and raises RuntimeError (or grpc.RpcError) otherwise."""

from __future__ import annotations

import http.client
import uuid
from collections.abc import Iterator

import grpc

from kura.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2 as reapi,
)
from kura.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2_grpc as reapi_grpc,
)
from kura.protos.google.bytestream import bytestream_pb2 as bs
from kura.protos.google.bytestream import bytestream_pb2_grpc as bs_grpc

MiB = 1024 * 1024
MAX_MESSAGE_BYTES = 64 * MiB


class GrpcClient:
    """One channel: ByteStream + CAS stubs, instance name ``""``."""

    def __init__(self, target: str, chunk_bytes: int) -> None:
        self.channel = grpc.insecure_channel(
            target,
            options=[
                ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
                ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ],
        )
        grpc.channel_ready_future(self.channel).result(timeout=60)
        self.bytestream = bs_grpc.ByteStreamStub(self.channel)
        self.cas = reapi_grpc.ContentAddressableStorageStub(self.channel)
        self.chunk_bytes = chunk_bytes

    def close(self) -> None:
        self.channel.close()

    def write(self, blob: tuple[str, bytes]) -> None:
        sha, data = blob
        name = f"uploads/{uuid.uuid4()}/blobs/{sha}/{len(data)}"
        r = self.bytestream.Write(self._requests(name, data), timeout=300)
        if r.committed_size != len(data):
            raise RuntimeError(f"Write committed {r.committed_size} of {len(data)}")

    def _requests(self, name: str, data: bytes) -> Iterator[bs.WriteRequest]:
        view = memoryview(data)
        pos = 0
        while True:
            piece = view[pos : pos + self.chunk_bytes]
            last = pos + len(piece) >= len(data)
            yield bs.WriteRequest(
                resource_name=name if pos == 0 else "",
                write_offset=pos,
                data=bytes(piece),
                finish_write=last,
            )
            pos += len(piece)
            if last:
                return

    def read(self, blob: tuple[str, int]) -> None:
        sha, size = blob
        got = 0
        for r in self.bytestream.Read(
            bs.ReadRequest(resource_name=f"blobs/{sha}/{size}"), timeout=300
        ):
            got += len(r.data)
        if got != size:
            raise RuntimeError(f"Read gave {got} of {size} bytes")

    def batch_update(self, blobs: list[tuple[str, bytes]]) -> None:
        r = self.cas.BatchUpdateBlobs(
            reapi.BatchUpdateBlobsRequest(
                requests=[
                    reapi.BatchUpdateBlobsRequest.Request(
                        digest=reapi.Digest(hash=sha, size_bytes=len(data)), data=data
                    )
                    for sha, data in blobs
                ]
            ),
            timeout=120,
        )
        bad = [x.status.code for x in r.responses if x.status.code != 0]
        if bad:
            raise RuntimeError(f"BatchUpdateBlobs: {len(bad)} failed, codes {set(bad)}")

    def batch_read(self, blobs: list[tuple[str, int]]) -> None:
        r = self.cas.BatchReadBlobs(
            reapi.BatchReadBlobsRequest(
                digests=[reapi.Digest(hash=sha, size_bytes=size) for sha, size in blobs]
            ),
            timeout=120,
        )
        bad = [x.status.code for x in r.responses if x.status.code != 0]
        short = [
            x for x, (_sha, size) in zip(r.responses, blobs, strict=True) if len(x.data) != size
        ]
        if bad or short or len(r.responses) != len(blobs):
            raise RuntimeError(f"BatchReadBlobs: {len(bad)} failed, {len(short)} short")

    def find_missing(self, digests: list[reapi.Digest]) -> int:
        r = self.cas.FindMissingBlobs(
            reapi.FindMissingBlobsRequest(blob_digests=digests), timeout=120
        )
        return len(r.missing_blob_digests)


class HttpClient:
    """One keep-alive ``http.client`` connection to kura's ``/cache/cas/<sha256>``."""

    def __init__(self, url: str) -> None:
        netloc = url.split("://", 1)[1].rstrip("/")
        self.conn = http.client.HTTPConnection(netloc, timeout=300)

    def close(self) -> None:
        self.conn.close()

    def write(self, blob: tuple[str, bytes]) -> None:
        sha, data = blob
        self.conn.request("PUT", f"/cache/cas/{sha}", body=data)
        r = self.conn.getresponse()
        r.read()
        if r.status not in (200, 201, 204):
            raise RuntimeError(f"PUT answered {r.status}")

    def read(self, blob: tuple[str, int]) -> None:
        sha, size = blob
        self.conn.request("GET", f"/cache/cas/{sha}")
        r = self.conn.getresponse()
        got = 0
        while chunk := r.read(MiB):
            got += len(chunk)
        if r.status != 200 or got != size:
            raise RuntimeError(f"GET answered {r.status} with {got} of {size} bytes")


Client = GrpcClient | HttpClient
