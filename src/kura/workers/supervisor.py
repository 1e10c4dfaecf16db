"""The primary's side of ``kura.workers``: start the workers, restart one that dies, stop them
first on SIGTERM, take their hits into the LRU, and answer what they forward.

Sockets (unix, in the data dir; in a private temporary directory when that path is too long
for ``sun_path``, unix(7)): ``.kura.primary.sock`` serves the public app for forwarded
requests, ``.kura.control.sock`` takes the workers' hits (``POST /hits``: accesses for the
LRU; ids whose bytes failed a check in a worker, which the primary verifies and quarantines
if they really are damaged; the XXH3-128 of rows from before the checksum that a worker
verified with SHA-256, recorded if the row is still that version) and gives them the
primary's JWKS (``GET /jwks``, ``api.jwt_auth.JwtVerifier.follow``; 503 before a first good
fetch), ``.kura.worker-N.sock`` is worker N's ``/metrics``. They are created only after the
data dir's lock is held, and ``stop`` removes only those this process created: a second node
refused on a live data dir leaves the running node's sockets alone (issue 26, item 8).

A worker that exits while the node runs is logged at ERROR, counted in
``kura_worker_restarts_total`` and started again after a jittered backoff (``kit.backoff``)
that resets once a worker has run for ``STABLE_SECONDS``. A worker that is alive but does not
answer (stopped by SIGSTOP, a stuck event loop) keeps its share of the port's connections,
since the kernel spreads them over every ``SO_REUSEPORT`` listener (socket(7)), and waiting
for its exit would never end (issue 26, item 7: 23 of 40 GETs timed out). So every
``KURA_WORKER_PROBE_PERIOD`` the primary asks each worker for ``GET /alive`` on its own socket;
one that does not answer within ``KURA_WORKER_PROBE_TIMEOUT`` (or no longer listens there) is
asked again at once, and after ``PROBE_MISSES_TO_KILL`` misses in a row it is logged at ERROR,
counted in ``kura_worker_probe_failures_total`` and killed with SIGKILL (a stopped process acts
on no other signal, signal(7)), and so restarted as any exit is. One miss is not enough: the
timeout runs on the primary's own loop, so a primary busy past it, or a worker's passing stall,
would otherwise kill a healthy worker and every request in flight on it (Kubernetes' liveness
probes also default to 3 failures, ``failureThreshold``). A probe this process cannot even open
(descriptors or memory short here) says nothing about the worker and kills nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import logging
import os
import pickle
import signal
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import aiohttp
from aiohttp import web

from kit.backoff import Backoff
from kura.api.auth import TOKEN_GENERATION, TokenAuth
from kura.api.connections import ConnectionGuard, GuardedAppRunner, unix_listening_socket
from kura.api.metrics import KuraMetrics, Scraped, counter, gauge
from kura.core.manifest import Manifest
from kura.mesh.load_report import LoadReport
from kura.mesh.peer_pace import PublicLoad
from kura.settings import Settings
from kura.storage.hot_generation import SharedGeneration
from kura.storage.ports import WorkerSupport
from kura.workers.metrics_merge import Carry, merge_workers
from kura.workers.worker import ALIVE_PATH, READY, WorkerPlan

log = logging.getLogger(__name__)

START_TIMEOUT_SECONDS = 30.0
STABLE_SECONDS = 60.0
MAX_SUN_PATH = 107  # sun_path is 108 bytes on Linux, NUL included (unix(7))
PROBE_MISSES_TO_KILL = 3  # liveness probes missed in a row (module docstring)
# A stopping worker exits by itself at the shutdown timeout (cancelling what still runs); this
# covers its last steps (the last hits, closing its index) and the lag of its SIGTERM.
STOP_MARGIN_SECONDS = 1.0
# A probe that fails with these is this process's shortage, not the worker's fault.
_OWN_SHORTAGES = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})


class Workers:
    """``settings.workers - 1`` worker processes of one node (module docstring)."""

    def __init__(
        self,
        settings: Settings,
        service: WorkerSupport,
        metrics: KuraMetrics,
        public_app: Callable[[], web.Application],
        auth: TokenAuth,
        load: PublicLoad | None = None,
        guard: ConnectionGuard | None = None,
    ) -> None:
        self.settings = settings
        # The primary's connection cap: forwarded requests count against it (api.connections).
        self.guard = guard or ConnectionGuard(settings.max_connections)
        self.auth = auth
        self.load = load  # the node's public load: the workers' reports join it
        self.service = service
        self.metrics = metrics
        self._public_app = public_app
        self.count = settings.workers - 1
        self.restarts_total = 0
        self.probe_failures_total = 0
        self.procs: dict[int, asyncio.subprocess.Process] = {}
        self.ready: set[int] = set()  # numbers of the workers that reported READY
        self._slots: list[asyncio.Task[None]] = []
        self._stopping = False
        # What dead, restarted or unanswering workers counted (metrics_merge.Carry).
        self._carry = Carry()
        self._merge_lock = asyncio.Lock()
        self._runners: list[web.AppRunner] = []
        self._verifying: set[asyncio.Task[bool]] = set()
        # The socket paths this process bound or whose worker it started: the only ones stop()
        # removes. A node that refused to start (another process owns the data dir) created
        # none, so it leaves the running node's sockets alone (issue 26, item 8).
        self._created: set[str] = set()
        self.socket_dir = Path(settings.data_dir).resolve()  # elsewhere when too long: start()
        metrics.register(
            Scraped(
                gauge("kura_workers", "Worker processes running.", lambda: self.live),
                counter(
                    "kura_worker_restarts",
                    "Worker processes started again after they exited unexpectedly.",
                    lambda: self.restarts_total,
                ),
                counter(
                    "kura_worker_probe_failures",
                    "Workers killed (SIGKILL) and started again because they did not answer a "
                    "liveness probe on their own socket within KURA_WORKER_PROBE_TIMEOUT.",
                    lambda: self.probe_failures_total,
                ),
            )
        )
        metrics.merge = self._merged

    @property
    def live(self) -> int:
        """Workers listening now."""
        return sum(1 for n, p in self.procs.items() if p.returncode is None and n in self.ready)

    @property
    def primary_socket(self) -> str:
        return str(self.socket_dir / ".kura.primary.sock")

    @property
    def control_socket(self) -> str:
        return str(self.socket_dir / ".kura.control.sock")

    def own_socket(self, number: int) -> str:
        return str(self.socket_dir / f".kura.worker-{number}.sock")

    async def start(self, port: int) -> web.AppRunner:
        """Listen on the two primary sockets and start the workers in the background: the
        primary serves the whole port alone until each worker listens (``kura_workers``
        counts those that do), so a slow or failing worker never delays or fails the node's
        start. Returns the runner of the forwarded-request listener (the node drains it with
        its own). Call it only once this process holds the data dir's lock: it replaces the
        socket files it finds there."""
        if len(str(self.socket_dir)) > MAX_SUN_PATH - 20:
            self.socket_dir = Path(tempfile.mkdtemp(prefix="kura-"))
        forwarded = GuardedAppRunner(  # counted like the node's other listeners
            self._public_app(),
            self.guard,
            handle_signals=False,
            access_log=None,  # the worker logs each request it relays, with the client's address
            shutdown_timeout=float(self.settings.shutdown_timeout_seconds),
        )
        control = web.Application()
        control.router.add_post("/hits", self._hits)
        control.router.add_get("/jwks", self._jwks)
        own = web.AppRunner(control, handle_signals=False, access_log=None)
        await forwarded.setup()
        sock = unix_listening_socket(self.guard, self.primary_socket)
        self._created.add(self.primary_socket)
        await web.SockSite(forwarded, sock, backlog=1024).start()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.control_socket)
        self._created.add(self.control_socket)
        await own.setup()
        await web.UnixSite(own, self.control_socket).start()
        self._runners.append(own)
        # Before any worker caches a byte: the primary's changes bump the shared counter.
        data_dir = Path(self.settings.data_dir)
        self.service.hot.share(SharedGeneration.create(data_dir), follow=False)
        # ... and a change to the token files, which the workers then take in.
        self.auth.share(SharedGeneration.create(data_dir, TOKEN_GENERATION), follow=False)
        self.port = port
        self._slots = [
            asyncio.create_task(self._watch(n), name=f"kura-worker-{n}")
            for n in range(1, self.count + 1)
        ]
        return forwarded

    async def _jwks(self, _request: web.Request) -> web.Response:
        doc = self.auth.jwt.jwks_document if self.auth.jwt is not None else None
        if doc is None:
            raise web.HTTPServiceUnavailable(text="no JWKS fetched yet")
        return web.json_response(doc)

    async def _spawn(self, number: int) -> None:
        """Start worker ``number`` and wait until it listens; RuntimeError if it does not
        within ``START_TIMEOUT_SECONDS`` (it is killed)."""
        self.ready.discard(number)
        began = asyncio.get_running_loop().time()
        plan = WorkerPlan(
            self.settings,
            number,
            self.port,
            self.primary_socket,
            self.control_socket,
            self.own_socket(number),
            index_immutable=self.service.index_read_only,
        )
        env = dict(os.environ, KURA_WORKER_PARENT_PID=str(os.getpid()))
        proc = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "kura.workers.worker",
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            env=env,
        )
        self.procs[number] = proc
        self._created.add(self.own_socket(number))
        assert proc.stdin is not None
        assert proc.stdout is not None
        proc.stdin.write(pickle.dumps(plan))
        proc.stdin.close()
        try:
            async with asyncio.timeout(START_TIMEOUT_SECONDS):
                line = await proc.stdout.readline()
        except TimeoutError:
            line = b""
        if line.decode().strip() != READY:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await proc.wait()
            raise RuntimeError(f"worker {number} did not start (exit {proc.returncode})")
        self.ready.add(number)
        took = asyncio.get_running_loop().time() - began
        log.info("worker %d (pid %d) listening after %.1f s", number, proc.pid, took)

    async def _watch(self, number: int) -> None:
        """Keep worker ``number`` running: start it, and start it again after a backoff
        whenever it exits or fails to start (ERROR log; ``kura_worker_restarts_total``)."""
        backoff = Backoff(0.2, 30.0, jitter=0.5)
        loop = asyncio.get_running_loop()
        first = True
        while not self._stopping:
            if not first:
                await asyncio.sleep(backoff.failed())
            first = False
            try:
                await self._spawn(number)
            except (RuntimeError, OSError) as exc:
                if self._stopping:
                    return
                self.restarts_total += 1
                log.error("could not start worker %d: %s; trying again", number, exc)
                continue
            started = loop.time()
            proc = self.procs[number]
            probe = asyncio.create_task(self._probe_until_hung(number, proc))
            try:
                rc = await proc.wait()
            finally:
                probe.cancel()
            self.ready.discard(number)
            if self.load is not None:
                self.load.forget(f"worker-{number}")
            if self._stopping:
                return
            self.restarts_total += 1
            log.error(
                "worker %d (pid %d) exited with %s; starting it again",
                number,
                self.procs[number].pid,
                rc,
            )
            if loop.time() - started >= STABLE_SECONDS:
                backoff.reset()

    async def _probe_until_hung(self, number: int, proc: asyncio.subprocess.Process) -> None:
        """Probe worker ``number`` every ``KURA_WORKER_PROBE_PERIOD`` until it misses
        ``PROBE_MISSES_TO_KILL`` probes in a row (a miss is retried at once), then kill it
        (module docstring); its ``_watch`` sees the exit and starts another."""
        period = self.settings.worker_probe_period_seconds
        while True:
            await asyncio.sleep(period)
            for miss in range(1, PROBE_MISSES_TO_KILL + 1):
                failure = await self._probe(number)
                if failure is None:
                    break
                if miss < PROBE_MISSES_TO_KILL:
                    log.warning("worker %d missed a liveness probe (%s)", number, failure)
            if failure is None:
                continue
            self.probe_failures_total += 1
            log.error(
                "worker %d (pid %d) did not answer its liveness probe %d times in a row (%s); "
                "killing it (SIGKILL) and starting another",
                number,
                proc.pid,
                PROBE_MISSES_TO_KILL,
                failure,
            )
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            return

    async def _probe(self, number: int) -> str | None:
        """One ``GET /alive`` on worker ``number``'s own socket: None if it answered 204
        within ``KURA_WORKER_PROBE_TIMEOUT`` or if this process could not open the probe (a
        shortage here), else why it failed."""
        timeout = self.settings.worker_probe_timeout_seconds
        try:
            async with (
                asyncio.timeout(timeout),
                aiohttp.ClientSession(
                    connector=aiohttp.UnixConnector(path=self.own_socket(number))
                ) as session,
                session.get("http://worker" + ALIVE_PATH) as r,
            ):
                return None if r.status == 204 else f"answered {r.status}"
        except TimeoutError:
            return f"no answer within {timeout:g} s (KURA_WORKER_PROBE_TIMEOUT)"
        except (aiohttp.ClientError, OSError) as exc:
            if isinstance(exc, OSError) and exc.errno in _OWN_SHORTAGES:  # ClientOSError too
                log.warning("could not probe worker %d: %s", number, exc)
                return None
            return f"its socket: {exc}"

    async def stop(self, deadline: float | None = None) -> None:
        """SIGTERM every worker and wait for it to drain (the primary still serves what they
        forward) and exit, which it does by itself within the shutdown timeout
        (``kura.workers.worker``); SIGKILL one still running ``STOP_MARGIN_SECONDS`` past
        ``deadline`` (loop time; by default the shutdown timeout from now), the node's one
        deadline for its whole stop, which the primary's own drain shares."""
        loop = asyncio.get_running_loop()
        if deadline is None:
            deadline = loop.time() + self.settings.shutdown_timeout_seconds
        self._stopping = True
        for task in self._slots:
            task.cancel()
        for proc in self.procs.values():
            if proc.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGTERM)
        waits = [asyncio.create_task(p.wait()) for p in self.procs.values()]
        if waits:
            left = deadline + STOP_MARGIN_SECONDS - loop.time()
            _done, late = await asyncio.wait(waits, timeout=max(0.0, left))
            for proc in self.procs.values():
                if proc.returncode is None:
                    log.error("worker pid %d did not stop; killing it", proc.pid)
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
            if late:
                await asyncio.wait(late, timeout=5)
        for runner in self._runners:
            await runner.cleanup()
        for path in self._created:  # no worker is left to use them; none but this node's
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
        self._created.clear()

    async def _hits(self, request: web.Request) -> web.Response:
        doc = json.loads(await request.read())
        accesses = doc.get("accesses") or {}
        self.service.note_access({str(k): int(v) for k, v in accesses.items()})
        promised = doc.get("promised") or {}
        self.service.note_promised({str(k): int(v) for k, v in promised.items()})
        for aid in doc.get("suspects") or []:
            task = asyncio.create_task(self.service.verify_stored(str(aid), detected_by="read"))
            self._verifying.add(task)
            task.add_done_callback(self._verifying.discard)
        checksums = []
        for found in doc.get("checksums") or []:
            try:
                checksums.append((Manifest.from_json(found["manifest"]), str(found["xxh3_128"])))
            except (KeyError, TypeError, ValueError) as exc:
                log.warning("worker %s sent a bad checksum: %s", doc.get("worker"), exc)
        if checksums:
            self.service.record_xxh3_128(checksums)
        if self.load is not None and "load" in doc:
            try:
                report = LoadReport.from_json(doc["load"])
            except ValueError as exc:
                log.warning("worker %s sent a bad load report: %s", doc.get("worker"), exc)
            else:
                self.load.merge(f"worker-{doc.get('worker')}", report)
        return web.Response(status=204)

    async def _merged(self, own: bytes) -> bytes:
        live = {
            n: (p.pid, self.own_socket(n))
            for n, p in self.procs.items()
            if p.returncode is None and n in self.ready
        }
        # One scrape at a time: Carry must read each worker's texts in the order they were
        # taken (/metrics, /status and /ui all merge; a late text would roll a count back).
        async with self._merge_lock:
            return await merge_workers(own, live, self.metrics.across_processes, self._carry)
