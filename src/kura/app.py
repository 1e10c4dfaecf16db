"""Composition root: builds a node's parts, starts them in order and stops them in reverse.

Start: descriptor limit and connection cap (``api/connections``) → storage, its cheap part
(takes the data-dir lock, sweeps staging leftovers, opens the index) → peer client → internal
listener (peer routes, optional mTLS) → public listener (both share the cap; with
``KURA_WORKERS > 1`` bound with ``SO_REUSEPORT`` and shared with the worker processes,
``kura.workers``, started once the index passed its check) → background tasks in one
``TaskGroup``: the rest of storage's start-up (``storage.startup_work``: the index check, then
reconciliation; ``/ready`` names it while it runs), discovery and token files at once, and once
that start-up work is done the others (outbox shipper, storage maintenance, upload reaper,
scrub, repair of quarantined artifacts from peers, anti-entropy, expiry). Stop (SIGTERM): mark draining
(``/ready`` 503), close the public listener, stop the workers (each stops accepting and
drains first; they forward to this process meanwhile), stop accepting and let in-flight
requests finish within ``KURA_SHUTDOWN_TIMEOUT_SECONDS``, cancel background tasks, abort open
multipart uploads, close the peer client and storage.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
import signal
import ssl
from asyncio import FIRST_COMPLETED
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from aiohttp import web
from prometheus_client.registry import Collector

from kit import event_loop
from kit.allocator import start_trimming
from kit.backoff import every
from kit.clock import Clock, SystemClock
from kit.log_ring import LogRing
from kit.unix_socket import socket_address
from kura.api import (
    admin,
    anti_entropy_routes,
    bazel_http,
    changes,
    connections,
    expect,
    gradle,
    http_cache,
    internal,
    internal_batch,
    keyvalue,
    metro,
    module,
    namespace,
    nx,
    probes,
    public_load,
    scope,
    status_page,
    turbo,
    webdav,
    xcode,
)
from kura.api.admin import ADMIN_KEY, AdminContext
from kura.api.anti_entropy_metrics import anti_entropy_collector
from kura.api.auth import TokenAuth, token_auth_from
from kura.api.auth_metrics import auth_collector, peer_auth_collector
from kura.api.expiry_metrics import bucket_expiry_collector, expiry_collector
from kura.api.http import ApiContext, serving_app, wait_for_handlers
from kura.api.integrity_metrics import IntegrityCollector
from kura.api.mesh_metrics import MeshCollector, catch_up_collector, peer_metadata_collector
from kura.api.metrics import KuraMetrics
from kura.api.namespace_metrics import NamespaceCollector
from kura.api.object_store_metrics import ObjectStoreCollector
from kura.api.peer_auth import PeerAuth
from kura.api.public_tls import PublicTls
from kura.api.storage_metrics import StoreCollector, commit_collector, uploads_collector
from kura.core.bucket_expiry import retention_in_bucket
from kura.grpc.server import GrpcServer
from kura.mesh.anti_entropy import AntiEntropy
from kura.mesh.bootstrap import Bootstrapper
from kura.mesh.catch_up import CatchUp
from kura.mesh.client import PeerClient, client_ssl_context, server_ssl_context
from kura.mesh.incremental import CursorPass
from kura.mesh.membership import Membership
from kura.mesh.peer_pace import PeerPace, PublicLoad
from kura.mesh.read_through import ReadThrough
from kura.mesh.repair import Repairer
from kura.mesh.shipper import Shipper
from kura.mesh.wire import peer_label
from kura.node_status import node_status
from kura.settings import Settings
from kura.settings_rules import is_loopback
from kura.storage.bucket_expiry import BucketExpiry, bucket_aging
from kura.storage.bucket_touch import BucketToucher
from kura.storage.budget import TmpBudget
from kura.storage.expiry import Expiry
from kura.storage.fill import FillingReader
from kura.storage.multipart import MultipartUploads
from kura.storage.object_store import ObjectStore, ObjectStoreConfig
from kura.storage.object_tier import ObjectTier
from kura.storage.ports import ArtifactReader, ArtifactWriter
from kura.storage.scrub import Scrubber
from kura.storage.service import CacheService
from kura.storage.startup_gate import StartupGatedWriter
from kura.workers.supervisor import Workers

log = logging.getLogger(__name__)

MAINTENANCE_INTERVAL_SECONDS = 60.0
# ``start`` returns (and prints its listening line) once the background start-up work is done
# or this long after the listeners came up, whichever is first (storage.startup_work).
ANNOUNCE_WITHIN_SECONDS = 0.5
# Request bodies are streamed; this only bounds what aiohttp itself would buffer.
CLIENT_MAX_SIZE_BYTES = 1024 * 1024


class Node:
    """One kura node. ``await start()``, then ``await stop()`` (or ``serve_forever``)."""

    def __init__(self, settings: Settings, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        self.budget = TmpBudget(settings.tmp_dir_max_bytes, tmp_dir=Path(settings.tmp_dir))
        self.service = CacheService(
            data_dir=Path(settings.data_dir),
            tmp_dir=Path(settings.tmp_dir),
            tenant_id=settings.tenant_id,
            budget=self.budget,
            clock=self.clock,
            max_disk_bytes=settings.max_disk_bytes,
            min_free_disk_bytes=settings.min_free_disk_bytes,
            min_retention_ms=int(settings.min_retention_seconds * 1000),
            namespace_rules=settings.namespace_rules,
            outbox_max_depth=settings.outbox_max_depth,
            hot_cache_bytes=settings.hot_cache_bytes // settings.workers,  # a share each
            verify_reads=settings.verify_reads,
            quarantine_max_bytes=settings.quarantine_max_bytes,
            on_quarantine=self._repair_quarantined,
            max_clock_skew_ms=settings.max_clock_skew_ms,
            max_inline_bytes=settings.max_keyvalue_bytes,
            inline_max_bytes=settings.inline_max_bytes,
            # What replication needs of a local write (storage.service): the parts answering
            # take the store, so they are built below; storage calls these only once started.
            targets=lambda: self.catch_up.targets(),
            bucket=bool(settings.object_store_url),
            outbox_written=self._outbox_written,
            eviction_floor_ms=lambda: self.bootstrapper.eviction_floor_ms,
            touched=self._touched,
            sent_again=self._sent_again,
            startup_wait_seconds=settings.startup_wait_seconds,
        )
        self.scrubber = Scrubber(
            self.service,
            interval_seconds=settings.scrub_interval_seconds,
            max_bytes_per_second=settings.scrub_max_bytes_per_second,
        )
        self.expiry = Expiry(
            self.service,
            self.clock,
            max_age_seconds=settings.max_age_seconds,
            rules=settings.namespace_rules,
            interval_seconds=settings.expiry_interval_seconds,
            max_deletes_per_second=settings.expiry_max_deletes_per_second,
            batch_size=settings.expiry_batch_size,
        )
        # Every client's write, through one gate while start-up's work runs (storage.startup_gate).
        self.writer: ArtifactWriter = StartupGatedWriter(self.service, self.service.startup)
        self.uploads = MultipartUploads(
            self.service,
            self.clock,
            settings.multipart_upload_ttl_seconds,
            settings.multipart_upload_idle_seconds,
            per_namespace=settings.multipart_uploads_per_namespace,
            min_bytes_per_second=settings.min_upload_bytes_per_second,
            grace_seconds=settings.upload_grace_seconds,
        )
        self.connections = connections.ConnectionGuard(settings.max_connections)
        server_ssl: ssl.SSLContext | None = None
        client_ssl: ssl.SSLContext | None = None
        if settings.internal_tls:
            tls = (
                str(settings.internal_tls_ca_cert_path),
                str(settings.internal_tls_cert_path),
                str(settings.internal_tls_key_path),
            )
            server_ssl, client_ssl = server_ssl_context(*tls), client_ssl_context(*tls)
        self._server_ssl = server_ssl
        self.peer_auth = PeerAuth(settings.internal_tokens)
        self.wire_versions = internal.WireVersions(self.clock.monotonic)
        self.auth = token_auth_from(settings)
        cert, key = settings.public_tls_cert_path, settings.public_tls_key_path
        self.public_tls = PublicTls(cert, key) if cert and key else None
        self.peer_pace = PeerPace(
            settings.replication_shared_bandwidth_bytes_per_second,
            PublicLoad(self.clock, settings.replication_public_latency_target_ms / 1000),
            self.clock,
        )
        self.peer_client = PeerClient(
            settings.tenant_id,
            client_ssl,
            peer_token=settings.internal_tokens[0] if settings.internal_tokens else None,
            pace=self.peer_pace if self.peer_pace.enabled else None,
            node_url=lambda: self.node_url,
        )
        self.node_url = settings.node_url or ""
        self.membership = Membership(
            self_url=lambda: self.node_url,
            tenant_id=settings.tenant_id,
            seeds=settings.peers,
            dns_name=settings.discovery_dns_name,
            client=self.peer_client,
            clock=self.clock,
            interval_seconds=settings.discovery_interval_ms / 1000,
            settle_seconds=settings.discovery_settle_ms / 1000,
            initial_timeout_seconds=settings.discovery_initial_timeout_ms / 1000,
            tls=settings.internal_tls,
        )
        replica_log = self.service.replica_log
        self.shipper = Shipper(
            self.service.reads,
            replica_log,
            self.peer_client,
            self.clock,
            settings.replication_backoff_max_ms / 1000,
        )
        self.read_through = ReadThrough(
            self.service,
            self.peer_client,
            # Never a peer that is down; before the first discovery round, the seeds: a
            # restarted node must not answer misses for what its peers hold.
            self.membership.askable_peers,
            self._read_through_enabled,
            settings.read_through_timeout_ms / 1000,
            negative_ttl_seconds=settings.read_through_negative_ttl_ms / 1000,
            monotonic=self.clock.monotonic,
        )
        self.repairer = Repairer(self.read_through.repair)
        self.bootstrapper = Bootstrapper(
            service=self.service,
            client=self.peer_client,
            budget=self.budget,
            clock=self.clock,
            peers=lambda: sorted(self.membership.peers),
            max_concurrent_peers=settings.bootstrap_max_concurrent_peers,
            downloads_per_peer=settings.bootstrap_downloads_per_peer,
            max_failed_passes=settings.bootstrap_max_failed_passes,
            stall_timeout_seconds=settings.bootstrap_timeout_ms / 1000,
            disk_limit_bytes=settings.max_disk_bytes * settings.bootstrap_disk_percent // 100,
            rest_served_by=(
                "the rest is served by read-through"
                if settings.read_through == "always"
                else f"the rest misses here (KURA_READ_THROUGH={settings.read_through})"
            ),
            cursors=CursorPass(replica_log, self.peer_client, lambda: self.node_url),
            poll_interval_seconds=settings.changes_poll_interval_seconds,
        )
        self.catch_up = CatchUp(
            replica_log,
            self.membership,
            self.clock,
            settings.peer_forget_after_seconds,
            lambda peer: self.peer_client.ask_to_pull(peer, self.node_url),
            object_tier=bool(settings.object_store_url),
            wake_shipper=self.shipper.wake,
        )
        self.anti_entropy = AntiEntropy(
            service=self.service,
            reader=self.service.reads,
            replica_log=replica_log,
            client=self.peer_client,
            clock=self.clock,
            peers=self.membership.healthy_peers,
            ready=lambda: not self.readiness_reasons(),
            fetch=self.bootstrapper.fetch_artifact,
            interval_seconds=settings.anti_entropy_interval_seconds,
            max_requests_per_second=settings.anti_entropy_max_requests_per_second,
            max_requests_per_round=settings.anti_entropy_max_requests_per_round,
        )
        self.membership.listeners.append(self._on_membership_change)
        self.metrics = KuraMetrics(settings.region, settings.tenant_id)
        # The object-storage tier (docs/object-storage.md), off without KURA_OBJECT_STORE_URL.
        self.object_tier: ObjectTier | None = None
        self.bucket_expiry: BucketExpiry | None = None  # with the tier and an age or quota
        self.bucket_toucher: BucketToucher | None = None
        if settings.object_store_url:
            config = ObjectStoreConfig.from_env(
                settings.object_store_url,
                os.environ,
                settings.object_store_timeout_seconds,
                settings.object_store_breaker_failures,
                settings.object_store_breaker_cooldown_seconds,
            )
            self.object_tier = ObjectTier(
                self.service,
                ObjectStore(config, clock=self.clock),
                self.clock,
                backoff_max_seconds=settings.replication_backoff_max_ms / 1000,
                max_deletes_per_second=settings.expiry_max_deletes_per_second,
                delete_batch_size=settings.expiry_batch_size,
            )
            # bucket expiry (docs/object-storage.md#expiry), with ages and quotas per namespace
            if retention_in_bucket(settings.namespace_rules, settings.max_age_seconds):
                self.bucket_toucher, self.bucket_expiry = bucket_aging(
                    self.service,
                    self.object_tier.store,
                    self.clock,
                    max_age_seconds=settings.max_age_seconds,
                    interval_seconds=settings.expiry_interval_seconds,
                    max_deletes_per_second=settings.expiry_max_deletes_per_second,
                    batch_size=settings.expiry_batch_size,
                    rules=settings.namespace_rules,
                )
        # What every listener reads through (storage.fill): the local store, then the bucket,
        # then the peers (mesh.read_through), each wrapping the one before.
        self.reader: ArtifactReader = self.service.reads
        if self.object_tier is not None:
            self.reader = FillingReader(self.reader, self.object_tier)
        if settings.read_through != "never":
            self.reader = FillingReader(
                self.reader,
                self.read_through,
                # a body served from memory (mesh.read_through) is a use like any other read
                note_read=lambda aid: self.service.note_access({aid: self.clock.now_ms()}),
            )
        # The last WARNING/ERROR records, for /status and the status page (attached in start).
        self.log_ring = LogRing()
        self.workers: Workers | None = None  # KURA_WORKERS > 1 (kura.workers)
        if settings.workers > 1:
            self.workers = Workers(
                settings,
                self.service,
                self.metrics,
                self.build_app,
                self.auth,
                self.peer_pace.load,
                self.connections,
            )
        self.draining = False
        self.public_url = ""
        self.event_loop = ""  # set by start()
        self._runners: list[web.AppRunner] = []
        self._admin_socket: Path | None = None  # kura.api.admin's, once this node made it
        self._public_runner: web.AppRunner | None = None
        self._public_port = 0
        # The REAPI v2 services over gRPC (kura.grpc), when KURA_GRPC_PORT is set.
        self.grpc = (
            GrpcServer(
                settings,
                self.reader,  # the store read through, and its writes gated at start-up
                self.writer,
                self.auth,
                self.metrics,
                self.connections,
                self.public_tls,
            )
            if settings.grpc_port is not None
            else None
        )
        # Request handlers running right now, so that stop() can let them finish (_drain).
        self._handlers: set[asyncio.Task[Any]] = set()
        self.metrics.count_inflight(lambda: len(self._handlers))
        self.metrics.register(*self._collectors())
        self._tasks: asyncio.Task[None] | None = None

    # -- state -----------------------------------------------------------------------------

    def readiness_reasons(self) -> list[str]:
        """Why the node is not ready; empty means ready."""
        reasons = []
        if self.draining:
            reasons.append("draining")
        reasons.extend(self.service.startup.reasons())  # storage.startup_work, with progress
        if not self.membership.initial_discovery_completed:
            reasons.append("initial discovery incomplete")
        elif self.membership.settling():
            reasons.append("discovery settling")
        if self.object_tier is None:  # with the tier, a fresh node is ready without a bootstrap
            reasons.extend(self.bootstrapper.reasons())
        reasons.extend(self.service.write_refusals())  # fsync failed, descriptors short, disk full
        return reasons

    def warnings(self) -> list[str]:
        """Problems that do not block readiness but need an operator: storage (a damaged
        index set aside at start-up; a full disk is a reason instead), bootstrap (an abandoned
        peer), replication (a peer that keeps failing, e.g. refusing this node's token) and
        the object store (unreachable, uploads stalled), a token file that fails to re-read and
        versions (a mixed mesh, a peer whose wire version this node does not speak:
        ``Membership.version_warnings``)."""
        tier = [] if self.object_tier is None else self.object_tier.warnings()
        found = self.service.warnings() + self.bootstrapper.warnings() + self.shipper.warnings()
        return found + tier + self.auth.warnings() + self.membership.version_warnings()

    def _read_through_enabled(self) -> bool:
        mode = self.settings.read_through
        return mode == "always" or (mode == "joining" and bool(self.readiness_reasons()))

    def _outbox_written(self) -> None:  # the shipper and the bucket's uploader look now
        self.shipper.wake()
        if self.object_tier is not None:
            self.object_tier.wake()

    def _touched(self, accesses: Mapping[str, int]) -> None:  # the bucket's touch markers
        if self.bucket_toucher is not None:
            self.bucket_toucher.touched(accesses)

    def _sent_again(self, artifact_id: str) -> None:  # the bucket's copy is checked
        if self.object_tier is not None:
            self.object_tier.sent_again(artifact_id)

    def _repair_quarantined(self, artifact_id: str) -> None:
        """Storage's writer thread quarantined an entry: fetch a good copy from a peer."""
        self.repairer.request_threadsafe(artifact_id)

    def _on_membership_change(self, change: str, node_url: str) -> None:
        if change == "healthy":
            self.shipper.peer_healthy_again(node_url)
        if change in ("joined", "healthy"):
            # Healthy again after a partition: catch up from the cursor (mesh.incremental).
            self.bootstrapper.peer_joined(node_url)

    async def status(self) -> dict[str, Any]:
        """The mesh as this node sees it (``GET /status``, ``kura status``; ``node_status``),
        its lookups counted over every process (``KuraMetrics.lookups_by_protocol``)."""
        return node_status(self, await self.metrics.lookups_by_protocol())

    # -- wiring ----------------------------------------------------------------------------

    def _collectors(self) -> list[Collector]:
        """Each component's metric families (``kura.api.metrics``), for the node's registry."""
        service, tier = self.service, self.object_tier
        found: list[Collector] = [
            StoreCollector(
                service.stats,
                self.budget,
                self.settings.max_disk_bytes,
                service.hot,
                lambda: service.start_report,
                service.free_disk_bytes,
            ),
            commit_collector(service.commit_stats),
            uploads_collector(self.uploads),
            IntegrityCollector(
                service.stats, service.quarantine, self.scrubber.stats, self.repairer.stats
            ),
            expiry_collector(self.expiry.stats),
            NamespaceCollector(service.stats, self.settings.namespace_rules),
            MeshCollector(self.membership, self.shipper, self.read_through, self.bootstrapper),
            catch_up_collector(self.catch_up.stats, service.queues),
            peer_metadata_collector(self.peer_client),
            anti_entropy_collector(self.anti_entropy.stats),
            public_load.collector(self.peer_pace),
            self.connections.collector(),
            peer_auth_collector(self.peer_auth),
            auth_collector(self.auth, self.public_tls),
        ]
        if tier is not None:
            found.append(ObjectStoreCollector(tier.store.stats, tier.store.breaker.state))
        if self.bucket_expiry is not None and self.bucket_toucher is not None:
            found.append(bucket_expiry_collector(self.bucket_expiry, self.bucket_toucher))
        return found

    def _context(self) -> ApiContext:
        return ApiContext(
            settings=self.settings,
            reader=self.reader,  # the ports of one store (kura.storage.ports), read through
            writer=self.writer,
            peers=self.service,
            uploads=self.uploads,
            auth=self.auth,
            metrics=self.metrics,
            handlers=self._handlers,  # shared by both listeners: the drain waits for all
            peer_pace=self.peer_pace if self.peer_pace.enabled else None,
        )

    def build_app(self) -> web.Application:
        app = serving_app(
            self._context(),
            [public_load.middleware(self.peer_pace.load)],
            client_max_size=CLIENT_MAX_SIZE_BYTES,
            public=True,
        )
        app[probes.READINESS_KEY] = self.readiness_reasons
        app[probes.WARNINGS_KEY] = self.warnings
        app[probes.MEMBERS_KEY] = self.membership.members
        app[probes.STATUS_KEY] = self.status
        app[ADMIN_KEY] = self._admin_context()
        s = self.settings
        for module_routes in (
            admin.routes(),
            probes.routes(),
            nx.routes(),
            metro.routes(),
            turbo.routes(),
            xcode.routes(),
            keyvalue.routes(),
            gradle.routes(),
            module.routes(),
            namespace.routes(),
            status_page.routes(),
        ):
            app.add_routes(expect.guarded(module_routes))
        # The routes whose clients cannot send a query: namespace "", or the one in the path.
        for base in ("", scope.NAMESPACED_PREFIX):
            cache, dav = base + s.http_cache_prefix, base + s.webdav_prefix
            app.add_routes(expect.guarded(bazel_http.routes(cache) + http_cache.routes(cache)))
            app.add_routes(expect.guarded(webdav.routes(dav)))
            app.add_routes(
                expect.guarded(namespace.root_routes(cache) + namespace.root_routes(dav))
            )
        return app

    def _admin_context(self) -> AdminContext:
        return AdminContext(
            self.service.stats,
            self.settings.namespace_rules,
            self.service,
            self.writer,
            self.clock,
        )

    def build_admin_socket_app(self) -> web.Application:
        """The admin routes (``kura.api.admin``) on the data directory's unix socket, where
        the socket file's mode (0600) is the access control: no token asked."""
        context = dataclasses.replace(self._context(), auth=TokenAuth((), ()))
        app = serving_app(context, [], client_max_size=CLIENT_MAX_SIZE_BYTES, public=False)
        app[ADMIN_KEY] = self._admin_context()
        app.add_routes(admin.routes())
        return app

    async def _listen_admin_socket(self) -> None:
        """Serve ``build_admin_socket_app`` on ``admin.sock`` in the data directory, mode 0600
        before it listens; a file left there (a crash) is replaced. Called with the data
        directory's lock held; ``stop`` removes the file."""
        runner = connections.GuardedAppRunner(
            self.build_admin_socket_app(),
            self.connections,
            access_log=None,
            shutdown_timeout=float(self.settings.shutdown_timeout_seconds),
            handle_signals=False,
        )
        await runner.setup()
        self._runners.append(runner)
        path, fd = socket_address(Path(self.settings.data_dir), admin.ADMIN_SOCKET)
        try:
            sock = connections.unix_listening_socket(self.connections, path)
            try:
                os.chmod(path, 0o600)  # before listen(): nobody connects before it holds
            except OSError:
                sock.close()
                raise
            self._admin_socket = Path(self.settings.data_dir) / admin.ADMIN_SOCKET
        finally:
            if fd is not None:
                os.close(fd)
        await web.SockSite(runner, sock, backlog=64).start()

    def _remove_admin_socket(self) -> None:
        if self._admin_socket is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._admin_socket)  # any length: unlink takes a whole path
            self._admin_socket = None

    def build_internal_app(self) -> web.Application:
        # Peers' copies and cleans wait at the store's own gate (storage.startup_gate), and a
        # peer's read with a body (a batch of bodies) is never refused as a write.
        app = serving_app(
            dataclasses.replace(self._context(), writer=self.service),
            [self.peer_auth.middleware, self.wire_versions.middleware],
            client_max_size=CLIENT_MAX_SIZE_BYTES,
            public=False,
        )
        app.on_response_prepare.append(self.wire_versions.stamp)
        app[internal.NODE_URL_KEY] = lambda: self.node_url
        app[changes.FEED_READ_KEY] = self.catch_up.feed_read
        if self.object_tier is None:  # with the tier no pass runs: a pull request is a 404
            app[changes.PULL_KEY] = self.bootstrapper.pull_now
        app.add_routes(
            expect.guarded(
                internal.routes() + internal_batch.routes() + anti_entropy_routes.routes(),
                self._internal_precheck,
            )
        )
        return app

    def _internal_precheck(self, request: web.Request) -> web.Response | None:
        """The internal listener's answer before ``100 Continue``: peer credentials first, then
        the wire version (the middlewares' order)."""
        refused = self.peer_auth.refusal(request)
        return refused if refused is not None else self.wire_versions.wire_refusal(request)

    async def _listen(
        self,
        app: web.Application,
        port: int,
        ssl_context: ssl.SSLContext | None,
        reuse_port: bool = False,
    ) -> int:
        runner = connections.GuardedAppRunner(
            app,
            self.connections,
            keepalive_timeout=float(self.settings.header_read_timeout_seconds),
            access_log=logging.getLogger("kura.access") if self.settings.access_log else None,
            shutdown_timeout=float(self.settings.shutdown_timeout_seconds),
            handle_signals=False,
        )
        await runner.setup()
        self._runners.append(runner)
        host = self.settings.host
        for sock in connections.listening_sockets(
            self.connections, host, port, reuse_port=reuse_port
        ):
            await web.SockSite(runner, sock, backlog=1024, ssl_context=ssl_context).start()
        return _bound_port(runner)

    async def start(self) -> None:
        self.event_loop = event_loop.running_loop_name()  # uvloop or asyncio (KURA_EVENT_LOOP)
        self.log_ring.attach()
        self.connections.apply_descriptor_limit()
        # Only the cheap part of start-up before listening; the rest runs in the background
        # (storage.startup_work), its progress a /ready reason.
        await self.service.start(background=True)
        await self.budget.refresh()  # outside bytes as left by the start-up sweep
        if self.object_tier is not None:
            await self.object_tier.check_start()  # a missing bucket or bad credentials: exit 1
        self.repairer.bind(asyncio.get_running_loop())
        await self.peer_client.start()
        if self.auth.jwt is not None:
            await self.auth.jwt.start()  # the JWKS, before the first request
        await self._listen_admin_socket()  # the data dir is this process's (service.start)
        host = self.settings.host
        with _naming_the_port("KURA_INTERNAL_PORT", host, self.settings.internal_port):
            internal_port = await self._listen(
                self.build_internal_app(), self.settings.internal_port, self._server_ssl
            )
        if not self.node_url:
            scheme = "https" if self.settings.internal_tls else "http"
            self.node_url = f"{scheme}://{self.settings.host}:{internal_port}"
        tls = self.public_tls
        with _naming_the_port("KURA_PORT", host, self.settings.port):
            if self.workers is not None:  # they share the port: make sure nobody else does
                connections.refuse_if_taken(host, self.settings.port)
            port = await self._listen(
                self.build_app(),
                self.settings.port,
                tls.context if tls else None,
                reuse_port=self.workers is not None,
            )
        self._public_runner = self._runners[-1]
        self._public_port = port
        self.public_url = f"{'https' if tls else 'http'}://{self.settings.host}:{port}"
        if self.grpc is not None:
            with _naming_the_port("KURA_GRPC_PORT", host, self.settings.grpc_port or 0):
                await self.grpc.start()
        self._tasks = asyncio.create_task(self._background(), name="kura-background")
        # A small cache is done at once: announce it done, as before the work moved behind
        # the listener; a large one is announced listening while the work goes on.
        done = asyncio.create_task(self.service.startup.wait_done())
        await asyncio.wait(
            {self._tasks, done}, timeout=ANNOUNCE_WITHIN_SECONDS, return_when=FIRST_COMPLETED
        )
        done.cancel()
        log.info(
            "kura listening public=%s internal=%s peers=%s data_dir=%s tmp_dir=%s event_loop=%s "
            "processes=%d",
            self.public_url,
            self.node_url,
            ",".join(map(peer_label, self.settings.peers)),
            self.settings.data_dir,
            self.settings.tmp_dir,
            self.event_loop,
            self.settings.workers,
        )
        if not self.auth.enabled and not is_loopback(self.settings.host):
            log.warning(
                "the public port on %s has no tokens (KURA_READ_WRITE_TOKENS, token files or "
                "JWT): anyone who can reach %s can read and write this cache",
                self.settings.host,
                self.public_url,
            )
        # One machine-readable line on stdout so wrappers and tests learn the bound ports.
        print(f"kura listening public={self.public_url} internal={self.node_url}", flush=True)

    async def _background(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.service.finish_start())  # storage.startup_work
            tg.create_task(self.membership.run())
            tg.create_task(self.auth.run())  # token files; a worker runs it too
            if self.auth.jwt is not None:
                tg.create_task(self.auth.jwt.run())
            if self.public_tls is not None:
                tg.create_task(self.public_tls.run())
            # The workers read the index themselves: once it passed its check.
            await self.service.startup.wait_checked()
            if self.workers is not None:  # they bind the same port (kura.workers)
                self._runners.append(await self.workers.start(self._public_port))
            # The rest reads and writes storage: once the start-up work is done.
            await self.service.startup.wait_done()
            tg.create_task(self.service.run_maintenance())
            tg.create_task(self.budget.run())  # the tmp dir's occupancy, walked off the loop
            tg.create_task(self._reap_uploads())
            tg.create_task(self.shipper.run())
            tg.create_task(self.catch_up.run())
            if self.object_tier is None:
                tg.create_task(self.bootstrapper.run())
                tg.create_task(self.anti_entropy.run())
            else:  # nodes sharing a bucket copy no bodies: no bootstrap, no anti-entropy
                tg.create_task(self.object_tier.run())
                if self.bucket_expiry is not None and self.bucket_toucher is not None:
                    tg.create_task(self.bucket_toucher.run())
                    tg.create_task(self.bucket_expiry.run())
            tg.create_task(self.scrubber.run())
            tg.create_task(self.expiry.run())
            tg.create_task(self.repairer.run())
            # Large buffers (gRPC messages, HTTP bodies) freed in bulk go back to the system:
            # what 200 cut Reads held, 530 MiB, instead of staying resident (kit.allocator).
            start_trimming()

    async def _reap_uploads(self) -> None:
        async def reap() -> None:
            reaped = self.uploads.reap_expired()
            if reaped:
                log.info("removed %d abandoned multipart uploads", reaped)

        await every(reap, MAINTENANCE_INTERVAL_SECONDS, what="multipart upload reaping", log=log)

    async def _close_public_listener(self) -> None:
        """Stop accepting on the public port; open connections stay (``_drain`` ends them).
        A stopped site leaves ``runner.sites``, so ``_drain`` does not stop it again."""
        if self._public_runner is not None:
            for site in list(self._public_runner.sites):
                await site.stop()

    async def _drain(self, deadline: float) -> None:
        """Stop accepting, then let running handlers finish until ``deadline`` (loop time).

        Every listening socket is closed first (new connections are refused) but open
        connections are left alone: aiohttp's ``AppRunner.cleanup`` stops reading from them at
        once (aio-libs/aiohttp#2298), so an upload still receiving its body would wait for bytes
        it can never get. Handlers still running at the timeout are cancelled, which removes
        their staged bodies.
        """
        for runner in self._runners:
            for site in list(runner.sites):
                await site.stop()
        left = deadline - asyncio.get_running_loop().time()
        late = await wait_for_handlers(self._handlers, left)
        for task in late:
            task.cancel()
        if late:
            log.warning("cancelled %d requests still running at the shutdown timeout", len(late))
            await asyncio.wait(late, timeout=5)

    async def stop(self) -> None:
        """Graceful stop; safe to call once after ``start``.

        Storage is closed (index flushed and closed, data-dir lock released) on every path,
        also when a background task already failed or a step before it raises. A background
        task's failure is logged here, once, with its traceback.
        """
        self.draining = True
        self.service.stop_startup()  # the background start-up work stops at its next page
        # One deadline for the whole stop, workers included (docs/operations.md).
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.shutdown_timeout_seconds
        try:
            if self.workers is not None:  # they forward to this process while they drain, so
                # it stops accepting on the public port, stops them, and then drains itself
                await self._close_public_listener()
                await self.workers.stop(deadline)
            if self.grpc is not None:
                await self.grpc.stop(max(0.0, deadline - loop.time()))
            await self._drain(deadline)
            for runner in reversed(self._runners):
                await runner.cleanup()
            self._remove_admin_socket()
            await self._stop_background()
            await self.read_through.close()  # the copies it is still storing
            self.uploads.abort_all()
            await self.peer_client.close()
        finally:
            await self.service.close()
            self.log_ring.detach()
        log.info("kura stopped")

    async def _stop_background(self) -> None:
        task = self._tasks
        if task is None:
            return
        task.cancel()
        # wait() never raises: a task that failed before it was cancelled must not keep the
        # rest of stop() (closing storage) from running.
        await asyncio.wait({task})
        if not task.cancelled() and task.exception() is not None:
            log.error("background task failed", exc_info=task.exception())

    async def serve_forever(self, stop_requested: Callable[[], bool] | None = None) -> None:
        """Run until SIGTERM or SIGINT (handled from before the port is announced: exit 0, not
        death by the signal), then stop gracefully. ``stop_requested`` says whether one came
        before this loop took the signals over (``kura serve``'s own handler). A failed
        background task stops the node too, so its supervisor can restart it."""
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        timeout = f"KURA_SHUTDOWN_TIMEOUT_SECONDS={self.settings.shutdown_timeout_seconds}"

        def stop_on(sig: signal.Signals) -> None:  # the log says why the node stopped
            if not stop.is_set():
                log.info("%s received: stopping gracefully (%s)", sig.name, timeout)
            stop.set()

        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop_on, sig)
        if stop_requested is not None and stop_requested():
            log.info("a stop was requested while the node was being built: stopping (%s)", timeout)
            stop.set()
        try:
            await self.start()
        except BaseException:
            await self._abandon_start()
            raise
        assert self._tasks is not None
        waiter = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait({waiter, self._tasks}, return_when=asyncio.FIRST_COMPLETED)
        failed = self._tasks in done
        waiter.cancel()
        await self.stop()  # logs the failed task's traceback
        if failed:
            raise RuntimeError("a background task stopped unexpectedly; see the log")

    async def _abandon_start(self) -> None:
        """Undo a start that failed half-way (a port in use, an unusable host)."""
        if self.workers is not None:
            await self.workers.stop()
        for runner in reversed(self._runners):
            await runner.cleanup()
        self._remove_admin_socket()
        if self.grpc is not None:
            await self.grpc.stop(0)
        await self.peer_client.close()
        await self.service.close()
        self.log_ring.detach()


@contextlib.contextmanager
def _naming_the_port(setting: str, host: str, port: int) -> Iterator[None]:
    """Re-raise a listener's bind failure as an OSError naming ``host:port`` and the setting
    that chose it (``kura serve`` prints it and exits 1, issue 26 item 11: a bare "Address
    already in use" named neither). grpc.aio reports a failed bind as RuntimeError."""
    try:
        yield
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise OSError(exc.errno, f"cannot listen on {host}:{port} ({setting}): {reason}") from exc
    except RuntimeError as exc:
        raise OSError(
            f"cannot listen on {host}:{port} ({setting}): the gRPC server could not bind it "
            "(in use, or not an address of this machine)"
        ) from exc


def _bound_port(runner: web.AppRunner) -> int:
    for addr in runner.addresses:
        if isinstance(addr, tuple):
            return int(addr[1])
    raise RuntimeError("listener has no TCP address")
