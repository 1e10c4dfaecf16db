"""A worker process: serves GET and HEAD hits of the public artifact routes on the shared
public port and forwards everything else to the primary (``kura.workers``).

Started by the primary as ``python -m kura.workers.worker`` with a ``WorkerPlan`` pickled on
stdin; prints ``READY`` on stdout once it listens. It exits when the primary dies (Linux
``PR_SET_PDEATHSIG``, prctl(2), plus a check that its parent is still the one that started
it) and drains on SIGTERM: stops accepting, lets running requests finish within
``KURA_SHUTDOWN_TIMEOUT_SECONDS``, sends its last hits to the primary, exits 0.

Routes: the GET/HEAD routes of the artifact protocols, with their own handlers, auth and
checks, over ``WorkerReads.reads`` (an ``ArtifactReader``, ``kura.storage.ports``); a catch-all
forwards the rest (other methods, probes, /metrics, /status, the status page); ``/ready`` is
answered 503 here while this process is short of descriptors (``api.probes.worker_ready``).
Routing decides the rest: a miss (a 404 a read route would answer: absent here, or its bytes failed a check)
is the primary's to answer, which may read it through from a peer, so it is forwarded
unsent and uncounted (``ApiContext.forward_misses``); so is a request whose handler raises
``ForwardToPrimary`` (a token kid this worker does not know). Neither has sent anything yet. The worker's own ``/metrics`` is served only on its
control socket, for the primary to merge, beside ``/alive``, the primary's liveness probe.

Hits go to the primary every ``FLUSH_SECONDS`` (sooner at ``FLUSH_MAX_IDS`` ids), which records
them as its own reads (LRU access times, bucket touch markers); until then such a read does not
protect its artifact from eviction (``kura_worker_unreported_hits`` counts them). A post that fails
is given back and sent with the next one; recording twice does no harm, since an access time keeps
the later of two.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import logging
import os
import pickle
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import aiohttp
from aiohttp import web
from aiohttp.typedefs import Middleware

from kit import event_loop
from kit import log as kit_log
from kit.allocator import start_trimming
from kit.clock import SystemClock
from kura.api import (
    bazel_http,
    connections,
    gradle,
    http_cache,
    keyvalue,
    metro,
    module,
    nx,
    probes,
    public_load,
    scope,
    turbo,
    webdav,
    xcode,
)
from kura.api.auth import TOKEN_GENERATION, token_auth_from
from kura.api.auth_metrics import auth_collector
from kura.api.http import ApiContext, serving_app, wait_for_handlers
from kura.api.metrics import KuraMetrics, Scraped, gauge
from kura.api.public_tls import PublicTls
from kura.api.storage_metrics import HotCacheCollector
from kura.core.errors import ForwardToPrimary
from kura.mesh.load_report import LoadTally
from kura.settings import Settings
from kura.storage.hot_generation import SharedGeneration
from kura.storage.multipart import MultipartUploads
from kura.storage.ports import ArtifactWriter
from kura.storage.worker_reads import WorkerReads
from kura.workers.forward import Forwarder

log = logging.getLogger(__name__)

READY = "READY"
ALIVE_PATH = "/alive"  # on the worker's own socket: 204 while its event loop runs
FLUSH_SECONDS = 1.0  # how often hits go to the primary's LRU
FLUSH_MAX_IDS = 4096  # ... or sooner, at this many ids
PR_SET_PDEATHSIG = 1  # linux/prctl.h
CANCELLED_WAIT_SECONDS = 0.5  # for handlers cancelled at the shutdown timeout to end
_READ_METHODS = frozenset({"GET", "HEAD"})


@dataclass(frozen=True)
class WorkerPlan:
    """What the primary tells a worker: settings, the bound public port, its sockets."""

    settings: Settings
    number: int
    port: int
    primary_socket: str  # forwarded requests
    control_socket: str  # the primary's: hits (LRU) and suspect entries
    own_socket: str  # this worker's /metrics, for the primary to merge
    index_immutable: bool = False  # the primary opened the index read-only (a full disk)


class _ThePrimarys:
    """What only the primary does (writes, multipart uploads): any use forwards the request.
    The worker's routes are GETs and HEADs, which use neither; this is the net under them."""

    def __init__(self, what: str) -> None:
        self._what = what

    def __getattr__(self, name: str) -> Any:
        raise ForwardToPrimary(self._what)


def _die_with_parent(parent: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:  # died before the prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def build_worker_app(
    context: ApiContext, forward: Forwarder, load: LoadTally | None = None
) -> web.Application:
    """The worker's public app: read routes of the artifact protocols, the rest forwarded.
    ``load`` counts the public requests it serves itself (``kura.api.public_load``), inside
    the forwarding: a request it forwards counts in the primary instead."""

    @web.middleware
    async def forward_the_rest(request: web.Request, handler: Any) -> web.StreamResponse:
        if request.method not in _READ_METHODS or request.match_info.http_exception is not None:
            return await forward(request)
        try:
            response: web.StreamResponse = await handler(request)
            return response
        except ForwardToPrimary:
            return await forward(request)

    async def no_continue(_request: web.Request) -> None:
        return None  # the forwarder sends 100 Continue when the primary does

    middlewares: list[Middleware] = [forward_the_rest]
    if load is not None:
        middlewares.append(public_load.middleware(load))
    app = serving_app(context, middlewares, client_max_size=1024 * 1024, public=True)
    s = context.settings
    route_lists = [nx.routes(), metro.routes(), turbo.routes(), xcode.routes()]
    route_lists += [keyvalue.routes(), gradle.routes(), module.routes()]
    for base in ("", scope.NAMESPACED_PREFIX):
        cache, dav = base + s.http_cache_prefix, base + s.webdav_prefix
        route_lists += [bazel_http.routes(cache), http_cache.routes(cache), webdav.routes(dav)]
    app.router.add_get("/ready", probes.worker_ready(forward))  # its own shortage first
    for routes in route_lists:
        app.add_routes([r for r in routes if isinstance(r, web.RouteDef) and r.method == "GET"])
        app.add_routes([r for r in routes if isinstance(r, web.RouteDef) and r.method == "HEAD"])
    app.router.add_route("*", "/{tail:.*}", forward, expect_handler=no_continue)
    return app


class Worker:
    def __init__(self, plan: WorkerPlan, primary_pid: int) -> None:
        s = self.settings = plan.settings
        self.plan = plan
        clock = SystemClock()
        self.service = WorkerReads(
            data_dir=Path(s.data_dir),
            tmp_dir=Path(s.tmp_dir),
            tenant_id=s.tenant_id,
            clock=clock,
            verify_reads=s.verify_reads,
            hot_cache_bytes=s.hot_cache_bytes // s.workers,  # a share each, as the primary's
            promises=s.min_retention_seconds > 0,  # else each hit was kept and sent for nothing
        )
        self.metrics = KuraMetrics(s.region, s.tenant_id)
        self.auth = token_auth_from(s)
        cert, key = s.public_tls_cert_path, s.public_tls_key_path
        self.public_tls = PublicTls(cert, key) if cert and key else None
        self.context = ApiContext(
            settings=s,
            reader=self.service.reads,
            writer=cast(ArtifactWriter, _ThePrimarys("writes")),
            uploads=cast(MultipartUploads, _ThePrimarys("multipart uploads")),
            forward_misses=True,  # the primary may read them through (module docstring)
            auth=self.auth,
            metrics=self.metrics,
        )
        self.forward = Forwarder(plan.primary_socket, primary_pid, s)
        self.load = LoadTally()  # for the primary's peer pace (kura.mesh.load_report)
        self.connections = connections.ConnectionGuard(s.max_connections)
        self._sending = 0  # ids of the hits on their way to the primary
        # The primary merges what the worker exposes (kura.workers.metrics_merge).
        self.metrics.register(
            HotCacheCollector(self.service.hot),
            auth_collector(self.auth, self.public_tls),
            self.connections.collector(),  # its own cap: KURA_MAX_CONNECTIONS is per process
            Scraped(
                gauge(
                    "kura_worker_unreported_hits",
                    "Artifacts read from a worker whose access the primary's LRU has not recorded "
                    "yet (a worker sends its hits about every second).",
                    lambda: len(self.service.pending_accesses) + self._sending,
                )
            ),
        )
        self._runners: list[web.AppRunner] = []

    async def run(self) -> None:
        # Before it listens (as the primary, kura.app.Node.serve_forever): a SIGTERM from the
        # supervisor while this worker starts is a graceful stop, not death by the signal.
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        self.connections.apply_descriptor_limit()
        self.service.attach(immutable=self.plan.index_immutable)
        # The token files as the primary last took them in (api.auth.TokenAuth.share).
        self.auth.share(
            SharedGeneration.open(Path(self.settings.data_dir), TOKEN_GENERATION), follow=True
        )
        await self.forward.start()
        if self.auth.jwt is not None:  # the primary's keys, not the issuer's (JwtVerifier.follow)
            via = self.plan.control_socket
            self.auth.jwt.follow(
                "http://primary/jwks",
                lambda: aiohttp.ClientSession(connector=aiohttp.UnixConnector(path=via)),
            )
            await self.auth.jwt.start()
        public = connections.GuardedAppRunner(
            build_worker_app(self.context, self.forward, self.load),
            self.connections,
            keepalive_timeout=float(self.settings.header_read_timeout_seconds),
            access_log=logging.getLogger("kura.access") if self.settings.access_log else None,
            shutdown_timeout=float(self.settings.shutdown_timeout_seconds),
            handle_signals=False,
        )
        await public.setup()
        self._runners.append(public)
        host, port = self.settings.host, self.plan.port
        for sock in connections.listening_sockets(self.connections, host, port, reuse_port=True):
            tls = self.public_tls.context if self.public_tls else None
            await web.SockSite(public, sock, backlog=1024, ssl_context=tls).start()
        control = web.Application()
        control.router.add_get("/metrics", self._metrics)
        control.router.add_get(ALIVE_PATH, self._alive)  # the primary's liveness probe
        own = web.AppRunner(control, handle_signals=False, access_log=None)
        await own.setup()
        self._runners.append(own)
        await web.UnixSite(own, self.plan.own_socket).start()
        background = [asyncio.create_task(self._flush_loop())]
        background.append(asyncio.create_task(self.auth.run()))  # as the primary's, following it
        if self.auth.jwt is not None:
            background.append(asyncio.create_task(self.auth.jwt.run()))
        if self.public_tls is not None:  # re-reads a renewed certificate, as the primary does
            background.append(asyncio.create_task(self.public_tls.run()))
        start_trimming()  # its freed bodies go back to the system, as the primary's (kura.app)
        print(READY, flush=True)
        log.info(
            "kura worker %d listening on port %d (pid %d)", self.plan.number, port, os.getpid()
        )
        await stop.wait()
        for sig in (signal.SIGTERM, signal.SIGINT):  # stopping already: a second one (the
            loop.remove_signal_handler(sig)  # primary's, on top of PDEATHSIG's) must not
            signal.signal(sig, signal.SIG_IGN)  # hit a closing loop's wakeup fd
        await self._drain()
        for task in background:
            task.cancel()
        await asyncio.wait(background)
        try:
            await self._flush()  # the last hits
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:  # the primary died first
            log.warning("could not send the last hits to the primary: %s", exc)
        for runner in reversed(self._runners):
            await runner.cleanup()
        await self.forward.close()
        await self.service.close()
        log.info("kura worker %d stopped", self.plan.number)

    async def _alive(self, _request: web.Request) -> web.Response:
        return web.Response(status=204)

    async def _metrics(self, _request: web.Request) -> web.Response:
        return web.Response(body=self.metrics.exposition(), content_type="text/plain")

    async def _drain(self) -> None:
        """As ``Node._drain``: stop accepting, let running handlers finish within the timeout,
        then cancel what still runs, so the worker exits by itself within the node's one stop
        deadline (``Workers.stop``) rather than wait in aiohttp's cleanup for as long again."""
        for site in list(self._runners[0].sites):
            await site.stop()
        timeout = self.settings.shutdown_timeout_seconds
        late = await wait_for_handlers(self.context.handlers, timeout)
        for task in late:
            task.cancel()
        if late:
            log.warning("cancelled %d requests still running at the shutdown timeout", len(late))
            await asyncio.wait(late, timeout=CANCELLED_WAIT_SECONDS)

    async def _flush_loop(self) -> None:
        while True:
            for _ in range(10):
                await asyncio.sleep(FLUSH_SECONDS / 10)
                if len(self.service.pending_accesses) >= FLUSH_MAX_IDS:
                    break
            try:
                await self._flush()
            except (aiohttp.ClientError, OSError, TimeoutError) as exc:
                log.warning("could not send hits to the primary: %s", exc)

    async def _flush(self) -> None:
        """Post the hits, suspect ids, checksums and public load (``kura.mesh.load_report``) gathered
        since the last flush to the primary, if there are any."""
        accesses, suspects = self.service.take_accesses(), self.service.take_suspects()
        checksums, promised = self.service.take_checksums(), self.service.take_promised()
        if not (accesses or suspects or checksums or promised or self.load.pending()):
            return
        doc = json.dumps(
            {
                "worker": self.plan.number,
                "accesses": accesses,
                "promised": promised,
                "suspects": suspects,
                "checksums": [{"manifest": m.to_json(), "xxh3_128": h} for m, h in checksums],
                "load": self.load.take().to_json(),
            }
        )
        connector = aiohttp.UnixConnector(path=self.plan.control_socket)
        self._sending = len(accesses)
        try:
            async with (
                aiohttp.ClientSession(connector=connector) as session,
                session.post(
                    "http://primary/hits", data=doc, timeout=aiohttp.ClientTimeout(10)
                ) as r,
            ):
                r.raise_for_status()
        except BaseException:
            self.service.give_back(accesses, suspects, checksums, promised)  # next flush
            raise
        finally:
            self._sending = 0  # recorded by the primary (it answers after), or queued again


def main() -> int:
    plan: WorkerPlan = pickle.loads(sys.stdin.buffer.read())
    parent = int(os.environ.get("KURA_WORKER_PARENT_PID", "0")) or os.getppid()
    _die_with_parent(parent)
    kit_log.configure(plan.settings.log_level)
    event_loop.run(Worker(plan, parent).run(), plan.settings.event_loop)
    return 0


if __name__ == "__main__":
    sys.exit(main())
