"""The gRPC listener: grpcio's asyncio server (``grpc.aio``) in the node's event loop.

Started by ``kura.app`` when ``KURA_GRPC_PORT`` is set, on ``KURA_HOST``; with the public TLS
certificate and key set it speaks TLS with them, and a new handshake gets the pair that
``kura.api.public_tls`` last loaded (grpcio asks ``_certificates`` before each one). Messages larger than
``KURA_GRPC_MAX_MESSAGE_BYTES`` are refused by grpcio itself (RESOURCE_EXHAUSTED) in both
directions; ``GetCapabilities`` advertises the batch limit below it. Its connections count
against the node's connection cap (``kura.api.connections.ConnectionGuard.grpc_options``: a
share of it, and the HTTP header-read timeout, at most 10 s, for handshakes and idle connections).
"""

from __future__ import annotations

import logging

import grpc

from kura.api.auth import TokenAuth
from kura.api.connections import ConnectionGuard
from kura.api.metrics import KuraMetrics, Scraped, gauge
from kura.api.public_tls import PublicTls
from kura.grpc.action_cache import ActionCache
from kura.grpc.asset import AssetRecords, Fetch, Push
from kura.grpc.bytestream import READ_METHOD, ByteStream
from kura.grpc.cas import Capabilities, ContentAddressableStorage
from kura.grpc.common import GrpcContext, TolerantDecoding
from kura.protos.build.bazel.remote.asset.v1 import remote_asset_pb2_grpc as ra_grpc
from kura.protos.build.bazel.remote.execution.v2 import (
    remote_execution_pb2_grpc as reapi_grpc,
)
from kura.protos.google.bytestream import bytestream_pb2_grpc as bs_grpc
from kura.settings import Settings
from kura.storage.ports import ArtifactReader, ArtifactWriter

log = logging.getLogger(__name__)


class GrpcServer:
    """The REAPI services on one port. ``await start()`` → bound port; ``await stop(grace)``."""

    def __init__(
        self,
        settings: Settings,
        reader: ArtifactReader,
        writer: ArtifactWriter,
        auth: TokenAuth,
        metrics: KuraMetrics,
        connections: ConnectionGuard,
        tls: PublicTls | None = None,
    ) -> None:
        self.settings = settings
        self.connections = connections
        self.tls = tls
        self.gc = GrpcContext(settings, reader, writer, auth, metrics)
        self.bytestream = ByteStream(self.gc)
        self.gc.metrics.register(
            Scraped(
                gauge(
                    "kura_grpc_uploads",
                    "ByteStream writes in progress or parked for resumption (each holds tmp "
                    "budget).",
                    lambda: len(self.bytestream.uploads),
                )
            )
        )
        self._server: grpc.aio.Server | None = None
        self.port = 0
        self.scheme = "grpc"

    async def start(self) -> int:
        s = self.settings
        assert s.grpc_port is not None
        # Created here, in the running loop: grpc.aio binds a server to the loop it was made in.
        limit = s.grpc_max_message_bytes
        self._server = grpc.aio.server(
            interceptors=[TolerantDecoding(frozenset({READ_METHOD}))],
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", limit),
                *self.connections.grpc_options(s.header_read_timeout_seconds),
                # gRPC sets SO_REUSEPORT by default, so a second node given the same port bound
                # it too and the kernel split the connections between two caches; only the
                # primary serves gRPC, so nothing here needs to share the port.
                ("grpc.so_reuseport", 0),
            ],
            # A call may hold a staged file: as many calls as connections keeps gRPC within
            # its share of descriptors (api.connections.DESCRIPTORS_PER_CONNECTION).
            maximum_concurrent_rpcs=self.connections.grpc_max_connections,
        )
        reapi_grpc.add_CapabilitiesServicer_to_server(Capabilities(self.gc), self._server)
        reapi_grpc.add_ContentAddressableStorageServicer_to_server(
            ContentAddressableStorage(self.gc), self._server
        )
        reapi_grpc.add_ActionCacheServicer_to_server(ActionCache(self.gc), self._server)
        bs_grpc.add_ByteStreamServicer_to_server(self.bytestream, self._server)
        records = AssetRecords(self.gc)  # the Remote Asset API (kura.grpc.asset)
        ra_grpc.add_FetchServicer_to_server(Fetch(self.gc, records), self._server)
        ra_grpc.add_PushServicer_to_server(Push(self.gc, records), self._server)
        address = f"{s.host}:{s.grpc_port}"
        if self.tls is not None:
            self.port = self._server.add_secure_port(address, _certificates(self.tls))
            self.scheme = "grpcs"
        else:
            self.port = self._server.add_insecure_port(address)
        await self._server.start()
        log.info(
            "kura gRPC (REAPI v2) listening %s://%s:%d (at most %d connections, of the cap)",
            self.scheme,
            s.host,
            self.port,
            self.connections.grpc_max_connections,
        )
        return self.port

    async def stop(self, grace_seconds: float) -> None:
        """Refuse new calls, let running ones finish within ``grace_seconds``, then cancel the
        rest and discard every unfinished upload (its staged bytes and reservation)."""
        if self._server is not None:
            await self._server.stop(grace_seconds)
        await self.bytestream.uploads.discard_all()


def _certificates(tls: PublicTls) -> grpc.ServerCredentials:
    """Server credentials that follow ``tls``: grpcio calls the fetcher before each handshake
    (from its own threads), and it answers a new configuration only when the public listener
    loaded a new pair, else None (keep the current one)."""
    served = tls.loaded

    def fetch() -> grpc.ServerCertificateConfiguration | None:
        nonlocal served
        loaded = tls.loaded
        if loaded[0] == served[0]:
            return None
        served = loaded
        return grpc.ssl_server_certificate_configuration([loaded[1]])

    initial = grpc.ssl_server_certificate_configuration([served[1]])
    # grpcio documents None as "keep the current configuration"; types-grpcio omits it.
    return grpc.dynamic_ssl_server_credentials(initial, fetch)  # type: ignore[arg-type]
