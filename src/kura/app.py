"""Composition root: builds a node's parts, starts them in order and stops them in reverse.

Start: storage (takes the data-dir lock, sweeps staging leftovers and orphans) → HTTP listener →
background tasks in one ``TaskGroup``. Stop (SIGTERM): mark draining (``/ready`` 503), stop
accepting and let in-flight requests finish within ``KURA_SHUTDOWN_TIMEOUT_SECONDS``, cancel
background tasks, abort open multipart uploads, close storage (flushing access times).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from pathlib import Path

from aiohttp import web

from kit.clock import Clock, SystemClock
from kura.api import (
    bazel_http,
    gradle,
    http_cache,
    keyvalue,
    metro,
    module,
    namespace,
    nx,
    probes,
    turbo,
    webdav,
    xcode,
)
from kura.api.auth import TokenAuth
from kura.api.http import CTX_KEY, ApiContext
from kura.api.metrics import KuraMetrics
from kura.settings import Settings
from kura.storage.budget import TmpBudget
from kura.storage.multipart import MultipartUploads
from kura.storage.service import CacheService

log = logging.getLogger(__name__)

MAINTENANCE_INTERVAL_SECONDS = 60.0
# Request bodies are streamed; this only bounds what aiohttp itself would buffer.
CLIENT_MAX_SIZE_BYTES = 1024 * 1024


class Node:
    """One kura node. ``await start()``, then ``await stop()`` (or ``serve_forever``)."""

    def __init__(self, settings: Settings, clock: Clock | None = None) -> None:
        self.settings = settings
        self.clock = clock or SystemClock()
        self.budget = TmpBudget(settings.tmp_dir_max_bytes)
        self.service = CacheService(
            data_dir=Path(settings.data_dir),
            tmp_dir=Path(settings.tmp_dir),
            tenant_id=settings.tenant_id,
            budget=self.budget,
            clock=self.clock,
            max_disk_bytes=settings.max_disk_bytes,
            min_free_disk_bytes=settings.min_free_disk_bytes,
        )
        self.uploads = MultipartUploads(
            self.service, self.clock, settings.multipart_upload_ttl_seconds
        )
        self.metrics = KuraMetrics(settings.region, settings.tenant_id)
        self.metrics.watch_store(
            self.service.stats,
            self.budget,
            settings.max_disk_bytes,
            self.service.files.tmp_dir_bytes,
        )
        self.draining = False
        self.public_url = ""
        self._runner: web.AppRunner | None = None
        self._tasks: asyncio.Task[None] | None = None

    def readiness_reasons(self) -> list[str]:
        """Why the node is not ready; empty means ready."""
        return ["draining"] if self.draining else []

    def members(self) -> list[str]:
        return [self.public_url]

    def build_app(self) -> web.Application:
        app = web.Application(client_max_size=CLIENT_MAX_SIZE_BYTES)
        app[CTX_KEY] = ApiContext(
            settings=self.settings,
            service=self.service,
            uploads=self.uploads,
            auth=TokenAuth(self.settings.read_write_tokens, self.settings.read_only_tokens),
            metrics=self.metrics,
        )
        app[probes.READINESS_KEY] = self.readiness_reasons
        app[probes.MEMBERS_KEY] = self.members
        s = self.settings
        for module_routes in (
            probes.routes(),
            nx.routes(),
            metro.routes(),
            turbo.routes(),
            xcode.routes(),
            keyvalue.routes(),
            gradle.routes(),
            module.routes(),
            namespace.routes(),
            bazel_http.routes(s.http_cache_prefix),
            http_cache.routes(s.http_cache_prefix),
            webdav.routes(s.webdav_prefix),
        ):
            app.add_routes(module_routes)
        return app

    async def start(self) -> None:
        await self.service.start()
        app = self.build_app()
        self._runner = web.AppRunner(
            app,
            access_log=logging.getLogger("kura.access") if self.settings.access_log else None,
            shutdown_timeout=float(self.settings.shutdown_timeout_seconds),
            handle_signals=False,
        )
        await self._runner.setup()
        site = web.TCPSite(
            self._runner, self.settings.host, self.settings.port, backlog=1024, reuse_address=True
        )
        await site.start()
        port = _bound_port(self._runner)
        self.public_url = f"http://{self.settings.host}:{port}"
        self._tasks = asyncio.create_task(self._background(), name="kura-background")
        log.info(
            "kura listening public=%s data_dir=%s tmp_dir=%s",
            self.public_url,
            self.settings.data_dir,
            self.settings.tmp_dir,
        )
        # One machine-readable line on stdout so wrappers and tests learn the bound port.
        print(f"kura listening public={self.public_url}", flush=True)

    async def _background(self) -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self.service.run_maintenance())
            tg.create_task(self._reap_uploads())

    async def _reap_uploads(self) -> None:
        while True:
            await asyncio.sleep(MAINTENANCE_INTERVAL_SECONDS)
            reaped = self.uploads.reap_expired()
            if reaped:
                log.info("removed %d abandoned multipart uploads", reaped)

    async def stop(self) -> None:
        """Graceful stop; safe to call once after ``start``."""
        self.draining = True
        if self._runner is not None:
            await self._runner.cleanup()
        if self._tasks is not None:
            self._tasks.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._tasks
        self.uploads.abort_all()
        await self.service.close()
        log.info("kura stopped")

    async def serve_forever(self) -> None:
        """Run until SIGTERM or SIGINT, then stop gracefully. A failed background task stops
        the node too, so its supervisor can restart it."""
        await self.start()
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        assert self._tasks is not None
        waiter = asyncio.create_task(stop.wait())
        done, _ = await asyncio.wait({waiter, self._tasks}, return_when=asyncio.FIRST_COMPLETED)
        failed = self._tasks in done
        waiter.cancel()
        await self.stop()
        if failed:
            raise RuntimeError("a background task stopped unexpectedly; see the log")


def _bound_port(runner: web.AppRunner) -> int:
    for addr in runner.addresses:
        if isinstance(addr, tuple):
            return int(addr[1])
    raise RuntimeError("listener has no TCP address")
